// Output length outliers (spec section 4): each response is tested on a robust log scale against
// the model's recent responses (an annotation, not an alert); the model-level alert tests whether
// the share of outliers — longer, shorter, or truncated at the request's own token limit — in a
// window is significantly above the model's (or instance's) baseline, and names the instances
// the outliers concentrate on (against their peers in the same window).

use crate::Finding;
use crate::robust::median_split_sigma;
use std::collections::{BTreeMap, VecDeque};

#[path = "length_attribution.rs"]
mod attribution;
#[path = "length_params.rs"]
mod params;
#[path = "length_share.rs"]
mod share;
use attribution::attribute;
pub use params::LengthOutlierParams;
use share::{CLASSES, Class, Counts, share_test};

/// The share tests of one evaluation.
#[derive(Debug, Clone, Default)]
pub struct LengthVerdict {
    /// The whole model's share test, when significant.
    pub model: Option<Finding>,
    /// Instances whose own share test (against their own baseline) is significant.
    pub instances: Vec<(String, Finding)>,
    /// Instances the outliers concentrate on, with the finding of that comparison.
    pub attributed: Vec<(String, Finding)>,
    /// Instances with tested responses in the window.
    pub serving: Vec<String>,
}

impl LengthVerdict {
    /// Nothing significant.
    pub fn is_empty(&self) -> bool {
        self.model.is_none() && self.instances.is_empty() && self.attributed.is_empty()
    }

    /// The instances the finding is about: those the outliers are attributed to; else the one
    /// instance whose own share test holds while the model's does not (the change is visible on
    /// it alone); else the only instance serving the model. Empty: model-wide.
    pub fn named(&self) -> Vec<&str> {
        if !self.attributed.is_empty() {
            return self.attributed.iter().map(|(i, _)| i.as_str()).collect();
        }
        match (
            &self.model,
            self.instances.as_slice(),
            self.serving.as_slice(),
        ) {
            (None, [(i, _)], _) => vec![i.as_str()],
            (_, _, [only]) if !self.is_empty() => vec![only.as_str()],
            _ => Vec::new(),
        }
    }

    /// Every scope with a finding of its own test or an attribution: "" for the model, else
    /// the instance (in that order, each once).
    pub fn scopes(&self) -> Vec<&str> {
        let mut out: Vec<&str> = self.model.iter().map(|_| "").collect();
        for (i, _) in self.instances.iter().chain(&self.attributed) {
            if !out.contains(&i.as_str()) {
                out.push(i);
            }
        }
        out
    }
}

/// Counts of one time bucket of one scope (the model, or one of its instances).
#[derive(Debug, Clone)]
struct Bucket {
    start: i64,
    tested: u64,
    longer: u64,
    shorter: u64,
    truncated: u64,
    /// Inside a window that tested significant: never part of a later baseline.
    flagged: bool,
}

#[derive(Debug, Clone, Default)]
struct Scope {
    buckets: VecDeque<Bucket>,
    /// Since when a share test of this scope has been significant, and the baseline it had
    /// then (kept while frozen, so the baseline does not learn the fault either).
    flagged_since: Option<(i64, Counts)>,
}

/// One model's output-length state. Keep one per model; `observe` each response, `evaluate`
/// on every engine step.
#[derive(Debug, Clone)]
pub struct LengthOutlier {
    p: LengthOutlierParams,
    window_ms: i64,
    bucket_ms: i64,
    /// (at, ln(1+L), truncated) of responses still inside the window under test.
    pending: VecDeque<(i64, f64, bool)>,
    /// ln(1+L) of the last `reference_size` responses older than the window.
    reference: VecDeque<f64>,
    /// Whether each of the last `truncated_reference_size` such responses was truncated.
    truncation: VecDeque<bool>,
    /// (median, σ below, σ above; floored) of `reference`, recomputed when it changes, and
    /// how many reference responses are themselves outliers by it (the baseline until the
    /// model has a tested history older than the window: right after start).
    stats: Option<((f64, f64, f64), Counts)>,
    /// "" is the whole model, other keys its instances.
    scopes: BTreeMap<String, Scope>,
    /// Responses that ended at or before this never join the reference: one window past the
    /// last time a share test was significant (within `max_freeze_ms` of its onset). A blow-up
    /// is then not absorbed while it is tested, nor from the responses still in the window.
    quarantine_until: i64,
}

impl LengthOutlier {
    /// `window_ms`: the window under test (the rule's `window`).
    pub fn new(p: LengthOutlierParams, window_ms: i64) -> Self {
        let window_ms = window_ms.max(1_000);
        LengthOutlier {
            bucket_ms: (window_ms / 24).max(250),
            window_ms,
            pending: VecDeque::new(),
            reference: VecDeque::with_capacity(p.reference_size),
            truncation: VecDeque::with_capacity(p.truncated_reference_size),
            stats: None,
            scopes: BTreeMap::new(),
            quarantine_until: i64::MIN,
            p,
        }
    }

    /// Responses in the reference now.
    pub fn reference_len(&self) -> usize {
        self.reference.len()
    }

    /// Tests one response of `instance` (may be empty) that ended at `at_ms` against the
    /// reference, counts it toward the share tests and keeps it for the reference. `truncated`:
    /// it stopped at its request's token limit (counted, never annotated on its own). Returns
    /// the per-request annotation when its length is an outlier. Non-finite or negative
    /// lengths are ignored.
    pub fn observe(
        &mut self,
        at_ms: i64,
        instance: &str,
        output_tokens: f64,
        truncated: bool,
    ) -> Option<Finding> {
        if !output_tokens.is_finite() || output_tokens < 0.0 {
            return None;
        }
        self.promote(at_ms);
        let x = output_tokens.ln_1p();
        let verdict = self.test(x);
        self.pending.push_back((at_ms, x, truncated));
        let (dev, outlier) = verdict?;
        let class = Class {
            longer: outlier && dev > 0.0,
            shorter: outlier && dev <= 0.0,
            truncated,
        };
        let bucket_ms = self.bucket_ms;
        self.count("", at_ms, bucket_ms, class);
        if !instance.is_empty() {
            self.count(instance, at_ms, bucket_ms, class);
        }
        outlier.then(|| self.annotation(dev, output_tokens))
    }

    /// Moves responses that left the window under test into the reference (dropping those of
    /// a quarantined period) and trims it to `reference_size`.
    fn promote(&mut self, now: i64) {
        let mut changed = false;
        while let Some(&(t, x, truncated)) = self.pending.front() {
            if t > now - self.window_ms {
                break;
            }
            self.pending.pop_front();
            if t > self.quarantine_until {
                self.reference.push_back(x);
                self.truncation.push_back(truncated);
                changed = true;
            }
        }
        while self.reference.len() > self.p.reference_size {
            self.reference.pop_front();
        }
        while self.truncation.len() > self.p.truncated_reference_size {
            self.truncation.pop_front();
        }
        if changed {
            self.stats = None;
        }
    }

    /// None: not tested (reference too small); else (ln deviation from the median, outlier?).
    fn test(&mut self, x: f64) -> Option<(f64, bool)> {
        let ((med, below, above), _) = self.reference_stats()?;
        let dev = x - med;
        let sigma = if dev < 0.0 { below } else { above };
        Some((dev, sigma > 0.0 && dev.abs() > self.p.sigmas * sigma))
    }

    /// The reference's (median, σ below, σ above) and its own outlier counts; None while it
    /// holds fewer than `min_reference` responses.
    fn reference_stats(&mut self) -> Option<((f64, f64, f64), Counts)> {
        if self.reference.len() < self.p.min_reference {
            return None;
        }
        if self.stats.is_none() {
            let v: Vec<f64> = self.reference.iter().copied().collect();
            let sp = median_split_sigma(&v)?;
            let floor = self.p.min_sigma_fraction;
            let (below, above) = (sp.below.max(floor), sp.above.max(floor));
            let k = self.p.sigmas;
            let own = Counts {
                tested: v.len() as u64,
                longer: v.iter().filter(|x| **x - sp.median > k * above).count() as u64,
                shorter: v.iter().filter(|x| sp.median - **x > k * below).count() as u64,
                truncated: self.truncation.iter().filter(|t| **t).count() as u64,
                truncated_of: self.truncation.len() as u64,
            };
            self.stats = Some(((sp.median, below, above), own));
        }
        self.stats
    }

    /// The per-request annotation of an outlier `dev` away from the reference median.
    fn annotation(&self, dev: f64, tokens: f64) -> Finding {
        let ((med, below, above), _) = self.stats.unwrap_or(((0.0, 1.0, 1.0), Counts::default()));
        let sigma = if dev < 0.0 { below } else { above };
        let median_tokens = med.exp_m1();
        let (direction, advice) = if dev > 0.0 {
            (
                "longer",
                "check for a runaway generation (missing stop token, repetition loop, prompt injection)",
            )
        } else {
            (
                "shorter",
                "check for a truncated or refused answer (error, safety filter, max_tokens)",
            )
        };
        let summary = format!(
            "a response of {tokens:.0} tokens is {:.1}σ {direction} (log scale) than the median {median_tokens:.0} \
             of the model's previous {} responses — {advice}",
            dev.abs() / sigma,
            self.reference.len()
        );
        Finding::new(dev.abs() / (self.p.sigmas * sigma), summary)
            .with("value", tokens)
            .with("output_tokens", tokens)
            .with("median", median_tokens)
            .with("log_deviation", dev)
            .with("log_sigma", sigma)
            .with("deviation_sigmas", dev.abs() / sigma)
            .with("sigmas_threshold", self.p.sigmas)
            .with("reference_samples", self.reference.len())
    }

    fn count(&mut self, scope: &str, at: i64, bucket_ms: i64, class: Class) {
        let s = self.scopes.entry(scope.to_string()).or_default();
        let start = at.div_euclid(bucket_ms) * bucket_ms;
        let flagged = s.flagged_since.is_some();
        // Mostly in order: search from the newest bucket.
        let pos = s.buckets.iter().rposition(|b| b.start <= start);
        let idx = match pos {
            Some(i) if s.buckets[i].start == start => i,
            Some(i) => {
                s.buckets.insert(
                    i + 1,
                    Bucket {
                        start,
                        tested: 0,
                        longer: 0,
                        shorter: 0,
                        truncated: 0,
                        flagged,
                    },
                );
                i + 1
            }
            None => {
                s.buckets.push_front(Bucket {
                    start,
                    tested: 0,
                    longer: 0,
                    shorter: 0,
                    truncated: 0,
                    flagged,
                });
                0
            }
        };
        let b = &mut s.buckets[idx];
        b.tested += 1;
        b.longer += u64::from(class.longer);
        b.shorter += u64::from(class.shorter);
        b.truncated += u64::from(class.truncated);
    }

    /// The share tests at `now`: the model's and each instance's share of longer, shorter or
    /// truncated responses against its own baseline, and the instances the outliers
    /// concentrate on (against their peers in the same window).
    pub fn evaluate(&mut self, now: i64) -> LengthVerdict {
        let (w, b, bucket_ms) = (self.window_ms, self.p.baseline_ms, self.bucket_ms);
        let own = self.reference_stats().map(|(_, c)| c);
        let (min, own_min) = (self.p.min_samples as u64, self.p.min_reference as u64);
        let short_w = self.p.short_window_ms;
        let two = short_w > 0 && short_w < w;
        // Per scope: the window, the short window and the baseline.
        let mut counts = Vec::with_capacity(self.scopes.len());
        for s in self.scopes.values_mut() {
            while s
                .buckets
                .front()
                .is_some_and(|x| x.start + bucket_ms <= now - w - b)
            {
                s.buckets.pop_front();
            }
            let (mut cur, mut short, mut base) =
                (Counts::default(), Counts::default(), Counts::default());
            for x in &s.buckets {
                if x.start + bucket_ms > now - w {
                    cur.add(x);
                    if x.start + bucket_ms > now - short_w {
                        short.add(x);
                    }
                } else if !x.flagged {
                    base.add(x);
                }
            }
            if let Some((t, frozen)) = s.flagged_since
                && now - t < self.p.max_freeze_ms
            {
                base = frozen;
            } else if base.tested < min
                && let Some(c) = own
            {
                // No tested history before the window yet: the reference's own tail share,
                // whose small size the Wilson bound makes conservative.
                base = c;
            }
            counts.push((cur, short, base));
        }
        let windows = |(cur, short, _): &(Counts, Counts, Counts)| {
            let mut v = vec![(*cur, w)];
            if two {
                v.push((*short, short_w));
            }
            v
        };
        let model = self
            .scopes
            .keys()
            .position(String::is_empty)
            .map(|i| (windows(&counts[i]), counts[i].2));
        let serving: Vec<String> = self
            .scopes
            .keys()
            .zip(&counts)
            .filter(|(k, c)| !k.is_empty() && c.0.tested > 0)
            .map(|(k, _)| k.clone())
            .collect();
        let tests = CLASSES * if two { 2 } else { 1 };
        let alpha = self.p.alpha / tests as f64;
        let attribution_alpha = self.p.attribution_alpha / tests as f64;
        let mut quarantine = self.quarantine_until;
        let mut verdict = LengthVerdict {
            serving,
            ..LengthVerdict::default()
        };
        for ((key, s), c) in self.scopes.iter_mut().zip(&counts) {
            let base = c.2;
            if base.tested < min.min(own_min) {
                s.flagged_since = None;
                continue;
            }
            let wins = windows(c);
            let best = |v: Vec<(f64, Finding)>| {
                v.into_iter()
                    .min_by(|a, b| a.0.total_cmp(&b.0))
                    .map(|(_, f)| f)
            };
            let finding = best(
                wins.iter()
                    .filter(|(c, _)| c.tested >= min)
                    .filter_map(|(c, win)| share_test(&self.p, c, &base, *win, alpha))
                    .collect(),
            );
            let attributed = match &model {
                Some((m, model_base)) if !key.is_empty() => best(
                    wins.iter()
                        .zip(m)
                        .filter_map(|((c, win), (mc, _))| {
                            let (inst, model) = ((c, &base), (mc, model_base));
                            attribute(&self.p, inst, model, *win, attribution_alpha)
                        })
                        .collect(),
                ),
                _ => None,
            };
            if finding.is_none() && attributed.is_none() {
                s.flagged_since = None;
                continue;
            }
            if s.flagged_since.is_none() {
                for x in s
                    .buckets
                    .iter_mut()
                    .filter(|x| x.start + bucket_ms > now - w)
                {
                    x.flagged = true;
                }
                s.flagged_since = Some((now, base));
            }
            if s.flagged_since
                .is_some_and(|(t, _)| now - t < self.p.max_freeze_ms)
            {
                // Held for one more window: a fault that dips under the test for a moment
                // does not slip into the reference.
                quarantine = now + w;
            }
            match (key.is_empty(), finding) {
                (true, f) => verdict.model = f,
                (false, Some(f)) => verdict.instances.push((key.clone(), f)),
                (false, None) => {}
            }
            if let Some(f) = attributed {
                verdict.attributed.push((key.clone(), f));
            }
        }
        self.quarantine_until = quarantine;
        self.scopes.retain(|_, s| !s.buckets.is_empty());
        verdict
    }
}

#[cfg(test)]
#[path = "length_tests.rs"]
mod tests;
