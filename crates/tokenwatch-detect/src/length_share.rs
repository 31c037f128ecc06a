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
}

/// One class's test result.
struct ClassTest {
    share: f64,
    /// The baseline's own share, and the rate tested against (Wilson upper bound, floored).
    observed: f64,
    rate: f64,
    /// The least share that counts as an effect (see `min_ratio`, `truncated_min_odds_ratio`).
    needed: f64,
    p_value: f64,
    /// The baseline's responses.
    base_n: u64,
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
    let test = |k: u64, kb: u64, truncated: bool| -> Option<ClassTest> {
        let nb = if truncated {
            base.truncated_of
        } else {
            base.tested
        };
        let observed = kb as f64 / nb as f64;
        let floor = if truncated {
            p.truncated_min_baseline_rate
        } else {
            p.min_baseline_rate
        };
        let rate = wilson_upper(kb, nb, p.baseline_z)?.max(floor);
        let share = k as f64 / cur.tested as f64;
        let needed = if truncated {
            let odds = p.truncated_min_odds_ratio * rate / (1.0 - rate).max(f64::EPSILON);
            odds / (1.0 + odds)
        } else {
            p.min_ratio * rate
        };
        if share < needed {
            return None;
        }
        let p_value = binomial_sf(k, cur.tested, rate);
        (p_value < alpha).then_some(ClassTest {
            share,
            observed,
            rate,
            needed,
            p_value,
            base_n: nb,
        })
    };
    let classes = [
        ("longer", cur.longer, base.longer),
        ("shorter", cur.shorter, base.shorter),
        ("truncated", cur.truncated, base.truncated),
    ];
    let (dir, k, t) = classes
        .iter()
        .filter_map(|&(dir, k, kb)| test(k, kb, dir == "truncated").map(|t| (dir, k, t)))
        .min_by(|a, b| {
            a.2.p_value
                .total_cmp(&b.2.p_value)
                .then((b.2.share / b.2.needed).total_cmp(&(a.2.share / a.2.needed)))
        })?;
    let (pattern, what, advice) = match dir {
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
    };
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
