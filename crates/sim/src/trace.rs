//! Loading the Alibaba openb CSV format (node list and pod list).
//!
//! Columns are found by header name, so extra columns (qos, timestamps) are ignored and the
//! `multigpu*` files, which lack `gpu_spec`, load too. Every error names the file, the line
//! and the column.

use std::path::{Path, PathBuf};

use gpuplace_model::{NodeInventory, Request};

/// A problem in a trace file.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{file}: cannot read: {source}")]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{file}: line 1: missing column {column:?} in header (found: {found})")]
    MissingColumn {
        file: PathBuf,
        column: &'static str,
        found: String,
    },
    #[error("{file}: line {line}: {message}")]
    Malformed {
        file: PathBuf,
        line: u64,
        message: String,
    },
    #[error("{file}: line {line}, column {column:?}: {message}")]
    BadValue {
        file: PathBuf,
        line: u64,
        column: &'static str,
        message: String,
    },
    #[error("{file}: no rows after the header")]
    Empty { file: PathBuf },
}

/// One pod of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TracePod {
    pub name: String,
    /// From the `qos` column (see [`qos_priority`]); 0 without one.
    pub priority: i32,
    pub request: Request,
    /// How long the pod ran, `deletion_time - creation_time` in seconds, when the pod list
    /// has both columns (the timeline replay runs it that long; see
    /// [`crate::timeline::durations`]).
    pub duration_s: Option<u64>,
    /// The pod's gang (optional `gang` column): pods with the same value arrive together
    /// and are placed all or nothing.
    pub gang: Option<String>,
}

/// A stable hash of a pod's name (FNV-1a), to pick pods by name: the same pods whatever
/// the seed and the policy.
pub fn name_hash(text: &str) -> u64 {
    name_hash_on(0xcbf2_9ce4_8422_2325, text)
}

/// [`name_hash`] of a text that begins with one whose hash is `hash` and goes on with
/// `more` (`name_hash_on(name_hash(a), b) == name_hash(a + b)`), with no text made.
pub fn name_hash_on(hash: u64, more: &str) -> u64 {
    more.bytes().fold(hash, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The priority of a trace's `qos` value.
pub fn qos_priority(qos: &str) -> Result<i32, String> {
    match qos {
        "LS" | "Guaranteed" => Ok(2),
        "Burstable" => Ok(1),
        "BE" | "" => Ok(0),
        other => Err(format!(
            "unknown qos {other:?}; expected LS, Guaranteed, Burstable or BE"
        )),
    }
}

struct Table {
    file: PathBuf,
    reader: csv::Reader<std::fs::File>,
    header: Vec<String>,
}

impl Table {
    fn open(path: &Path) -> Result<Self, TraceError> {
        let file = path.to_path_buf();
        let handle = std::fs::File::open(path).map_err(|source| TraceError::Read {
            file: file.clone(),
            source,
        })?;
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(true)
            .flexible(true)
            .trim(csv::Trim::All)
            .from_reader(handle);
        let header = reader
            .headers()
            .map_err(|e| TraceError::Malformed {
                file: file.clone(),
                line: 1,
                message: e.to_string(),
            })?
            .iter()
            .map(str::to_string)
            .collect();
        Ok(Table {
            file,
            reader,
            header,
        })
    }

    fn column(&self, name: &'static str) -> Result<usize, TraceError> {
        self.header
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| TraceError::MissingColumn {
                file: self.file.clone(),
                column: name,
                found: self.header.join(","),
            })
    }

    fn optional_column(&self, name: &str) -> Option<usize> {
        self.header.iter().position(|h| h == name)
    }

    /// Calls `row` for every record with its line number.
    fn rows(
        &mut self,
        mut row: impl FnMut(&Row<'_>) -> Result<(), TraceError>,
    ) -> Result<usize, TraceError> {
        let mut record = csv::StringRecord::new();
        let mut count = 0;
        loop {
            let more = self
                .reader
                .read_record(&mut record)
                .map_err(|e| TraceError::Malformed {
                    file: self.file.clone(),
                    line: e.position().map(|p| p.line()).unwrap_or(0),
                    message: e.to_string(),
                })?;
            if !more {
                break;
            }
            let line = record.position().map(|p| p.line()).unwrap_or(0);
            if record.iter().all(str::is_empty) {
                continue;
            }
            row(&Row {
                file: &self.file,
                line,
                record: &record,
            })?;
            count += 1;
        }
        if count == 0 {
            return Err(TraceError::Empty {
                file: self.file.clone(),
            });
        }
        Ok(count)
    }
}

struct Row<'a> {
    file: &'a Path,
    line: u64,
    record: &'a csv::StringRecord,
}

impl Row<'_> {
    fn text(&self, index: usize, column: &'static str) -> Result<&str, TraceError> {
        self.record
            .get(index)
            .ok_or_else(|| self.bad(column, "missing value (row is shorter than the header)"))
    }

    fn number(&self, index: usize, column: &'static str, max: u64) -> Result<u64, TraceError> {
        let text = self.text(index, column)?;
        if text.is_empty() {
            return Err(self.bad(column, "empty value, expected a whole number"));
        }
        let value: u64 = text.parse().map_err(|_| {
            if text.starts_with('-') {
                self.bad(column, &format!("{text:?} is negative"))
            } else {
                self.bad(column, &format!("{text:?} is not a whole number"))
            }
        })?;
        if value > max {
            return Err(self.bad(column, &format!("{value} is larger than {max}")));
        }
        Ok(value)
    }

    fn bad(&self, column: &'static str, message: &str) -> TraceError {
        TraceError::BadValue {
            file: self.file.to_path_buf(),
            line: self.line,
            column,
            message: message.to_string(),
        }
    }
}

/// Largest CPU (milli) or memory (MiB) value accepted, far above any real machine.
const SANE_MAX: u64 = 1 << 40;

/// Loads a node list (`sn,cpu_milli,memory_mib,gpu,model`).
pub fn load_nodes(path: &Path) -> Result<Vec<NodeInventory>, TraceError> {
    let mut table = Table::open(path)?;
    let (sn, cpu, mem, gpu, model) = (
        table.column("sn")?,
        table.column("cpu_milli")?,
        table.column("memory_mib")?,
        table.column("gpu")?,
        table.column("model")?,
    );
    let mut nodes = Vec::new();
    let mut names = std::collections::HashSet::new();
    table.rows(|row| {
        let name = row.text(sn, "sn")?.to_string();
        if name.is_empty() {
            return Err(row.bad("sn", "empty node name"));
        }
        if !names.insert(name.clone()) {
            return Err(row.bad("sn", &format!("node {name:?} appears twice")));
        }
        let cpu_milli = row.number(cpu, "cpu_milli", SANE_MAX)?;
        let memory_mib = row.number(mem, "memory_mib", SANE_MAX)?;
        let count = row.number(gpu, "gpu", 64)? as u32;
        let model_name = row.text(model, "model")?;
        if count > 0 && model_name.is_empty() {
            return Err(row.bad("model", "a node with GPUs needs a model"));
        }
        nodes.push(NodeInventory::uniform(
            &name, cpu_milli, memory_mib, count, model_name,
        ));
        Ok(())
    })?;
    Ok(nodes)
}

/// Loads a pod list (`name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]`).
pub fn load_pods(path: &Path) -> Result<Vec<TracePod>, TraceError> {
    let mut table = Table::open(path)?;
    let (name, cpu, mem, num, milli) = (
        table.column("name")?,
        table.column("cpu_milli")?,
        table.column("memory_mib")?,
        table.column("num_gpu")?,
        table.column("gpu_milli")?,
    );
    let spec = table.optional_column("gpu_spec");
    let qos = table.optional_column("qos");
    let times = table
        .optional_column("creation_time")
        .zip(table.optional_column("deletion_time"));
    let gang = table.optional_column("gang");
    let mut pods = Vec::new();
    table.rows(|row| {
        let gpu_count = row.number(num, "num_gpu", 64)? as u32;
        let gpu_milli = row.number(milli, "gpu_milli", 1000)? as u32;
        let allowed_models = match spec {
            Some(i) => row
                .text(i, "gpu_spec")?
                .split('|')
                .filter(|m| !m.is_empty())
                .map(str::to_string)
                .collect(),
            None => Vec::new(),
        };
        let request = Request {
            cpu_milli: row.number(cpu, "cpu_milli", SANE_MAX)?,
            memory_mib: row.number(mem, "memory_mib", SANE_MAX)?,
            gpu_count,
            gpu_milli,
            allowed_models,
            need: Default::default(),
        };
        request
            .validate()
            .map_err(|e| row.bad("gpu_milli", &e.to_string()))?;
        let priority = match qos {
            Some(i) => qos_priority(row.text(i, "qos")?).map_err(|e| row.bad("qos", &e))?,
            None => 0,
        };
        let duration_s = match times {
            Some((created, deleted)) => duration(row, created, deleted)?,
            None => None,
        };
        let gang = match gang {
            Some(i) => Some(row.text(i, "gang")?.to_string()).filter(|g| !g.is_empty()),
            None => None,
        };
        pods.push(TracePod {
            name: row.text(name, "name")?.to_string(),
            priority,
            request,
            duration_s,
            gang,
        });
        Ok(())
    })?;
    Ok(pods)
}

/// `deletion_time - creation_time`; `None` when either is empty (a pod still running when
/// the trace ended has no deletion time).
fn duration(row: &Row<'_>, created: usize, deleted: usize) -> Result<Option<u64>, TraceError> {
    let present = |i: usize, column: &'static str| -> Result<bool, TraceError> {
        Ok(!row.text(i, column)?.is_empty())
    };
    if !present(created, "creation_time")? || !present(deleted, "deletion_time")? {
        return Ok(None);
    }
    let from = row.number(created, "creation_time", SANE_MAX)?;
    let to = row.number(deleted, "deletion_time", SANE_MAX)?;
    if to < from {
        return Err(row.bad(
            "deletion_time",
            &format!("{to} is before the pod's creation_time {from}"),
        ));
    }
    Ok(Some(to - from))
}

/// Where the shared openb trace is for tests and examples: `$GPUPLACE_OPENB_DIR`, else
/// `../shared/traces/openb` beside the repository (`manifest_dir` is a crate's
/// `CARGO_MANIFEST_DIR`, two levels below the repository). `Err` says why it is absent.
pub fn shared_openb_dir(manifest_dir: &Path) -> Result<PathBuf, String> {
    let dir = std::env::var_os("GPUPLACE_OPENB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest_dir.join("../../../shared/traces/openb"));
    if dir.join("openb_node_list_gpu_node.csv").is_file() {
        Ok(dir)
    } else {
        Err(format!(
            "openb trace not found at {} (set GPUPLACE_OPENB_DIR)",
            dir.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    #[test]
    fn loads_nodes_and_pods() {
        let nodes =
            file("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nc0,32000,1024,0,\n");
        let nodes = load_nodes(nodes.path()).unwrap();
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[0].gpus.len(), 2);
        assert_eq!(nodes[0].gpu_model(), "P100");
        let pods = file(
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\np0,1000,10,1,500,T4|P100,LS\np1,1000,10,0,0,,BE\n",
        );
        let pods = load_pods(pods.path()).unwrap();
        assert_eq!(pods[0].request.allowed_models, vec!["T4", "P100"]);
        assert_eq!(pods[1].request.gpu_count, 0);
        // multigpu files have no gpu_spec column.
        let pods = file("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,8,1000\n");
        let pods = load_pods(pods.path()).unwrap();
        assert_eq!(pods[0].request.gpu_count, 8);
        assert_eq!((pods[0].duration_s, pods[0].gang.as_deref()), (None, None));
    }

    #[test]
    fn durations_and_gangs_come_from_their_columns() {
        let pods = file(
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time,gang\np0,1,1,1,1000,10,70,\np1,1,1,1,1000,5,,g1\n",
        );
        let pods = load_pods(pods.path()).unwrap();
        assert_eq!(pods[0].duration_s, Some(60));
        assert_eq!(pods[1].duration_s, None, "no deletion time: unknown");
        assert_eq!(pods[1].gang.as_deref(), Some("g1"));
        let f = file(
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\np0,1,1,1,1000,70,10\n",
        );
        let err = load_pods(f.path()).unwrap_err().to_string();
        assert!(
            err.contains("column \"deletion_time\": 10 is before the pod's creation_time 70"),
            "{err}"
        );
    }

    #[test]
    fn errors_name_file_line_and_column() {
        let f = file("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,1,500\np1,-4,1,1,500\n");
        let err = load_pods(f.path()).unwrap_err().to_string();
        assert!(
            err.contains("line 3, column \"cpu_milli\": \"-4\" is negative"),
            "{err}"
        );
        let f = file("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,2,500\n");
        let err = load_pods(f.path()).unwrap_err().to_string();
        assert!(
            err.contains("line 2, column \"gpu_milli\": a fractional share"),
            "{err}"
        );
        let f = file("name,cpu_milli,memory_mib,num_gpu\np0,1,1,2\n");
        let err = load_pods(f.path()).unwrap_err().to_string();
        assert!(
            err.contains("line 1: missing column \"gpu_milli\""),
            "{err}"
        );
        let f = file("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,x,1,1000\n");
        let err = load_pods(f.path()).unwrap_err().to_string();
        assert!(
            err.contains("column \"memory_mib\": \"x\" is not a whole number"),
            "{err}"
        );
        let f = file("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,1,1500\n");
        let err = load_pods(f.path()).unwrap_err().to_string();
        assert!(err.contains("1500 is larger than 1000"), "{err}");
        let f = file("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1\n");
        let err = load_pods(f.path()).unwrap_err().to_string();
        assert!(
            err.contains("line 2, column \"num_gpu\": missing value"),
            "{err}"
        );
        let f = file("sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,2,\n");
        let err = load_nodes(f.path()).unwrap_err().to_string();
        assert!(err.contains("a node with GPUs needs a model"), "{err}");
        let f = file("sn,cpu_milli,memory_mib,gpu,model\n");
        assert!(matches!(
            load_nodes(f.path()),
            Err(TraceError::Empty { .. })
        ));
        let err = load_nodes(Path::new("/nonexistent/n.csv"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("/nonexistent/n.csv: cannot read"), "{err}");
    }
}
