//! Review answers kept for a short while, as kube-apiserver's delegating authenticator and
//! authorizer keep them (10 s, allowed and denied alike). Errors are not kept.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::review::{Access, Decision, ReviewError, Reviews, User};

/// How long an answer is reused.
pub const TTL: Duration = Duration::from_secs(10);
/// Answers kept at most per kind; past it the expired ones go, then all of them.
const MAX_ENTRIES: usize = 10_000;

/// Answers by key, each with the instant it stops being used.
struct Answers<K, V> {
    entries: HashMap<K, (Instant, V)>,
}

impl<K: Eq + Hash, V: Clone> Answers<K, V> {
    fn new() -> Self {
        Answers {
            entries: HashMap::new(),
        }
    }

    fn get(&self, key: &K, now: Instant) -> Option<V> {
        self.entries
            .get(key)
            .filter(|(until, _)| *until > now)
            .map(|(_, v)| v.clone())
    }

    fn put(&mut self, key: K, value: V, now: Instant) {
        if self.entries.len() >= MAX_ENTRIES {
            self.entries.retain(|_, (until, _)| *until > now);
            if self.entries.len() >= MAX_ENTRIES {
                self.entries.clear();
            }
        }
        self.entries.insert(key, (now + TTL, value));
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A [`Reviews`] that asks `inner` at most once per token (or user and access) per [`TTL`].
#[derive(Clone)]
pub struct Cached<R> {
    inner: R,
    tokens: Arc<Mutex<Answers<String, Option<User>>>>,
    decisions: Arc<Mutex<Answers<(User, Access), Decision>>>,
}

impl<R: Reviews> Cached<R> {
    pub fn new(inner: R) -> Self {
        Cached {
            inner,
            tokens: Arc::new(Mutex::new(Answers::new())),
            decisions: Arc::new(Mutex::new(Answers::new())),
        }
    }
}

impl<R: Reviews> Reviews for Cached<R> {
    async fn authenticate(&self, token: &str) -> Result<Option<User>, ReviewError> {
        if let Some(user) = lock(&self.tokens).get(&token.to_string(), Instant::now()) {
            return Ok(user);
        }
        let user = self.inner.authenticate(token).await?;
        lock(&self.tokens).put(token.to_string(), user.clone(), Instant::now());
        Ok(user)
    }

    async fn authorize(&self, user: &User, access: &Access) -> Result<Decision, ReviewError> {
        let key = (user.clone(), access.clone());
        if let Some(decision) = lock(&self.decisions).get(&key, Instant::now()) {
            return Ok(decision);
        }
        let decision = self.inner.authorize(user, access).await?;
        lock(&self.decisions).put(key, decision.clone(), Instant::now());
        Ok(decision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Accepts the token "good" as user "alice", allows only `get /metrics`; counts calls.
    #[derive(Clone, Default)]
    struct Counting {
        calls: Arc<AtomicUsize>,
        fail: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Reviews for Counting {
        async fn authenticate(&self, token: &str) -> Result<Option<User>, ReviewError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.fail.load(Ordering::SeqCst) {
                return Err(ReviewError::Unreachable("down".into()));
            }
            Ok((token == "good").then(|| User {
                name: "alice".into(),
                ..User::default()
            }))
        }

        async fn authorize(&self, _: &User, access: &Access) -> Result<Decision, ReviewError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            Ok(Decision {
                allowed: *access == Access::path("/metrics", "get"),
                reason: String::new(),
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn answers_are_reused_for_ten_seconds_and_errors_not_at_all() {
        let inner = Counting::default();
        let cached = Cached::new(inner.clone());
        let calls = || inner.calls.load(Ordering::SeqCst);
        assert!(cached.authenticate("good").await.unwrap().is_some());
        assert!(cached.authenticate("good").await.unwrap().is_some());
        assert!(cached.authenticate("bad").await.unwrap().is_none());
        assert!(cached.authenticate("bad").await.unwrap().is_none());
        assert_eq!(calls(), 2, "one review per token");
        let alice = User {
            name: "alice".into(),
            ..User::default()
        };
        let metrics = Access::path("/metrics", "get");
        let ui = Access::path("/ui", "get");
        assert!(cached.authorize(&alice, &metrics).await.unwrap().allowed);
        assert!(!cached.authorize(&alice, &ui).await.unwrap().allowed);
        assert!(cached.authorize(&alice, &metrics).await.unwrap().allowed);
        assert!(!cached.authorize(&alice, &ui).await.unwrap().allowed);
        assert_eq!(calls(), 4, "one review per access, allowed or denied");
        tokio::time::advance(TTL + Duration::from_millis(1)).await;
        inner.fail.store(true, Ordering::SeqCst);
        assert!(cached.authenticate("good").await.is_err(), "asked again");
        assert!(
            cached.authenticate("good").await.is_err(),
            "errors not kept"
        );
        assert_eq!(calls(), 6);
    }
}
