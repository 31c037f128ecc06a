// Tests of the attribution of output length findings to instances: a blow-up on one instance
// of four is named by its peers' share in the same window; one on every instance is nobody's.

use super::*;

#[test]
fn outliers_are_attributed_to_the_one_instance_they_concentrate_on() {
    // ×4 on one instance of four: attributed by its peers' share in the same window and its own
    // baseline — capped at each request's max_tokens by the truncated share, uncapped by the
    // longer share — and never another instance. A Pareto-tailed model moves by only ~1.7σ:
    // its instance's own test names it first (the model's share is still normal), the
    // attribution follows on the long window.
    let from = 2_400_000;
    for (shape, within, attributed_within, direction) in [
        (Shape::ParetoTail, 60.0, 120.0, "longer"),
        (Shape::CappedLogNormal, 20.0, 20.0, "longer"),
        (Shape::MaxTokens, 15.0, 15.0, "truncated"),
    ] {
        let one = Fault {
            from_ms: from,
            to_ms: i64::MAX,
            factor: 4.0,
            instance: Some(2),
        };
        let run = simulate(shape, 0.75, 9, Some(one));
        let (t, _) = run
            .named
            .iter()
            .find(|(_, n)| !n.is_empty())
            .expect("an instance was named");
        let after = (t - from) as f64 / 1000.0;
        assert!(after <= within, "named after {after} s");
        let wrong = run
            .named
            .iter()
            .find(|(t, n)| *t < from || n.len() > 1 || n.iter().any(|i| i != "i2"));
        assert!(
            wrong.is_none(),
            "named before the fault or a healthy instance: {wrong:?}"
        );
        let (t, _, f) = run
            .attributed
            .iter()
            .find(|(t, _, _)| *t >= from)
            .expect("the blow-up was attributed");
        let after = (t - from) as f64 / 1000.0;
        assert!(after <= attributed_within, "attributed after {after} s");
        assert_eq!(f.evidence["direction"], direction, "{}", f.summary);
        assert!(f.summary.contains("other instances"), "{}", f.summary);
        let peer = f.evidence["peer_rate"].as_f64().unwrap();
        let share = f.evidence["outlier_share"].as_f64().unwrap();
        assert!(share > 3.0 * peer, "{}", f.summary);
        let wrong = run
            .attributed
            .iter()
            .find(|(t, s, _)| *t < from || s != "i2");
        assert!(
            wrong.is_none(),
            "attributed before the fault or to a healthy instance: {:?}",
            wrong.map(|(t, s, f)| (t, s, &f.summary))
        );
    }
    // The same blow-up on every instance: the model's finding, model-wide, attributed to none
    // (the instances' medians drift apart, so their shares differ, but every one is abnormal).
    for shape in [Shape::ParetoTail, Shape::CappedLogNormal, Shape::MaxTokens] {
        let all = Fault {
            from_ms: from,
            to_ms: i64::MAX,
            factor: 4.0,
            instance: None,
        };
        let run = simulate(shape, 0.75, 9, Some(all));
        let after = detected_after(&run, from, "").expect("the model's finding");
        assert!(after <= 15.0, "found after {after} s");
        assert!(
            run.attributed.is_empty(),
            "a model-wide blow-up attributed to {:?}",
            run.attributed.first().map(|(t, s, f)| (t, s, &f.summary))
        );
        let named = run.named.iter().find(|(_, n)| !n.is_empty());
        assert!(named.is_none(), "a model-wide blow-up named {named:?}");
    }
}
