// What the alert engine evaluates: compact copies of request records (fed by `AlertSink`, see
// `feed.rs`), per-model record windows, SLO counters, signal reads, and the sampled output
// embeddings and prefix-cache accesses of records or of `POST /api/v1/embeddings`.

use super::kept::{KeptQueue, Timed};
use super::thin::{Cuts, Schedule, read_at, sample_id};
use super::vectors::{EmbeddingSamples, PrefixLog};
use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::ops::Deref;
use std::sync::{Arc, LazyLock};
use tokenwatch_core::model::{FirstToken, RequestRecord};
use tokenwatch_core::signals::SignalBoard;

pub use super::feed::{AlertSink, EmbeddingInput, EngineFeed, Input, drain};
pub use super::vectors::PrefixAccess;

/// The one empty label value every empty `Label` shares.
static EMPTY: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from(""));

/// A label value of a record (model, instance, A/B group, prompt version, finish reason). The
/// records `Inputs` keeps share one allocation per distinct value (see `Inputs::ingest`); the
/// empty value allocates nothing.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Label(Arc<str>);

impl Label {
    pub fn new(s: &str) -> Label {
        if s.is_empty() {
            Label::default()
        } else {
            Label(Arc::from(s))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for Label {
    fn default() -> Label {
        Label(EMPTY.clone())
    }
}

impl Deref for Label {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Label {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Hashes and compares as its text, so maps keyed by `Label` are looked up by `&str`.
impl Borrow<str> for Label {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Label {
    fn from(s: &str) -> Label {
        Label::new(s)
    }
}

impl From<String> for Label {
    fn from(s: String) -> Label {
        Label::new(&s)
    }
}

impl fmt::Debug for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<str> for Label {
    fn eq(&self, o: &str) -> bool {
        &*self.0 == o
    }
}

impl PartialEq<&str> for Label {
    fn eq(&self, o: &&str) -> bool {
        &*self.0 == *o
    }
}

impl PartialEq<String> for Label {
    fn eq(&self, o: &String) -> bool {
        *self.0 == **o
    }
}

/// The distinct label values of the records `Inputs` keeps. A value no record (nor map key)
/// refers to any more is forgotten at the next `prune`, so churning values do not pile up.
#[derive(Default)]
struct Interner {
    values: HashSet<Arc<str>>,
}

impl Interner {
    /// The shared copy of `s` (added when new).
    fn get(&mut self, s: &str) -> Label {
        if s.is_empty() {
            return Label::default();
        }
        if let Some(a) = self.values.get(s) {
            return Label(a.clone());
        }
        let a: Arc<str> = Arc::from(s);
        self.values.insert(a.clone());
        Label(a)
    }

    /// Makes `l` the shared copy of its value (`l`'s own becomes it when the value is new).
    fn intern(&mut self, l: &mut Label) {
        if l.is_empty() {
            return;
        }
        match self.values.get(&*l.0) {
            Some(a) if Arc::ptr_eq(a, &l.0) => {}
            Some(a) => l.0 = a.clone(),
            None => {
                self.values.insert(l.0.clone());
            }
        }
    }

    /// Forget the values only the interner still holds.
    fn prune(&mut self) {
        self.values.retain(|a| Arc::strong_count(a) > 1);
        shrink_set(&mut self.values);
    }
}

/// The fields of a request record the detectors use.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Rec {
    pub model: Label,
    pub instance: Label,
    pub ab_group: Label,
    pub prompt_version: Label,
    /// For per-tenant SLOs: counted at `Inputs::ingest`, not kept in the windows.
    pub tenant: Label,
    /// Set on the records of an evaluation (`EvalCtx::new_records`: their annotations name
    /// the request); the copies `Inputs` keeps in its windows drop it (`Inputs::ingest`).
    pub request_id: Box<str>,
    /// The request's W3C trace id, for the latency breakdown's lookup of the slowest requests'
    /// traces (all zero without one).
    pub trace_id: TraceKey,
    /// When the record became known: arrival + end.
    pub at_ms: i64,
    pub ttft: Option<f64>,
    pub e2e: f64,
    pub itl: Option<f64>,
    pub queue: Option<f64>,
    pub headers: Option<f64>,
    pub prompt_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub ok: bool,
    /// Counts against the success-rate SLO (client 4xx and cancelled requests do not).
    pub server_failure: bool,
    pub finish_reason: Label,
    /// The record of a request whose first token was reported while it streamed: that early
    /// copy stands for its TTFT in time-to-first-token windows, this one does not.
    pub ttft_early: bool,
    /// Its push sequence among its model's kept records (set by `Inputs::ingest`).
    pub seq: u64,
}

impl Timed for Rec {
    const SOURCE: u64 = 0;
    fn at_ms(&self) -> i64 {
        self.at_ms
    }
    fn seq(&self) -> u64 {
        self.seq
    }
}

impl Rec {
    pub fn from_record(r: &RequestRecord) -> Rec {
        Rec {
            model: Label::new(&r.labels.model_id),
            instance: Label::new(&r.labels.instance),
            ab_group: Label::new(&r.labels.ab_group),
            prompt_version: Label::new(&r.prompt_version),
            tenant: Label::new(&r.labels.tenant),
            request_id: r.request_id.as_str().into(),
            trace_id: TraceKey::parse(&r.trace_id),
            at_ms: r.arrival_unix_ms + (r.end_s.max(0.0) * 1000.0) as i64,
            ttft: r.first_token_s,
            e2e: r.end_s,
            itl: r.time_per_output_token_s(),
            queue: r.queue_s,
            headers: r.upstream_headers_s,
            prompt_tokens: r.prompt_tokens,
            output_tokens: r.output_tokens,
            ok: r.is_success(),
            server_failure: r.is_server_failure(),
            finish_reason: Label::new(&r.finish_reason),
            ttft_early: false,
            seq: 0,
        }
    }

    /// A per-request value by name (`ttft`, `e2e`, `itl`, `queue`, `output_tokens`, `prompt_tokens`).
    pub fn value(&self, name: &str) -> Option<f64> {
        match name {
            "ttft" => self.ttft,
            "e2e" => Some(self.e2e),
            "itl" => self.itl,
            "queue" => self.queue,
            "output_tokens" => self.output_tokens.map(|v| v as f64),
            "prompt_tokens" => self.prompt_tokens.map(|v| v as f64),
            _ => None,
        }
        .filter(|v| v.is_finite())
    }
}

/// A W3C trace id in 16 bytes (8-byte aligned, so a `Rec` grows by no more); all zero, which
/// W3C trace context forbids, stands for none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct TraceKey([u64; 2]);

impl TraceKey {
    /// From 32 hex digits; anything else is none.
    pub fn parse(s: &str) -> TraceKey {
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return TraceKey::default();
        }
        match (
            u64::from_str_radix(&s[..16], 16),
            u64::from_str_radix(&s[16..], 16),
        ) {
            (Ok(hi), Ok(lo)) => TraceKey([hi, lo]),
            _ => TraceKey::default(),
        }
    }

    /// The 32 lowercase hex digits; None for none.
    pub fn hex(self) -> Option<String> {
        (self.0 != [0, 0]).then(|| format!("{:016x}{:016x}", self.0[0], self.0[1]))
    }
}

/// When a first token became known: arrival + time to first token.
pub fn first_token_at_ms(f: &FirstToken) -> i64 {
    f.arrival_unix_ms + (f.first_token_s.max(0.0) * 1000.0) as i64
}

/// What `Inputs` keeps of a request's first token reported while it streamed (its model is
/// the key it is kept under): where and when, its TTFT, and a hash of its request id to match
/// the record when it comes.
#[derive(Debug, Clone, PartialEq)]
pub struct EarlyTtft {
    /// When the first token became known: arrival + TTFT.
    pub at_ms: i64,
    pub ttft: f64,
    pub instance: Label,
    id: u64,
    /// Its push sequence among its model's early first tokens.
    pub seq: u64,
}

impl Timed for EarlyTtft {
    const SOURCE: u64 = 1;
    fn at_ms(&self) -> i64 {
        self.at_ms
    }
    fn seq(&self) -> u64 {
        self.seq
    }
}

/// One request as a latency rule reads it (`Inputs::latency_window`): its record, or the early
/// copy of its first token standing for its TTFT.
#[derive(Debug, Clone, Copy)]
pub enum LatencySample<'a> {
    Record(&'a Rec),
    FirstToken(&'a EarlyTtft),
}

impl<'a> LatencySample<'a> {
    pub fn at_ms(self) -> i64 {
        match self {
            LatencySample::Record(r) => r.at_ms,
            LatencySample::FirstToken(f) => f.at_ms,
        }
    }

    pub fn instance(self) -> &'a str {
        match self {
            LatencySample::Record(r) => &r.instance,
            LatencySample::FirstToken(f) => &f.instance,
        }
    }

    /// A first token is of a request that got an answer.
    pub fn ok(self) -> bool {
        match self {
            LatencySample::Record(r) => r.ok,
            LatencySample::FirstToken(_) => true,
        }
    }

    /// As `Rec::value`; a first token knows its `ttft` (and `e2e` so far: the same), nothing else.
    pub fn value(self, name: &str) -> Option<f64> {
        match self {
            LatencySample::Record(r) => r.value(name),
            LatencySample::FirstToken(f) => match name {
                "ttft" | "e2e" => Some(f.ttft).filter(|v| v.is_finite()),
                _ => None,
            },
        }
    }
}

fn shrink_set<T: Eq + std::hash::Hash>(s: &mut HashSet<T>) {
    if s.capacity() > 2 * s.len() + 1024 {
        s.shrink_to_fit();
    }
}

/// The fewest records a model keeps before thinning, however many models share the budget.
pub const MIN_MODEL_BUDGET: usize = 1_000;

/// Per-model recent records, SLO counters, sampled embeddings and prefix-cache accesses.
pub struct Inputs {
    /// Per model, in chunks: memory follows what is kept, and windows skip what is outside.
    records: HashMap<Label, KeptQueue<Rec>>,
    /// Early copies of requests that have their first token (`add_first_token`).
    first_tokens: HashMap<Label, KeptQueue<EarlyTtft>>,
    /// Per model, the request ids (hashed with `ids`) in `first_tokens` whose records have not
    /// arrived yet.
    awaiting_record: HashMap<Label, HashSet<u64>>,
    /// The SLOs' counts (`crate::slo`), fed by every ingested record.
    slos: crate::slo::tracker::SloTracker,
    embeddings: HashMap<String, EmbeddingSamples>,
    prefixes: HashMap<String, PrefixLog>,
    /// Feedback and evaluation scores joined to their requests.
    scores: super::scores::ScoreBook,
    /// The label values of the kept records and early copies.
    labels: Interner,
    /// Hashes request ids (keyed per process: ids may come from clients).
    ids: RandomState,
    retention_ms: i64,
    /// How long embeddings are kept; None: they are not kept (no rule reads them).
    embedding_retention_ms: Option<i64>,
    /// Records kept per model before older ones are thinned (`super::thin`); a quarter more
    /// before the oldest are dropped. Less where `total_budget` shared by the models is less.
    cap_per_model: usize,
    /// Records kept by all models together, shared equally (see `budget`).
    total_budget: usize,
    /// Records dropped for `cap_per_model` before their retention ran out.
    evicted: u64,
    /// Records thinned out of the older part of the windows (`super::thin`).
    thinned: u64,
    /// Per model, how its kept records and early first tokens are thinned, and the cuts its
    /// queues were thinned by so far.
    thinning: HashMap<Label, (Schedule, Cuts)>,
    /// Per model, how many records and early first tokens its queues were pushed (the latency
    /// rules' incremental windows follow the queues by it).
    pushed: HashMap<Label, Pushed>,
    /// Names each model's queues as they are made (queues emptied and made again differ).
    epochs: u64,
    /// The incremental windows (`super::windows`) the latency rules, `ks_drift` and
    /// `ab_regression` share.
    latency_windows: std::sync::Mutex<super::windows::LatencyWindows>,
}

#[derive(Debug, Clone, Copy)]
struct Pushed {
    epoch: u64,
    records: u64,
    early: u64,
}

/// Where a model's kept records and early first tokens stand by push sequence: `[front, end)`
/// of each, under the `epoch` of its queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeptSeq {
    pub epoch: u64,
    pub records: (u64, u64),
    pub early: (u64, u64),
}

impl Inputs {
    pub fn new(retention_ms: i64, cap_per_model: usize) -> Inputs {
        Inputs {
            records: HashMap::new(),
            first_tokens: HashMap::new(),
            awaiting_record: HashMap::new(),
            slos: Default::default(),
            embeddings: HashMap::new(),
            prefixes: HashMap::new(),
            // Request and trace ids of the last 100,000 records (about 7 MB) join scores.
            scores: super::scores::ScoreBook::new(200_000, cap_per_model.max(1)),
            labels: Interner::default(),
            ids: RandomState::new(),
            retention_ms,
            embedding_retention_ms: Some(retention_ms),
            cap_per_model: cap_per_model.max(1),
            total_budget: usize::MAX,
            evicted: 0,
            thinned: 0,
            thinning: HashMap::new(),
            pushed: HashMap::new(),
            epochs: 0,
            latency_windows: Default::default(),
        }
    }

    /// Keep at most this many records over all models, shared equally (each at least
    /// `MIN_MODEL_BUDGET`, at most `cap_per_model`).
    pub fn with_total_budget(mut self, records: usize) -> Inputs {
        self.total_budget = records.max(1);
        self
    }

    /// New record budgets after a configuration reload (`alerting.max_records_per_model`,
    /// `alerting.max_records`): thinning steers by them from the next `prune` on.
    pub fn set_budget(&mut self, cap_per_model: usize, total: usize) {
        self.cap_per_model = cap_per_model.max(1);
        self.total_budget = total.max(1);
    }

    /// Keep embeddings this long (the sample budget spreads over it) or, with None, not at all.
    pub fn with_embedding_retention(mut self, ms: Option<i64>) -> Inputs {
        self.embedding_retention_ms = ms.map(|m| m.max(1_000));
        self
    }

    /// Count every ingested record in these SLOs.
    pub fn with_slos(mut self, slos: crate::slo::tracker::SloTracker) -> Inputs {
        self.slos = slos;
        self
    }

    /// The SLOs' latest statuses (refreshed by `prune`).
    pub fn slos(&self) -> &crate::slo::tracker::SloTracker {
        &self.slos
    }

    /// The SLOs, changed by a configuration reload (see `SloTracker::reconfigure`).
    pub fn slos_mut(&mut self) -> &mut crate::slo::tracker::SloTracker {
        &mut self.slos
    }

    /// New retentions after the rules changed (a configuration reload): what is kept now is
    /// pruned by them from the next `prune` on.
    pub fn set_retention(&mut self, retention_ms: i64, embedding_retention_ms: Option<i64>) {
        self.retention_ms = retention_ms;
        self.embedding_retention_ms = embedding_retention_ms.map(|m| m.max(1_000));
    }

    /// A model's embeddings take the dimension of its first one; others are skipped (the
    /// producers check dimensions first, so this only guards against a dimension change
    /// while older embeddings are still kept).
    pub fn add_embedding(&mut self, e: EmbeddingInput) {
        let Some(retention) = self.embedding_retention_ms else {
            return;
        };
        let s = self
            .embeddings
            .entry(e.model)
            .or_insert_with(|| EmbeddingSamples::new(e.vector.len(), retention));
        if s.dim() != e.vector.len() && s.count(i64::MIN, i64::MAX) == 0 {
            *s = EmbeddingSamples::new(e.vector.len(), retention);
        }
        s.add(e.at_ms, e.vector);
    }

    pub fn add_prefix(&mut self, p: PrefixAccess) {
        self.prefixes
            .entry(p.model)
            .or_default()
            .add(p.tenant, p.key, p.at_ms);
    }

    /// Models with sampled embeddings, sorted.
    pub fn embedding_models(&self) -> Vec<String> {
        let mut m: Vec<String> = self.embeddings.keys().cloned().collect();
        m.sort();
        m
    }

    pub fn embeddings(&self, model: &str) -> Option<&EmbeddingSamples> {
        self.embeddings.get(model)
    }

    /// Models with prefix-cache accesses, sorted.
    pub fn prefix_models(&self) -> Vec<String> {
        let mut m: Vec<String> = self.prefixes.keys().cloned().collect();
        m.sort();
        m
    }

    pub fn prefixes(&self, model: &str) -> Option<&PrefixLog> {
        self.prefixes.get(model)
    }

    /// A request's first token, ahead of its record (ids must be unique to be matched; a
    /// request without one is counted by its record instead).
    pub fn add_first_token(&mut self, f: &FirstToken) {
        if f.request_id.is_empty() {
            return;
        }
        let model = self.labels.get(&f.model_id);
        let id = self.ids.hash_one(f.request_id.as_str());
        let seq = self.pushed_to(&model).early;
        let early = EarlyTtft {
            at_ms: first_token_at_ms(f),
            ttft: f.first_token_s,
            instance: self.labels.get(&f.instance),
            id,
            seq,
        };
        self.awaiting_record
            .entry(model.clone())
            .or_default()
            .insert(id);
        let hard_cap = self.hard_cap();
        let q = self.first_tokens.entry(model.clone()).or_default();
        if q.len() >= hard_cap
            && let Some(old) = q.pop_front()
            && let Some(ids) = self.awaiting_record.get_mut(&model)
        {
            ids.remove(&old.id);
        }
        q.push_back(early);
        self.pushed_to(&model).early += 1;
    }

    /// Keep a record: its labels shared with the kept records' (see `Label`), its request id
    /// only matched against the first tokens awaiting it, then dropped.
    pub fn ingest(&mut self, mut r: Rec) {
        for l in [
            &mut r.model,
            &mut r.instance,
            &mut r.ab_group,
            &mut r.prompt_version,
            &mut r.finish_reason,
        ] {
            self.labels.intern(l);
        }
        if let Some(ids) = self.awaiting_record.get_mut(&r.model) {
            // Ids of first tokens are never empty (`add_first_token`).
            r.ttft_early =
                !r.request_id.is_empty() && ids.remove(&self.ids.hash_one(&*r.request_id));
        }
        self.scores.note_record(&r);
        self.count_verdicts();
        r.request_id = Box::default();
        let mut tenant = std::mem::take(&mut r.tenant);
        self.labels.intern(&mut tenant);
        self.slos.observe(&r, &tenant);
        let model = r.model.clone();
        r.seq = self.pushed_to(&model).records;
        let hard_cap = self.hard_cap();
        let q = self.records.entry(model.clone()).or_default();
        if q.len() >= hard_cap {
            q.pop_front();
            self.evicted += 1;
        }
        q.push_back(r);
        self.pushed_to(&model).records += 1;
    }

    /// Records a model keeps before its older ones are thinned: its share of the total budget.
    fn budget(&self) -> usize {
        let share = self.total_budget / self.records.len().max(1);
        self.cap_per_model.min(share.max(MIN_MODEL_BUDGET))
    }

    /// Kept records (or early first tokens) of a model beyond which the oldest are dropped:
    /// thinning keeps them under `budget`, short of a burst faster than it narrows.
    fn hard_cap(&self) -> usize {
        let b = self.budget();
        b + b / 4
    }

    /// How `model`'s kept samples are thinned now (`super::thin`): windows reaching back past
    /// a cut read a uniform sample.
    pub fn cuts(&self, model: &str) -> Cuts {
        self.thinning
            .get(model)
            .map(|(s, _)| *s.cuts())
            .unwrap_or_default()
    }

    /// `model`'s dense span (all samples kept) when its older samples are thinned.
    pub fn dense_ms(&self, model: &str) -> Option<i64> {
        self.thinning.get(model).and_then(|(s, _)| s.dense_ms())
    }

    fn pushed_to(&mut self, model: &Label) -> &mut Pushed {
        let epochs = &mut self.epochs;
        self.pushed.entry(model.clone()).or_insert_with(|| {
            *epochs += 1;
            Pushed {
                epoch: *epochs,
                records: 0,
                early: 0,
            }
        })
    }

    /// Where `model`'s kept samples stand by push sequence; None when it keeps nothing.
    pub fn kept_seq(&self, model: &str) -> Option<KeptSeq> {
        let p = self.pushed.get(model)?;
        let records = self
            .records
            .get(model)
            .and_then(|q| q.front())
            .map(|r| r.seq);
        let early = self
            .first_tokens
            .get(model)
            .and_then(|q| q.front())
            .map(|f| f.seq);
        Some(KeptSeq {
            epoch: p.epoch,
            records: (records.unwrap_or(p.records), p.records),
            early: (early.unwrap_or(p.early), p.early),
        })
    }

    /// `model`'s kept records pushed at or after push sequence `seq`, with theirs.
    pub fn records_since<'a>(
        &'a self,
        model: &str,
        seq: u64,
    ) -> impl Iterator<Item = (u64, &'a Rec)> + 'a {
        self.records
            .get(model)
            .into_iter()
            .flat_map(move |q| q.from_seq(seq))
            .map(|r| (r.seq, r))
    }

    /// `model`'s kept early first tokens pushed at or after push sequence `seq`, with theirs.
    pub fn early_since<'a>(
        &'a self,
        model: &str,
        seq: u64,
    ) -> impl Iterator<Item = (u64, &'a EarlyTtft)> + 'a {
        self.first_tokens
            .get(model)
            .into_iter()
            .flat_map(move |q| q.from_seq(seq))
            .map(|f| (f.seq, f))
    }

    /// The latency rules' incremental windows (a poisoned lock, after a panic while they were
    /// changed, starts them afresh).
    pub fn latency_windows(&self) -> std::sync::MutexGuard<'_, super::windows::LatencyWindows> {
        self.latency_windows.lock().unwrap_or_else(|poisoned| {
            self.latency_windows.clear_poison();
            let mut g = poisoned.into_inner();
            *g = Default::default();
            g
        })
    }

    /// Forget what is older than the retention, give back the memory of queues a burst grew,
    /// and forget label values nothing refers to any more.
    pub fn prune(&mut self, now: i64) {
        let keep = self.retention_ms;
        for q in self.records.values_mut() {
            while q.front().is_some_and(|r| now - r.at_ms > keep) {
                q.pop_front();
            }
        }
        self.records.retain(|_, q| !q.is_empty());
        for (model, q) in self.first_tokens.iter_mut() {
            while let Some(r) = q.front() {
                if now - r.at_ms <= keep {
                    break;
                }
                if let Some(ids) = self.awaiting_record.get_mut(model) {
                    ids.remove(&r.id);
                }
                q.pop_front();
            }
        }
        self.thin(now);
        self.first_tokens.retain(|_, q| !q.is_empty());
        self.awaiting_record.retain(|_, ids| !ids.is_empty());
        let (records, early) = (&self.records, &self.first_tokens);
        self.pushed
            .retain(|m, _| records.contains_key(m) || early.contains_key(m));
        let pushed = &self.pushed;
        self.thinning.retain(|m, _| pushed.contains_key(m));
        for ids in self.awaiting_record.values_mut() {
            shrink_set(ids);
        }
        self.slos.prune(now);
        let keep_embeddings = self.embedding_retention_ms.unwrap_or(0);
        self.embeddings
            .retain(|_, e| !e.prune(now, keep_embeddings));
        self.prefixes.retain(|_, p| !p.prune(now, keep));
        self.scores.prune(now, keep);
        self.labels.prune();
    }

    /// Steer each model's thinning by its kept records against its `budget` and thin its
    /// queues by it. An early first token thinned no longer awaits its record (which then
    /// stands for its TTFT itself, as a request's without one).
    fn thin(&mut self, now: i64) {
        let (cap, retention) = (self.budget(), self.retention_ms);
        for (model, q) in &mut self.records {
            let Some(oldest) = q.front().map(|r| r.at_ms) else {
                continue;
            };
            let (schedule, applied) = self.thinning.entry(model.clone()).or_default();
            schedule.step(now, (q.len(), cap), oldest, retention);
            let cuts = *schedule.cuts();
            if !cuts.moved_since(applied) {
                continue;
            }
            self.thinned += q.thin(applied, &cuts, |_| {}) as u64;
            if let Some(early) = self.first_tokens.get_mut(model) {
                let mut awaiting = self.awaiting_record.get_mut(model);
                early.thin(applied, &cuts, |f| {
                    if let Some(ids) = awaiting.as_mut() {
                        ids.remove(&f.id);
                    }
                });
            }
            *applied = cuts;
        }
    }

    /// A posted score (`POST /api/v1/feedback`, `/api/v1/scores`), joined to its request.
    pub fn add_score(&mut self, s: super::scores::ScoreInput, now: i64) {
        self.scores.add(s, now);
        self.count_verdicts();
    }

    /// Guardrail and hallucination verdicts joined to their requests count in the SLOs.
    fn count_verdicts(&mut self) {
        for (model, tenant, at, flagged) in self.scores.take_verdicts() {
            self.slos.observe_verdict(&model, &tenant, at, flagged);
        }
    }

    /// The feedback and evaluation scores, per model.
    pub fn scores(&self) -> &super::scores::ScoreBook {
        &self.scores
    }

    /// Publish the scores' trend gauges on `/metrics`.
    pub fn with_score_metrics(mut self, m: super::scores::ScoreMetrics) -> Inputs {
        self.scores =
            std::mem::replace(&mut self.scores, super::scores::ScoreBook::new(1, 1)).publishing(m);
        self
    }

    pub fn models(&self) -> Vec<String> {
        let mut m: Vec<String> = self.records.keys().map(|k| k.to_string()).collect();
        m.sort();
        m.dedup();
        m
    }

    /// Records of `model` known in `(from, to]` (chunks of kept records wholly outside are
    /// not read).
    /// Where the model's records are thinned, a window reaching back past a cut reads the
    /// uniform sample of that cut's level everywhere in it (`super::thin`).
    pub fn window(&self, model: &str, from: i64, to: i64) -> impl Iterator<Item = &Rec> {
        let lvl = self.cuts(model).window_level(from);
        self.records
            .get(model)
            .into_iter()
            .flat_map(move |q| q.overlapping(from, to))
            .filter(move |r| r.at_ms > from && r.at_ms <= to)
            .filter(move |r| read_at(sample_id(r.seq, Rec::SOURCE), lvl))
    }

    /// Records dropped because their model had `cap_per_model` kept, before their retention
    /// ran out (the windows of the longest rules then start later than configured).
    pub fn evicted_records(&self) -> u64 {
        self.evicted
    }

    /// Records thinned out of the older part of the windows since start (`super::thin`).
    pub fn thinned_records(&self) -> u64 {
        self.thinned
    }

    /// Bytes allocated for kept records and early first tokens, the ids of those awaiting
    /// their record, the incremental windows' mirrored samples and values, the index of request
    /// ids that joins scores (and the scores), and the prefix-cache accesses: the engine's
    /// per-request memory (labels are shared and not counted). Read from the containers' room,
    /// never sample by sample.
    pub fn kept_bytes(&self) -> usize {
        let records: usize = self.records.values().map(|q| q.capacity()).sum();
        let early: usize = self.first_tokens.values().map(|q| q.capacity()).sum();
        let awaiting: usize = self.awaiting_record.values().map(|s| s.capacity()).sum();
        let prefixes: usize = self.prefixes.values().map(PrefixLog::bytes).sum();
        records * size_of::<Rec>()
            + early * size_of::<EarlyTtft>()
            + super::kept::table_bytes::<u64>(awaiting)
            + self.latency_windows().bytes()
            + self.scores.bytes()
            + prefixes
    }

    /// What a latency rule reads of `signal` in `(from, to]`: the records, except that for
    /// `ttft` a request is counted when its first token arrived (the early copy, see
    /// `add_first_token`), not when it ended — a slow stream's record comes seconds later.
    pub fn latency_window<'a>(
        &'a self,
        model: &'a str,
        signal: &str,
        from: i64,
        to: i64,
    ) -> impl Iterator<Item = LatencySample<'a>> + 'a {
        let ttft = signal == "ttft";
        let early = if ttft {
            self.first_tokens.get(model)
        } else {
            None
        };
        let lvl = self.cuts(model).window_level(from);
        self.window(model, from, to)
            .filter(move |r| !(ttft && r.ttft_early))
            .map(LatencySample::Record)
            .chain(
                early
                    .into_iter()
                    .flat_map(move |q| q.overlapping(from, to))
                    .filter(move |f| f.at_ms > from && f.at_ms <= to)
                    .filter(move |f| read_at(sample_id(f.seq, EarlyTtft::SOURCE), lvl))
                    .map(LatencySample::FirstToken),
            )
    }
}

/// Values of `name` in the window, successful requests only.
pub fn values<'a>(recs: impl Iterator<Item = &'a Rec>, name: &str) -> Vec<f64> {
    recs.filter(|r| r.ok)
        .filter_map(|r| r.value(name))
        .collect()
}

/// Nearest-rank quantile of unsorted values (None when empty).
pub fn quantile(mut v: Vec<f64>, q: f64) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    sorted_rank_quantile(&v, q)
}

/// `quantile` of values already sorted (by `f64::total_cmp`).
pub fn sorted_rank_quantile(v: &[f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1])
}

/// One signal series on the board: labels and recent history.
pub struct SignalSeries {
    pub model: String,
    pub instance: String,
    pub device: String,
    pub notes: BTreeMap<String, String>,
    pub history: Vec<(i64, f64)>,
}

/// Every series of `signal` (all models, instances, devices) with its history since `since_ms`.
pub fn signal_series(board: &SignalBoard, signal: &str, since_ms: i64) -> Vec<SignalSeries> {
    board
        .latest(None)
        .into_iter()
        .filter(|p| p.signal == signal)
        .map(|p| {
            let history: Vec<(i64, f64)> = board
                .history(&p.model_id, signal, &p.instance, &p.device_id)
                .into_iter()
                .filter(|(t, _)| *t >= since_ms)
                .collect();
            SignalSeries {
                model: p.model_id,
                instance: p.instance,
                device: p.device_id,
                notes: p.notes,
                history,
            }
        })
        .collect()
}

/// History of one (model, instance, device) series since `since_ms`.
pub fn history(
    board: &SignalBoard,
    model: &str,
    signal: &str,
    instance: &str,
    device: &str,
    since_ms: i64,
) -> Vec<(i64, f64)> {
    board
        .history(model, signal, instance, device)
        .into_iter()
        .filter(|(t, _)| *t >= since_ms)
        .collect()
}

/// Latest value of `signal` for a model on an instance (any device; the highest when several).
pub fn latest(
    board: &SignalBoard,
    model: &str,
    signal: &str,
    instance: Option<&str>,
) -> Option<f64> {
    board
        .latest(Some(model))
        .into_iter()
        .filter(|p| p.signal == signal && instance.is_none_or(|i| p.instance == i))
        .map(|p| p.value)
        .reduce(f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(model: &str, at: i64, ttft: f64, ok: bool) -> Rec {
        Rec {
            model: model.into(),
            instance: "i".into(),
            at_ms: at,
            ttft: Some(ttft),
            e2e: ttft * 2.0,
            output_tokens: Some(10),
            ok,
            server_failure: !ok,
            finish_reason: "stop".into(),
            ..Rec::default()
        }
    }

    fn ttfts<'a>(s: impl Iterator<Item = LatencySample<'a>>) -> Vec<f64> {
        s.filter(|s| s.ok())
            .filter_map(|s| s.value("ttft"))
            .collect()
    }

    #[test]
    fn what_a_request_costs_the_engine() {
        // Before: 288 bytes per record (seven owned Strings) plus the heap of its strings, and
        // another full record for a first token reported early, plus its id as a String.
        let (rec, early) = (size_of::<Rec>(), size_of::<EarlyTtft>());
        println!("size_of Rec = {rec} bytes, EarlyTtft = {early} bytes");
        // 216 + the tenant label of per-tenant SLOs + the trace id (latency breakdown) + the
        // push sequence (thinning, reads by sequence).
        assert!(rec <= 256, "Rec is {rec} bytes");
        assert!(early <= 48, "EarlyTtft is {early} bytes");
        assert!(size_of::<LatencySample>() <= 16);
    }

    #[test]
    fn kept_records_share_their_labels_and_drop_their_ids() {
        let mut i = Inputs::new(60_000, 1000);
        for t in 0..3 {
            let mut r = rec("m", t * 1000, 1.0, true);
            r.request_id = format!("r{t}").into();
            i.ingest(r);
        }
        let kept: Vec<&Rec> = i.window("m", -1, 10_000).collect();
        assert_eq!(kept.len(), 3);
        assert!(kept.iter().all(|r| r.request_id.is_empty()));
        let fields: [fn(&Rec) -> Arc<str>; 2] =
            [|r| r.model.0.clone(), |r| r.finish_reason.0.clone()];
        for field in fields {
            assert!(Arc::ptr_eq(&field(kept[0]), &field(kept[2])));
        }
        // The map keys (records, push counts), the records and the interner hold the model;
        // nothing else.
        let model = kept[0].model.0.clone();
        assert_eq!(Arc::strong_count(&model), 1 + 2 + 3 + 1);
        // Empty labels all share one value, never interned.
        assert!(Arc::ptr_eq(&kept[0].ab_group.0, &Label::default().0));
        assert!(Arc::ptr_eq(
            &Label::from(String::new()).0,
            &Label::default().0
        ));
        assert!(!i.labels.values.contains(""));
        drop(model);
        // A label value nothing keeps any more is forgotten.
        i.prune(200_000);
        assert!(i.window("m", -1, i64::MAX).next().is_none());
        assert!(i.labels.values.is_empty() && i.models().is_empty());
    }

    #[test]
    fn kept_memory_follows_the_records_kept_and_the_cap_is_counted() {
        // As the engine keeps records (200,000 per model), after a run of 80,000 requests: a
        // queue that doubles would hold room for 131,072 (and both buffers while growing).
        let n: usize = 80_000;
        let mut i = Inputs::new(3_600_000, 200_000);
        for t in 0..n as i64 {
            i.ingest(rec("m", t, 1.0, true));
        }
        let per = size_of::<Rec>();
        let doubling = n.next_power_of_two() * per;
        println!(
            "kept after {n} records: {} bytes (a doubling queue: {doubling} bytes)",
            i.kept_bytes()
        );
        assert!(i.kept_bytes() >= n * per);
        assert!(i.kept_bytes() <= (n + super::super::kept::CHUNK) * per);
        assert_eq!(i.evicted_records(), 0);
        // Past the budget and a quarter (between two prunes, which thin) the oldest go, counted.
        let mut capped = Inputs::new(3_600_000, 1_000);
        for t in 0..2_500 {
            capped.ingest(rec("m", t, 1.0, true));
        }
        assert_eq!(capped.window("m", i64::MIN, i64::MAX).count(), 1_250);
        assert_eq!(capped.evicted_records(), 1_250);
        assert_eq!(
            capped
                .window("m", i64::MIN, i64::MAX)
                .next()
                .map(|r| r.at_ms),
            Some(1_250)
        );
    }

    #[test]
    fn kept_bytes_count_the_samples_the_windows_mirror() {
        use super::super::windows::{SAMPLE_BYTES, Slot};
        let n: usize = 4096;
        let mut i = Inputs::new(3_600_000, 1_000_000);
        for t in 0..n as i64 {
            let mut r = rec("m", t, 1.0 + (t % 7) as f64, t % 5 != 0);
            r.ab_group = if t % 2 == 0 { "a" } else { "b" }.into();
            i.ingest(r);
        }
        let records = i.kept_bytes();
        assert!(records >= n * size_of::<Rec>());
        // A value per sample in the one window read on each mirror.
        let per = SAMPLE_BYTES + size_of::<f64>();
        println!("mirrored per record: {SAMPLE_BYTES} bytes + 8 per window holding it");
        let now = n as i64;
        let range = (now - 60_000, now);
        let ok = (0..n).filter(|t| t % 5 != 0).count();
        let series = ("m", "e2e", "e2e");
        {
            let mut lw = i.latency_windows();
            assert!(lw.sync(&i, series, 60_000, now));
            let all = lw.window(series, now, None, Slot::Current(60_000), range);
            // The successful records: 4 in 5.
            assert_eq!(all.map(<[f64]>::len), Some(ok));
        }
        let latency = i.kept_bytes() - records;
        assert!(
            latency >= ok * per && latency <= 2 * ok * per,
            "{latency} bytes for {ok} samples"
        );
        // The arms' mirror counts every record with an arm, failed ones too.
        {
            let mut lw = i.latency_windows();
            assert!(lw.sync_arms(&i, ("m", "e2e"), 60_000, now));
            for arm in ["a", "b"] {
                let v = lw.arm_window(("m", "e2e"), now, arm, Slot::Current(60_000), range);
                assert!(v.is_some_and(|v| !v.is_empty()));
            }
        }
        let arms = i.kept_bytes() - records - latency;
        let lines = n * SAMPLE_BYTES + ok * size_of::<f64>();
        assert!(
            arms >= lines && arms <= 2 * lines,
            "{arms} bytes for {n} records ({ok} with values)"
        );
        // The records go: their samples go with them.
        let later = now + 10_000_000;
        i.prune(later);
        assert!(!i.latency_windows().sync(&i, series, 60_000, later));
        let arms = ("m", "e2e");
        assert!(!i.latency_windows().sync_arms(&i, arms, 60_000, later));
        assert_eq!(i.kept_bytes(), 0);
    }

    #[test]
    fn a_burst_does_not_pin_its_memory() {
        let mut i = Inputs::new(10_000, 1_000_000);
        for t in 0..20_000 {
            i.ingest(rec("m", t, 1.0, true));
            i.add_first_token(&FirstToken {
                request_id: format!("r{t}"),
                model_id: "m".into(),
                instance: "i".into(),
                arrival_unix_ms: t,
                first_token_s: 0.0,
            });
        }
        assert!(i.records["m"].capacity() >= 20_000);
        assert!(i.awaiting_record["m"].capacity() >= 20_000);
        // The newest 100 ms are kept.
        i.prune(29_900);
        assert_eq!(i.window("m", i64::MIN, i64::MAX).count(), 100);
        assert!(i.records["m"].capacity() <= 100 + 2 * super::super::kept::CHUNK);
        assert!(i.first_tokens["m"].capacity() <= 2 * 100 + 1024);
        assert!(i.awaiting_record["m"].capacity() <= 2 * 100 + 1024);
    }

    #[test]
    fn windows_counts_and_pruning() {
        let mut i = Inputs::new(60_000, 1000);
        for t in 0..100 {
            i.ingest(rec("m", t * 1000, t as f64, t % 10 != 0));
        }
        assert_eq!(i.window("m", 89_000, 99_000).count(), 10);
        assert_eq!(values(i.window("m", 89_000, 99_000), "ttft").len(), 9);
        i.prune(100_000);
        assert!(i.window("m", 0, 39_000).next().is_none());
        assert_eq!(i.models(), vec!["m".to_string()]);
    }

    #[test]
    fn a_first_token_counts_its_request_once_at_the_token() {
        let mut i = Inputs::new(60_000, 1000);
        let first = FirstToken {
            request_id: "r1".into(),
            model_id: "m".into(),
            instance: "a".into(),
            arrival_unix_ms: 10_000,
            first_token_s: 2.0,
        };
        i.add_first_token(&first);
        // Before the record: the TTFT is known at 12 s; other signals know nothing yet.
        assert_eq!(
            ttfts(i.latency_window("m", "ttft", 11_000, 13_000)),
            vec![2.0]
        );
        let s = i
            .latency_window("m", "ttft", 11_000, 13_000)
            .next()
            .unwrap();
        assert_eq!(
            (s.at_ms(), s.instance(), s.value("e2e")),
            (12_000, "a", Some(2.0))
        );
        assert_eq!(s.value("prompt_tokens"), None);
        assert_eq!(i.latency_window("m", "e2e", 0, 100_000).count(), 0);
        assert_eq!(i.window("m", 0, 100_000).count(), 0);
        // The record (ended at 30 s) is not counted a second time for TTFT, but is for e2e.
        let mut r = rec("m", 30_000, 2.0, true);
        r.request_id = "r1".into();
        i.ingest(r);
        assert!(i.window("m", 0, 100_000).all(|r| r.ttft_early));
        assert_eq!(i.latency_window("m", "ttft", 0, 100_000).count(), 1);
        assert_eq!(i.latency_window("m", "ttft", 29_000, 31_000).count(), 0);
        assert_eq!(i.latency_window("m", "e2e", 29_000, 31_000).count(), 1);
        // A record without an early copy (OTLP, non-streaming) counts when it ends; so does
        // one without an id.
        let mut other = rec("m", 40_000, 3.0, true);
        other.request_id = "r2".into();
        i.ingest(other);
        assert_eq!(
            ttfts(i.latency_window("m", "ttft", 39_000, 41_000)),
            vec![3.0]
        );
        i.ingest(rec("m", 45_000, 4.0, true));
        assert_eq!(
            ttfts(i.latency_window("m", "ttft", 44_000, 46_000)),
            vec![4.0]
        );
        // Pruning forgets the early copies with the records.
        i.prune(200_000);
        assert_eq!(i.latency_window("m", "ttft", 0, 200_000).count(), 0);
        assert!(i.awaiting_record.is_empty() && i.first_tokens.is_empty());
    }

    #[test]
    fn the_oldest_first_token_over_the_cap_stops_awaiting_its_record() {
        let mut i = Inputs::new(1_000_000, 2);
        for n in 0..3 {
            i.add_first_token(&FirstToken {
                request_id: format!("r{n}"),
                model_id: "m".into(),
                instance: "a".into(),
                arrival_unix_ms: n,
                first_token_s: 1.0,
            });
        }
        for n in [0, 2] {
            let mut r = rec("m", 10_000 + n, 1.0, true);
            r.request_id = format!("r{n}").into();
            i.ingest(r);
        }
        let early: Vec<bool> = i.window("m", 0, i64::MAX).map(|r| r.ttft_early).collect();
        assert_eq!(early, [false, true]);
    }

    #[test]
    fn past_the_budget_old_records_are_thinned_to_a_uniform_sample_over_the_whole_retention() {
        use super::super::windows::{LatencyWindows, Slot};
        // 200 requests/s for 40 minutes against a budget of 20,000 and 35 minutes' retention
        // (the drift rules' 7 windows of 5 minutes): the e2e of a request is its minute.
        let (retention, budget) = (35 * 60_000, 20_000);
        let mut i = Inputs::new(retention, budget);
        let mut lw = LatencyWindows::default();
        let series = ("m", "e2e", "e2e");
        let (t0, end) = (1_700_000_000_000i64, 40 * 60_000);
        let mut most = 0;
        for t in (0..end).step_by(5) {
            let mut r = rec("m", t0 + t, 1.0, t % 50 != 0);
            r.e2e = (t / 60_000) as f64;
            i.ingest(r);
            if t % 250 == 0 {
                i.prune(t0 + t);
                most = most.max(i.records["m"].len());
                if t % 60_000 == 0 {
                    // A latency rule reading 6 minutes keeps its mirror in step.
                    assert!(lw.sync(&i, series, 360_000, t0 + t));
                }
            }
        }
        let now = t0 + end - 5;
        assert!(most <= budget + budget / 4, "kept up to {most}");
        assert_eq!(
            i.evicted_records(),
            0,
            "thinned, never evicted at a steady rate"
        );
        let dense = i.dense_ms("m").expect("thinned");
        assert!((2_000..60_000).contains(&dense), "dense span {dense} ms");
        // The dense span is read whole.
        let recent = i.window("m", now - dense / 2, now).count() as i64;
        assert!(
            (recent - dense / 2 / 5).abs() <= 1,
            "{recent} in {} ms",
            dense / 2
        );
        // The drift rules' reference (the six windows before the last) is a uniform sample of
        // its whole span: as many of each minute, within chance.
        let (from, to) = (now - retention, now - 5 * 60_000);
        let mut per_minute = BTreeMap::<i64, usize>::new();
        for r in i.window("m", from, to) {
            *per_minute.entry(r.e2e as i64).or_default() += 1;
        }
        let full: Vec<usize> = per_minute.values().copied().skip(1).take(28).collect();
        assert_eq!(full.len(), 28, "{per_minute:?}");
        let mean = full.iter().sum::<usize>() as f64 / full.len() as f64;
        assert!(mean >= 20.0, "{mean} a minute");
        for n in &full {
            assert!(
                (*n as f64 - mean).abs() < 5.0 * mean.sqrt() + 2.0,
                "{per_minute:?}"
            );
        }
        // The mirrored windows read what the records read, thinned the same way.
        assert!(lw.sync(&i, series, 360_000, now));
        for (slot, range) in [
            (Slot::Current(30_000), (now - 30_000, now)),
            (Slot::Baseline(300_000), (now - 330_000, now - 30_000)),
        ] {
            let mut want = values(i.window("m", range.0, range.1), "e2e");
            want.sort_by(f64::total_cmp);
            let got = lw
                .window(series, now, None, slot, range)
                .map(<[f64]>::to_vec);
            assert_eq!(got, Some(want), "{slot:?}");
        }
        // The mirror dropped what the records' thinning dropped.
        let kept_bytes = i.kept_bytes();
        assert!(
            kept_bytes < 3 * budget * size_of::<Rec>(),
            "{kept_bytes} bytes"
        );
    }

    #[test]
    fn a_reloaded_budget_steers_the_thinning_from_the_next_prunes() {
        let mut i = Inputs::new(3_600_000, 1_000_000).with_total_budget(1_000_000);
        for t in 0..20_000 {
            i.ingest(rec("m", t * 10, 1.0, true));
        }
        let now = 200_000;
        i.prune(now);
        assert_eq!((i.thinned_records(), i.dense_ms("m")), (0, None));
        // Two models share 8,000: 4,000 each.
        i.set_budget(1_000_000, 8_000);
        i.ingest(rec("other", now, 1.0, true));
        for k in 1..=40 {
            i.prune(now + k * 250);
        }
        let kept = i.records["m"].len();
        assert!((2_000..=4_000).contains(&kept), "kept {kept}");
        assert_eq!(i.evicted_records(), 0);
        assert!(i.dense_ms("m").is_some());
        // The whole span is still read, as a uniform sample.
        assert!(i.window("m", -1, 1_000).count() > 0);
    }

    #[test]
    fn cap_and_quantile() {
        // A budget of 4 keeps 5 between two prunes.
        let mut i = Inputs::new(1_000_000, 4);
        for t in 0..10 {
            i.ingest(rec("m", t, 1.0, true));
        }
        assert_eq!(i.window("m", -1, 100).count(), 5);
        assert_eq!(quantile(vec![], 0.99), None);
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(v.clone(), 0.99), Some(99.0));
        assert_eq!(quantile(v, 0.5), Some(50.0));
    }
}
