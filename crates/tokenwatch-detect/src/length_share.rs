// The share tests of the output length outlier detector: per window, the counts of longer,
// shorter and truncated responses against the baseline's, by one-sided binomial tests.

use super::{Bucket, LengthOutlierParams};
use crate::Finding;
use crate::robust::{binomial_sf, wilson_upper};

/// The share-test classes: longer, shorter, truncated.
pub(super) const CLASSES: usize = 3;

/// Which share-test classes one tested response counts toward.
#[derive(Debug, Clone, Copy)]
pub(super) struct Class {
    pub(super) longer: bool,
    pub(super) shorter: bool,
    pub(super) truncated: bool,
}

/// Tested responses and outliers per class, summed over buckets.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Counts {
    pub(super) tested: u64,
    pub(super) longer: u64,
    pub(super) shorter: u64,
    pub(super) truncated: u64,
    /// The responses `truncated` is out of: `tested`, except for the reference's own counts.
    pub(super) truncated_of: u64,
}

impl Counts {
    pub(super) fn add(&mut self, b: &Bucket) {
        self.tested += b.tested;
        self.longer += b.longer;
        self.shorter += b.shorter;
        self.truncated += b.truncated;
        self.truncated_of += b.tested;
    }

    /// These counts without `part`'s (a scope's window without one of its instances').
    pub(super) fn minus(&self, part: &Counts) -> Counts {
        Counts {
            tested: self.tested.saturating_sub(part.tested),
            longer: self.longer.saturating_sub(part.longer),
            shorter: self.shorter.saturating_sub(part.shorter),
            truncated: self.truncated.saturating_sub(part.truncated),
            truncated_of: self.truncated_of.saturating_sub(part.truncated_of),
        }
    }
}

/// One class's test result.
pub(super) struct ClassTest {
    pub(super) share: f64,
    /// The baseline's own share, and the rate tested against (Wilson upper bound, floored).
    pub(super) observed: f64,
    pub(super) rate: f64,
    /// The least share that counts as an effect (see `min_ratio`, `truncated_min_odds_ratio`).
    pub(super) needed: f64,
    pub(super) p_value: f64,
    /// The baseline's responses.
    pub(super) base_n: u64,
}

/// One class's one-sided binomial test: `k` of `n` against `kb` of `nb` (its Wilson upper
/// bound, floored), with the class's effect size; None when not significant at `alpha`, below
/// the effect size, or without a baseline.
pub(super) fn class_test(
    p: &LengthOutlierParams,
    (k, n): (u64, u64),
    (kb, nb): (u64, u64),
    truncated: bool,
    alpha: f64,
) -> Option<ClassTest> {
    if n == 0 {
        return None;
    }
    let (observed, rate, needed) = effect_floor(p, (kb, nb), truncated)?;
    let share = k as f64 / n as f64;
    if share < needed {
        return None;
    }
    let p_value = binomial_sf(k, n, rate);
    (p_value < alpha).then_some(ClassTest {
        share,
        observed,
        rate,
        needed,
        p_value,
        base_n: nb,
    })
}

/// Against `kb` of `nb`: (the observed rate, the rate tested against — its Wilson upper bound,
/// floored —, the least share that counts as an effect); None without a baseline.
pub(super) fn effect_floor(
    p: &LengthOutlierParams,
    (kb, nb): (u64, u64),
    truncated: bool,
) -> Option<(f64, f64, f64)> {
    let floor = if truncated {
        p.truncated_min_baseline_rate
    } else {
        p.min_baseline_rate
    };
    let rate = wilson_upper(kb, nb, p.baseline_z)?.max(floor);
    let needed = if truncated {
        let odds = p.truncated_min_odds_ratio * rate / (1.0 - rate).max(f64::EPSILON);
        odds / (1.0 + odds)
    } else {
        p.min_ratio * rate
    };
    Some((kb as f64 / nb.max(1) as f64, rate, needed))
}

/// The classes as (name, count in `c`, whether it is the truncated class).
pub(super) fn classes(c: &Counts) -> [(&'static str, u64, bool); CLASSES] {
    [
        ("longer", c.longer, false),
        ("shorter", c.shorter, false),
        ("truncated", c.truncated, true),
    ]
}

/// (pattern, what the outliers are, advice) of a class, for summaries and evidence.
pub(super) fn wording(dir: &str) -> (&'static str, &'static str, &'static str) {
    match dir {
        "longer" => (
            "longer than normal",
            "are longer than normal (length outliers on a log scale)",
            "look for runaway generations (missing stop tokens, repetition loops, a changed max_tokens or prompt)",
        ),
        "shorter" => (
            "shorter than normal",
            "are shorter than normal (length outliers on a log scale)",
            "look for truncated or refused answers (errors, safety filter, a lowered max_tokens)",
        ),
        _ => (
            "cut off at their token limit, more often than normal",
            "were cut off at their request's token limit (finish_reason \"length\")",
            "look for runaway generations that only max_tokens stops (missing stop tokens, repetition loops, a changed prompt or sampling settings) or a lowered max_tokens",
        ),
    }
}

/// One-sided binomial tests of the window's longer, shorter and truncated counts against the
/// baseline's rates, each at `alpha`; the most significant class is reported with its p-value
/// (on a tie, the larger effect).
pub(super) fn share_test(
    p: &LengthOutlierParams,
    cur: &Counts,
    base: &Counts,
    window_ms: i64,
    alpha: f64,
) -> Option<(f64, Finding)> {
    let base_of = |kb: u64, truncated: bool| {
        if truncated {
            (kb, base.truncated_of)
        } else {
            (kb, base.tested)
        }
    };
    let base_k = classes(base);
    let (dir, k, t) = classes(cur)
        .iter()
        .zip(base_k)
        .filter_map(|(&(dir, k, truncated), (_, kb, _))| {
            class_test(p, (k, cur.tested), base_of(kb, truncated), truncated, alpha)
                .map(|t| (dir, k, t))
        })
        .min_by(|a, b| {
            a.2.p_value
                .total_cmp(&b.2.p_value)
                .then((b.2.share / b.2.needed).total_cmp(&(a.2.share / a.2.needed)))
        })?;
    let (pattern, what, advice) = wording(dir);
    let n = cur.tested;
    let summary = format!(
        "{:.1}% of the last {:.0} s of responses ({k} of {n}) {what}, against a baseline of {:.1}% \
         (tested at {:.1}%, p = {:.1e}) — {advice}",
        t.share * 100.0,
        window_ms as f64 / 1000.0,
        t.observed * 100.0,
        t.rate * 100.0,
        t.p_value
    );
    Some((
        t.p_value,
        Finding::new(t.share / t.needed, summary)
            .with("value", t.share)
            .with("direction", dir)
            .with("pattern", pattern)
            .with("outlier_share", t.share)
            .with("outliers", k)
            .with("tested", n)
            .with("longer", cur.longer)
            .with("shorter", cur.shorter)
            .with("truncated", cur.truncated)
            .with("baseline_rate", t.observed)
            .with("baseline_rate_tested", t.rate)
            .with("baseline_tested", t.base_n)
            .with("p_value", t.p_value)
            .with("alpha", p.alpha)
            .with("window_s", window_ms as f64 / 1000.0),
    ))
}
