//! The report on disk: summary.json, curves.csv, the plots and index.html.

use std::path::Path;

use crate::report::{ReportError, Summary, curves_csv, html, write};

/// Writes summary.json, curves.csv, the plots (SVG and PNG) and index.html into `dir`.
pub fn write_report(summary: &Summary, dir: &Path) -> Result<Vec<String>, ReportError> {
    std::fs::create_dir_all(dir).map_err(|source| ReportError::Write {
        path: dir.display().to_string(),
        source,
    })?;
    let json = serde_json::to_string_pretty(summary).unwrap_or_default();
    write(&dir.join("summary.json"), &json)?;
    write(&dir.join("curves.csv"), &curves_csv(summary))?;
    let mut files = vec!["summary.json".to_string(), "curves.csv".to_string()];
    for chart in crate::plot::CHARTS {
        files.extend(crate::plot::draw(summary, chart, dir)?);
    }
    write(&dir.join("index.html"), &html(summary))?;
    files.push("index.html".to_string());
    Ok(files)
}
