// Log templates (spec §7a): OTLP log bodies and tailed files are mined online into templates
// on a thread of their own; template anomalies go to the alert engine's root-cause history.

pub mod anomaly;
pub mod api;
pub mod drain;
pub mod file_source;
pub mod mask;
pub mod miner;

use crate::kernel::duration::HumanDuration;
use crate::kernel::telemetry::Metrics;
use file_source::{FileOffset, Tailer};
use miner::{LogLine, SavedState, TemplateMiner};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_core::alert::EventInbox;
use tokenwatch_store::LogRow;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The saved templates, counts and file positions, in the data directory.
pub const STATE_FILE: &str = "log_templates.json";
/// OTLP log lines waiting for the miner; more are dropped (counted).
const FEED_CAPACITY: usize = 65_536;
const EVALUATE_EVERY: Duration = Duration::from_secs(1);
const SAVE_EVERY: Duration = Duration::from_secs(10);

/// The miner, shared by its thread and the API.
pub type SharedMiner = Arc<Mutex<TemplateMiner>>;

/// `sources:` — sources configured as a list (files tailed into the template miner).
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SourcesConfig {
    pub files: Vec<FileSourceConfig>,
}

/// One tailed log file.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileSourceConfig {
    pub path: PathBuf,
    /// The runtime writing it (`vllm`, `sglang`, …).
    #[serde(default = "default_file_runtime")]
    pub runtime: String,
    /// The instance it belongs to [default: the path].
    #[serde(default)]
    pub instance: String,
}

fn default_file_runtime() -> String {
    "unknown".into()
}

impl FileSourceConfig {
    pub fn instance(&self) -> String {
        if self.instance.is_empty() {
            self.path.display().to_string()
        } else {
            self.instance.clone()
        }
    }
}

/// `logs:` — the template miner and its anomaly tests.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogsConfig {
    /// Mine OTLP logs and tailed files into templates.
    pub enabled: bool,
    /// Share of a template's positions a line must match to join it (0..1].
    pub similarity: f64,
    /// Leading tokens routing a line in the parse tree.
    pub prefix_tokens: usize,
    pub max_children: usize,
    pub max_templates: usize,
    /// How often tailed files are read.
    pub poll_interval: HumanDuration,
    /// A source is warmed up (new error templates become anomalies) after this many lines or
    /// this long, whichever comes first.
    pub warmup_lines: u64,
    pub warmup: HumanDuration,
    /// Rate test: one-sided Poisson p-value, fewest lines in the last minute, least ratio to
    /// the baseline's expectation, and the baseline needed first.
    pub alpha: f64,
    pub min_count: u64,
    pub min_ratio: f64,
    pub min_baseline: HumanDuration,
    /// A template of a source raises again only after this long.
    pub rearm_after: HumanDuration,
}

impl Default for LogsConfig {
    fn default() -> Self {
        LogsConfig {
            enabled: true,
            similarity: 0.5,
            prefix_tokens: 2,
            max_children: 100,
            max_templates: 5_000,
            poll_interval: HumanDuration(Duration::from_millis(250)),
            warmup_lines: 200,
            warmup: HumanDuration(Duration::from_secs(300)),
            alpha: 1e-6,
            min_count: 10,
            min_ratio: 3.0,
            min_baseline: HumanDuration(Duration::from_secs(300)),
            rearm_after: HumanDuration(Duration::from_secs(600)),
        }
    }
}

impl LogsConfig {
    /// Checks serde cannot express: (key path, message).
    pub fn validate(&self, sources: &SourcesConfig) -> Result<(), (String, String)> {
        let bad = |k: &str, m: &str| Err((format!("logs.{k}"), m.to_string()));
        if !(self.similarity > 0.0 && self.similarity <= 1.0) {
            return bad("similarity", "must be in (0, 1]");
        }
        if !(1..=8).contains(&self.prefix_tokens) {
            return bad("prefix_tokens", "must be 1 to 8");
        }
        if self.max_children < 2 {
            return bad("max_children", "must be at least 2");
        }
        if self.max_templates == 0 {
            return bad("max_templates", "must be at least 1");
        }
        if self.poll_interval.0 < Duration::from_millis(10) {
            return bad("poll_interval", "must be at least 10ms");
        }
        if !(self.alpha > 0.0 && self.alpha <= 0.01) {
            return bad(
                "alpha",
                "must be in (0, 0.01]: a loose test pages on healthy noise",
            );
        }
        if self.min_count < 3 {
            return bad("min_count", "must be at least 3");
        }
        if !(self.min_ratio.is_finite() && self.min_ratio >= 1.0) {
            return bad("min_ratio", "must be at least 1");
        }
        if self.min_baseline.0 < Duration::from_secs(60) {
            return bad("min_baseline", "must be at least 1m");
        }
        let mut seen = std::collections::HashSet::new();
        for (i, f) in sources.files.iter().enumerate() {
            if f.path.as_os_str().is_empty() {
                return Err((
                    format!("sources.files[{i}].path"),
                    "must not be empty".into(),
                ));
            }
            if !seen.insert(&f.path) {
                return Err((
                    format!("sources.files[{i}].path"),
                    format!("{} is listed twice", f.path.display()),
                ));
            }
        }
        Ok(())
    }
}

/// A log line's level. Ordered: anything at `Error` or above is "error level".
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "UPPERCASE")]
pub enum Severity {
    Unspecified,
    Trace,
    Debug,
    Info,
    Warn,
    Error,
    Fatal,
}

impl Severity {
    pub fn name(self) -> &'static str {
        match self {
            Severity::Unspecified => "UNSPECIFIED",
            Severity::Trace => "TRACE",
            Severity::Debug => "DEBUG",
            Severity::Info => "INFO",
            Severity::Warn => "WARN",
            Severity::Error => "ERROR",
            Severity::Fatal => "FATAL",
        }
    }

    /// A level word as loggers print it (`INFO`, `WARNING`, `err`, `INFO:`, `[ERROR]`).
    pub fn from_word(w: &str) -> Option<Severity> {
        let w = w.trim_matches(|c: char| matches!(c, '[' | ']' | '(' | ')' | ':' | '|' | ','));
        Some(match w.to_ascii_uppercase().as_str() {
            "TRACE" => Severity::Trace,
            "DEBUG" => Severity::Debug,
            "INFO" | "NOTICE" => Severity::Info,
            "WARN" | "WARNING" => Severity::Warn,
            "ERROR" | "ERR" => Severity::Error,
            "CRITICAL" | "FATAL" | "PANIC" => Severity::Fatal,
            _ => return None,
        })
    }

    /// OTLP's severity number (1–24), else its text.
    pub fn from_otlp(number: i32, text: &str) -> Severity {
        match number {
            1..=4 => Severity::Trace,
            5..=8 => Severity::Debug,
            9..=12 => Severity::Info,
            13..=16 => Severity::Warn,
            17..=20 => Severity::Error,
            21..=24 => Severity::Fatal,
            _ => Severity::from_word(text).unwrap_or(Severity::Unspecified),
        }
    }

    pub fn parse(s: &str) -> Option<Severity> {
        match s.to_ascii_uppercase().as_str() {
            "UNSPECIFIED" => Some(Severity::Unspecified),
            other => Severity::from_word(other),
        }
    }
}

/// The level and message of a text log line: a level word among the first tokens (vLLM's
/// `INFO 12-03 10:00:01 [file.py:1] …`, uvicorn's `INFO:     …`, `(EngineCore_0 pid=1) ERROR …`,
/// `2024-12-03 10:00:01,123 - vllm - WARNING - …`) is taken out with the timestamp around it;
/// without one, a line naming an exception or traceback is an error.
pub fn parse_line(line: &str) -> (Severity, &str) {
    let mut pos = Vec::new();
    let mut rest = line;
    // The level is looked for among the first 6 tokens; a few more for what follows it.
    for _ in 0..10 {
        let t = rest.trim_start();
        if t.is_empty() {
            break;
        }
        let start = line.len() - t.len();
        let end = start + t.find(char::is_whitespace).unwrap_or(t.len());
        pos.push((start, end));
        rest = &line[end..];
    }
    for (i, &(s, e)) in pos.iter().enumerate().take(6) {
        let Some(sev) = Severity::from_word(&line[s..e]) else {
            continue;
        };
        // Skip the timestamp and separators that follow the level.
        let mut msg_start = e;
        for &(s2, e2) in &pos[i + 1..] {
            let tok = &line[s2..e2];
            if tok == "-"
                || tok == "|"
                || mask::classify(tok.trim_end_matches(',')) == Some(mask::FieldKind::Timestamp)
            {
                msg_start = e2;
            } else {
                break;
            }
        }
        return (sev, line[msg_start..].trim());
    }
    let lower = line.to_ascii_lowercase();
    let errorish = line.contains("Error:")
        || line.contains("Exception:")
        || line.starts_with("Traceback (most recent call last)")
        || lower.contains("cuda out of memory");
    (
        if errorish {
            Severity::Error
        } else {
            Severity::Unspecified
        },
        line.trim(),
    )
}

/// An owned line on its way to the miner's thread.
#[derive(Debug, Clone)]
struct OwnedLine {
    text: String,
    severity: Severity,
    runtime: String,
    instance: String,
}

/// The OTLP receiver's way in: never blocks; a full queue drops (counted).
#[derive(Clone)]
pub struct LogFeed {
    tx: FeedSender,
    dropped: Counter,
}

/// A bounded queue of lines whose memory grows with what is queued: `std::sync::mpsc`'s
/// bounded channel allocates and writes all its slots up front (65,536 lines ≈ 6 MiB resident
/// from startup, whether any OTLP log ever arrives); its unbounded one allocates as it goes,
/// and a count of queued lines keeps the bound.
fn feed_channel(capacity: usize) -> (FeedSender, FeedReceiver) {
    let (tx, rx) = std::sync::mpsc::channel();
    let queued = Arc::new(AtomicUsize::new(0));
    (
        FeedSender {
            tx,
            queued: queued.clone(),
            capacity,
        },
        FeedReceiver { rx, queued },
    )
}

#[derive(Clone)]
struct FeedSender {
    tx: Sender<OwnedLine>,
    queued: Arc<AtomicUsize>,
    capacity: usize,
}

impl FeedSender {
    /// Queue `line` unless `capacity` lines are queued or the receiver is gone (false).
    fn try_send(&self, line: OwnedLine) -> bool {
        let reserved = self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.capacity).then_some(n + 1)
            })
            .is_ok();
        if !reserved {
            return false;
        }
        if self.tx.send(line).is_err() {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        true
    }
}

struct FeedReceiver {
    rx: Receiver<OwnedLine>,
    queued: Arc<AtomicUsize>,
}

impl FeedReceiver {
    fn took<E>(&self, got: Result<OwnedLine, E>) -> Result<OwnedLine, E> {
        if got.is_ok() {
            self.queued.fetch_sub(1, Ordering::AcqRel);
        }
        got
    }

    fn recv_timeout(&self, wait: Duration) -> Result<OwnedLine, RecvTimeoutError> {
        self.took(self.rx.recv_timeout(wait))
    }

    fn try_recv(&self) -> Result<OwnedLine, TryRecvError> {
        self.took(self.rx.try_recv())
    }
}

impl LogFeed {
    /// Offer received OTLP log records (after their text was dropped or masked). GenAI event
    /// records (prompts, completions) are not mined.
    pub fn offer_rows(&self, rows: &[LogRow]) {
        for r in rows {
            if r.body.trim().is_empty() || r.attributes_json.contains("\"event.name\":\"gen_ai.") {
                continue;
            }
            let (text, _) = crate::capture::cut(r.body.clone(), file_source::MAX_LINE_BYTES);
            let (parsed, _) = parse_line(&text);
            let severity = match Severity::from_otlp(r.severity_number, &r.severity_text) {
                Severity::Unspecified => parsed,
                s => s,
            };
            let instance = if r.service_name.is_empty() {
                "unknown".to_string()
            } else {
                r.service_name.clone()
            };
            let line = OwnedLine {
                text,
                severity,
                runtime: "otlp".into(),
                instance,
            };
            if !self.tx.try_send(line) {
                self.dropped.inc();
            }
        }
    }
}

/// The miner's self-metrics.
#[derive(Clone, Default)]
struct LogMetrics {
    file_lines: Counter,
    otlp_lines: Counter,
    dropped: Counter,
    anomalies: Counter,
    templates: Gauge,
}

impl LogMetrics {
    fn register(&self, metrics: &Metrics) {
        metrics.register(
            "tokenwatch_log_file_lines",
            "Log lines read from tailed files",
            self.file_lines.clone(),
        );
        metrics.register(
            "tokenwatch_log_otlp_lines",
            "OTLP log records mined into templates",
            self.otlp_lines.clone(),
        );
        metrics.register(
            "tokenwatch_log_lines_dropped",
            "OTLP log records not mined: the miner's queue was full",
            self.dropped.clone(),
        );
        metrics.register(
            "tokenwatch_log_template_anomalies",
            "Log-template anomaly events raised",
            self.anomalies.clone(),
        );
        metrics.register(
            "tokenwatch_log_templates",
            "Log templates known",
            self.templates.clone(),
        );
    }
}

/// What `app.rs` wires in.
pub struct Started {
    pub miner: SharedMiner,
    /// For the OTLP receiver (None when mining is off).
    pub feed: Option<LogFeed>,
    pub routes: axum::Router,
    /// Ends once the miner's thread has saved its state and stopped.
    pub task: Option<JoinHandle<()>>,
}

/// Errors reading or writing the saved state.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not a saved template state: {message}")]
    Format { path: String, message: String },
}

pub fn state_path(data_dir: &Path) -> PathBuf {
    data_dir.join(STATE_FILE)
}

/// The saved state, or None when there is none yet.
pub fn load_state(path: &Path) -> Result<Option<SavedState>, StateError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(StateError::Io {
                path: path.display().to_string(),
                source,
            });
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| StateError::Format {
            path: path.display().to_string(),
            message: e.to_string(),
        })
}

/// Write the state atomically (a temporary file renamed over the old one).
pub fn save_state(path: &Path, state: &SavedState) -> Result<(), StateError> {
    let io = |source| StateError::Io {
        path: path.display().to_string(),
        source,
    };
    let text = serde_json::to_vec(state).map_err(|e| StateError::Format {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    let tmp = path.with_extension("json.tmp");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(&text).map_err(io)?;
        f.sync_all().map_err(io)?;
    }
    std::fs::rename(&tmp, path).map_err(io)
}

/// What the miner's thread is given besides configuration: where its anomaly events go, and the
/// masker of personal data in tailed lines (`capture.mask.telemetry`; None: lines mined as read).
pub struct MinerLinks {
    pub inbox: EventInbox,
    pub masker: Option<Arc<crate::capture::mask::Masker>>,
}

/// Load the saved state (under `data_dir`), start the miner's thread (the `sources.files`,
/// OTLP lines, evaluation, saving; at the analysis priority of `runtime`) and build the API
/// routes. A missing or unreadable state starts empty (the reason is logged).
pub fn start(
    logs: &LogsConfig,
    sources: &SourcesConfig,
    data_dir: &Path,
    runtime: &crate::runtimes::RuntimeConfig,
    links: MinerLinks,
    metrics: &Metrics,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<Started> {
    let MinerLinks { inbox, masker } = links;
    let now = tokenwatch_core::clock::now_unix_ms();
    let path = state_path(data_dir);
    let (miner, files) = match load_state(&path) {
        Ok(Some(state)) => {
            let files = state.files.clone();
            match TemplateMiner::restore(logs, state, now) {
                Ok(m) => (m, files),
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "saved log templates not loaded: starting empty");
                    (TemplateMiner::new(logs, now), BTreeMap::new())
                }
            }
        }
        Ok(None) => (TemplateMiner::new(logs, now), BTreeMap::new()),
        Err(e) => {
            tracing::warn!(error = %e, "saved log templates not loaded: starting empty");
            (TemplateMiner::new(logs, now), BTreeMap::new())
        }
    };
    let miner: SharedMiner = Arc::new(Mutex::new(miner));
    let routes = api::router(miner.clone(), logs.enabled);
    if !logs.enabled {
        return Ok(Started {
            miner,
            feed: None,
            routes,
            task: None,
        });
    }
    let m = LogMetrics::default();
    m.register(metrics);
    let (tx, rx) = feed_channel(FEED_CAPACITY);
    let feed = LogFeed {
        tx,
        dropped: m.dropped.clone(),
    };
    let tailers: Vec<(Tailer, String, String)> = sources
        .files
        .iter()
        .map(|f| {
            let key = f.path.display().to_string();
            (
                Tailer::new(&f.path, files.get(&key).copied()),
                f.runtime.clone(),
                f.instance(),
            )
        })
        .collect();
    let worker = Worker {
        miner: miner.clone(),
        tailers,
        rx,
        inbox,
        metrics: m,
        masker,
        state_path: path,
        poll: logs.poll_interval.0,
        stop: stop.clone(),
        errors: BTreeMap::new(),
        dirty: false,
    };
    for f in &sources.files {
        tracing::info!(path = %f.path.display(), runtime = %f.runtime, instance = %f.instance(), "tailing log file");
    }
    let priority = crate::runtimes::analysis_priority(runtime);
    let handle = std::thread::Builder::new()
        .name("tw-log-templates".into())
        .spawn(move || {
            crate::runtimes::lower_current_thread_priority(priority);
            worker.run()
        })?;
    let mut stop = stop;
    let task = tokio::spawn(async move {
        let _ = stop.wait_for(|s| *s).await;
        let _ = tokio::task::spawn_blocking(move || handle.join()).await;
    });
    Ok(Started {
        miner,
        feed: Some(feed),
        routes,
        task: Some(task),
    })
}

/// Hand anomaly events to the alert engine (called with the miner locked, so an event is in the
/// engine's inbox before the API shows it).
fn raise(events: Vec<AnomalyEvent>, metrics: &LogMetrics, inbox: &EventInbox) {
    for e in events {
        tracing::warn!(detector = %e.detector, labels = ?e.labels, summary = %e.summary, "log template anomaly");
        metrics.anomalies.inc();
        inbox.push(e);
    }
}

struct Worker {
    miner: SharedMiner,
    tailers: Vec<(Tailer, String, String)>,
    rx: FeedReceiver,
    inbox: EventInbox,
    metrics: LogMetrics,
    /// Personal data in tailed lines is masked with it before mining (`capture.mask.telemetry`),
    /// so templates, their examples and field values never hold it. OTLP lines come masked.
    masker: Option<Arc<crate::capture::mask::Masker>>,
    state_path: PathBuf,
    poll: Duration,
    stop: watch::Receiver<bool>,
    /// The last error of each file, so one failing file logs once, not every poll.
    errors: BTreeMap<String, String>,
    /// Something changed since the state was last saved.
    dirty: bool,
}

impl Worker {
    fn run(mut self) {
        let mut last_eval = Instant::now();
        let mut last_save = Instant::now();
        let mut next_poll = Instant::now();
        loop {
            let stopping = *self.stop.borrow();
            let wait = next_poll
                .saturating_duration_since(Instant::now())
                .min(self.poll);
            let mut otlp = Vec::new();
            match self
                .rx
                .recv_timeout(if stopping { Duration::ZERO } else { wait })
            {
                Ok(l) => otlp.push(l),
                Err(RecvTimeoutError::Timeout) => {}
                // No OTLP feed (the receiver is off or gone): `recv_timeout` no longer waits, so
                // wait for the next file poll here instead of spinning.
                Err(RecvTimeoutError::Disconnected) => {
                    if !stopping {
                        std::thread::sleep(wait);
                    }
                }
            }
            while otlp.len() < 4_096
                && let Ok(l) = self.rx.try_recv()
            {
                otlp.push(l);
            }
            if !otlp.is_empty() {
                let now = tokenwatch_core::clock::now_unix_ms();
                let mut miner = self.miner.lock().unwrap_or_else(|p| p.into_inner());
                for l in &otlp {
                    let line = LogLine {
                        text: &l.text,
                        severity: l.severity,
                        runtime: &l.runtime,
                        instance: &l.instance,
                    };
                    miner.observe(&line, now);
                }
                raise(miner.take_new(), &self.metrics, &self.inbox);
                self.metrics.otlp_lines.inc_by(otlp.len() as u64);
                self.dirty = true;
            }
            if Instant::now() >= next_poll || stopping {
                next_poll = Instant::now() + self.poll;
                self.poll_files();
            }
            if last_eval.elapsed() >= EVALUATE_EVERY {
                last_eval = Instant::now();
                self.evaluate();
            }
            if stopping || (self.dirty && last_save.elapsed() >= SAVE_EVERY) {
                last_save = Instant::now();
                self.save();
            }
            if stopping {
                return;
            }
        }
    }

    fn poll_files(&mut self) {
        for (t, runtime, instance) in &mut self.tailers {
            let mut lines = Vec::new();
            let res = t.poll(&mut |l| lines.push(l.to_string()));
            let key = t.path().display().to_string();
            match res {
                Ok(()) => {
                    if self.errors.remove(&key).is_some() {
                        tracing::info!(path = %key, "log file readable again");
                    }
                }
                Err(e) => {
                    let msg = e.to_string();
                    if self.errors.get(&key) != Some(&msg) {
                        tracing::warn!(path = %key, error = %msg, "reading log file failed");
                        self.errors.insert(key, msg);
                    }
                }
            }
            if lines.is_empty() {
                continue;
            }
            // Masked before the miner is locked: the API's readers do not wait on the scans.
            let parsed: Vec<(Severity, std::borrow::Cow<'_, str>)> = lines
                .iter()
                .map(|l| {
                    let (severity, text) = parse_line(l);
                    let text = match self.masker.as_ref().and_then(|m| m.mask_free_text(text)) {
                        Some(masked) => std::borrow::Cow::Owned(masked),
                        None => std::borrow::Cow::Borrowed(text),
                    };
                    (severity, text)
                })
                .collect();
            let now = tokenwatch_core::clock::now_unix_ms();
            let mut miner = self.miner.lock().unwrap_or_else(|p| p.into_inner());
            for (severity, text) in &parsed {
                miner.observe(
                    &LogLine {
                        text,
                        severity: *severity,
                        runtime,
                        instance,
                    },
                    now,
                );
            }
            raise(miner.take_new(), &self.metrics, &self.inbox);
            self.metrics.file_lines.inc_by(lines.len() as u64);
            self.dirty = true;
        }
    }

    fn evaluate(&mut self) {
        let now = tokenwatch_core::clock::now_unix_ms();
        let (events, templates) = {
            let mut miner = self.miner.lock().unwrap_or_else(|p| p.into_inner());
            (miner.evaluate(now), miner.template_count())
        };
        self.metrics.templates.set(templates as i64);
        self.dirty |= !events.is_empty();
        raise(events, &self.metrics, &self.inbox);
    }

    fn save(&mut self) {
        let files: BTreeMap<String, FileOffset> = self
            .tailers
            .iter()
            .filter_map(|(t, _, _)| t.position().map(|p| (t.path().display().to_string(), p)))
            .collect();
        let state = self
            .miner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .save(files);
        match save_state(&self.state_path, &state) {
            Ok(()) => self.dirty = false,
            Err(e) => tracing::warn!(error = %e, "saving log templates failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CPU time (user + system, clock ticks) of each of this process's threads named `name`
    /// (as the kernel keeps it: cut to 15 bytes).
    fn thread_ticks(name: &str) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            let dir = task.path();
            let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            if comm.trim() != &name[..name.len().min(15)] {
                continue;
            }
            let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
            // Fields after the parenthesised command: state is field 3, utime 14, stime 15.
            let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks = f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
                + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            out.insert(task.file_name().to_string_lossy().into_owned(), ticks);
        }
        out
    }

    #[tokio::test]
    async fn without_an_otlp_feed_the_worker_waits_instead_of_spinning() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = crate::config::Config {
            data_dir: dir.path().to_path_buf(),
            ..Default::default()
        };
        let (stop_tx, stop) = watch::channel(false);
        let before = thread_ticks("tw-log-templates");
        let started = start(
            &cfg.logs,
            &cfg.sources,
            &cfg.data_dir,
            &cfg.runtime,
            MinerLinks {
                inbox: EventInbox::default(),
                masker: None,
            },
            &Metrics::new(),
            stop,
        )
        .unwrap();
        // Nothing will ever be offered: the OTLP side of the channel is gone.
        drop(started.feed);
        std::thread::sleep(Duration::from_millis(600));
        let mine: Vec<u64> = thread_ticks("tw-log-templates")
            .into_iter()
            .filter(|(tid, _)| !before.contains_key(tid))
            .map(|(_, t)| t)
            .collect();
        assert!(!mine.is_empty(), "the worker thread was not found");
        // 600 ms of spinning would be ~60 ticks; waiting for the 250 ms file poll is ~0.
        assert!(
            mine.iter().all(|t| *t < 15),
            "CPU ticks of the worker: {mine:?}"
        );
        stop_tx.send(true).unwrap();
        if let Some(task) = started.task {
            task.await.unwrap();
        }
    }

    #[test]
    fn levels_and_messages_are_parsed() {
        let (s, m) =
            parse_line("INFO 12-03 10:00:01 [metrics.py:455] Avg prompt throughput: 1.0 tokens/s");
        assert_eq!(
            (s, m),
            (
                Severity::Info,
                "[metrics.py:455] Avg prompt throughput: 1.0 tokens/s"
            )
        );
        let (s, m) = parse_line(
            r#"INFO:     127.0.0.1:50012 - "POST /v1/chat/completions HTTP/1.1" 200 OK"#,
        );
        assert_eq!(
            (s, m),
            (
                Severity::Info,
                r#"127.0.0.1:50012 - "POST /v1/chat/completions HTTP/1.1" 200 OK"#
            )
        );
        let (s, m) = parse_line(
            "(EngineCore_0 pid=311) ERROR 12-03 10:05:01 [core.py:700] EngineCore failed",
        );
        assert_eq!((s, m), (Severity::Error, "[core.py:700] EngineCore failed"));
        let (s, m) = parse_line("2024-12-03 10:00:01,123 - vllm.worker - WARNING - slow step");
        assert_eq!((s, m), (Severity::Warn, "slow step"));
        assert_eq!(
            parse_line("torch.OutOfMemoryError: CUDA out of memory.").0,
            Severity::Error
        );
        assert_eq!(
            parse_line("  File \"/x.py\", line 3, in f").0,
            Severity::Unspecified
        );
        assert_eq!(Severity::from_otlp(17, ""), Severity::Error);
        assert_eq!(Severity::from_otlp(0, "warning"), Severity::Warn);
        assert_eq!(Severity::from_otlp(0, ""), Severity::Unspecified);
    }

    #[test]
    fn config_is_checked_with_key_paths() {
        let c = crate::config::Config::from_yaml(
            "sources:\n  files:\n    - path: /var/log/vllm.log\n      runtime: vllm\n      instance: gpu-1\nlogs:\n  warmup_lines: 5\n",
            "c.yaml",
        )
        .unwrap();
        assert_eq!(c.sources.files[0].instance(), "gpu-1");
        assert_eq!(c.logs.warmup_lines, 5);
        let c = crate::config::Config::from_yaml("logs:\n  alpha: 1e-7\n", "c.yaml").unwrap();
        assert_eq!(c.logs.alpha, 1e-7);
        let err = crate::config::Config::from_yaml(
            "sources:\n  files:\n    - path: /x\n      runtme: vllm\n",
            "c.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("key sources.files[0]") && err.contains("runtme"),
            "{err}"
        );
        let err = crate::config::Config::from_yaml(
            "sources:\n  files:\n    - path: /x\n    - path: /x\n",
            "c.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("sources.files[1].path") && err.contains("twice"),
            "{err}"
        );
        let err = crate::config::Config::from_yaml("logs:\n  alpha: 0.5\n", "c.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("logs.alpha"), "{err}");
        let err = crate::config::Config::from_yaml("logs:\n  simlarity: 0.5\n", "c.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("key logs") && err.contains("simlarity"),
            "{err}"
        );
    }

    #[test]
    fn state_files_round_trip_and_bad_ones_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = state_path(dir.path());
        assert!(load_state(&path).unwrap().is_none(), "no state yet");
        let mut m = TemplateMiner::new(&LogsConfig::default(), 1_000);
        let line = LogLine {
            text: "Started engine process with PID 4711",
            severity: Severity::Info,
            runtime: "vllm",
            instance: "a",
        };
        m.observe(&line, 1_000);
        let files = BTreeMap::from([(
            "/l".to_string(),
            FileOffset {
                inode: 1,
                offset: 9,
            },
        )]);
        save_state(&path, &m.save(files.clone())).unwrap();
        let back = load_state(&path).unwrap().unwrap();
        assert_eq!(back.files, files);
        let r = TemplateMiner::restore(&LogsConfig::default(), back, 2_000).unwrap();
        assert_eq!(r.list(2_000, &|_| true), m.list(2_000, &|_| true));
        std::fs::write(&path, "{\"version\": 1, \"templates\": 3}").unwrap();
        let err = load_state(&path).unwrap_err().to_string();
        assert!(
            err.contains("log_templates.json") && err.contains("not a saved template state"),
            "{err}"
        );
    }

    #[test]
    fn otlp_rows_are_offered_with_their_level_and_genai_events_are_not() {
        let (tx, rx) = feed_channel(2);
        let feed = LogFeed {
            tx,
            dropped: Counter::default(),
        };
        let row = |body: &str, n: i32, attrs: &str| LogRow {
            severity_number: n,
            body: body.into(),
            service_name: "vllm".into(),
            attributes_json: attrs.into(),
            ..LogRow::default()
        };
        feed.offer_rows(&[
            row("NCCL watchdog timeout", 17, "{}"),
            row("prompt text", 9, r#"{"event.name":"gen_ai.user.message"}"#),
            row("WARNING 12-03 10:00:01 [scheduler.py:1] preempted", 0, "{}"),
            row("third fills the queue", 9, "{}"),
        ]);
        let got: Vec<OwnedLine> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(got.len(), 2);
        assert_eq!(
            (got[0].severity, got[0].instance.as_str()),
            (Severity::Error, "vllm")
        );
        assert_eq!(got[1].severity, Severity::Warn);
        assert_eq!(feed.dropped.get(), 1);
    }
}
