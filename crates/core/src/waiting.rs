//! Why a pod waits, and until when: one structured record per pending pod (what blocks it,
//! its gang, its place in its queue and in the cluster's line, its queue's standing, what
//! would unblock it, when it is expected to start), computed in one place by the driver and
//! rendered with the blocker and the expected start *first*
//! (`blocked by: fragmentation | expected start: ... | <kube-scheduler's message> | ...`),
//! so that a note cut at 1 KiB keeps them; read back from that text by [`Waiting::parse`].
//!
//! - [`start`]: the expected start, by projecting the line forward over the running pods'
//!   expected ends (declared, else learnt from what ran before: [`history`]), as a range;
//! - [`told`]: how often the line is projected and what a pod is told from it.
//!
//! Pure: times are milliseconds since the epoch, passed in.

pub mod history;
pub mod start;
#[cfg(test)]
mod tests;
pub mod told;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use start::{Ahead, Ending, Span, project, project_line};

/// What a pod is short of when capacity blocks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Resource {
    Gpu,
    Cpu,
    Memory,
}

impl Resource {
    pub fn label(self) -> &'static str {
        match self {
            Resource::Gpu => "gpu",
            Resource::Cpu => "cpu",
            Resource::Memory => "memory",
        }
    }
}

/// What keeps a pod from starting now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blocker {
    /// Its queue (or an ancestor) is at its limit.
    QueueLimit,
    /// It would have fit when the round began: pods ahead of it in fair order took the room.
    Ahead,
    /// Not enough free on the nodes it may use: GPUs, or CPU or memory on the nodes that
    /// have its GPUs free.
    Capacity(Resource),
    /// Enough free GPUs in total, none of its shape on one node or link group.
    Fragmentation,
    /// Its own requirements (model, memory, selectors, NVLink...): the nodes each rules out
    /// are in kube-scheduler's message.
    Constraints,
    /// Its DRA claims' selectors: no node whose GPUs match them (the nodes each rules out
    /// are in kube-scheduler's message).
    ClaimSelectors,
    /// Its gang is not all there, or is being placed.
    Gang,
    /// Its queue does not exist or serves no pod.
    Queue,
    /// A moved pod's replacement waits for the place its move planned for it (held for it
    /// while the pods there leave), not placed elsewhere meanwhile.
    PlannedPlace,
}

impl Blocker {
    pub const ALL: [Blocker; 11] = [
        Blocker::QueueLimit,
        Blocker::Ahead,
        Blocker::Capacity(Resource::Gpu),
        Blocker::Capacity(Resource::Cpu),
        Blocker::Capacity(Resource::Memory),
        Blocker::Fragmentation,
        Blocker::Constraints,
        Blocker::ClaimSelectors,
        Blocker::Gang,
        Blocker::Queue,
        Blocker::PlannedPlace,
    ];

    /// As written after `blocked by: `.
    pub fn label(&self) -> &'static str {
        match self {
            Blocker::QueueLimit => "queue limit",
            Blocker::Ahead => "others ahead in fair share",
            Blocker::Capacity(Resource::Gpu) => "capacity (gpu)",
            Blocker::Capacity(Resource::Cpu) => "capacity (cpu)",
            Blocker::Capacity(Resource::Memory) => "capacity (memory)",
            Blocker::Fragmentation => "fragmentation",
            Blocker::Constraints => "its own constraints",
            Blocker::ClaimSelectors => "claim selectors",
            Blocker::Gang => "gang",
            Blocker::Queue => "queue",
            Blocker::PlannedPlace => "its planned place",
        }
    }

    /// Whether what blocks it is room (so an expected start can be told).
    pub fn waits_for_room(&self) -> bool {
        matches!(
            self,
            Blocker::Ahead | Blocker::Capacity(_) | Blocker::Fragmentation
        )
    }
}

impl Serialize for Blocker {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.label())
    }
}

impl<'de> Deserialize<'de> for Blocker {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let label = String::deserialize(d)?;
        Blocker::ALL
            .into_iter()
            .find(|b| b.label() == label)
            .ok_or_else(|| serde::de::Error::custom(format!("no blocker is called {label:?}")))
    }
}

/// What a pod is short of when its GPUs would fit but nothing else does, read from the
/// nodes' first reasons: CPU or memory when some node that may take it lacks them (the
/// larger count; CPU on a tie), else `None` (its constraints rule the nodes out).
pub fn short_of(why: &crate::fit::Unschedulable) -> Option<Resource> {
    use crate::fit::FitFailure;
    let (cpu, memory) = (
        why.count(FitFailure::InsufficientCpu),
        why.count(FitFailure::InsufficientMemory),
    );
    match (cpu, memory) {
        (0, 0) => None,
        (c, m) if c >= m => Some(Resource::Cpu),
        _ => Some(Resource::Memory),
    }
}

/// A 1-based place among `of`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Place {
    pub at: usize,
    pub of: usize,
}

/// Where a pod stands in the line of every waiting unit (not only those tried this round).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    /// In the cluster's line: priority, then age.
    pub in_cluster: Place,
    /// In its queue's line; `None` without queues.
    pub in_queue: Option<Place>,
}

/// Its queue's standing, in GPUs as people read them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueStanding {
    pub name: String,
    pub allocated: String,
    pub fair_share: String,
    pub guaranteed: String,
    pub limit: String,
    /// The decayed mean and the half-life, with usage over time.
    pub decayed: Option<(String, String)>,
}

/// The gang a pod waits with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GangStanding {
    /// `namespace/name` of its PodGroup.
    pub name: String,
    /// Members waiting (this unit), and the gang's minMember.
    pub waiting: u32,
    pub min_member: u32,
    /// Members that fit at once in the best trial (`None`: not tried, e.g. its queue's
    /// limit held it back first).
    pub fit: Option<u32>,
}

/// When the pod is expected to start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Start {
    /// Likely at `at_ms`, between `earliest_ms` and `latest_ms` (ms since the epoch).
    At(Span),
    /// Nothing known frees a place of its shape, or too much is ahead to tell.
    Unknown,
}

/// Why one pod waits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiting {
    pub blocker: Blocker,
    pub gang: Option<GangStanding>,
    pub position: Option<Position>,
    pub queue: Option<QueueStanding>,
    /// What would unblock it (a plan pending or not carried out, and why).
    pub unblock: Option<String>,
    pub start: Option<Start>,
}

/// `in 25m`, `in 2h10m`, `now`.
fn show_in(ms: i64) -> String {
    let s = (ms.max(0) + 999) / 1000;
    if s == 0 {
        return "now".into();
    }
    format!("in {}", show_span(s))
}

/// `45s`, `25m`, `2h10m`.
fn show_span(s: i64) -> String {
    if s < 60 {
        return format!("{s}s");
    }
    let (h, m) = (s / 3600, s % 3600 / 60);
    match (h, m) {
        (0, m) => format!("{m}m"),
        (h, 0) => format!("{h}h"),
        (h, m) => format!("{h}h{m}m"),
    }
}

/// RFC 3339 UTC (seconds) of `ms`, as the callers format it.
pub type TimeFormat<'a> = &'a dyn Fn(i64) -> String;

impl Waiting {
    /// A waiting record with only its blocker known.
    pub fn blocked(blocker: Blocker) -> Waiting {
        Waiting {
            blocker,
            gang: None,
            position: None,
            queue: None,
            unblock: None,
            start: None,
        }
    }

    /// The whole message: the blocker and the expected start first, then kube-scheduler's
    /// `message`, then the gang, the position, the queue's standing and the plan.
    pub fn render(&self, message: &str, now_ms: i64, time: TimeFormat<'_>) -> String {
        let mut out = format!("blocked by: {}", self.blocker.label());
        match &self.start {
            Some(Start::At(span)) => {
                out.push_str(&format!(
                    " | expected start: {} ({}",
                    time(span.at_ms),
                    show_in(span.at_ms - now_ms)
                ));
                if span.latest_ms > span.earliest_ms {
                    out.push_str(&format!(
                        "; {} to {}",
                        show_in(span.earliest_ms - now_ms).trim_start_matches("in "),
                        show_in(span.latest_ms - now_ms).trim_start_matches("in ")
                    ));
                }
                out.push(')');
            }
            Some(Start::Unknown) => out.push_str(" | expected start: unknown"),
            None => {}
        }
        let message = message.trim();
        if !message.is_empty() {
            out.push_str(" | ");
            out.push_str(message);
        }
        if let Some(g) = &self.gang {
            out.push_str(&format!(
                " | gang: {}, {} member(s) waiting of {} needed",
                g.name, g.waiting, g.min_member
            ));
            if let Some(fit) = g.fit {
                out.push_str(&format!(", {fit} fit at once"));
            }
        }
        if let Some(p) = &self.position {
            out.push_str(&format!(
                " | position: {} of {} in the cluster",
                p.in_cluster.at, p.in_cluster.of
            ));
            if let (Some(inq), Some(q)) = (p.in_queue, &self.queue) {
                out.push_str(&format!(", {} of {} in queue {}", inq.at, inq.of, q.name));
            }
        }
        if let Some(q) = &self.queue {
            out.push_str(&format!(
                " | queue {}: allocated {}, fair share {}, guarantee {}, limit {}",
                q.name, q.allocated, q.fair_share, q.guaranteed, q.limit
            ));
            if let Some((mean, h)) = &q.decayed {
                out.push_str(&format!(", decayed use {mean} (half-life {h})"));
            }
            out.push_str(" GPUs");
        }
        if let Some(u) = &self.unblock {
            out.push_str(&format!(" | unblocked by: {u}"));
        }
        out
    }
}

/// A message read back: kube-scheduler's part and each segment.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Parsed {
    pub message: String,
    /// `blocked by` as its label says it.
    pub blocked_by: Option<String>,
    pub gang: Option<String>,
    pub position: Option<String>,
    /// `queue <name>: ...`.
    pub queue: Option<String>,
    pub unblocked_by: Option<String>,
    pub expected_start: Option<String>,
}

impl Waiting {
    /// Reads a message [`Waiting::render`] wrote (segments in any order, so messages of
    /// earlier versions, which put them after kube-scheduler's part, read too); any other
    /// message is all kube-scheduler's part.
    pub fn parse(text: &str) -> Parsed {
        let mut out = Parsed::default();
        let mut message: Vec<&str> = Vec::new();
        for part in text.split(" | ") {
            let value = |key: &str| part.strip_prefix(key).map(str::to_string);
            if let Some(v) = value("blocked by: ") {
                out.blocked_by = Some(v);
            } else if let Some(v) = value("expected start: ") {
                out.expected_start = Some(v);
            } else if let Some(v) = value("gang: ") {
                out.gang = Some(v);
            } else if let Some(v) = value("position: ") {
                out.position = Some(v);
            } else if let Some(v) = value("unblocked by: ") {
                out.unblocked_by = Some(v);
            } else if part.starts_with("queue ") && part.contains(": allocated ") {
                out.queue = Some(part.to_string());
            } else {
                message.push(part);
            }
        }
        out.message = message.join(" | ");
        out
    }

    /// What a message means, for deciding whether it is worth a write to the API: its
    /// kube-scheduler part, its blocker, its gang and what would unblock it, with every
    /// number made `#` (free GPU counts, node counts, "looks again in 55 s" move from
    /// attempt to attempt); its position, its queue's standing and its expected start left
    /// out (they are served on demand). Two messages of the same meaning are one Event and
    /// one condition; names (`node-7`) are kept.
    pub fn meaning(text: &str) -> String {
        let parsed = Waiting::parse(text);
        let mut out = numbers_hidden(&parsed.message);
        for (key, value) in [
            ("blocked by", &parsed.blocked_by),
            ("gang", &parsed.gang),
            ("unblocked by", &parsed.unblocked_by),
        ] {
            if let Some(v) = value {
                out.push_str(&format!(" | {key}: {}", numbers_hidden(v)));
            }
        }
        out
    }
}

/// `text` with every number that stands alone (not part of a name such as `n1` or
/// `gpu-0`'s `0` after a dash is kept as part of the name) written `#`.
fn numbers_hidden(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let starts_alone = c.is_ascii_digit()
            && i.checked_sub(1)
                .and_then(|j| chars.get(j))
                .is_none_or(|p| !p.is_alphanumeric() && *p != '-' && *p != '_');
        if !starts_alone {
            out.push(c);
            i += 1;
            continue;
        }
        let mut j = i;
        while j < chars.len() && (chars[j].is_ascii_digit() || chars[j] == '.' || chars[j] == ',') {
            j += 1;
        }
        // A number glued to letters after it (`2x`, `8GB`) is part of a name: kept.
        if chars
            .get(j)
            .is_some_and(|n| n.is_alphabetic() || *n == '-' || *n == '_')
        {
            out.extend(&chars[i..j]);
        } else {
            // A trailing '.' or ',' ends the sentence, not the number.
            let mut end = j;
            while end > i && matches!(chars[end - 1], '.' | ',') {
                end -= 1;
            }
            out.push('#');
            out.extend(&chars[end..j]);
        }
        i = j;
    }
    out
}
