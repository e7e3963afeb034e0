//! Lists of candidate names recently read or answered, kept with their exact JSON bytes.
//! kube-scheduler sends filter the same candidates call after call (all its nodes, when
//! they all pass its own filters), and sends prioritize the names filter answered, in that
//! order, as gpuplace wrote them. A list whose bytes are those of a kept one is taken from
//! it (one comparison of the bytes) instead of being read name by name: the same bytes
//! decode to the same names, whatever they hold.

use std::sync::{Arc, Mutex, MutexGuard};

use super::super::names::Names;

/// The last list filter read, and the last one it answered.
#[derive(Default)]
pub struct RecentLists {
    read: Read,
    answered: Answered,
}

/// A list as a filter request carried it.
#[derive(Default)]
struct Read {
    json: Vec<u8>,
    names: Names,
}

/// The passing names of a filter answer, written as `json`.
#[derive(Default)]
struct Answered {
    json: Vec<u8>,
    picked: Picked,
}

/// Names a filter answer passed: positions `at` (in order) in `from`, its candidates.
/// Prioritize is told where its names stood in filter's list, so that it need not find
/// them again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Picked {
    pub from: Arc<Names>,
    pub at: Arc<[u32]>,
}

/// A list taken from a kept one.
pub(super) struct Found {
    pub names: Names,
    /// The bytes it took.
    pub used: usize,
    /// Where the names came from, when from a filter answer.
    pub picked: Option<Picked>,
}

/// Which verb decodes a request: only a filter's list is kept.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// Its list is kept for the next filter.
    Filter,
    /// Its list is only looked up (prioritize's names came from filter's answer).
    Prioritize,
}

pub(super) fn lock(lists: &Mutex<RecentLists>) -> MutexGuard<'_, RecentLists> {
    lists.lock().unwrap_or_else(|p| p.into_inner())
}

impl RecentLists {
    /// The names of the list at the start of `rest` when its bytes are those of a kept
    /// one.
    pub(super) fn find(&self, rest: &[u8]) -> Option<Found> {
        let read = &self.read.json;
        if !read.is_empty() && rest.starts_with(read) {
            return Some(Found {
                names: self.read.names.clone(),
                used: read.len(),
                picked: None,
            });
        }
        let answered = &self.answered;
        if !answered.json.is_empty() && rest.starts_with(&answered.json) {
            let picked = &answered.picked;
            return Some(Found {
                names: picked.from.picked(&picked.at)?,
                used: answered.json.len(),
                picked: Some(picked.clone()),
            });
        }
        None
    }

    /// Keeps a list a filter request carried: `json` its bytes, `names` as read (the
    /// buffers are reused).
    pub(super) fn read(&mut self, json: &[u8], names: &Names) {
        self.read.json.clear();
        self.read.json.extend_from_slice(json);
        self.read.names.clone_from(names);
    }

    /// Keeps the names a filter answer passed: `json` as written, positions `at` in `from`.
    pub(super) fn answered(&mut self, json: &[u8], from: Names, at: Vec<u32>) {
        self.answered.json.clear();
        self.answered.json.extend_from_slice(json);
        self.answered.picked = Picked {
            from: Arc::new(from),
            at: Arc::from(at),
        };
    }
}
