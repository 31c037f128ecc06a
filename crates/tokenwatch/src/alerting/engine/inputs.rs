// What the alert engine evaluates: compact copies of request records (fed by `AlertSink`, see
// `feed.rs`), per-model record windows, SLO counters, signal reads, and the sampled output
// embeddings and prefix-cache accesses of records or of `POST /api/v1/embeddings`.

use super::kept::{KeptQueue, Timed};
use super::record::{
    EarlyTtft, Interner, Label, LatencySample, Rec, first_token_at_ms, shrink_set,
};
use super::thin::{Cuts, Schedule, read_at, sample_id};
use super::vectors::{EmbeddingSamples, PrefixLog};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use tokenwatch_core::model::FirstToken;
use tokenwatch_core::signals::SignalBoard;

pub use super::feed::{AlertSink, EmbeddingInput, EngineFeed, Input, drain};
pub use super::vectors::PrefixAccess;

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
    /// The SLOs' counts (`crate::alerting::slo`), fed by every ingested record.
    slos: crate::alerting::slo::tracker::SloTracker,
    /// The spend budgets (`crate::alerting::budget`), fed by every ingested record's cost.
    budgets: crate::alerting::budget::BudgetTracker,
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
            budgets: Default::default(),
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
    pub fn with_slos(mut self, slos: crate::alerting::slo::tracker::SloTracker) -> Inputs {
        self.slos = slos;
        self
    }

    /// The SLOs' latest statuses (refreshed by `prune`).
    pub fn with_budgets(mut self, budgets: crate::alerting::budget::BudgetTracker) -> Inputs {
        self.budgets = budgets;
        self
    }

    pub fn budgets(&self) -> &crate::alerting::budget::BudgetTracker {
        &self.budgets
    }

    pub fn slos(&self) -> &crate::alerting::slo::tracker::SloTracker {
        &self.slos
    }

    /// The SLOs, changed by a configuration reload (see `SloTracker::reconfigure`).
    pub fn slos_mut(&mut self) -> &mut crate::alerting::slo::tracker::SloTracker {
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
        self.budgets.observe(
            r.model.as_str(),
            tenant.as_str(),
            r.at_ms,
            f64::from(r.cost_usd),
        );
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
        self.budgets.publish(now);
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
    /// their record, the index of request ids that joins scores (and the scores), and the prefix-cache accesses: the engine's
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
    use crate::alerting::engine::record::rec;
    use std::sync::Arc;

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
