//! Process signals shared by the long-running subcommands.

use std::future::Future;

use tracing::info;

/// Completes on SIGTERM or SIGINT. The handlers are installed when this is called (inside
/// the runtime), not when the future is first polled, so a signal that arrives while start-up
/// is still under way is not lost to the default action.
pub fn shutdown() -> impl Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let interrupt = signal(SignalKind::interrupt());
    async move {
        match (term, interrupt) {
            (Ok(mut term), Ok(mut interrupt)) => tokio::select! {
                _ = term.recv() => info!("SIGTERM"),
                _ = interrupt.recv() => info!("SIGINT"),
            },
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}
