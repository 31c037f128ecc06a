// File-based target discovery as Prometheus `file_sd` does it: JSON or YAML files listing
// `{targets: [host:port], labels: {...}}` groups, re-read whenever a file's mtime changes.

use super::target::{SpecError, TargetSpec};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// One group of a file_sd file.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TargetGroup {
    pub targets: Vec<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, thiserror::Error)]
pub enum FileSdError {
    #[error("{file}: cannot read: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}: not a list of {{targets, labels}} groups: {message}")]
    Parse { file: String, message: String },
    #[error("{file}: group {group}, target {target:?}: {source}")]
    Target {
        file: String,
        group: usize,
        target: String,
        source: SpecError,
    },
}

/// Defaults a discovered target takes from the scrape configuration.
#[derive(Debug, Clone, Copy)]
pub struct Defaults {
    pub interval: Duration,
    pub timeout: Duration,
}

/// Parse a file's text (`.json` as JSON, anything else as YAML) into target specs.
///
/// Labels `__scheme__` (only `http`), `__metrics_path__` (default `/metrics`),
/// `__scrape_interval__`, `__scrape_timeout__` and `__runtime__` configure the target and are
/// dropped; the other labels are attached to the target.
pub fn parse(text: &str, file: &Path, defaults: Defaults) -> Result<Vec<TargetSpec>, FileSdError> {
    let name = file.display().to_string();
    let is_json = file
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    let groups: Vec<TargetGroup> = if text.trim().is_empty() {
        Vec::new()
    } else if is_json {
        serde_json::from_str(text).map_err(|e| FileSdError::Parse {
            file: name.clone(),
            message: e.to_string(),
        })?
    } else {
        serde_saphyr::from_str(text).map_err(|e| FileSdError::Parse {
            file: name.clone(),
            message: e.to_string(),
        })?
    };
    targets_of(groups, &name, "file_sd", defaults)
}

/// The target specs of `groups` read from `name` (a file, or an http_sd URL: `kind`), with the
/// group labels that configure a target applied and dropped (see `parse`).
pub fn targets_of(
    groups: Vec<TargetGroup>,
    name: &str,
    kind: &str,
    defaults: Defaults,
) -> Result<Vec<TargetSpec>, FileSdError> {
    let mut out = Vec::new();
    for (gi, g) in groups.into_iter().enumerate() {
        let mut labels = g.labels;
        let scheme = labels.remove("__scheme__").unwrap_or_else(|| "http".into());
        let path = labels
            .remove("__metrics_path__")
            .unwrap_or_else(|| "/metrics".into());
        let interval = labels.remove("__scrape_interval__");
        let timeout = labels.remove("__scrape_timeout__");
        let runtime = labels.remove("__runtime__");
        labels.retain(|k, _| !k.starts_with("__"));
        for t in g.targets {
            let err = |source| FileSdError::Target {
                file: name.to_string(),
                group: gi,
                target: t.clone(),
                source,
            };
            let path = if path.starts_with('/') {
                path.clone()
            } else {
                format!("/{path}")
            };
            let url = format!("{scheme}://{}{path}", t.trim());
            let interval = match &interval {
                Some(s) => Some(
                    crate::kernel::duration::HumanDuration::parse(s)
                        .map_err(|m| err(SpecError::Duration(m)))?
                        .0,
                ),
                None => None,
            };
            let timeout = match &timeout {
                Some(s) => Some(
                    crate::kernel::duration::HumanDuration::parse(s)
                        .map_err(|m| err(SpecError::Duration(m)))?
                        .0,
                ),
                None => None,
            };
            let spec = TargetSpec::new(
                &url,
                runtime.clone(),
                interval.unwrap_or(defaults.interval),
                timeout.unwrap_or(defaults.timeout),
                labels.clone(),
                format!("{kind}:{name}"),
            )
            .map_err(err)?;
            out.push(spec);
        }
    }
    Ok(out)
}

/// What a discovery source (a file_sd file, an http_sd endpoint, a Prometheus) gave last: its
/// targets, when it was last read whole, and why its last read failed — the previous targets
/// are then kept, as Prometheus keeps them.
#[derive(Debug, Default)]
pub struct Found {
    pub targets: Vec<TargetSpec>,
    pub last_error: Option<String>,
    pub loaded_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl Found {
    /// Take the outcome of a read of `source` (logged by it when it fails, once per error, and
    /// when it works again); true when the targets changed.
    pub fn take(&mut self, read: Result<Vec<TargetSpec>, String>, source: &str) -> bool {
        match read {
            Ok(targets) => {
                if self.last_error.take().is_some() {
                    tracing::info!(source, "target discovery reads again");
                }
                self.loaded_at = Some(chrono::Utc::now());
                let changed = targets != self.targets;
                self.targets = targets;
                changed
            }
            Err(msg) => {
                if self.last_error.as_deref() != Some(msg.as_str()) {
                    tracing::warn!(source, error = %msg, "target discovery failed: keeping the previous targets");
                }
                self.last_error = Some(msg);
                false
            }
        }
    }
}

/// A watched file: its last seen modification time and what it last yielded.
#[derive(Debug)]
pub struct WatchedFile {
    pub path: PathBuf,
    seen: Option<(SystemTime, u64)>,
    pub found: Found,
}

impl WatchedFile {
    pub fn new(path: PathBuf) -> WatchedFile {
        WatchedFile {
            path,
            seen: None,
            found: Found::default(),
        }
    }

    /// Re-read the file when it changed. Returns true when its targets changed. A file that
    /// cannot be read or parsed keeps its previous targets (as Prometheus does) and records why.
    pub fn refresh(&mut self, defaults: Defaults) -> bool {
        let stamp = std::fs::metadata(&self.path)
            .ok()
            .map(|m| (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()));
        if stamp.is_some() && stamp == self.seen {
            return false;
        }
        let result = std::fs::read_to_string(&self.path)
            .map_err(|source| FileSdError::Read {
                file: self.path.display().to_string(),
                source,
            })
            .and_then(|text| parse(&text, &self.path, defaults));
        self.seen = stamp;
        let source = format!("file_sd:{}", self.path.display());
        self.found.take(result.map_err(|e| e.to_string()), &source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Defaults = Defaults {
        interval: Duration::from_secs(5),
        timeout: Duration::from_secs(3),
    };

    #[test]
    fn json_and_yaml_groups() {
        let json = r#"[{"targets": ["127.0.0.1:8000", "10.0.0.2:9400"], "labels": {"model_id": "llama", "__metrics_path__": "/m", "__scrape_interval__": "2s"}},
                       {"targets": ["h:1"]}]"#;
        let t = parse(json, Path::new("t.json"), D).unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(t[0].url, "http://127.0.0.1:8000/m");
        assert_eq!(t[0].interval, Duration::from_secs(2));
        assert_eq!(
            t[0].labels.get("model_id").map(String::as_str),
            Some("llama")
        );
        assert!(!t[0].labels.contains_key("__metrics_path__"));
        assert_eq!(t[1].instance(), "10.0.0.2:9400");
        assert_eq!(t[2].url, "http://h:1/metrics");
        assert_eq!(t[2].interval, Duration::from_secs(5));
        assert_eq!(t[2].origin, "file_sd:t.json");

        let yaml =
            "- targets: ['127.0.0.1:9400']\n  labels:\n    __runtime__: dcgm\n    rack: r1\n";
        let t = parse(yaml, Path::new("t.yaml"), D).unwrap();
        assert_eq!(t[0].runtime.as_deref(), Some("dcgm"));
        assert_eq!(t[0].labels.len(), 1);
        assert!(parse("", Path::new("e.yml"), D).unwrap().is_empty());
    }

    #[test]
    fn bad_files_name_what_is_wrong() {
        let e = parse("{\"targets\": 1}", Path::new("x.json"), D)
            .unwrap_err()
            .to_string();
        assert!(e.contains("x.json") && e.contains("not a list"), "{e}");
        let e = parse(
            "[{\"targets\": [\"h:1\"], \"labels\": {\"__scrape_interval__\": \"500ms\"}}]",
            Path::new("x.json"),
            D,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("\"h:1\"") && e.contains("at least 1s"), "{e}");
        let e = parse(
            "[{\"targets\": [\"h:1\"], \"labels\": {\"__scheme__\": \"https\"}}]",
            Path::new("x.json"),
            D,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("https"), "{e}");
    }

    #[test]
    fn reloads_on_change_and_keeps_targets_on_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sd.json");
        std::fs::write(&path, r#"[{"targets": ["a:1"]}]"#).unwrap();
        let mut w = WatchedFile::new(path.clone());
        assert!(w.refresh(D));
        assert!(!w.refresh(D), "unchanged file is not re-read");
        std::fs::write(&path, r#"[{"targets": ["a:1", "b:2"]}]"#).unwrap();
        assert!(w.refresh(D));
        assert_eq!(w.found.targets.len(), 2);
        std::fs::write(&path, "[{\"targets\": [").unwrap();
        assert!(!w.refresh(D));
        assert_eq!(w.found.targets.len(), 2);
        assert!(
            w.found
                .last_error
                .as_deref()
                .unwrap_or("")
                .contains("sd.json")
        );
    }
}
