//! The timeline report on disk.

use std::path::Path;

use super::summary::TimelineSummary;
use crate::report::{ReportError, write};

/// Writes summary.json, series.csv, the plots (SVG and PNG) and index.html into `dir`.
pub fn write_report(summary: &TimelineSummary, dir: &Path) -> Result<Vec<String>, ReportError> {
    std::fs::create_dir_all(dir).map_err(|source| ReportError::Write {
        path: dir.display().to_string(),
        source,
    })?;
    let json = serde_json::to_string_pretty(summary).unwrap_or_default();
    write(&dir.join("summary.json"), &json)?;
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
