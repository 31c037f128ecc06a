// The template miner's state: the Drain tree, per (template, source) counts, 10 s buckets of
// the last hour, examples and field values; the anomaly tests; the state saved across restarts.

use super::anomaly::{RateTestParams, TemplateClass, rate_jump};
use super::drain::{Added, Cluster, Drain, DrainParams};
use super::file_source::FileOffset;
use super::mask::{FieldKind, mask};
use super::{LogsConfig, Severity};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::{BTreeMap, HashMap, VecDeque};
use tokenwatch_core::alert::AnomalyEvent;

const BUCKET_MS: i64 = 10_000;
/// Buckets in the recent window of the rate test (one minute).
const RECENT_BUCKETS: i64 = 6;
/// Buckets kept: one hour, the longest baseline.
const KEPT_BUCKETS: i64 = 360;
const EXAMPLES: usize = 3;
const FIELD_EXAMPLES: usize = 3;
/// Fields per template whose example values are kept.
const MAX_FIELDS: usize = 16;
/// Version of the saved state; another version is not loaded.
pub const STATE_VERSION: u32 = 1;

/// One log line offered to the miner.
#[derive(Debug, Clone, Copy)]
pub struct LogLine<'a> {
    pub text: &'a str,
    pub severity: Severity,
    pub runtime: &'a str,
    pub instance: &'a str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SourceKey {
    pub runtime: String,
    pub instance: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct SourceStats {
    first_seen_ms: i64,
    lines: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FieldExamples {
    pub kind: FieldKind,
    pub examples: Vec<String>,
}

/// The last anomaly a (template, source) raised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnomalyMark {
    /// `new_error_template` or `rate_jump`.
    pub kind: String,
    pub detector: String,
    pub at_unix_ms: i64,
}

/// Counts of one template from one source.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    severity: Severity,
    count: u64,
    first_seen_ms: i64,
    last_seen_ms: i64,
    /// (bucket index, lines), ascending, the last `KEPT_BUCKETS` only.
    buckets: VecDeque<(i64, u32)>,
    examples: VecDeque<String>,
    fields: Vec<FieldExamples>,
    anomaly: Option<AnomalyMark>,
}

impl Entry {
    fn new(now: i64, severity: Severity) -> Entry {
        Entry {
            severity,
            count: 0,
            first_seen_ms: now,
            last_seen_ms: now,
            buckets: VecDeque::new(),
            examples: VecDeque::new(),
            fields: Vec::new(),
            anomaly: None,
        }
    }

    fn prune(&mut self, now: i64) {
        let oldest = now.div_euclid(BUCKET_MS) - KEPT_BUCKETS;
        while self.buckets.front().is_some_and(|(b, _)| *b < oldest) {
            self.buckets.pop_front();
        }
    }

    fn lines_between(&self, from_bucket: i64, to_bucket: i64) -> u64 {
        self.buckets
            .iter()
            .filter(|(b, _)| *b >= from_bucket && *b <= to_bucket)
            .map(|(_, n)| u64::from(*n))
            .sum()
    }
}

/// A template as the API lists it (one row per template and source).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TemplateView {
    pub id: String,
    pub template: String,
    pub class: TemplateClass,
    pub severity: Severity,
    pub count: u64,
    /// Lines per minute over the last 5 minutes.
    pub rate_per_min: f64,
    pub count_last_minute: u64,
    pub first_seen_unix_ms: i64,
    pub last_seen_unix_ms: i64,
    pub examples: Vec<String>,
    pub fields: Vec<FieldExamples>,
    pub source: SourceKey,
    pub last_anomaly: Option<AnomalyMark>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct SavedTemplate {
    id: String,
    tokens: Vec<String>,
    path: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct SavedEntry {
    template_id: String,
    source: SourceKey,
    #[serde(flatten)]
    entry: Entry,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct SavedSource {
    source: SourceKey,
    #[serde(flatten)]
    stats: SourceStats,
}

/// Everything that survives a restart: templates with their tree paths, counts, and the read
/// position of each tailed file (saved together, so a restart neither loses nor doubles lines).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedState {
    version: u32,
    templates: Vec<SavedTemplate>,
    sources: Vec<SavedSource>,
    entries: Vec<SavedEntry>,
    pub files: BTreeMap<String, FileOffset>,
}

pub struct TemplateMiner {
    cfg: LogsConfig,
    drain: Drain,
    classes: Vec<TemplateClass>,
    entries: HashMap<(usize, SourceKey), Entry>,
    sources: HashMap<SourceKey, SourceStats>,
    /// New-template anomalies found while observing, handed out by the next `evaluate`.
    pending: Vec<AnomalyEvent>,
    /// When this process started mining: time before it is no baseline (nothing was counted).
    started_ms: i64,
    /// Lines that would have started a template beyond `max_templates`.
    pub refused: u64,
}

fn params(cfg: &LogsConfig) -> DrainParams {
    DrainParams {
        prefix_tokens: cfg.prefix_tokens,
        similarity: cfg.similarity,
        max_children: cfg.max_children,
        max_templates: cfg.max_templates,
    }
}

impl TemplateMiner {
    pub fn new(cfg: &LogsConfig, now_ms: i64) -> TemplateMiner {
        TemplateMiner {
            cfg: cfg.clone(),
            drain: Drain::new(params(cfg)),
            classes: Vec::new(),
            entries: HashMap::new(),
            sources: HashMap::new(),
            pending: Vec::new(),
            started_ms: now_ms,
            refused: 0,
        }
    }

    pub fn template_count(&self) -> usize {
        self.drain.clusters().len()
    }

    fn warm(&self, src: &SourceKey, now: i64) -> bool {
        self.sources.get(src).is_some_and(|s| {
            s.lines > self.cfg.warmup_lines
                || now - s.first_seen_ms >= self.cfg.warmup.0.as_millis() as i64
        })
    }

    /// Mine one line at `now_ms`.
    pub fn observe(&mut self, line: &LogLine, now_ms: i64) {
        let masked = mask(line.text);
        if masked.tokens.is_empty() {
            return;
        }
        let (idx, new) = match self.drain.add(&masked.tokens) {
            Added::New(i) => {
                self.classes
                    .push(TemplateClass::of(&masked.tokens.join(" ")));
                (i, true)
            }
            Added::Joined(i, _) => (i, false),
            Added::Refused => {
                self.refused += 1;
                return;
            }
        };
        let src = SourceKey {
            runtime: line.runtime.to_string(),
            instance: line.instance.to_string(),
        };
        let warm = self.warm(&src, now_ms);
        let stats = self.sources.entry(src.clone()).or_insert(SourceStats {
            first_seen_ms: now_ms,
            lines: 0,
        });
        stats.lines += 1;
        let e = self
            .entries
            .entry((idx, src.clone()))
            .or_insert_with(|| Entry::new(now_ms, line.severity));
        e.severity = e.severity.max(line.severity);
        e.count += 1;
        e.last_seen_ms = e.last_seen_ms.max(now_ms);
        let b = now_ms.div_euclid(BUCKET_MS);
        match e.buckets.back_mut() {
            Some((last, n)) if *last == b => *n = n.saturating_add(1),
            _ => e.buckets.push_back((b, 1)),
        }
        e.prune(now_ms);
        let text = line.text.trim();
        if !e.examples.iter().any(|x| x == text) {
            if e.examples.len() >= EXAMPLES {
                e.examples.pop_front();
            }
            e.examples.push_back(text.to_string());
        }
        for (i, (kind, value)) in masked.fields.into_iter().take(MAX_FIELDS).enumerate() {
            if e.fields.len() <= i {
                e.fields.push(FieldExamples {
                    kind,
                    examples: Vec::new(),
                });
            }
            let f = &mut e.fields[i];
            if f.kind == kind && !f.examples.contains(&value) {
                if f.examples.len() >= FIELD_EXAMPLES {
                    f.examples.remove(0);
                }
                f.examples.push(value);
            }
        }
        if new && warm && line.severity >= Severity::Error {
            let class = self.classes[idx];
            if let Some(detector) = class.detector(true, true) {
                let ev = self.event(idx, &src, detector, "new_error_template", now_ms, json!({}));
                self.pending.push(ev);
            }
        }
    }

    fn event(
        &mut self,
        idx: usize,
        src: &SourceKey,
        detector: &str,
        kind: &str,
        now: i64,
        extra: serde_json::Value,
    ) -> AnomalyEvent {
        let c: &Cluster = self.drain.cluster(idx);
        let class = self.classes[idx];
        let template = c.text();
        let e = self.entries.get_mut(&(idx, src.clone()));
        let (severity, examples, count) = match &e {
            Some(e) => (
                e.severity,
                e.examples.iter().cloned().collect::<Vec<_>>(),
                e.count,
            ),
            None => (Severity::Unspecified, Vec::new(), 0),
        };
        if let Some(e) = e {
            e.anomaly = Some(AnomalyMark {
                kind: kind.to_string(),
                detector: detector.to_string(),
                at_unix_ms: now,
            });
        }
        let mut evidence: BTreeMap<String, serde_json::Value> = BTreeMap::new();
        evidence.insert("kind".into(), json!(kind));
        evidence.insert("template_id".into(), json!(c.id));
        evidence.insert("template".into(), json!(template));
        evidence.insert("class".into(), json!(class.name()));
        evidence.insert("severity".into(), json!(severity.name()));
        evidence.insert("examples".into(), json!(examples));
        evidence.insert("count".into(), json!(count));
        if let serde_json::Value::Object(m) = extra {
            evidence.extend(m);
        }
        let short: String = template.chars().take(160).collect();
        let what = match kind {
            "rate_jump" => "log template jumped against its baseline",
            _ => "new log template at error level",
        };
        let example = examples.last().map(|x| {
            let x: String = x.chars().take(200).collect();
            format!(" — e.g. {x:?}")
        });
        AnomalyEvent {
            detector: detector.to_string(),
            signal: format!("log_template:{}", class.name()),
            labels: BTreeMap::from([
                ("runtime".to_string(), src.runtime.clone()),
                ("instance".to_string(), src.instance.clone()),
                ("template_id".to_string(), c.id.clone()),
            ]),
            score: 1.0,
            at_unix_ms: now,
            evidence,
            summary: format!(
                "{what} on {}/{}: [{}] {short}{}",
                src.runtime,
                src.instance,
                severity.name(),
                example.unwrap_or_default()
            ),
        }
    }

    /// The new-template anomalies found since the last call (the miner's thread raises them
    /// right after the lines that made them, before an alert they explain can fire).
    pub fn take_new(&mut self) -> Vec<AnomalyEvent> {
        std::mem::take(&mut self.pending)
    }

    /// The anomalies at `now_ms`: new error templates seen since the last call, and the rate
    /// test of every template that can raise one (classified, or warning level and above). A
    /// (template, source) raises again only after `rearm_after` without raising.
    pub fn evaluate(&mut self, now_ms: i64) -> Vec<AnomalyEvent> {
        let mut out = std::mem::take(&mut self.pending);
        let p = RateTestParams {
            alpha: self.cfg.alpha,
            min_count: self.cfg.min_count,
            min_ratio: self.cfg.min_ratio,
            min_baseline_ms: self.cfg.min_baseline.0.as_millis() as i64,
        };
        let rearm = self.cfg.rearm_after.0.as_millis() as i64;
        let cur = now_ms.div_euclid(BUCKET_MS);
        let recent_from = cur - (RECENT_BUCKETS - 1);
        let recent_start_ms = recent_from * BUCKET_MS;
        let mut jumps = Vec::new();
        for ((idx, src), e) in self.entries.iter_mut() {
            e.prune(now_ms);
            let class = self.classes[*idx];
            let Some(detector) =
                class.detector(e.severity >= Severity::Error, e.severity >= Severity::Warn)
            else {
                continue;
            };
            if e.anomaly
                .as_ref()
                .is_some_and(|a| now_ms - a.at_unix_ms < rearm)
            {
                continue;
            }
            let first_seen = self.sources.get(src).map_or(now_ms, |s| s.first_seen_ms);
            let base_start_ms = (cur - KEPT_BUCKETS + 1).max(0) * BUCKET_MS;
            let base_start_ms = base_start_ms.max(first_seen).max(self.started_ms);
            let baseline_ms = recent_start_ms - base_start_ms;
            let recent = e.lines_between(recent_from, cur);
            let baseline = e.lines_between(base_start_ms.div_euclid(BUCKET_MS), recent_from - 1);
            if let Some(j) = rate_jump(recent, now_ms - recent_start_ms, baseline, baseline_ms, &p)
            {
                jumps.push((*idx, src.clone(), detector, j));
            }
        }
        for (idx, src, detector, j) in jumps {
            let extra = json!({
                "count_recent": j.recent_count,
                "recent_s": j.recent_ms as f64 / 1000.0,
                "expected_recent": j.expected,
                "baseline_count": j.baseline_count,
                "baseline_s": j.baseline_ms as f64 / 1000.0,
                "p_value": j.p_value,
            });
            let mut ev = self.event(idx, &src, detector, "rate_jump", now_ms, extra);
            ev.score = (j.recent_count as f64 / j.expected.max(1e-9)).max(1.0);
            out.push(ev);
        }
        out
    }

    /// Templates by source, most frequent first; `filter` keeps a row.
    pub fn list(&self, now_ms: i64, filter: &dyn Fn(&TemplateView) -> bool) -> Vec<TemplateView> {
        let cur = now_ms.div_euclid(BUCKET_MS);
        let mut out: Vec<TemplateView> = self
            .entries
            .iter()
            .map(|((idx, src), e)| {
                let c = self.drain.cluster(*idx);
                let five = e.lines_between(cur - 5 * RECENT_BUCKETS + 1, cur);
                let span_ms = (now_ms - (cur - 5 * RECENT_BUCKETS + 1) * BUCKET_MS).max(1);
                TemplateView {
                    id: c.id.clone(),
                    template: c.text(),
                    class: self.classes[*idx],
                    severity: e.severity,
                    count: e.count,
                    rate_per_min: five as f64 * 60_000.0 / span_ms as f64,
                    count_last_minute: e.lines_between(cur - RECENT_BUCKETS + 1, cur),
                    first_seen_unix_ms: e.first_seen_ms,
                    last_seen_unix_ms: e.last_seen_ms,
                    examples: e.examples.iter().cloned().collect(),
                    fields: e.fields.clone(),
                    source: src.clone(),
                    last_anomaly: e.anomaly.clone(),
                }
            })
            .filter(|v| filter(v))
            .collect();
        out.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then_with(|| a.id.cmp(&b.id))
                .then_with(|| a.source.cmp(&b.source))
        });
        out
    }

    pub fn save(&self, files: BTreeMap<String, FileOffset>) -> SavedState {
        let clusters = self.drain.clusters();
        let mut entries: Vec<SavedEntry> = self
            .entries
            .iter()
            .map(|((idx, src), e)| SavedEntry {
                template_id: clusters[*idx].id.clone(),
                source: src.clone(),
                entry: e.clone(),
            })
            .collect();
        entries.sort_by(|a, b| {
            a.template_id
                .cmp(&b.template_id)
                .then_with(|| a.source.cmp(&b.source))
        });
        let mut sources: Vec<SavedSource> = self
            .sources
            .iter()
            .map(|(k, s)| SavedSource {
                source: k.clone(),
                stats: s.clone(),
            })
            .collect();
        sources.sort_by(|a, b| a.source.cmp(&b.source));
        SavedState {
            version: STATE_VERSION,
            templates: clusters
                .iter()
                .map(|c| SavedTemplate {
                    id: c.id.clone(),
                    tokens: c.tokens.clone(),
                    path: c.path.clone(),
                })
                .collect(),
            sources,
            entries,
            files,
        }
    }

    /// A miner holding `state` (templates of another version are not loaded: Err).
    pub fn restore(
        cfg: &LogsConfig,
        state: SavedState,
        now_ms: i64,
    ) -> Result<TemplateMiner, String> {
        if state.version != STATE_VERSION {
            return Err(format!(
                "saved state version {} (expected {STATE_VERSION})",
                state.version
            ));
        }
        let mut m = TemplateMiner::new(cfg, now_ms);
        let mut by_id: HashMap<String, usize> = HashMap::new();
        for t in state.templates {
            if by_id.contains_key(&t.id) || t.path.is_empty() || t.tokens.is_empty() {
                continue;
            }
            let class = TemplateClass::of(&t.tokens.join(" "));
            let id = t.id.clone();
            let i = m.drain.restore(Cluster {
                id: t.id,
                tokens: t.tokens,
                path: t.path,
            });
            m.classes.push(class);
            by_id.insert(id, i);
        }
        for s in state.sources {
            m.sources.insert(s.source, s.stats);
        }
        for e in state.entries {
            if let Some(&i) = by_id.get(&e.template_id) {
                m.entries.insert((i, e.source), e.entry);
            }
        }
        Ok(m)
    }
}

#[cfg(test)]
#[path = "miner_tests.rs"]
mod tests;
