//! Log setup shared by the long-running subcommands: RUST_LOG filters, text or JSON lines.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber (`info` unless RUST_LOG says otherwise). Colours only
/// when stderr is a terminal (and NO_COLOR is unset): log files and collectors get plain
/// text, or JSON lines with `json`.
pub fn init(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(use_colour(
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
            std::env::var_os("NO_COLOR").is_some(),
        ))
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// Colour escapes only for a terminal, and never when NO_COLOR is set.
fn use_colour(terminal: bool, no_colour: bool) -> bool {
    terminal && !no_colour
}

#[cfg(test)]
mod tests {
    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(super::use_colour(true, false));
        assert!(
            !super::use_colour(false, false),
            "a pipe or a file gets no escapes"
        );
        assert!(!super::use_colour(true, true));
    }
}
