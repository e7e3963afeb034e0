//! Why a pod waits, and until when: one structured reason per pending pod (what blocks it,
//! its place in its queue and in the cluster's order, its queue's standing, what would
//! unblock it, when it is expected to start), written as segments after kube-scheduler's
//! own message (`<message> | blocked by: fragmentation | position: ... | ...`) so that the
//! Event, the pod's condition, `gpuplace status` and the live map all say the same, and
//! read back from that text by [`Waiting::parse`].
//!
//! The expected start ([`expected_start`]) is the earliest time, by the running pods that
//! declare their end, at which a node or block of the pod's shape frees: their GPUs given
//! back one by one in order of their ends on a copy of the cluster, until the pod fits.
//!
//! Pure: times are milliseconds since the epoch, passed in.

use gpuplace_model::Request;

use crate::state::ClusterState;

/// What keeps a pod from starting now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blocker {
    /// Its queue (or an ancestor) is at its limit.
    QueueLimit,
    /// It would have fit when the round began: pods ahead of it in fair order took the room.
    Ahead,
    /// Not enough free GPUs on the nodes it may use.
    Capacity,
    /// Enough free GPUs in total, none of its shape on one node or link group.
    Fragmentation,
    /// Its own requirements (model, memory, selectors, NVLink...): the nodes each rules out
    /// are in kube-scheduler's message.
    Constraints,
    /// Its gang does not fit whole (or is not all there).
    Gang,
    /// Its queue does not exist or serves no pod.
    Queue,
}

impl Blocker {
    pub const ALL: [Blocker; 7] = [
        Blocker::QueueLimit,
        Blocker::Ahead,
        Blocker::Capacity,
        Blocker::Fragmentation,
        Blocker::Constraints,
        Blocker::Gang,
        Blocker::Queue,
    ];

    /// As written after `blocked by: `.
    pub fn label(&self) -> &'static str {
        match self {
            Blocker::QueueLimit => "queue limit",
            Blocker::Ahead => "others ahead in fair share",
            Blocker::Capacity => "capacity",
            Blocker::Fragmentation => "fragmentation",
            Blocker::Constraints => "its own constraints",
            Blocker::Gang => "gang",
            Blocker::Queue => "queue",
        }
    }
}

/// Where a pod stands in the order of its round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Position {
    /// 1-based, of `of` units served in the round.
    pub in_cluster: usize,
    pub of_cluster: usize,
    /// 1-based in its queue, of `of_queue` units of its queue; `None` without queues.
    pub in_queue: Option<(usize, usize)>,
}

/// Its queue's standing, in GPUs as people read them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueStanding {
    pub name: String,
    pub allocated: String,
    pub fair_share: String,
    pub guaranteed: String,
    pub limit: String,
    /// The decayed mean and the half-life, with usage over time.
    pub decayed: Option<(String, String)>,
}

/// When the pod is expected to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Start {
    /// At this time (ms since the epoch), by the declared ends of running pods.
    At(i64),
    /// No running pod that declares its end frees a place of its shape.
    Unknown,
}

/// Why one pod waits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub blocker: Blocker,
    pub position: Option<Position>,
    pub queue: Option<QueueStanding>,
    /// What would unblock it (a plan pending or not carried out, and why).
    pub unblock: Option<String>,
    pub start: Option<Start>,
}

/// A running pod that declares its end: where it is and when it ends.
#[derive(Clone, Debug)]
pub struct Ending<'a> {
    pub node: usize,
    pub request: &'a Request,
    pub gpus: &'a [(usize, u32)],
    pub end_ms: i64,
}

/// The earliest end among `endings` after which `request` fits on a node of `allowed` (all
/// when `None`) of `state`, the pods' places given back in order of their ends (`now_ms`
/// when it fits already: the pod waits for something else).
pub fn expected_start(
    state: &ClusterState,
    request: &Request,
    allowed: Option<&[bool]>,
    endings: &[Ending<'_>],
    now_ms: i64,
) -> Start {
    let fits = |s: &ClusterState| {
        (0..s.len()).any(|n| {
            allowed.is_none_or(|m| m.get(n).copied().unwrap_or(false)) && s.fit(n, request).is_ok()
        })
    };
    if fits(state) {
        return Start::At(now_ms);
    }
    let mut order: Vec<&Ending<'_>> = endings.iter().collect();
    order.sort_by_key(|e| e.end_ms);
    let mut copy = state.clone();
    for e in order {
        if copy.release(e.node, e.request, e.gpus).is_err() {
            continue;
        }
        if allowed.is_none_or(|m| m.get(e.node).copied().unwrap_or(false))
            && copy.fit(e.node, request).is_ok()
        {
            return Start::At(e.end_ms.max(now_ms));
        }
    }
    Start::Unknown
}

/// `in 25m`, `in 2h10m`, `now`.
fn show_in(ms: i64) -> String {
    let s = (ms.max(0) + 999) / 1000;
    if s < 60 {
        return if s == 0 {
            "now".into()
        } else {
            format!("in {s}s")
        };
    }
    let (h, m) = (s / 3600, s % 3600 / 60);
    match (h, m) {
        (0, m) => format!("in {m}m"),
        (h, 0) => format!("in {h}h"),
        (h, m) => format!("in {h}h{m}m"),
    }
}

/// RFC 3339 UTC (seconds) of `ms`, as the callers format it (`fmt`).
pub type TimeFormat<'a> = &'a dyn Fn(i64) -> String;

impl Waiting {
    /// The segments written after kube-scheduler's message (each ` | key: value`).
    pub fn segments(&self, now_ms: i64, time: TimeFormat<'_>) -> String {
        let mut out = format!(" | blocked by: {}", self.blocker.label());
        if let Some(p) = &self.position {
            out.push_str(&format!(
                " | position: {} of {} in the cluster",
                p.in_cluster, p.of_cluster
            ));
            if let (Some((i, of)), Some(q)) = (p.in_queue, &self.queue) {
                out.push_str(&format!(", {i} of {of} in queue {}", q.name));
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
        match &self.start {
            Some(Start::At(ms)) => out.push_str(&format!(
                " | expected start: {} ({})",
                time(*ms),
                show_in(ms - now_ms)
            )),
            Some(Start::Unknown) => out.push_str(
                " | expected start: unknown (no running pod that declares its end frees a place of its shape)",
            ),
            None => {}
        }
        out
    }
}

/// A message read back: kube-scheduler's part and each segment (`key`, `value`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Parsed {
    pub message: String,
    /// `blocked by` as its label says it.
    pub blocked_by: Option<String>,
    pub position: Option<String>,
    /// `queue <name>: ...`.
    pub queue: Option<String>,
    pub unblocked_by: Option<String>,
    pub expected_start: Option<String>,
}

impl Waiting {
    /// Reads a message [`Waiting::segments`] ended (any other message: all of it is
    /// kube-scheduler's part).
    pub fn parse(text: &str) -> Parsed {
        let mut parts = text.split(" | ");
        let mut out = Parsed {
            message: parts.next().unwrap_or_default().to_string(),
            ..Parsed::default()
        };
        for part in parts {
            let Some((key, value)) = part.split_once(": ") else {
                continue;
            };
            let value = value.to_string();
            match key {
                "blocked by" => out.blocked_by = Some(value),
                "position" => out.position = Some(value),
                "unblocked by" => out.unblocked_by = Some(value),
                "expected start" => out.expected_start = Some(value),
                k if k.starts_with("queue ") => out.queue = Some(format!("{k}: {value}")),
                _ => {}
            }
        }
        out
    }

    /// What a message means, for deciding whether it is worth a write to the API: its
    /// kube-scheduler part, its blocker and what would unblock it, with every number made
    /// `#` (free GPU counts, node counts, "looks again in 55 s" move from attempt to
    /// attempt); its position, its queue's standing and its expected start left out (they
    /// are served on demand). Two messages of the same meaning are one Event and one
    /// condition; names (`node-7`) are kept.
    pub fn meaning(text: &str) -> String {
        let parsed = Waiting::parse(text);
        let mut out = numbers_hidden(&parsed.message);
        for (key, value) in [
            ("blocked by", &parsed.blocked_by),
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

#[cfg(test)]
mod tests {
    use super::*;
    use gpuplace_model::NodeInventory;

    fn gpus(n: u32) -> Request {
        Request {
            cpu_milli: 1000,
            memory_mib: 1024,
            gpu_count: n,
            gpu_milli: 1000,
            allowed_models: Vec::new(),
            need: Default::default(),
        }
    }

    #[test]
    fn segments_read_back_as_written() {
        let w = Waiting {
            blocker: Blocker::Fragmentation,
            position: Some(Position {
                in_cluster: 3,
                of_cluster: 9,
                in_queue: Some((2, 4)),
            }),
            queue: Some(QueueStanding {
                name: "team-a".into(),
                allocated: "8".into(),
                fair_share: "8".into(),
                guaranteed: "4".into(),
                limit: "none".into(),
                decayed: Some(("7.5".into(), "1h".into())),
            }),
            unblock: Some("make-room: no pod that opted in to moving frees a block of 4".into()),
            start: Some(Start::At(1_500_000)),
        };
        let time = |ms: i64| format!("t{ms}");
        let text = format!(
            "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.{}",
            w.segments(0, &time)
        );
        assert_eq!(
            text,
            "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. | blocked by: fragmentation | position: 3 of 9 in the cluster, 2 of 4 in queue team-a | queue team-a: allocated 8, fair share 8, guarantee 4, limit none, decayed use 7.5 (half-life 1h) GPUs | unblocked by: make-room: no pod that opted in to moving frees a block of 4 | expected start: t1500000 (in 25m)"
        );
        let p = Waiting::parse(&text);
        assert_eq!(
            p.message,
            "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
        );
        assert_eq!(p.blocked_by.as_deref(), Some("fragmentation"));
        assert_eq!(
            p.position.as_deref(),
            Some("3 of 9 in the cluster, 2 of 4 in queue team-a")
        );
        assert!(p.queue.unwrap().starts_with("queue team-a: allocated 8"));
        assert_eq!(p.expected_start.as_deref(), Some("t1500000 (in 25m)"));
        assert_eq!(Waiting::parse("plain").message, "plain");
        for b in Blocker::ALL {
            assert!(!b.label().contains(" | "));
        }
    }

    #[test]
    fn the_expected_start_is_the_first_end_that_frees_a_place_of_its_shape() {
        // Two 4-GPU nodes, each half held by two 1-GPU pods (ends 10, 40 on a; 20, 30 on
        // b): a 4-GPU pod starts when one node is whole again, at 30 (b's last), not 10.
        let mut state = ClusterState::new(vec![
            NodeInventory::uniform("a", 64_000, 1 << 20, 4, "A100"),
            NodeInventory::uniform("b", 64_000, 1 << 20, 4, "A100"),
        ])
        .unwrap();
        let one = gpus(1);
        let places = [(0, 0usize, 10), (0, 1, 40), (1, 0, 20), (1, 1, 30)];
        let gpu_sets: Vec<Vec<(usize, u32)>> =
            places.iter().map(|&(_, g, _)| vec![(g, 1000)]).collect();
        for (&(n, _, _), g) in places.iter().zip(&gpu_sets) {
            state.apply(n, &one, g).unwrap();
        }
        let endings: Vec<Ending<'_>> = places
            .iter()
            .zip(&gpu_sets)
            .map(|(&(node, _, end), g)| Ending {
                node,
                request: &one,
                gpus: g,
                end_ms: end,
            })
            .collect();
        assert_eq!(
            expected_start(&state, &gpus(4), None, &endings, 0),
            Start::At(30)
        );
        // Only node a allowed: at 40.
        assert_eq!(
            expected_start(&state, &gpus(4), Some(&[true, false]), &endings, 0),
            Start::At(40)
        );
        // Fits now: now.
        assert_eq!(
            expected_start(&state, &gpus(2), None, &endings, 5),
            Start::At(5)
        );
        // Nothing declares an end: unknown.
        assert_eq!(
            expected_start(&state, &gpus(4), None, &[], 0),
            Start::Unknown
        );
        // Eight GPUs never fit on four-GPU nodes.
        assert_eq!(
            expected_start(&state, &gpus(8), None, &endings, 0),
            Start::Unknown
        );
    }

    #[test]
    fn a_meaning_leaves_out_what_moves_from_attempt_to_attempt() {
        let a = "0/12 nodes are available: 12 Insufficient nvidia.com/gpu. Fragmentation: 13 GPU(s) with room for it free across 2 of the 2 node(s) it may use; the largest block is 7 on node n2. defragmentation: no pods that may move made room for a pod like this one; it looks again in 55 s. | blocked by: fragmentation | position: 3 of 9 in the cluster, 2 of 4 in queue team-a | queue team-a: allocated 8, fair share 8, guarantee 4, limit none, decayed use 7.5 (half-life 1h) GPUs | unblocked by: nothing found: no pods that may move make room for its shape; make-room looks again in 55 s | expected start: 2026-12-04T01:00:00Z (in 29m)";
        let b = a
            .replace("13 GPU(s)", "11 GPU(s)")
            .replace("again in 55 s", "again in 50 s")
            .replace("3 of 9", "1 of 1")
            .replace("decayed use 7.5", "decayed use 7.499")
            .replace("in 29m", "in 28m");
        assert_eq!(Waiting::meaning(a), Waiting::meaning(&b));
        assert!(Waiting::meaning(a).contains("largest block is # on node n2"));
        // Another blocker, plan or node is another meaning.
        for other in [
            a.replace("blocked by: fragmentation", "blocked by: capacity"),
            a.replace(
                "unblocked by: nothing found",
                "unblocked by: make-room under way",
            ),
            a.replace("on node n2", "on node n3"),
        ] {
            assert_ne!(Waiting::meaning(a), Waiting::meaning(&other), "{other}");
        }
    }
}
