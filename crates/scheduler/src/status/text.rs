//! `gpuplace status` as plain text: one line per node with a character per GPU, then the
//! pending pods with their reasons and the gangs. Readable without colour; colour (ANSI)
//! only when asked for (a terminal).

use std::fmt::Write;

use super::{FleetStatus, GpuStatus, NodeStatus, gpus_text};

/// How to render.
#[derive(Clone, Copy, Debug, Default)]
pub struct Style {
    /// Every GPU's holders and NVLink groups, reasons unshortened.
    pub wide: bool,
    /// ANSI colours.
    pub colour: bool,
    /// Columns available (lines are cut to it unless wide); 0: no limit.
    pub width: usize,
}

/// `#` a GPU held whole, `1`-`9` tenths held of a shared GPU, `.` free, `x` unhealthy.
pub const LEGEND: &str = "GPUs: # in use, 1-9 tenths in use (shares), . free, x unhealthy";

/// One character for a GPU's use.
pub fn cell(g: &GpuStatus) -> char {
    if !g.healthy {
        return 'x';
    }
    if g.used_milli == 0 {
        return '.';
    }
    if g.used_milli >= g.capacity_milli {
        return '#';
    }
    let tenths = (u64::from(g.used_milli) * 10).div_ceil(u64::from(g.capacity_milli.max(1)));
    char::from_digit(tenths.clamp(1, 9) as u32, 10).unwrap_or('#')
}

fn paint(c: char, colour: bool) -> String {
    if !colour {
        return c.to_string();
    }
    let code = match c {
        '#' => "31",
        '.' => "32",
        'x' => "35",
        _ => "33",
    };
    format!("\x1b[{code}m{c}\x1b[0m")
}

fn cut(line: &str, width: usize) -> String {
    if width == 0 || line.chars().count() <= width {
        return line.to_string();
    }
    let mut out: String = line.chars().take(width.saturating_sub(3)).collect();
    out.push_str("...");
    out
}

/// The whole status.
pub fn render(status: &FleetStatus, style: Style) -> String {
    let mut out = String::new();
    summary(&mut out, status);
    nodes(&mut out, &status.nodes, style);
    pending(&mut out, status);
    groups(&mut out, status);
    super::queues::render(&mut out, &status.queues);
    for w in &status.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    if style.wide || style.colour || style.width == 0 {
        return out;
    }
    out.lines().map(|l| cut(l, style.width) + "\n").collect()
}

fn summary(out: &mut String, status: &FleetStatus) {
    let t = &status.totals;
    let fit = &t.largest_fit;
    let largest = match (&fit.node, fit.whole_gpus, fit.share_milli) {
        (None, _, _) | (_, 0, 0) => "nothing".to_string(),
        (Some(node), 0, share) => format!("a {} GPU share ({node})", gpus_text(1, share)),
        (Some(node), whole, _) => format!("{whole} GPUs ({node})"),
    };
    let _ = writeln!(
        out,
        "{} nodes, {} GPUs, {} unhealthy; allocated {} of {} ({:.1}%); {} free, {} shared",
        t.nodes,
        t.gpus,
        t.unhealthy_gpus,
        milli_text(t.allocated_milli),
        milli_text(t.capacity_milli),
        t.allocation_pct,
        t.free_gpus,
        t.shared_gpus
    );
    let _ = writeln!(
        out,
        "fragmentation {:.2} GPUs ({:.1}% of idle) | largest fit: {largest} | {} pending",
        t.fragmentation_gpus, t.fragmentation_pct, t.pending_pods
    );
}

fn milli_text(milli: u64) -> String {
    if milli.is_multiple_of(1000) {
        (milli / 1000).to_string()
    } else {
        let text = format!("{:.3}", milli as f64 / 1000.0);
        text.trim_end_matches('0').to_string()
    }
}

fn nodes(out: &mut String, nodes: &[NodeStatus], style: Style) {
    if nodes.is_empty() {
        let _ = writeln!(out, "\nno GPU nodes");
        return;
    }
    let name_w = nodes.iter().map(|n| n.name.len()).max().unwrap_or(4).max(4);
    let model_w = nodes
        .iter()
        .map(|n| n.model.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let gpus_w = nodes.iter().map(|n| n.gpus.len()).max().unwrap_or(4).max(4);
    let _ = writeln!(out, "\n{LEGEND}");
    let _ = writeln!(
        out,
        "{:name_w$}  {:model_w$}  {:gpus_w$}  FREE  FRAG  PODS",
        "NODE", "MODEL", "GPUS"
    );
    for node in nodes {
        let cells: String = node
            .gpus
            .iter()
            .map(|g| paint(cell(g), style.colour))
            .collect();
        let pad = " ".repeat(gpus_w - node.gpus.len());
        let free = node
            .gpus
            .iter()
            .filter(|g| g.healthy && g.used_milli == 0)
            .count();
        let mut pods: Vec<String> = Vec::new();
        for g in &node.gpus {
            for h in &g.holders {
                let name = format!("{}/{}", h.namespace, h.name);
                if !pods.contains(&name) {
                    pods.push(name);
                }
            }
        }
        let head = format!(
            "{:name_w$}  {:model_w$}  {cells}{pad}  {free:>4}  {:>4.2}  {}",
            node.name,
            node.model,
            node.fragmentation_gpus,
            if pods.is_empty() {
                "-".to_string()
            } else {
                pods.join(" ")
            }
        );
        let _ = writeln!(out, "{head}");
        if style.wide {
            node_detail(out, node);
        }
    }
}

fn node_detail(out: &mut String, node: &NodeStatus) {
    if !node.nvlink_groups.is_empty() {
        let groups: Vec<String> = node
            .nvlink_groups
            .iter()
            .map(|g| {
                let ids: Vec<String> = g.iter().map(u32::to_string).collect();
                format!("[{}]", ids.join(","))
            })
            .collect();
        let _ = writeln!(out, "    nvlink {}", groups.join(" "));
    }
    for g in &node.gpus {
        let holders: Vec<String> = g
            .holders
            .iter()
            .map(|h| {
                let since = h.since.as_deref().unwrap_or("?");
                format!(
                    "{}/{} {} since {since}",
                    h.namespace,
                    h.name,
                    gpus_text(1, h.milli)
                )
            })
            .collect();
        let state = if !g.healthy {
            "unhealthy".to_string()
        } else if g.holders.is_empty() && g.used_milli == 0 {
            "free".to_string()
        } else {
            holders.join(", ")
        };
        let mut peers: Vec<u32> = node
            .links
            .iter()
            .filter_map(|l| match (l.a == g.index, l.b == g.index) {
                (true, _) => Some(l.b),
                (_, true) => Some(l.a),
                _ => None,
            })
            .collect();
        peers.sort_unstable();
        let peers = if peers.is_empty() {
            String::new()
        } else {
            let ids: Vec<String> = peers.iter().map(u32::to_string).collect();
            format!("  nvlink {}", ids.join(","))
        };
        let _ = writeln!(
            out,
            "    gpu {:>2} {} {} {} MiB{peers}  {state}",
            g.index,
            cell(g),
            g.model,
            g.memory_mib
        );
    }
}

fn pending(out: &mut String, status: &FleetStatus) {
    if status.pending.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nPENDING GPU PODS ({})", status.pending.len());
    let name_w = status
        .pending
        .iter()
        .map(|p| p.namespace.len() + p.name.len() + 1)
        .max()
        .unwrap_or(4);
    for p in &status.pending {
        let reason = match &p.waiting {
            Some(w) => w.message.as_str(),
            None => p.reason.as_deref().unwrap_or("(no reason recorded yet)"),
        };
        let line = format!(
            "{:name_w$}  {:>6}  {reason}",
            format!("{}/{}", p.namespace, p.name),
            p.gpus
        );
        let _ = writeln!(out, "{line}");
        let Some(w) = &p.waiting else {
            continue;
        };
        let parts = [
            ("blocked by", &w.blocked_by),
            ("position", &w.position),
            ("", &w.queue),
            ("unblocked by", &w.unblocked_by),
            ("expected start", &w.expected_start),
        ];
        for (key, value) in parts {
            let Some(value) = value else {
                continue;
            };
            let text = if key.is_empty() {
                value.clone()
            } else {
                format!("{key}: {value}")
            };
            let _ = writeln!(out, "{:name_w$}          {text}", "");
        }
    }
}

fn groups(out: &mut String, status: &FleetStatus) {
    if status.groups.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nGANGS ({})", status.groups.len());
    for g in &status.groups {
        let phase = if g.phase.is_empty() { "-" } else { &g.phase };
        let line = format!(
            "{}/{}  min {}  {phase}  {} scheduled{}",
            g.namespace,
            g.name,
            g.min_member,
            g.scheduled,
            g.message
                .as_deref()
                .map(|m| format!("  {m}"))
                .unwrap_or_default()
        );
        let _ = writeln!(out, "{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::PendingPod;

    #[test]
    fn a_waiting_pod_shows_kubes_message_then_each_segment_on_its_own_line() {
        let message = "0/1 nodes are available: 1 node(s) had no 4 GPUs linked by NVLink. | blocked by: fragmentation | position: 1 of 1 in the cluster | unblocked by: nothing found | expected start: 2026-11-29T10:30:09Z (in 29m)";
        let status = FleetStatus {
            pending: vec![PendingPod {
                namespace: "ml".into(),
                name: "quad".into(),
                gpus: "4".into(),
                reason: Some(message.into()),
                waiting: Some(gpuplace_core::waiting::Waiting::parse(message)),
                ..PendingPod::default()
            }],
            ..FleetStatus::default()
        };
        let text = render(&status, Style::default());
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        assert!(lines.contains(
            &"ml/quad       4  0/1 nodes are available: 1 node(s) had no 4 GPUs linked by NVLink."
        ), "{text}");
        for segment in [
            "blocked by: fragmentation",
            "position: 1 of 1 in the cluster",
            "unblocked by: nothing found",
            "expected start: 2026-11-29T10:30:09Z (in 29m)",
        ] {
            assert!(lines.contains(&segment), "{segment}: {text}");
        }
    }
}
