use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::*;

/// One Lease on a pretend server, with resourceVersions; each candidate's handle can be
/// cut off from it (a network partition).
#[derive(Default)]
struct Server {
    lease: Option<Lease>,
    version: u64,
}

#[derive(Clone)]
struct Handle {
    server: Arc<Mutex<Server>>,
    cut: Arc<AtomicBool>,
}

impl Handle {
    fn new(server: &Arc<Mutex<Server>>) -> Handle {
        Handle {
            server: server.clone(),
            cut: Arc::default(),
        }
    }

    fn reach(&self) -> Result<std::sync::MutexGuard<'_, Server>, ApiError> {
        if self.cut.load(Ordering::Relaxed) {
            return Err(ApiError::Other("connection refused".into()));
        }
        Ok(self.server.lock().unwrap())
    }
}

impl LeaseStore for Handle {
    async fn get(&self) -> Result<Option<Lease>, ApiError> {
        Ok(self.reach()?.lease.clone())
    }

    async fn create(&self, lease: &Lease) -> Result<Lease, ApiError> {
        let mut s = self.reach()?;
        if s.lease.is_some() {
            return Err(ApiError::Conflict("exists".into()));
        }
        s.version += 1;
        let mut lease = lease.clone();
        lease.metadata.resource_version = Some(s.version.to_string());
        s.lease = Some(lease.clone());
        Ok(lease)
    }

    async fn replace(&self, lease: &Lease) -> Result<Lease, ApiError> {
        let mut s = self.reach()?;
        let current = s
            .lease
            .as_ref()
            .and_then(|l| l.metadata.resource_version.clone());
        if current != lease.metadata.resource_version {
            return Err(ApiError::Conflict("stale".into()));
        }
        s.version += 1;
        let mut lease = lease.clone();
        lease.metadata.resource_version = Some(s.version.to_string());
        s.lease = Some(lease.clone());
        Ok(lease)
    }
}

fn holder(server: &Arc<Mutex<Server>>) -> Option<String> {
    server
        .lock()
        .unwrap()
        .lease
        .as_ref()
        .and_then(|l| l.spec.as_ref())
        .and_then(|s| s.holder_identity.clone())
}

#[tokio::test(start_paused = true)]
async fn a_cut_off_leader_stops_before_the_standby_takes_over() {
    let server = Arc::new(Mutex::new(Server::default()));
    let (a, b) = (Handle::new(&server), Handle::new(&server));
    let (gate_a, gate_b) = (Gate::closed(), Gate::closed());
    let run_a = tokio::spawn(
        Elector::new(a.clone(), ElectionConfig::new("l", "a"), gate_a.clone())
            .run(std::future::pending()),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let run_b = tokio::spawn(
        Elector::new(b.clone(), ElectionConfig::new("l", "b"), gate_b.clone())
            .run(std::future::pending()),
    );
    let mut took_over_at = None;
    for step in 0..600 {
        if step == 50 {
            a.cut.store(true, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !(gate_a.is_open() && gate_b.is_open()),
            "two leaders at step {step}"
        );
        if gate_b.is_open() && took_over_at.is_none() {
            took_over_at = Some(step);
        }
    }
    let took_over_at = took_over_at.expect("the standby took over");
    assert!(
        took_over_at >= 50 + 100,
        "not before the record was unchanged for a lease duration: step {took_over_at}"
    );
    assert_eq!(holder(&server).as_deref(), Some("b"));
    assert_eq!(run_a.await.unwrap(), Ended::Lost, "the old leader exits");
    run_b.abort();
}

#[tokio::test(start_paused = true)]
async fn expiry_is_judged_by_local_time_since_the_record_changed_not_by_clocks() {
    let server = Arc::new(Mutex::new(Server::default()));
    // Held by another replica whose clock is an hour behind ours.
    let hour_ago = Timestamp::from_second(Timestamp::now().as_second() - 3600).unwrap();
    server.lock().unwrap().lease = Some(Lease {
        metadata: ObjectMeta {
            name: Some("l".into()),
            resource_version: Some("7".into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("other".into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(hour_ago)),
            ..Default::default()
        }),
    });
    let mut me = Elector::new(
        Handle::new(&server),
        ElectionConfig::new("l", "me"),
        Gate::closed(),
    );
    assert!(!me.try_acquire_or_renew().await, "just seen: not expired");
    tokio::time::advance(Duration::from_secs(14)).await;
    assert!(!me.try_acquire_or_renew().await);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(me.try_acquire_or_renew().await, "unchanged for 16 s: taken");
    let spec = server.lock().unwrap().lease.clone().unwrap().spec.unwrap();
    assert_eq!(spec.lease_transitions, Some(1));
}

#[tokio::test(start_paused = true)]
async fn shutdown_releases_the_lease_for_the_standby() {
    let server = Arc::new(Mutex::new(Server::default()));
    let gate_a = Gate::closed();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run_a = tokio::spawn(
        Elector::new(
            Handle::new(&server),
            ElectionConfig::new("l", "a"),
            gate_a.clone(),
        )
        .run(async {
            let _ = stopped.await;
        }),
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(gate_a.is_open());
    let gate_b = Gate::closed();
    let run_b = tokio::spawn(
        Elector::new(
            Handle::new(&server),
            ElectionConfig::new("l", "b"),
            gate_b.clone(),
        )
        .run(std::future::pending()),
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.send(()).unwrap();
    assert_eq!(run_a.await.unwrap(), Ended::Stopped);
    assert!(!gate_a.is_open());
    assert_eq!(holder(&server), None, "released");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert!(
        gate_b.is_open(),
        "taken at the standby's next retry, not after expiry"
    );
    run_b.abort();
}
