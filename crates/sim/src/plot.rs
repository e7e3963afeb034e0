//! Line charts of the curves against arrived GPU %, as SVG and PNG.

use std::path::Path;
use std::sync::Once;

use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

use crate::report::{PolicySummary, ReportError, Summary};

/// The font every chart uses, committed so output is the same on every machine.
pub(crate) static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
static REGISTER: Once = Once::new();

/// Registers the committed font once (every chart draws with it).
pub(crate) fn register() {
    REGISTER.call_once(|| {
        // The committed font is valid; if registering ever failed, plotters reports the
        // missing font when drawing, which surfaces as a ReportError.
        let _ = register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

/// Which curve a chart shows.
#[derive(Clone, Copy, Debug)]
pub struct Chart {
    pub file: &'static str,
    /// First arrived % shown (the zoomed chart starts where policies part ways).
    pub x_from: usize,
    pub title: &'static str,
    pub y_label: &'static str,
    pub curve: fn(&PolicySummary) -> &Vec<f64>,
}

pub const CHARTS: [Chart; 3] = [
    Chart {
        file: "unallocated",
        x_from: 0,
        title: "Unallocated GPU",
        y_label: "unallocated GPU (% of capacity)",
        curve: |p| &p.unallocated_curve,
    },
    Chart {
        file: "unallocated_zoom",
        x_from: 70,
        title: "Unallocated GPU, arrived 70% and up",
        y_label: "unallocated GPU (% of capacity)",
        curve: |p| &p.unallocated_curve,
    },
    Chart {
        file: "fragmentation",
        x_from: 0,
        title: "GPU fragmentation (FGD measure)",
        y_label: "fragmented GPU (% of capacity)",
        curve: |p| &p.fragmentation_curve,
    },
];

pub(crate) const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

pub(crate) fn plot_error(path: &Path, e: impl std::fmt::Display) -> ReportError {
    ReportError::Plot {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

fn render<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    summary: &Summary,
    chart: Chart,
) -> Result<(), String> {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let x_max = summary
        .policies
        .iter()
        .map(|p| (chart.curve)(p).len())
        .max()
        .unwrap_or(1)
        .saturating_sub(1)
        .max(1) as f64;
    let x_min = (chart.x_from as f64).min(x_max - 1.0);
    let y_max = summary
        .policies
        .iter()
        .flat_map(|p| (chart.curve)(p).iter().skip(chart.x_from).copied())
        .fold(1.0f64, f64::max)
        .min(100.0)
        * 1.05;
    let mut ctx = ChartBuilder::on(&root)
        .caption(
            format!("{} — {}", chart.title, summary.workload),
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(x_min..x_max, 0f64..y_max)
        .map_err(|e| e.to_string())?;
    ctx.configure_mesh()
        .x_desc("arrived GPU request (% of capacity)")
        .y_desc(chart.y_label)
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, p) in summary.policies.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let points = (chart.curve)(p)
            .iter()
            .enumerate()
            .skip(chart.x_from)
            .map(|(x, y)| (x as f64, *y));
        ctx.draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(p.policy.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    ctx.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 16))
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

/// Draws `chart` for every policy into `<dir>/<file>.svg` and `.png`.
pub fn draw(summary: &Summary, chart: Chart, dir: &Path) -> Result<Vec<String>, ReportError> {
    register();
    let size = (1000, 620);
    let svg = dir.join(format!("{}.svg", chart.file));
    render(
        SVGBackend::new(&svg, size).into_drawing_area(),
        summary,
        chart,
    )
    .map_err(|e| plot_error(&svg, e))?;
    let png = dir.join(format!("{}.png", chart.file));
    render(
        BitMapBackend::new(&png, size).into_drawing_area(),
        summary,
        chart,
    )
    .map_err(|e| plot_error(&png, e))?;
    Ok(vec![
        format!("{}.svg", chart.file),
        format!("{}.png", chart.file),
    ])
}
