//! Defragmentation's settings and their defaults: one type for the scheduler (`gpuplace
//! scheduler --defrag*`, `gpuplace defrag --plan`) and the simulator's timeline replay, so
//! the two cannot drift apart.

use std::time::Duration;

/// Which defragmentation runs (`--defrag`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    Off,
    /// Move pods that opted in when a pod fits nowhere and preemption cannot help.
    #[default]
    MakeRoom,
    /// Move pods in the background to lower fragmentation.
    Rebalance,
    /// Both.
    All,
}

impl Mode {
    pub fn makes_room(self) -> bool {
        matches!(self, Mode::MakeRoom | Mode::All)
    }

    pub fn rebalances(self) -> bool {
        matches!(self, Mode::Rebalance | Mode::All)
    }
}

/// A `--defrag` value that is none of the modes.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("--defrag must be off, make-room, rebalance or all, got {0:?}")]
pub struct UnknownMode(pub String);

impl std::str::FromStr for Mode {
    type Err = UnknownMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "off" => Ok(Mode::Off),
            "make-room" => Ok(Mode::MakeRoom),
            "rebalance" => Ok(Mode::Rebalance),
            // `both` is taken as well: the simulator once named it so.
            "all" | "both" => Ok(Mode::All),
            other => Err(UnknownMode(other.to_string())),
        }
    }
}

/// The longest `--defrag-min-age` (30 days).
pub const MAX_MIN_AGE: Duration = Duration::from_secs(30 * 24 * 3600);

/// A rebalancing move must lower fragmentation by at least a GPU (milli-GPU): moves for
/// less cost more work than they save (measured: docs/defrag.md).
pub const REBALANCE_MIN_GAIN_MILLI: f64 = 1000.0;

/// A pod whose controller had a pod moved by rebalancing within this long is not moved
/// again, so no move is undone.
pub const REBALANCE_COOLDOWN: Duration = Duration::from_secs(3600);

/// How much one plan may move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Pods moved at most.
    pub max_pods: usize,
    /// Milli-GPU moved at most.
    pub max_milli: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_pods: 8,
            max_milli: u64::MAX,
        }
    }
}

/// What defragmentation may do.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Settings {
    pub mode: Mode,
    /// A pod moves only after running this long (`--defrag-min-age`).
    pub min_age: Duration,
    /// Pods one plan may move, and rebalancing moves in flight at most
    /// (`--defrag-max-moves`).
    pub max_moves: usize,
    /// GPUs rebalancing may move per hour (`--defrag-budget`).
    pub budget_gpus_per_hour: f64,
    /// How often rebalancing looks at the fleet.
    pub rebalance_every: Duration,
    /// Rebalancing runs while the fleet's fragmentation is above this share of its GPUs
    /// (FGD's measure) and some pod waits.
    pub rebalance_threshold: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            mode: Mode::Off,
            min_age: Duration::from_secs(300),
            max_moves: 4,
            budget_gpus_per_hour: 16.0,
            rebalance_every: Duration::from_secs(60),
            rebalance_threshold: 0.02,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_read_as_the_flags_write_them() {
        assert_eq!("all".parse::<Mode>(), Ok(Mode::All));
        assert_eq!(" both ".parse::<Mode>(), Ok(Mode::All));
        assert_eq!(
            "sometimes".parse::<Mode>().unwrap_err().to_string(),
            "--defrag must be off, make-room, rebalance or all, got \"sometimes\""
        );
        assert!(Mode::All.makes_room() && Mode::All.rebalances());
        assert!(!Mode::Off.makes_room() && !Mode::MakeRoom.rebalances());
    }
}
