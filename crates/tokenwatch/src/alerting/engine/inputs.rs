// What the alert engine evaluates: compact copies of request records (fed by `AlertSink`, see
// `feed.rs`), per-model record windows, SLO counters, signal reads, and the sampled output
// embeddings and prefix-cache accesses of records or of `POST /api/v1/embeddings`.

use super::vectors::{EmbeddingSamples, PrefixLog};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use tokenwatch_core::model::{FirstToken, RequestRecord};
use tokenwatch_core::signals::SignalBoard;

pub use super::feed::{AlertSink, EmbeddingInput, EngineFeed, Input, drain};
pub use super::vectors::PrefixAccess;

/// The fields of a request record the detectors use.
#[derive(Debug, Clone, PartialEq)]
pub struct Rec {
    pub model: String,
    pub instance: String,
    pub ab_group: String,
    pub prompt_version: String,
    pub trace_id: String,
    pub request_id: String,
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
    pub finish_reason: String,
    /// The record of a request whose first token was reported while it streamed: that early
    /// copy stands for its TTFT in time-to-first-token windows, this one does not.
    pub ttft_early: bool,
}

impl Rec {
    pub fn from_record(r: &RequestRecord) -> Rec {
        Rec {
            model: r.labels.model_id.clone(),
            instance: r.labels.instance.clone(),
            ab_group: r.labels.ab_group.clone(),
            prompt_version: r.prompt_version.clone(),
            trace_id: r.trace_id.clone(),
            request_id: r.request_id.clone(),
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
            finish_reason: r.finish_reason.clone(),
            ttft_early: false,
        }
    }

    /// The early copy of a request that has its first token: TTFT only, timed at the token.
    pub fn from_first_token(f: &FirstToken) -> Rec {
        Rec {
            model: f.model_id.clone(),
            instance: f.instance.clone(),
            ab_group: String::new(),
            prompt_version: String::new(),
            trace_id: String::new(),
            request_id: f.request_id.clone(),
            at_ms: f.arrival_unix_ms + (f.first_token_s.max(0.0) * 1000.0) as i64,
            ttft: Some(f.first_token_s),
            e2e: f.first_token_s,
            itl: None,
            queue: None,
            headers: None,
            prompt_tokens: None,
            output_tokens: None,
            ok: true,
            server_failure: false,
            finish_reason: String::new(),
            ttft_early: false,
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

const SLO_BUCKET_MS: i64 = 10_000;
const SLO_RETENTION_MS: i64 = 6 * 3_600_000;

/// Per-model recent records, SLO counters, sampled embeddings and prefix-cache accesses.
pub struct Inputs {
    records: HashMap<String, VecDeque<Rec>>,
    /// Early copies of requests that have their first token (`Rec::from_first_token`).
    first_tokens: HashMap<String, VecDeque<Rec>>,
    /// Per model, the request ids in `first_tokens` whose records have not arrived yet.
    awaiting_record: HashMap<String, HashSet<String>>,
    /// (bucket start, bad, total) per model, 10 s buckets over 6 h.
    slo: HashMap<String, VecDeque<(i64, u64, u64)>>,
    embeddings: HashMap<String, EmbeddingSamples>,
    prefixes: HashMap<String, PrefixLog>,
    retention_ms: i64,
    /// How long embeddings are kept; None: they are not kept (no rule reads them).
    embedding_retention_ms: Option<i64>,
    cap_per_model: usize,
}

impl Inputs {
    pub fn new(retention_ms: i64, cap_per_model: usize) -> Inputs {
        Inputs {
            records: HashMap::new(),
            first_tokens: HashMap::new(),
            awaiting_record: HashMap::new(),
            slo: HashMap::new(),
            embeddings: HashMap::new(),
            prefixes: HashMap::new(),
            retention_ms,
            embedding_retention_ms: Some(retention_ms),
            cap_per_model: cap_per_model.max(1),
        }
    }

    /// Keep embeddings this long (the sample budget spreads over it) or, with None, not at all.
    pub fn with_embedding_retention(mut self, ms: Option<i64>) -> Inputs {
        self.embedding_retention_ms = ms.map(|m| m.max(1_000));
        self
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
    pub fn add_first_token(&mut self, r: Rec) {
        if r.request_id.is_empty() {
            return;
        }
        self.awaiting_record
            .entry(r.model.clone())
            .or_default()
            .insert(r.request_id.clone());
        let q = self.first_tokens.entry(r.model.clone()).or_default();
        if q.len() >= self.cap_per_model
            && let Some(old) = q.pop_front()
            && let Some(ids) = self.awaiting_record.get_mut(&old.model)
        {
            ids.remove(&old.request_id);
        }
        q.push_back(r);
    }

    pub fn ingest(&mut self, mut r: Rec) {
        if let Some(ids) = self.awaiting_record.get_mut(&r.model) {
            r.ttft_early = ids.remove(&r.request_id);
        }
        let b = self.slo.entry(r.model.clone()).or_default();
        let bucket = r.at_ms - r.at_ms.rem_euclid(SLO_BUCKET_MS);
        match b.back_mut() {
            Some(last) if last.0 == bucket => {
                last.1 += u64::from(r.server_failure);
                last.2 += 1;
            }
            Some(last) if last.0 > bucket => {
                // Out of order (a long request finishing late): count it in the newest bucket.
                last.1 += u64::from(r.server_failure);
                last.2 += 1;
            }
            _ => b.push_back((bucket, u64::from(r.server_failure), 1)),
        }
        let q = self.records.entry(r.model.clone()).or_default();
        if q.len() >= self.cap_per_model {
            q.pop_front();
        }
        q.push_back(r);
    }

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
                    ids.remove(&r.request_id);
                }
                q.pop_front();
            }
        }
        self.first_tokens.retain(|_, q| !q.is_empty());
        self.awaiting_record.retain(|_, ids| !ids.is_empty());
        for b in self.slo.values_mut() {
            while b
                .front()
                .is_some_and(|(t, _, _)| now - t > SLO_RETENTION_MS)
            {
                b.pop_front();
            }
        }
        self.slo.retain(|_, b| !b.is_empty());
        let keep_embeddings = self.embedding_retention_ms.unwrap_or(0);
        self.embeddings
            .retain(|_, e| !e.prune(now, keep_embeddings));
        self.prefixes.retain(|_, p| !p.prune(now, keep));
    }

    pub fn models(&self) -> Vec<String> {
        let mut m: Vec<String> = self
            .records
            .keys()
            .chain(self.slo.keys())
            .cloned()
            .collect();
        m.sort();
        m.dedup();
        m
    }

    /// Records of `model` known in `(from, to]`.
    pub fn window(&self, model: &str, from: i64, to: i64) -> impl Iterator<Item = &Rec> {
        self.records
            .get(model)
            .into_iter()
            .flatten()
            .filter(move |r| r.at_ms > from && r.at_ms <= to)
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
    ) -> impl Iterator<Item = &'a Rec> + 'a {
        let ttft = signal == "ttft";
        let early = if ttft {
            self.first_tokens.get(model)
        } else {
            None
        };
        self.window(model, from, to)
            .filter(move |r| !(ttft && r.ttft_early))
            .chain(
                early
                    .into_iter()
                    .flatten()
                    .filter(move |r| r.at_ms > from && r.at_ms <= to),
            )
    }

    /// (bad, total) of `model` over the last `span_ms`.
    pub fn counts(&self, model: &str, now: i64, span_ms: i64) -> (u64, u64) {
        self.slo
            .get(model)
            .into_iter()
            .flatten()
            .filter(|(t, _, _)| *t + SLO_BUCKET_MS > now - span_ms)
            .fold((0, 0), |(b, n), (_, bad, tot)| (b + bad, n + tot))
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
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
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
            ab_group: String::new(),
            prompt_version: String::new(),
            trace_id: String::new(),
            request_id: String::new(),
            at_ms: at,
            ttft: Some(ttft),
            e2e: ttft * 2.0,
            itl: None,
            queue: None,
            headers: None,
            prompt_tokens: None,
            output_tokens: Some(10),
            ok,
            server_failure: !ok,
            finish_reason: "stop".into(),
            ttft_early: false,
        }
    }

    #[test]
    fn windows_counts_and_pruning() {
        let mut i = Inputs::new(60_000, 1000);
        for t in 0..100 {
            i.ingest(rec("m", t * 1000, t as f64, t % 10 != 0));
        }
        assert_eq!(i.window("m", 89_000, 99_000).count(), 10);
        assert_eq!(values(i.window("m", 89_000, 99_000), "ttft").len(), 9);
        let (bad, total) = i.counts("m", 99_000, 20_000);
        assert!(total >= 20 && bad >= 2, "{bad}/{total}");
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
        i.add_first_token(Rec::from_first_token(&first));
        // Before the record: the TTFT is known at 12 s; other signals know nothing yet.
        let ttft: Vec<f64> = values(i.latency_window("m", "ttft", 11_000, 13_000), "ttft");
        assert_eq!(ttft, vec![2.0]);
        assert_eq!(i.latency_window("m", "e2e", 0, 100_000).count(), 0);
        assert_eq!(i.window("m", 0, 100_000).count(), 0);
        // The record (ended at 30 s) is not counted a second time for TTFT, but is for e2e.
        let mut r = rec("m", 30_000, 2.0, true);
        r.request_id = "r1".into();
        i.ingest(r);
        assert_eq!(i.latency_window("m", "ttft", 0, 100_000).count(), 1);
        assert_eq!(i.latency_window("m", "ttft", 29_000, 31_000).count(), 0);
        assert_eq!(i.latency_window("m", "e2e", 29_000, 31_000).count(), 1);
        // A record without an early copy (OTLP, non-streaming) counts when it ends.
        let mut other = rec("m", 40_000, 3.0, true);
        other.request_id = "r2".into();
        i.ingest(other);
        assert_eq!(
            values(i.latency_window("m", "ttft", 39_000, 41_000), "ttft"),
            vec![3.0]
        );
        // Pruning forgets the early copies with the records.
        i.prune(200_000);
        assert_eq!(i.latency_window("m", "ttft", 0, 200_000).count(), 0);
        assert!(i.awaiting_record.is_empty() && i.first_tokens.is_empty());
    }

    #[test]
    fn cap_and_quantile() {
        let mut i = Inputs::new(1_000_000, 5);
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
