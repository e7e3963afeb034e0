//! The timeline report on disk.

use std::path::Path;

use super::summary::TimelineSummary;
use crate::report::{ReportError, start_report, write};

/// Writes summary.json, series.csv, the plots (SVG and PNG) and index.html into `dir`.
pub fn write_report(summary: &TimelineSummary, dir: &Path) -> Result<Vec<String>, ReportError> {
    start_report(dir, summary)?;
    write(
        &dir.join("series.csv"),
        &super::summary::series_csv(summary),
    )?;
    let mut files = vec!["summary.json".to_string(), "series.csv".to_string()];
    let charts = super::plot::draw_all(summary, dir)?;
    files.extend(charts.iter().cloned());
    write(
        &dir.join("index.html"),
        &super::summary::html(summary, &charts),
    )?;
    files.push("index.html".to_string());
    Ok(files)
}
