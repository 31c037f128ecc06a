// Tests of the truncated class of the output length detector: the share of responses cut off at
// their token limit, against the model's own truncation rate, never a per-request annotation.

use super::*;

#[test]
fn the_truncated_share_is_tested_against_the_models_own_truncation_rate() {
    let p = LengthOutlierParams::default();
    let c = |tested, truncated| Counts {
        tested,
        longer: 0,
        shorter: 0,
        truncated,
        truncated_of: tested,
    };
    let test = |cur: Counts, base: Counts| share_test(&p, &cur, &base, 120_000, p.alpha / 6.0);
    // 12 % truncated is this model's normal: 15 % is not a finding, nor is 40 % (drift of the
    // lengths against fixed limits, and chance in a 15 s window, move it a lot); 55 % is (odds
    // ratio ≥ 6 against the baseline's upper bound).
    let usual = c(5_000, 600);
    assert!(test(c(1000, 150), usual).is_none());
    assert!(test(c(1000, 400), usual).is_none());
    let (_, f) = test(c(1000, 550), usual).expect("55 % against 12 %");
    assert_eq!(f.evidence["direction"], "truncated");
    assert_eq!(f.evidence["truncated"], 550);
    assert!(
        f.summary.contains("finish_reason \"length\""),
        "{}",
        f.summary
    );
    // Never truncated before: the floor (5 %) keeps a handful from paging.
    assert!(test(c(200, 12), c(5_000, 0)).is_none());
    assert!(test(c(200, 60), c(5_000, 0)).is_some());
    // A workload truncated 60 % of the time: 2× its rate is out of reach, 6× its odds (~90 %)
    // is not.
    let often = c(5_000, 3_000);
    assert!(test(c(500, 400), often).is_none(), "80 %");
    assert!(test(c(500, 460), often).is_some(), "92 %");

    // In the detector: a truncated response alone is no annotation; a window where most are is
    // a finding for the model and the instance, even with ordinary lengths.
    let mut d = LengthOutlier::new(p, 10_000);
    let mut at = 0;
    for i in 0..600 {
        let len = 180.0 + f64::from((i * 7 % 41) as u32);
        assert!(d.observe(at, "a", len, i % 10 == 0).is_none());
        at += 100;
        if i % 10 == 0 {
            assert!(
                d.evaluate(at).is_empty(),
                "10 % truncated is this model's normal"
            );
        }
    }
    for i in 0..100 {
        let len = 180.0 + f64::from((i * 7 % 41) as u32);
        assert!(
            d.observe(at, "a", len, i % 5 != 0).is_none(),
            "never annotated"
        );
        at += 100;
    }
    let found = d.evaluate(at);
    assert_eq!(found.scopes(), ["", "a"], "80 % truncated against 10 %");
    let model = found.model.iter().map(|f| ("", f));
    let all = model.chain(found.instances.iter().map(|(i, f)| (i.as_str(), f)));
    assert!(
        all.into_iter()
            .all(|(_, f)| f.evidence["direction"] == "truncated")
    );
}
