//! Log setup shared by the long-running subcommands: RUST_LOG filters, text or JSON lines.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber (`info` unless RUST_LOG says otherwise).
pub fn init(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
