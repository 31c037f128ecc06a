// The engine's compact copy of a request: what its detectors and the SLO tracker read of each
// record (`Rec`) and of a first token reported while the request streamed (`EarlyTtft`), with
// label values shared through one interner and trace ids in 16 bytes.

use super::kept::Timed;
use std::borrow::Borrow;
use std::collections::HashSet;
use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, LazyLock};
use tokenwatch_core::model::{FirstToken, RequestRecord};

/// The one empty label value every empty `Label` shares.
static EMPTY: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from(""));

/// A label value of a record (model, instance, A/B group, prompt version, finish reason). The
/// records `Inputs` keeps share one allocation per distinct value (see `Inputs::ingest`); the
/// empty value allocates nothing.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Label(pub(super) Arc<str>);

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
pub(super) struct Interner {
    pub(super) values: HashSet<Arc<str>>,
}

impl Interner {
    /// The shared copy of `s` (added when new).
    pub(super) fn get(&mut self, s: &str) -> Label {
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
    pub(super) fn intern(&mut self, l: &mut Label) {
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
    pub(super) fn prune(&mut self) {
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
    /// The request's cost (`cost_usd`), for the budgets; 0 when unpriced. An f32 (7 significant
    /// digits: well under a cent on any budget) fits beside the flags without growing `Rec`.
    pub cost_usd: f32,
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
            cost_usd: r.cost_usd.unwrap_or(0.0) as f32,
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
    pub(super) id: u64,
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

pub(super) fn shrink_set<T: Eq + std::hash::Hash>(s: &mut HashSet<T>) {
    if s.capacity() > 2 * s.len() + 1024 {
        s.shrink_to_fit();
    }
}

/// A record of `model` known at `at` (ms) with time to first token `ttft` (s), end to end twice
/// that, 10 output tokens, successful or a server failure: the engine's tests' plain record.
#[cfg(test)]
pub(crate) fn rec(model: &str, at: i64, ttft: f64, ok: bool) -> Rec {
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
