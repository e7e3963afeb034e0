//! The two large answers (`ExtenderFilterResult`, `HostPriorityList`) written straight to
//! bytes: thousands of entries per call, where serde_json's serializer took ~70 ns per
//! `{"Host": .., "Score": ..}` (measured at 5,000 nodes). Names without characters to
//! escape are copied as they are; any other string goes through serde_json.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use super::super::names::{needs_escape, runs};
use super::recent::{self, RecentLists};
use super::{FilterResult, Names, Priorities};

/// `s` as a JSON string.
fn string(out: &mut Vec<u8>, s: &str) {
    if needs_escape(s) {
        // Writing a str to a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, s);
    } else {
        quoted(out, s.as_bytes());
    }
}

/// `s`, known to need no escape, between quotes.
fn quoted(out: &mut Vec<u8>, s: &[u8]) {
    out.push(b'"');
    out.extend_from_slice(s);
    out.push(b'"');
}

/// The `i`th of `names` as a JSON string (copied as it stands, quotes and all, when no
/// name needs escaping).
fn name(out: &mut Vec<u8>, names: &Names, i: usize) {
    if names.escapes() {
        string(out, names.get(i));
    } else {
        out.extend_from_slice(names.json_run(i, i));
    }
}

fn integer(out: &mut Vec<u8>, n: i64) {
    match u8::try_from(n) {
        // Scores are 0-10: one or two digits written directly.
        Ok(d @ 0..=9) => out.push(b'0' + d),
        Ok(10) => out.extend_from_slice(b"10"),
        _ => {
            use std::io::Write as _;
            // Writing to a Vec cannot fail; no String is made.
            let _ = write!(out, "{n}");
        }
    }
}

/// A JSON list of the names at `at` (positions in `names`, each past the one before).
/// Without escapes, each run of consecutive positions is one copy: a filter usually passes
/// long runs of its candidates.
fn picked(out: &mut Vec<u8>, names: &Names, at: &[u32]) {
    out.push(b'[');
    if names.escapes() {
        for (k, &i) in at.iter().enumerate() {
            if k > 0 {
                out.push(b',');
            }
            name(out, names, i as usize);
        }
    } else {
        let mut wrote = false;
        for run in runs(at) {
            let run = names.json_run(run.first, run.last);
            if !run.is_empty() {
                if wrote {
                    out.push(b',');
                }
                out.extend_from_slice(run);
                wrote = true;
            }
        }
    }
    out.push(b']');
}

/// A JSON object name -> reason, in the order given. Thousands of nodes share a handful
/// of reasons (one `Arc` each): a reason is encoded once and copied while it repeats.
fn reasons(out: &mut Vec<u8>, names: &Names, list: &[(u32, Arc<str>)]) {
    out.push(b'{');
    let mut last: Option<&Arc<str>> = None;
    let mut encoded = Vec::new();
    for (k, (i, why)) in list.iter().enumerate() {
        if k > 0 {
            out.push(b',');
        }
        name(out, names, *i as usize);
        out.push(b':');
        if !last.is_some_and(|last| Arc::ptr_eq(last, why)) {
            encoded.clear();
            string(&mut encoded, why);
            last = Some(why);
        }
        out.extend_from_slice(&encoded);
    }
    out.push(b'}');
}

impl FilterResult {
    /// The answer's JSON (`Nodes`, `NodeNames`, `FailedNodes`,
    /// `FailedAndUnresolvableNodes`, `Error`).
    pub fn to_json(&self) -> Vec<u8> {
        self.encode().0
    }

    /// [`FilterResult::to_json`], with the passing names kept in `lists` for prioritize
    /// (kube-scheduler sends them back as written).
    pub fn into_json(self, lists: &Mutex<RecentLists>) -> Vec<u8> {
        let (bytes, span) = self.encode();
        if let (Some(span), Some(at)) = (span, self.passing)
            && let Some(json) = bytes.get(span)
        {
            recent::lock(lists).answered(json, self.names, at);
        }
        bytes
    }

    /// The answer's JSON, and where its list of passing names is in it.
    fn encode(&self) -> (Vec<u8>, Option<Range<usize>>) {
        let entries =
            self.passing.as_ref().map_or(0, Vec::len) + self.failed.len() + self.unresolvable.len();
        let mut out = Vec::with_capacity(128 + entries * 24);
        out.extend_from_slice(b"{\"Nodes\":");
        match &self.nodes {
            Some(nodes) => {
                let _ = serde_json::to_writer(&mut out, nodes);
            }
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"NodeNames\":");
        let start = out.len();
        let span = match &self.passing {
            Some(at) => {
                picked(&mut out, &self.names, at);
                Some(start..out.len())
            }
            None => {
                out.extend_from_slice(b"null");
                None
            }
        };
        out.extend_from_slice(b",\"FailedNodes\":");
        reasons(&mut out, &self.names, &self.failed);
        out.extend_from_slice(b",\"FailedAndUnresolvableNodes\":");
        reasons(&mut out, &self.names, &self.unresolvable);
        out.extend_from_slice(b",\"Error\":");
        string(&mut out, &self.error);
        out.push(b'}');
        (out, span)
    }
}

impl Priorities {
    /// The answer's JSON: `[{"Host": .., "Score": ..}, ..]` in the order given.
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(2 + self.scores.len() * 40);
        out.push(b'[');
        for (k, &score) in self.scores.iter().enumerate().take(self.names.len()) {
            out.extend_from_slice(if k > 0 { b",{\"Host\":" } else { b"{\"Host\":" });
            name(&mut out, &self.names, k);
            out.extend_from_slice(b",\"Score\":");
            integer(&mut out, score);
            out.push(b'}');
        }
        out.push(b']');
        out
    }
}
