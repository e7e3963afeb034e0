//! The driver's requests in flight: creations and deletions retried while the server is
//! briefly away, and what each came back with.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::api::{ApiError, Kind, Object, ReplayApi};
use crate::error::ReplayError;

/// How long a request is tried again while the server throttles (429, as long as it keeps
/// asking to wait) and while it cannot be reached (a crashed API server restarted here in
/// 3 s; a run against no server at all, with its clean-up, must end within a minute).
pub const PATIENCE: Duration = Duration::from_secs(60);
pub const AWAY_PATIENCE: Duration = Duration::from_secs(10);
/// The first pause between tries, doubled each time up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(200);
const MAX_PAUSE: Duration = Duration::from_secs(5);

/// The pauses between tries of one request: the server's `Retry-After` when it gives one
/// (as client-go waits), else doubling; for [`PATIENCE`] in all ([`AWAY_PATIENCE`] while
/// it cannot be reached).
pub(crate) struct Backoff {
    pause: Duration,
    waited: Duration,
}

impl Backoff {
    pub(crate) fn new() -> Self {
        Backoff {
            pause: FIRST_PAUSE,
            waited: Duration::ZERO,
        }
    }

    /// After failure `e`: waits and says to try again, or `false` (not transient, or
    /// patience spent).
    pub(crate) async fn wait(&mut self, e: &ApiError) -> bool {
        let patience = match e {
            ApiError::Throttled { .. } => PATIENCE,
            _ => AWAY_PATIENCE,
        };
        if !e.is_transient() || self.waited >= patience {
            return false;
        }
        let pause = match e.retry_after() {
            Some(asked) => asked,
            None => {
                let pause = self.pause;
                self.pause = (self.pause * 2).min(MAX_PAUSE);
                pause
            }
        }
        .min(patience - self.waited);
        tokio::time::sleep(pause).await;
        self.waited += pause;
        true
    }
}

/// `call`'s answer, asked again while the server is away or throttling ([`Backoff`]).
pub(crate) async fn patiently<T, F, Fut>(call: F) -> Result<T, ApiError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, ApiError>>,
{
    let mut backoff = Backoff::new();
    loop {
        match call().await {
            Ok(answer) => return Ok(answer),
            Err(e) => {
                if !backoff.wait(&e).await {
                    return Err(e);
                }
            }
        }
    }
}

/// Asks for `object`, again while the server is briefly away or throttling (as its
/// `Retry-After` says): a name that exists after a try that got no answer is that try's
/// (this run's own); counts requests.
pub(crate) async fn create_with_retry<A: ReplayApi>(
    api: &A,
    object: &Object,
    requests: &mut u64,
) -> Result<(), ApiError> {
    let mut backoff = Backoff::new();
    let mut tried = false;
    loop {
        *requests += 1;
        match api.create(object).await {
            Err(ApiError::AlreadyExists(_)) if tried => return Ok(()),
            Err(e) => {
                if !backoff.wait(&e).await {
                    return Err(e);
                }
                tried = true;
            }
            Ok(()) => return Ok(()),
        }
    }
}

/// Deletes `kind` `name`, again while the server is briefly away or throttling
/// ([`patiently`]); counts requests.
pub(crate) async fn delete_with_retry<A: ReplayApi>(
    api: &A,
    kind: Kind,
    name: &str,
    requests: &mut u64,
) -> Result<bool, ApiError> {
    let tries = std::sync::atomic::AtomicU64::new(0);
    let done = patiently(|| {
        tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        api.delete(kind, name)
    })
    .await;
    *requests += tries.into_inner();
    done
}

/// What one flight came back with.
pub(crate) enum Flight {
    /// Every fake node's heartbeat renewed; the first refusal, if any.
    Heartbeat {
        refused: Option<ApiError>,
        requests: u64,
    },
    Created {
        done: Result<(), (String, ApiError)>,
        requests: u64,
    },
    Deleted {
        name: String,
        done: Result<bool, ApiError>,
        requests: u64,
    },
}

/// A finished flight, applied: a refused creation stops the replay (a pod that already
/// exists was made by an earlier run that was not cleaned); requests it made.
pub(crate) fn settle(flight: Flight) -> Result<u64, ReplayError> {
    match flight {
        // A server briefly away shows in the watch and the pods' requests; a refusal
        // (forbidden, invalid) would leave the nodes to be marked unreachable: stop.
        Flight::Heartbeat { refused, requests } => match refused {
            Some(source) if !source.is_transient() => Err(ReplayError::Api {
                doing: "renewing the fake nodes' heartbeats".into(),
                source,
            }),
            _ => Ok(requests),
        },
        Flight::Created { done, requests } => {
            if let Err((name, source)) = done {
                let hint = if matches!(source, ApiError::AlreadyExists(_)) {
                    ": an earlier replay left it (run `gpuplace replay --clean`)"
                } else {
                    ""
                };
                return Err(ReplayError::Api {
                    doing: format!("creating {name}{hint}"),
                    source,
                });
            }
            Ok(requests)
        }
        Flight::Deleted {
            name,
            done,
            requests,
        } => match done {
            Ok(_) => Ok(requests),
            Err(source) => Err(ReplayError::Api {
                doing: format!("deleting pod {name}"),
                source,
            }),
        },
    }
}

pub(crate) fn create_flight<'a, A: ReplayApi>(
    api: &'a A,
    objects: Vec<Object>,
) -> Pin<Box<dyn Future<Output = Flight> + Send + 'a>> {
    Box::pin(async move {
        let mut requests = 0;
        for o in &objects {
            if let Err(e) = create_with_retry(api, o, &mut requests).await {
                return Flight::Created {
                    done: Err((format!("{} {}", o.kind().name(), o.name()), e)),
                    requests,
                };
            }
        }
        Flight::Created {
            done: Ok(()),
            requests,
        }
    })
}

pub(crate) fn delete_flight<A: ReplayApi>(
    api: &A,
    name: String,
) -> Pin<Box<dyn Future<Output = Flight> + Send + '_>> {
    Box::pin(async move {
        let mut requests = 0;
        let done = delete_with_retry(api, Kind::Pod, &name, &mut requests).await;
        Flight::Deleted {
            name,
            done,
            requests,
        }
    })
}

pub(crate) fn heartbeat_flight<'a, A: ReplayApi>(
    api: &'a A,
    run: &'a str,
    nodes: &'a [String],
) -> Pin<Box<dyn Future<Output = Flight> + Send + 'a>> {
    Box::pin(async move {
        let mut refused = None;
        for chunk in nodes.chunks(8) {
            let beats = chunk.iter().map(|n| api.heartbeat(run, n.as_str()));
            for r in futures::future::join_all(beats).await {
                if let Err(e) = r {
                    refused.get_or_insert(e);
                }
            }
        }
        Flight::Heartbeat {
            refused,
            requests: nodes.len() as u64,
        }
    })
}
