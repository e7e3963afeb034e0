//! Review answers kept for a short while, as kube-apiserver's delegating authenticator and
//! authorizer keep them (10 s, allowed and denied alike). Errors are not kept.
//!
//! Bounded against a caller who sends many distinct tokens: a token is kept only as its
//! SHA-256 digest (never the token itself), and each kind of answer is bounded in entries
//! and in bytes; past either bound the expired answers go, then all of them. Tokens longer
//! than [`MAX_TOKEN_BYTES`] are refused by the guard before any review.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::review::{Access, Decision, ReviewError, Reviews, User};

/// How long an answer is reused.
pub const TTL: Duration = Duration::from_secs(10);
/// Answers kept at most per kind.
pub const MAX_ENTRIES: usize = 10_000;
/// Bytes of answers (keys and values, as [`Size`] counts them) kept at most per kind.
pub const MAX_BYTES: usize = 4 << 20;
/// The longest bearer token reviewed (service-account JWTs are 1-2 KiB; OIDC tokens with
/// many groups a few KiB). Longer ones are refused unread by the API server.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// What an answer costs to keep, roughly: its heap bytes plus a fixed overhead.
pub trait Size {
    fn size(&self) -> usize;
}

const OVERHEAD: usize = 64;

impl Size for User {
    fn size(&self) -> usize {
        let extra: usize = self
            .extra
            .iter()
            .map(|(k, v)| k.len() + v.iter().map(String::len).sum::<usize>())
            .sum();
        self.name.len()
            + self.uid.len()
            + self.groups.iter().map(String::len).sum::<usize>()
            + extra
    }
}

impl Size for Option<User> {
    fn size(&self) -> usize {
        self.as_ref().map_or(0, Size::size)
    }
}

impl Size for Access {
    fn size(&self) -> usize {
        match self {
            Access::Path { path, verb } => path.len() + verb.len(),
            Access::Resource {
                namespace,
                verb,
                group,
                resource,
            } => namespace.len() + verb.len() + group.len() + resource.len(),
        }
    }
}

impl Size for Decision {
    fn size(&self) -> usize {
        self.reason.len()
    }
}

impl Size for (User, Access) {
    fn size(&self) -> usize {
        self.0.size() + self.1.size()
    }
}

impl Size for [u8; 32] {
    fn size(&self) -> usize {
        32
    }
}

/// Answers by key, each with the instant it stops being used, within the bounds.
struct Answers<K, V> {
    entries: HashMap<K, (Instant, V)>,
    bytes: usize,
}

impl<K: Eq + Hash + Size, V: Clone + Size> Answers<K, V> {
    fn new() -> Self {
        Answers {
            entries: HashMap::new(),
            bytes: 0,
        }
    }

    fn get(&self, key: &K, now: Instant) -> Option<V> {
        self.entries
            .get(key)
            .filter(|(until, _)| *until > now)
            .map(|(_, v)| v.clone())
    }

    fn cost(key: &K, value: &V) -> usize {
        key.size() + value.size() + OVERHEAD
    }

    fn put(&mut self, key: K, value: V, now: Instant) {
        let cost = Self::cost(&key, &value);
        if cost > MAX_BYTES {
            return;
        }
        if self.entries.len() >= MAX_ENTRIES || self.bytes + cost > MAX_BYTES {
            self.entries.retain(|_, (until, _)| *until > now);
            self.bytes = self
                .entries
                .iter()
                .map(|(k, (_, v))| Self::cost(k, v))
                .sum();
            if self.entries.len() >= MAX_ENTRIES || self.bytes + cost > MAX_BYTES {
                self.entries.clear();
                self.bytes = 0;
            }
        }
        let key_size = key.size();
        if let Some((_, old)) = self.entries.insert(key, (now + TTL, value)) {
            self.bytes -= key_size + old.size() + OVERHEAD;
        }
        self.bytes += cost;
    }

    #[cfg(test)]
    fn held(&self) -> (usize, usize) {
        (self.entries.len(), self.bytes)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The key a token is kept under: its SHA-256 digest.
fn digest(token: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// A [`Reviews`] that asks `inner` at most once per token (or user and access) per [`TTL`].
#[derive(Clone)]
pub struct Cached<R> {
    inner: R,
    tokens: Arc<Mutex<Answers<[u8; 32], Option<User>>>>,
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
        if token.len() > MAX_TOKEN_BYTES {
            return Ok(None);
        }
        let key = digest(token);
        if let Some(user) = lock(&self.tokens).get(&key, Instant::now()) {
            return Ok(user);
        }
        let user = self.inner.authenticate(token).await?;
        lock(&self.tokens).put(key, user.clone(), Instant::now());
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
#[path = "cache_tests.rs"]
mod tests;
