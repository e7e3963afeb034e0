//! The fake server's clock (`gpuplace_testkit::clock`): stamps follow tokio's clock.

use std::time::Duration;

use gpuplace_testkit::clock::server_time;
use k8s_openapi::jiff::Timestamp;

#[tokio::test(start_paused = true)]
async fn stamps_follow_paused_time() {
    let before = server_time();
    tokio::time::sleep(Duration::from_secs(3600)).await;
    let after = server_time();
    let apart = after.as_second() - before.as_second();
    assert!((3599..=3601).contains(&apart), "{apart}");
}

#[test]
fn outside_a_runtime_it_is_the_wall_clock() {
    let apart = (server_time().as_millisecond() - Timestamp::now().as_millisecond()).abs();
    assert!(apart < 1_000, "{apart}");
}

/// A library built with `test = false` never compiles its `#[cfg(test)]` code: such tests
/// would never run (the testkit's clock tests sat there unseen). Every workspace crate's
/// manifest is read; one whose lib has `test = false` must hold no `#[cfg(test)]` code.
#[test]
fn no_crate_that_is_not_unit_tested_holds_unit_tests() {
    let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = 0;
    for entry in std::fs::read_dir(&crates).expect("crates/") {
        let dir = entry.expect("entry").path();
        let Ok(manifest) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        let lib = manifest.split("[lib]").nth(1).unwrap_or_default();
        let lib = lib.split("\n[").next().unwrap_or_default();
        if !lib.lines().any(|l| l.replace(' ', "") == "test=false") {
            continue;
        }
        checked += 1;
        let mut stack = vec![dir.join("src")];
        while let Some(d) = stack.pop() {
            for f in std::fs::read_dir(&d).expect("src dir") {
                let path = f.expect("entry").path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).expect("source");
                    assert!(
                        !text.contains("#[cfg(test)]"),
                        "{} has #[cfg(test)] code, but its crate's lib is `test = false`: move the tests to tests/",
                        path.display()
                    );
                }
            }
        }
    }
    assert!(checked >= 1, "the testkit itself is `test = false`");
}
