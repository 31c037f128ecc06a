// Snapshot on alert: freezes an alert's context (series, slowest requests, their spans, GPU
// state, latency summaries, effective configuration) into one compressed archive, atomically.
//
// Format: one gzip-compressed JSON document (`<alert id>.json.gz`) rather than a tar of files.
// Every part is JSON anyway, so one document needs no new dependency (flate2 is already used),
// is written and read in one pass, streams back over HTTP as is, and opens with
// `zcat x.json.gz | jq .` — the parts are its top-level keys:
// `format, created_at_unix_ms, alert, series, slowest_records, spans, gpu, latency, config, errors`.

use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokenwatch_core::aggregate::{Aggregator, LatencyQuery};
use tokenwatch_core::alert::Alert;
use tokenwatch_core::model::{LatencyMetric, RequestRecord};
use tokenwatch_core::signals::{SharedSignals, SignalPoint};
use tokenwatch_core::window::Window;
use tokenwatch_store::{RecordQuery, SpanQuery, SpanRow, Store};

/// Value of the `format` key.
pub const SNAPSHOT_FORMAT: &str = "tokenwatch-snapshot/1";
/// File name extension of a snapshot.
pub const SNAPSHOT_EXT: &str = "json.gz";
/// Content type to serve a snapshot with.
pub const SNAPSHOT_CONTENT_TYPE: &str = "application/gzip";
/// Slowest request records kept.
pub const SLOWEST_RECORDS: usize = 50;
/// How far back request records are searched.
pub const RECORD_LOOKBACK_MS: i64 = 10 * 60_000;
/// Records scanned to find the slowest ones.
const RECORD_SCAN_LIMIT: usize = 20_000;
/// Bounds on the other parts, so a snapshot stays small whatever the fleet's size.
const MAX_SERIES: usize = 500;
const MAX_SPANS: usize = 5_000;
const MAX_GPU_POINTS: usize = 2_000;
/// Largest snapshot `read_snapshot` will load.
const MAX_SNAPSHOT_BYTES: u64 = 256 * 1024 * 1024;

/// What a snapshot is taken from; the engine builds it once and passes it on each firing.
pub struct SnapshotContext {
    pub signals: SharedSignals,
    pub store: Arc<dyn Store>,
    pub aggregator: Arc<Mutex<Aggregator>>,
    /// The effective configuration, rendered as JSON by the caller.
    pub config_json: serde_json::Value,
    pub data_dir: PathBuf,
    /// Snapshots older than this are deleted (the raw-record retention).
    pub retention: std::time::Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("alert id {0:?} cannot name a snapshot file")]
    InvalidId(String),
    #[error("snapshot {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("snapshot {path}: encoding: {source}")]
    Encode {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("snapshot {path}: not a valid snapshot: {reason}")]
    Decode { path: PathBuf, reason: String },
    #[error("snapshot {path}: {size} bytes is larger than the {max} bytes allowed")]
    TooLarge { path: PathBuf, size: u64, max: u64 },
}

/// The recent history of one involved series.
#[derive(Debug, Serialize)]
struct SeriesPart {
    model_id: String,
    signal: String,
    instance: String,
    device_id: String,
    source: String,
    runtime: String,
    /// `[unix_ms, value]`, oldest first.
    points: Vec<(i64, f64)>,
}

#[derive(Serialize)]
struct Document<'a> {
    format: &'static str,
    created_at_unix_ms: i64,
    alert: &'a Alert,
    series: Vec<SeriesPart>,
    slowest_records: Vec<RequestRecord>,
    spans: Vec<SpanRow>,
    gpu: Vec<SignalPoint>,
    /// `{metric: {window: summary}}` for the alert's model (all models when it names none).
    latency: BTreeMap<&'static str, BTreeMap<&'static str, serde_json::Value>>,
    config: &'a serde_json::Value,
    /// Parts that could not be collected, and why (the snapshot is written anyway).
    errors: Vec<String>,
}

/// Delete the snapshots (and temporary files left by a crash) in `dir` last modified more than
/// `retention` before `now`; a missing directory has none. Returns how many were deleted.
/// Blocking (file I/O): call it from `spawn_blocking`.
pub fn prune_snapshots(
    dir: &Path,
    retention: std::time::Duration,
    now: std::time::SystemTime,
) -> std::io::Result<usize> {
    let Some(cutoff) = now.checked_sub(retention) else {
        return Ok(0);
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let suffix = format!(".{SNAPSHOT_EXT}");
    let mut deleted = 0;
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !(name.ends_with(&suffix) || (name.starts_with('.') && name.ends_with(".tmp"))) {
            continue;
        }
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        if meta.is_file() && meta.modified().is_ok_and(|m| m < cutoff) {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => deleted += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(deleted)
}

/// `<data_dir>/snapshots`.
pub fn snapshot_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("snapshots")
}

/// Where the snapshot of `alert_id` lives inside `dir`.
pub fn snapshot_path(dir: &Path, alert_id: &str) -> Result<PathBuf, SnapshotError> {
    let ok = !alert_id.is_empty()
        && alert_id.len() <= 200
        && !alert_id.starts_with('.')
        && alert_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !ok {
        return Err(SnapshotError::InvalidId(alert_id.into()));
    }
    Ok(dir.join(format!("{alert_id}.{SNAPSHOT_EXT}")))
}

/// Freeze the alert's context into `dir/<alert id>.json.gz` (usually `dir` =
/// [`snapshot_dir`]`(&ctx.data_dir)`), writing a temporary file and renaming it into place.
/// Blocking (store queries, file I/O): call it from `spawn_blocking`.
pub fn write_snapshot(
    dir: &Path,
    alert: &Alert,
    ctx: &SnapshotContext,
) -> Result<PathBuf, SnapshotError> {
    let path = snapshot_path(dir, &alert.id)?;
    let now_ms = chrono::Utc::now().timestamp_millis();
    let involved = involved_labels(alert);
    let model = involved.get("model_id").cloned();
    let mut errors = Vec::new();

    let (series, gpu) = collect_signals(ctx, &involved);
    let slowest_records = match slowest_records(ctx.store.as_ref(), model.as_deref(), now_ms) {
        Ok(r) => r,
        Err(e) => {
            errors.push(format!("slowest_records: {e}"));
            Vec::new()
        }
    };
    let spans = spans_of(ctx.store.as_ref(), &slowest_records, &mut errors);
    let latency = latency_summaries(ctx, model.as_deref(), now_ms);
    let doc = Document {
        format: SNAPSHOT_FORMAT,
        created_at_unix_ms: now_ms,
        alert,
        series,
        slowest_records,
        spans,
        gpu,
        latency,
        config: &ctx.config_json,
        errors,
    };

    let io = |source| SnapshotError::Io {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(|source| SnapshotError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let tmp = dir.join(format!(".{}.{}.tmp", alert.id, std::process::id()));
    let result = (|| {
        let file = std::fs::File::create(&tmp).map_err(io)?;
        let mut gz = GzEncoder::new(std::io::BufWriter::new(file), Compression::default());
        serde_json::to_writer(&mut gz, &doc).map_err(|source| SnapshotError::Encode {
            path: path.clone(),
            source,
        })?;
        let buf = gz.finish().map_err(io)?;
        let file = buf.into_inner().map_err(|e| io(e.into_error()))?;
        file.sync_all().map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(io)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map(|()| path)
}

/// The compressed bytes of a snapshot, to stream back as is (`Content-Type: application/gzip`).
pub fn read_snapshot(path: &Path) -> Result<Vec<u8>, SnapshotError> {
    let io = |source| SnapshotError::Io {
        path: path.to_path_buf(),
        source,
    };
    let size = std::fs::metadata(path).map_err(io)?.len();
    if size > MAX_SNAPSHOT_BYTES {
        return Err(SnapshotError::TooLarge {
            path: path.into(),
            size,
            max: MAX_SNAPSHOT_BYTES,
        });
    }
    std::fs::read(path).map_err(io)
}

/// Decompress and parse a snapshot (tests, tooling).
pub fn open_snapshot(path: &Path) -> Result<serde_json::Value, SnapshotError> {
    let bytes = read_snapshot(path)?;
    let mut text = Vec::new();
    GzDecoder::new(&bytes[..])
        .take(4 * MAX_SNAPSHOT_BYTES)
        .read_to_end(&mut text)
        .map_err(|e| SnapshotError::Decode {
            path: path.into(),
            reason: format!("gzip: {e}"),
        })?;
    let v: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| SnapshotError::Decode {
            path: path.into(),
            reason: format!("JSON: {e}"),
        })?;
    if v.get("format").and_then(|f| f.as_str()) != Some(SNAPSHOT_FORMAT) {
        return Err(SnapshotError::Decode {
            path: path.into(),
            reason: format!("format is not {SNAPSHOT_FORMAT}"),
        });
    }
    Ok(v)
}

/// The alert's location labels, completed by those of its latest anomaly.
fn involved_labels(alert: &Alert) -> BTreeMap<String, String> {
    let mut l: BTreeMap<String, String> = alert
        .last_event
        .as_ref()
        .map(|e| e.labels.clone())
        .unwrap_or_default();
    l.extend(alert.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    l.retain(|k, v| !v.is_empty() && matches!(k.as_str(), "model_id" | "instance" | "device_id"));
    l
}

fn collect_signals(
    ctx: &SnapshotContext,
    involved: &BTreeMap<String, String>,
) -> (Vec<SeriesPart>, Vec<SignalPoint>) {
    let board = ctx.signals.read().unwrap_or_else(|p| p.into_inner());
    let (model, instance, device) = (
        involved.get("model_id"),
        involved.get("instance"),
        involved.get("device_id"),
    );
    let latest = board.latest(None);
    // Device-level series (no model) of the instances serving the model belong to its context.
    let serving: BTreeSet<&str> = match model {
        Some(m) => latest
            .iter()
            .filter(|p| p.model_id == *m)
            .map(|p| p.instance.as_str())
            .collect(),
        None => BTreeSet::new(),
    };
    let matches = |p: &SignalPoint| {
        let model_ok = match model {
            Some(m) => {
                p.model_id == *m || (p.model_id.is_empty() && serving.contains(p.instance.as_str()))
            }
            None => true,
        };
        model_ok
            && instance.is_none_or(|i| p.instance == *i)
            && device.is_none_or(|d| p.device_id == *d)
    };
    let series = latest
        .iter()
        .filter(|p| matches(p))
        .take(MAX_SERIES)
        .map(|p| SeriesPart {
            points: board.history(&p.model_id, &p.signal, &p.instance, &p.device_id),
            model_id: p.model_id.clone(),
            signal: p.signal.clone(),
            instance: p.instance.clone(),
            device_id: p.device_id.clone(),
            source: p.source.clone(),
            runtime: p.runtime.clone(),
        })
        .collect();
    let gpu = board.devices().into_iter().take(MAX_GPU_POINTS).collect();
    (series, gpu)
}

fn slowest_records(
    store: &dyn Store,
    model: Option<&str>,
    now_ms: i64,
) -> Result<Vec<RequestRecord>, tokenwatch_store::StoreError> {
    let mut recs = store.query_records(&RecordQuery {
        model: model.map(str::to_string),
        since_unix_ms: Some(now_ms - RECORD_LOOKBACK_MS),
        limit: RECORD_SCAN_LIMIT,
        ..RecordQuery::default()
    })?;
    recs.sort_by(|a, b| b.end_s.total_cmp(&a.end_s));
    recs.truncate(SLOWEST_RECORDS);
    Ok(recs)
}

fn spans_of(
    store: &dyn Store,
    records: &[RequestRecord],
    errors: &mut Vec<String>,
) -> Vec<SpanRow> {
    let traces: BTreeSet<&str> = records
        .iter()
        .map(|r| r.trace_id.as_str())
        .filter(|t| !t.is_empty())
        .collect();
    let mut spans = Vec::new();
    for t in traces {
        if spans.len() >= MAX_SPANS {
            errors.push(format!("spans: stopped at {MAX_SPANS} spans"));
            break;
        }
        let q = SpanQuery {
            trace_id: Some(t.to_string()),
            limit: MAX_SPANS - spans.len(),
            ..Default::default()
        };
        match store.query_spans(&q) {
            Ok(s) => spans.extend(s),
            Err(e) => {
                errors.push(format!("spans of trace {t}: {e}"));
                break;
            }
        }
    }
    spans
}

fn latency_summaries(
    ctx: &SnapshotContext,
    model: Option<&str>,
    now_ms: i64,
) -> BTreeMap<&'static str, BTreeMap<&'static str, serde_json::Value>> {
    let agg = ctx.aggregator.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = BTreeMap::new();
    for metric in LatencyMetric::ALL {
        let mut per_window = BTreeMap::new();
        for window in Window::ALL {
            let q = LatencyQuery {
                model: model.map(str::to_string),
                metric,
                window,
                by: None,
            };
            let groups = agg.query(&q, now_ms);
            let v = groups
                .into_iter()
                .next()
                .map(|g| serde_json::to_value(g.summary).unwrap_or_default());
            per_window.insert(window.name(), v.unwrap_or_default());
        }
        out.insert(metric.name(), per_window);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn prune_deletes_only_old_snapshots() {
        use std::time::{Duration, SystemTime};
        let tmp = tempfile::tempdir().unwrap();
        let dir = super::snapshot_dir(tmp.path());
        assert_eq!(
            super::prune_snapshots(&dir, Duration::from_secs(60), SystemTime::now()).unwrap(),
            0,
            "no directory yet"
        );
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["old.json.gz", ".old.1.tmp", "new.json.gz", "notes.txt"] {
            std::fs::write(dir.join(name), b"x").unwrap();
        }
        // Seen from two hours on, with a one-hour retention: every file is old, but only
        // snapshots and temporary files go.
        let later = SystemTime::now() + Duration::from_secs(7200);
        std::fs::File::options()
            .write(true)
            .open(dir.join("new.json.gz"))
            .unwrap()
            .set_modified(later)
            .unwrap();
        let n = super::prune_snapshots(&dir, Duration::from_secs(3600), later).unwrap();
        assert_eq!(n, 2);
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["new.json.gz", "notes.txt"]);
    }

    use super::*;
    use std::collections::BTreeMap;
    use tokenwatch_core::aggregate::AggregatorConfig;
    use tokenwatch_core::alert::{AlertState, Severity};
    use tokenwatch_core::model::SeriesLabels;
    use tokenwatch_core::signals::{SignalBoard, names};
    use tokenwatch_store::{SqliteStore, StoreOptions};

    fn point(model: &str, signal: &str, device: &str, v: f64, ts: i64) -> SignalPoint {
        SignalPoint {
            model_id: model.into(),
            signal: signal.into(),
            value: v,
            source: "test".into(),
            runtime: "vllm".into(),
            instance: "i1".into(),
            device_id: device.into(),
            timestamp_unix_ms: ts,
            notes: BTreeMap::new(),
        }
    }

    fn record(id: usize, model: &str, now: i64, end_s: f64) -> RequestRecord {
        RequestRecord {
            request_id: format!("r{id}"),
            trace_id: format!("{id:032x}"),
            labels: SeriesLabels {
                model_id: model.into(),
                instance: "i1".into(),
                ..Default::default()
            },
            // Finished 10 s ago, so every record sits inside every window whatever the clock.
            arrival_unix_ms: now - 10_000 - (end_s * 1000.0) as i64,
            first_token_s: Some(end_s / 4.0),
            end_s,
            status: 200,
            ..Default::default()
        }
    }

    fn alert(id: &str) -> Alert {
        Alert {
            id: id.into(),
            fingerprint: "fp".into(),
            rule: "ttft_p99_spike".into(),
            labels: [("model_id".to_string(), "m1".to_string())].into(),
            annotations: BTreeMap::new(),
            severity: Severity::Critical,
            grade: Some("L2".into()),
            state: AlertState::Firing,
            active_at_unix_ms: 1,
            fired_at_unix_ms: Some(2),
            resolved_at_unix_ms: None,
            last_event: None,
            root_cause: vec![],
            incident_id: None,
            snapshot: None,
        }
    }

    #[test]
    fn snapshot_round_trips_with_every_part() {
        let tmp = tempfile::tempdir().unwrap();
        let now = chrono::Utc::now().timestamp_millis();
        let store =
            Arc::new(SqliteStore::open(&tmp.path().join("db"), StoreOptions::default()).unwrap());
        let recs: Vec<RequestRecord> = (0..80)
            .map(|i| {
                record(
                    i,
                    if i % 2 == 0 { "m1" } else { "m2" },
                    now,
                    i as f64 / 10.0,
                )
            })
            .collect();
        store.insert_records(&recs).unwrap();
        let span = SpanRow {
            trace_id: format!("{:032x}", 78),
            span_id: "00000000000000aa".into(),
            name: "llm.generate".into(),
            start_unix_nano: 1,
            end_unix_nano: 2,
            attributes_json: "{}".into(),
            ..Default::default()
        };
        store.insert_spans(std::slice::from_ref(&span)).unwrap();
        let mut board = SignalBoard::new(100, 1000);
        for t in 0..5 {
            board.update(point(
                "m1",
                names::KV_CACHE_USAGE,
                "",
                0.5 + t as f64 / 10.0,
                now - 5000 + t * 1000,
            ));
            board.update(point("m2", names::KV_CACHE_USAGE, "", 0.1, now));
            board.update(point(
                "",
                names::GPU_MEMORY_USED_BYTES,
                "GPU-0",
                1e9 + t as f64,
                now - 5000 + t * 1000,
            ));
        }
        let mut agg = Aggregator::new(AggregatorConfig::default());
        for r in &recs {
            agg.observe(r);
        }
        let ctx = SnapshotContext {
            signals: Arc::new(std::sync::RwLock::new(board)),
            store,
            aggregator: Arc::new(Mutex::new(agg)),
            config_json: serde_json::json!({"listen": "127.0.0.1:9464"}),
            data_dir: tmp.path().to_path_buf(),
            retention: std::time::Duration::from_secs(3600),
        };
        let dir = snapshot_dir(&ctx.data_dir);
        let path = write_snapshot(&dir, &alert("al-1"), &ctx).unwrap();
        assert_eq!(path, dir.join("al-1.json.gz"));
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers.len(), 1, "no temporary file left: {leftovers:?}");
        assert_eq!(
            &read_snapshot(&path).unwrap()[..2],
            &[0x1f, 0x8b],
            "gzip magic"
        );

        let v = open_snapshot(&path).unwrap();
        assert_eq!(v["alert"]["id"], "al-1");
        assert!(
            v["errors"].as_array().unwrap().is_empty(),
            "{}",
            v["errors"]
        );
        let series = v["series"].as_array().unwrap();
        let kv = series
            .iter()
            .find(|s| s["signal"] == names::KV_CACHE_USAGE && s["model_id"] == "m1")
            .unwrap();
        assert_eq!(kv["points"].as_array().unwrap().len(), 5);
        assert!(
            series.iter().all(|s| s["model_id"] != "m2"),
            "only the alert's model"
        );
        assert!(
            series.iter().any(|s| s["device_id"] == "GPU-0"),
            "device series of the same instance"
        );
        let slow = v["slowest_records"].as_array().unwrap();
        assert_eq!(slow.len(), 40, "the m1 records (40 < 50)");
        assert_eq!(slow[0]["request_id"], "r78", "slowest first");
        assert!(
            slow.windows(2)
                .all(|w| w[0]["end_s"].as_f64() >= w[1]["end_s"].as_f64())
        );
        assert_eq!(v["spans"][0]["name"], "llm.generate");
        assert_eq!(v["gpu"][0]["device_id"], "GPU-0");
        assert_eq!(v["latency"]["ttft"]["5m"]["count"], 40);
        assert_eq!(v["config"]["listen"], "127.0.0.1:9464");
    }

    #[test]
    fn rejects_ids_that_are_not_file_names() {
        for id in ["", "../x", ".hidden", "a/b", "a b"] {
            assert!(
                matches!(
                    snapshot_path(Path::new("/d"), id),
                    Err(SnapshotError::InvalidId(_))
                ),
                "{id}"
            );
        }
        assert!(snapshot_path(Path::new("/d"), "fp-1.2_x").is_ok());
    }

    #[test]
    fn open_refuses_garbage() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("x.json.gz");
        std::fs::write(&p, b"not gzip").unwrap();
        assert!(matches!(
            open_snapshot(&p),
            Err(SnapshotError::Decode { .. })
        ));
        assert!(matches!(
            read_snapshot(&tmp.path().join("missing")),
            Err(SnapshotError::Io { .. })
        ));
    }
}
