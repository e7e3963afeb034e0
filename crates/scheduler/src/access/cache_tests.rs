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

/// Accepts every token of the form `user-N` as user N; refuses the rest.
#[derive(Clone, Default)]
struct Everyone {
    calls: Arc<AtomicUsize>,
}

impl Reviews for Everyone {
    async fn authenticate(&self, token: &str) -> Result<Option<User>, ReviewError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        // The user is named by the number after `user-` (the rest is padding).
        Ok(token.strip_prefix("user-").map(|n| User {
            name: format!("user-{}", n.split('-').next().unwrap_or_default()),
            ..User::default()
        }))
    }

    async fn authorize(&self, _: &User, _: &Access) -> Result<Decision, ReviewError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(Decision {
            allowed: true,
            reason: String::new(),
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_token_over_the_bound_is_refused_without_a_review() {
    let inner = Everyone::default();
    let cached = Cached::new(inner.clone());
    let long = format!("user-{}", "x".repeat(MAX_TOKEN_BYTES));
    assert!(cached.authenticate(&long).await.unwrap().is_none());
    assert_eq!(inner.calls.load(Ordering::SeqCst), 0, "never reviewed");
    assert_eq!(lock(&cached.tokens).held(), (0, 0), "nothing kept");
}

#[tokio::test(start_paused = true)]
async fn distinct_tokens_stay_within_the_entry_and_byte_bounds() {
    let cached = Cached::new(Everyone::default());
    // 300 KB would be refused; the largest reviewed tokens, refused and accepted alike.
    let pad = "x".repeat(MAX_TOKEN_BYTES - 32);
    for i in 0..(3 * MAX_ENTRIES) {
        let token = if i % 2 == 0 {
            format!("user-{i}-{pad}")
        } else {
            format!("nobody-{i}-{pad}")
        };
        cached.authenticate(&token).await.unwrap();
        let (entries, bytes) = lock(&cached.tokens).held();
        assert!(entries <= MAX_ENTRIES, "{entries} entries");
        assert!(bytes <= MAX_BYTES, "{bytes} bytes");
    }
    // A key is a digest: what is kept does not grow with the token's length.
    let (entries, bytes) = lock(&cached.tokens).held();
    assert!(
        bytes / entries.max(1) < 200,
        "{bytes} bytes for {entries} entries"
    );
}

#[tokio::test(start_paused = true)]
async fn decisions_stay_within_their_bounds() {
    let cached = Cached::new(Everyone::default());
    let user = User {
        name: "alice".into(),
        groups: vec!["g".repeat(1000)],
        ..User::default()
    };
    for i in 0..(2 * MAX_ENTRIES) {
        let access = Access::path(&format!("/ui/{i}/{}", "p".repeat(500)), "get");
        assert!(cached.authorize(&user, &access).await.unwrap().allowed);
        let (entries, bytes) = lock(&cached.decisions).held();
        assert!(
            entries <= MAX_ENTRIES && bytes <= MAX_BYTES,
            "{entries} {bytes}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn an_answer_put_again_is_counted_once() {
    let cached = Cached::new(Everyone::default());
    cached.authenticate("user-1").await.unwrap();
    let once = lock(&cached.tokens).held();
    tokio::time::advance(TTL + Duration::from_millis(1)).await;
    cached.authenticate("user-1").await.unwrap();
    assert_eq!(lock(&cached.tokens).held(), once);
}
