//! Lists of candidate names recently read or answered, kept with their exact JSON bytes.
//! kube-scheduler sends filter the same candidates call after call (all its nodes, when
//! they all pass its own filters), and sends prioritize the names filter answered, in that
//! order, as gpuplace wrote them. A list whose bytes are those of a kept one is taken from
//! it (one comparison of the bytes) instead of being read name by name: the same bytes
//! decode to the same names, whatever they hold.

use std::sync::{Mutex, MutexGuard};

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

/// The passing names of a filter answer: positions `at` in `from` (the answer's
/// candidates), written as `json`.
#[derive(Default)]
struct Answered {
    json: Vec<u8>,
    from: Names,
    at: Vec<u32>,
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
    /// one, and how many bytes it takes.
    pub(super) fn find(&self, rest: &[u8]) -> Option<(Names, usize)> {
        let read = &self.read.json;
        if !read.is_empty() && rest.starts_with(read) {
            return Some((self.read.names.clone(), read.len()));
        }
        let answered = &self.answered;
        if !answered.json.is_empty() && rest.starts_with(&answered.json) {
            return Some((answered.from.picked(&answered.at)?, answered.json.len()));
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
        self.answered.from = from;
        self.answered.at = at;
    }
}
