//! Seeds for the randomised end-to-end tests: fixed by an environment variable to replay a
//! run, otherwise drawn fresh for each run, so every run (CI's included) tries interleavings
//! no earlier run tried. The seed is printed either way; `cargo test` shows it with a
//! failure's output.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::{SystemTime, UNIX_EPOCH};

/// The seed of one test's run: `var` when set (a test then replays that run), otherwise a
/// fresh one below 1,000,000 (short enough to copy from a log).
///
/// # Panics
/// When `var` is set to something other than a whole number: a replay that silently used
/// another seed would prove nothing.
pub fn for_run(var: &str, test: &str) -> u64 {
    let seed = match std::env::var(var) {
        Ok(value) => value
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{var}={value:?} is not a whole number")),
        Err(_) => fresh(),
    };
    eprintln!("{test}: seed {seed} (replay it with {var}={seed})");
    seed
}

fn fresh() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    hasher.write_u128(nanos);
    hasher.finish() % 1_000_000
}
