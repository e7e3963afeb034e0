//! The timeline report's charts: allocation, fragmentation and pending demand over time,
//! and the wait CDF of each class (log time axis), as SVG and PNG.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::summary::{TimelinePolicy, TimelineSummary};
use crate::plot::{COLORS, plot_error, register};
use crate::report::ReportError;

/// One chart: per policy a line of (x, y) points.
struct Lines<'a> {
    file: String,
    title: String,
    x_label: &'a str,
    y_label: &'a str,
    log_x: bool,
    lines: Vec<(String, Vec<(f64, f64)>)>,
}

fn over_time(
    summary: &TimelineSummary,
    file: &str,
    title: &str,
    y_label: &'static str,
    pick: fn(&TimelinePolicy) -> &Vec<f64>,
) -> Lines<'static> {
    Lines {
        file: file.to_string(),
        title: format!("{title} — {}, load {}", summary.workload, summary.load),
        x_label: "simulated time (hours)",
        y_label,
        log_x: false,
        lines: summary
            .policies
            .iter()
            .map(|p| {
                let points = p
                    .series
                    .t_s
                    .iter()
                    .zip(pick(p))
                    .map(|(t, y)| (t / 3_600.0, *y))
                    .collect();
                (p.policy.clone(), points)
            })
            .collect(),
    }
}

/// Every chart of the report.
fn charts(summary: &TimelineSummary) -> Vec<Lines<'static>> {
    let mut out = vec![
        over_time(
            summary,
            "allocation",
            "GPU allocation",
            "allocated GPU (% of capacity)",
            |p| &p.series.allocation_pct,
        ),
        over_time(
            summary,
            "pending",
            "Pending GPU demand",
            "GPUs asked by waiting pods",
            |p| &p.series.pending_gpus,
        ),
        over_time(
            summary,
            "fragmentation",
            "GPU fragmentation (FGD measure)",
            "fragmented GPU (% of capacity)",
            |p| &p.series.fragmentation_pct,
        ),
    ];
    for class in super::metrics::Class::ALL {
        let key = class.key();
        let lines: Vec<(String, Vec<(f64, f64)>)> = summary
            .policies
            .iter()
            .filter_map(|p| {
                let cdf = p.cdf.get(key)?;
                let points = cdf
                    .iter()
                    .enumerate()
                    .map(|(pct, wait)| (wait.max(1.0), pct as f64 / 100.0))
                    .collect();
                Some((p.policy.clone(), points))
            })
            .collect();
        if lines.is_empty() {
            continue;
        }
        out.push(Lines {
            file: format!("wait_cdf_{}", key.replace('-', "_")),
            title: format!(
                "Wait of {key} pods — {}, load {}",
                summary.workload, summary.load
            ),
            x_label: "wait (seconds, log scale; under 1 s shown at 1 s)",
            y_label: "share of pods that waited at most this long",
            log_x: true,
            lines,
        });
    }
    out
}

fn render<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    chart: &Lines<'_>,
) -> Result<(), String> {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let points = chart.lines.iter().flat_map(|(_, p)| p.iter());
    let x_max = points.clone().map(|p| p.0).fold(1.0f64, f64::max).max(2.0);
    let y_max = points.clone().map(|p| p.1).fold(0.0f64, f64::max).max(1e-3) * 1.05;
    // Over time the policies differ by points, not tens of points: the axis starts a
    // little below the lowest line.
    let y_min = if chart.log_x {
        0.0
    } else {
        let low = points.map(|p| p.1).fold(f64::INFINITY, f64::min);
        (low - 0.1 * (y_max - low)).max(0.0).floor()
    };
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(&chart.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60);
    macro_rules! finish {
        ($ctx:expr) => {{
            let mut ctx = $ctx.map_err(|e| e.to_string())?;
            ctx.configure_mesh()
                .x_desc(chart.x_label)
                .y_desc(chart.y_label)
                .label_style(("sans-serif", 14))
                .axis_desc_style(("sans-serif", 16))
                .draw()
                .map_err(|e| e.to_string())?;
            for (i, (name, line)) in chart.lines.iter().enumerate() {
                let color = COLORS[i % COLORS.len()];
                ctx.draw_series(LineSeries::new(line.iter().copied(), color.stroke_width(2)))
                    .map_err(|e| e.to_string())?
                    .label(name.clone())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                    });
            }
            ctx.configure_series_labels()
                .position(if chart.log_x {
                    SeriesLabelPosition::LowerRight
                } else {
                    SeriesLabelPosition::UpperLeft
                })
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .label_font(("sans-serif", 14))
                .draw()
                .map_err(|e| e.to_string())?;
        }};
    }
    if chart.log_x {
        finish!(builder.build_cartesian_2d((1.0..x_max).log_scale(), 0.0..1.0f64));
    } else {
        finish!(builder.build_cartesian_2d(0.0..x_max, y_min..y_max));
    }
    root.present().map_err(|e| e.to_string())
}

/// Draws every chart into `dir` as SVG and PNG; returns the file names.
pub fn draw_all(summary: &TimelineSummary, dir: &Path) -> Result<Vec<String>, ReportError> {
    register();
    let size = (1000, 560);
    let mut files = Vec::new();
    for chart in charts(summary) {
        let svg = dir.join(format!("{}.svg", chart.file));
        render(SVGBackend::new(&svg, size).into_drawing_area(), &chart)
            .map_err(|e| plot_error(&svg, e))?;
        let png = dir.join(format!("{}.png", chart.file));
        render(BitMapBackend::new(&png, size).into_drawing_area(), &chart)
            .map_err(|e| plot_error(&png, e))?;
        files.push(format!("{}.svg", chart.file));
        files.push(format!("{}.png", chart.file));
    }
    Ok(files)
}
