//! The report on disk: summary.json, curves.csv, the plots and index.html.

use std::path::Path;

use crate::report::{ReportError, Summary, curves_csv, html, start_report, write};

/// Writes summary.json, curves.csv, the plots (SVG and PNG) and index.html into `dir`.
pub fn write_report(summary: &Summary, dir: &Path) -> Result<Vec<String>, ReportError> {
    start_report(dir, summary)?;
    write(&dir.join("curves.csv"), &curves_csv(summary))?;
    let mut files = vec!["summary.json".to_string(), "curves.csv".to_string()];
    for chart in crate::plot::CHARTS {
        files.extend(crate::plot::draw(summary, chart, dir)?);
    }
    write(&dir.join("index.html"), &html(summary))?;
    files.push("index.html".to_string());
    Ok(files)
}
