// Attribution of the output length detector's findings to instances: an instance whose share of
// outliers in the window is significantly above its peers' in the same window and its own baseline.

use super::LengthOutlierParams;
use super::share::{ClassTest, Counts, class_test, classes, effect_floor, wording};
use crate::Finding;

/// Whether the outliers of one window concentrate on one instance: for some class, at least
/// `attribution_min_outliers` of the instance's `inst` responses are outliers, their share is
/// significantly above (one-sided binomial at `alpha`, with the class's effect size) both the
/// share of the model's other responses in the same window (`model` − `inst`) and the
/// instance's own `base`line, and the other responses' share is itself below that effect size
/// against the model's baseline (`model_base`): a change on every instance is nobody's.
/// Comparing peers in the same window cancels what moves the whole model (load swings, prompt
/// mix, drift); comparing with its own past cancels what keeps one instance apart (sticky
/// routing). Returns the class whose larger p-value of the two is the smallest, as (that
/// p-value, finding).
pub(super) fn attribute(
    p: &LengthOutlierParams,
    (inst, base): (&Counts, &Counts),
    (model, model_base): (&Counts, &Counts),
    window_ms: i64,
    alpha: f64,
) -> Option<(f64, Finding)> {
    let peers = model.minus(inst);
    let of = |c: &Counts, truncated: bool| {
        if truncated { c.truncated_of } else { c.tested }
    };
    let (dir, k, kp, vs_peers, vs_own) = classes(inst)
        .into_iter()
        .zip(classes(&peers))
        .zip(classes(base).into_iter().zip(classes(model_base)))
        .filter(|(((_, k, _), _), _)| *k >= p.attribution_min_outliers)
        .filter_map(
            |(((dir, k, truncated), (_, kp, _)), ((_, kb, _), (_, km, _)))| {
                let (_, _, normal) = effect_floor(p, (km, of(model_base, truncated)), truncated)?;
                if kp as f64 >= normal * peers.tested as f64 {
                    return None;
                }
                let n = (k, inst.tested);
                let vs_peers = class_test(p, n, (kp, peers.tested), truncated, alpha)?;
                let vs_own = class_test(p, n, (kb, of(base, truncated)), truncated, alpha)?;
                Some((dir, k, kp, vs_peers, vs_own))
            },
        )
        .min_by(|a, b| worst(&a.3, &a.4).total_cmp(&worst(&b.3, &b.4)))?;
    let p_value = worst(&vs_peers, &vs_own);
    let (pattern, what, advice) = wording(dir);
    let n = inst.tested;
    let summary = format!(
        "{:.1}% of this instance's responses of the last {:.0} s ({k} of {n}) {what}, against \
         {:.1}% on the model's other instances in the same window ({kp} of {}) and a baseline of \
         {:.1}% (p = {p_value:.1e}) — {advice}",
        vs_own.share * 100.0,
        window_ms as f64 / 1000.0,
        vs_peers.observed * 100.0,
        peers.tested,
        vs_own.observed * 100.0,
    );
    let score = (vs_peers.share / vs_peers.needed).min(vs_own.share / vs_own.needed);
    Some((
        p_value,
        Finding::new(score, summary)
            .with("value", vs_own.share)
            .with("direction", dir)
            .with("pattern", pattern)
            .with("outlier_share", vs_own.share)
            .with("outliers", k)
            .with("tested", n)
            .with("longer", inst.longer)
            .with("shorter", inst.shorter)
            .with("truncated", inst.truncated)
            .with("peer_rate", vs_peers.observed)
            .with("peer_rate_tested", vs_peers.rate)
            .with("peer_tested", peers.tested)
            .with("peer_p_value", vs_peers.p_value)
            .with("baseline_rate", vs_own.observed)
            .with("baseline_rate_tested", vs_own.rate)
            .with("baseline_tested", vs_own.base_n)
            .with("baseline_p_value", vs_own.p_value)
            .with("p_value", p_value)
            .with("alpha", p.attribution_alpha)
            .with("window_s", window_ms as f64 / 1000.0),
    ))
}

/// The larger p-value of the two tests: both must hold.
fn worst(a: &ClassTest, b: &ClassTest) -> f64 {
    a.p_value.max(b.p_value)
}
