//! Queues that share the cluster: a tree of queues with guarantees, limits and weights,
//! their fair shares (hierarchical, per resource), the order in which their pending work is
//! served (hierarchical dominant resource fairness) and which pods reclaim may take back.
//!
//! Pure: the caller says what each queue holds and asks for; nothing here reads a clock or
//! a cluster. The scheduler, the extender (limits only) and the simulator's timeline replay
//! all use this one implementation.
//!
//! Resources are GPU (milli-GPU: a whole GPU is 1000, a share its part), CPU (milli-CPU)
//! and memory (MiB), plus optional per-GPU-model amounts (milli-GPU on GPUs of that model).

mod amounts;
mod pick;
mod reclaim;
mod res;
mod shares;
mod tree;
mod usage;

pub use amounts::{AmountError, AmountRules, read_bounds};
pub use pick::{LimitHit, Picker};
pub use reclaim::{Entitlement, Loss};
pub use res::{DIM_NAMES, DIMS, Res, show_amount};
pub use shares::{fair_shares, fair_shares_of};
pub use tree::{Bounds, DEFAULT_QUEUE, QueueNode, QueueProblem, QueueSpec, QueueTree, ROOT};
pub use usage::{HalfLifeError, Ledger, MAX_HALF_LIFE_MS, Usage, parse_half_life, show_half_life};
