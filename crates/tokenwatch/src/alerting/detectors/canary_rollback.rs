// `canary_rollback`: the rollback controller of the proxy's weighted routes. Once per window it
// compares each canary arm with the stable one (`ab_regression` plus error rate) and, after the
// route's `rollback.windows` bad windows in a row, sets the canary's weight to 0 and alerts.

use super::ab_regression::{Tail, ab_noise_floor};
use super::{Detector, EvalCtx, PromCtx, PromRule, RuleInput};
use crate::alerting::engine::eval::labels;
use crate::alerting::engine::inputs::values;
use crate::alerting::engine::record::Rec;
use crate::alerting::rules::{RuleError, RuleSpec};
use crate::kernel::actions::RollbackRequest;
use crate::kernel::splits::{ArmWindow, RollbackOn, SplitTable, WindowView};
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_detect as det;

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct CanaryParams {
    /// Absolute rise of the canary's error rate over the stable arm's that is a regression.
    pub error_rate_rise: f64,
    /// `ab_regression`'s thresholds (`p99_increase`, `quality_drop`, `toxicity_rise`,
    /// `split_tolerance`, `min_requests`).
    #[serde(flatten)]
    pub detect: serde_json::Map<String, serde_json::Value>,
}

impl Default for CanaryParams {
    fn default() -> Self {
        CanaryParams {
            error_rate_rise: 0.05,
            detect: Default::default(),
        }
    }
}

pub struct CanaryRollback {
    pub params: det::AbRegressionParams,
    pub error_rate_rise: f64,
}

impl Detector for CanaryRollback {
    fn name() -> &'static str {
        "canary_rollback"
    }

    fn default_window_s() -> i64 {
        60
    }

    fn compile(rule: &RuleInput) -> Result<(Self, String), RuleError> {
        let p: CanaryParams = rule.params()?;
        if !(p.error_rate_rise.is_finite() && p.error_rate_rise > 0.0 && p.error_rate_rise < 1.0) {
            return Err(rule.error("params.error_rate_rise", "must be in (0, 1)"));
        }
        let mut detect = serde_json::Map::new();
        detect.insert("min_requests".into(), json!(20));
        detect.extend(p.detect);
        let params = rule.validated_from(&serde_json::Value::Object(detect))?;
        let signal = rule.signal(&["ttft", "e2e"], "e2e")?;
        Ok((
            CanaryRollback {
                params,
                error_rate_rise: p.error_rate_rise,
            },
            signal,
        ))
    }

    fn evaluate(&mut self, rule: &RuleSpec, cx: &EvalCtx) -> Vec<AnomalyEvent> {
        self.evaluate_tables(&cx.splits.all(), rule, cx)
    }

    fn promql(&self, x: &PromCtx) -> Result<Vec<PromRule>, String> {
        Err(x.no_promql("acts on the proxy's route weights"))
    }
}

impl CanaryRollback {
    /// Step the controller of each of `tables`; one event per canary rolled back and not
    /// restored (the alert stays while the canary is at 0 by the controller's hand).
    fn evaluate_tables(
        &self,
        tables: &[Arc<SplitTable>],
        rule: &RuleSpec,
        cx: &EvalCtx,
    ) -> Vec<AnomalyEvent> {
        let mut out = Vec::new();
        for t in tables {
            self.step(t, rule, cx);
            for rb in t.control().rolled_back.clone() {
                let summary = format!(
                    "canary {} of route {} ({}) rolled back: weight {} → 0 after {} bad windows in a row ({}); traffic goes to {}. \
                     Restore with POST /api/v1/routes/{}/weights {{\"weights\": {{\"{}\": {}}}}}",
                    rb.version,
                    t.name,
                    t.model,
                    rb.weight_before,
                    rb.windows,
                    rb.reason,
                    t.stable_version(),
                    t.name,
                    rb.version,
                    rb.weight_before,
                );
                let restore = format!(
                    "POST /api/v1/routes/{}/weights with body {{\"weights\": {{\"{}\": {}}}}}",
                    t.name, rb.version, rb.weight_before
                );
                let f = det::Finding::new(1.0, summary)
                    .with("route", t.name.as_str())
                    .with("canary_version", rb.version.as_str())
                    .with("stable_version", t.stable_version())
                    .with("weight_before", rb.weight_before)
                    .with("weight_now", 0.0)
                    .with("bad_windows", rb.windows)
                    .with("rolled_back_at_unix_ms", rb.at_unix_ms)
                    .with("reason", rb.reason.as_str())
                    .with("restore", restore)
                    .with("window_evidence", rb.evidence.clone());
                let l = labels(&[
                    ("route", t.name.as_str()),
                    ("model_id", t.model.as_str()),
                    ("model_version", rb.version.as_str()),
                ]);
                out.push(f.into_event(&rule.detector, &rule.signal, l, cx.now));
            }
        }
        out
    }
}

/// One arm's records of a window.
struct ArmRecs<'a> {
    recs: Vec<&'a Rec>,
}

impl ArmRecs<'_> {
    fn stats(&self, signal: &str) -> (det::ArmStats, Tail) {
        let mut v = values(self.recs.iter().copied(), signal);
        v.sort_by(f64::total_cmp);
        let tail = Tail::of(&v);
        let stats = det::ArmStats {
            requests: self.recs.len() as u64,
            p99_s: tail.p99_s,
            quality: None,
            toxicity: None,
        };
        (stats, tail)
    }

    fn error_rate(&self) -> f64 {
        if self.recs.is_empty() {
            return 0.0;
        }
        self.recs.iter().filter(|r| !r.ok).count() as f64 / self.recs.len() as f64
    }
}

/// One canary's verdict over a window.
struct Verdict {
    /// None: too few requests on an arm to judge.
    bad: Option<bool>,
    reason: String,
    evidence: serde_json::Value,
}

impl CanaryRollback {
    /// Close the route's window when it is over: judge each canary and roll back the ones bad
    /// for `rollback.windows` windows in a row. Windows too thin to judge leave streaks as they are.
    fn step(&self, t: &SplitTable, rule: &RuleSpec, cx: &EvalCtx) {
        let now = cx.now;
        let start = {
            let mut c = t.control();
            match c.window_start_ms {
                None => {
                    c.window_start_ms = Some(now);
                    return;
                }
                Some(s) if now - s < rule.window_ms => return,
                Some(s) => {
                    c.window_start_ms = Some(now);
                    s
                }
            }
        };
        let win: Vec<&Rec> = cx.inputs.window(&t.model, start, now).collect();
        let weights = t.weights();
        let total_w: f64 = weights.iter().map(|(_, w)| w.max(0.0)).sum();
        let arm_recs = |v: &str| ArmRecs {
            recs: win.iter().copied().filter(|r| r.ab_group == v).collect(),
        };
        let routed: usize = weights.iter().map(|(v, _)| arm_recs(v).recs.len()).sum();
        let stable_v = t.stable_version().to_string();
        let stable = arm_recs(&stable_v);
        let stable_w = t.weight_of(&stable_v).unwrap_or(0.0);
        let mut view = WindowView {
            from_unix_ms: start,
            to_unix_ms: now,
            arms: Vec::new(),
        };
        let mut verdicts = Vec::new();
        for (v, w) in &weights {
            let arm = arm_recs(v);
            let (stats, _) = arm.stats(&rule.signal);
            let mut bad = None;
            if *v != stable_v && *w > 0.0 {
                let verdict = self.judge(
                    &stable,
                    &arm,
                    stable_w,
                    *w,
                    rule,
                    (&stable_v, v),
                    t.rollback.condition,
                );
                bad = verdict.bad;
                verdicts.push((v.clone(), verdict));
            }
            view.arms.push(ArmWindow {
                version: v.clone(),
                requests: stats.requests,
                share: if routed > 0 {
                    stats.requests as f64 / routed as f64
                } else {
                    0.0
                },
                target_share: if total_w > 0.0 {
                    w.max(0.0) / total_w
                } else {
                    0.0
                },
                error_rate: arm.error_rate(),
                p99_s: stats.p99_s,
                bad,
            });
        }
        let mut to_roll_back = Vec::new();
        {
            let mut c = t.control();
            c.last_window = Some(view);
            for (v, verdict) in &verdicts {
                match verdict.bad {
                    Some(true) => {
                        let n = c.bad_windows.entry(v.clone()).or_insert(0);
                        *n += 1;
                        if t.rollback.enabled && *n >= t.rollback.windows {
                            to_roll_back.push((v.clone(), *n));
                        }
                    }
                    Some(false) => {
                        c.bad_windows.remove(v);
                    }
                    None => {}
                }
            }
        }
        for (v, n) in to_roll_back {
            let Some((_, verdict)) = verdicts.iter().find(|(x, _)| *x == v) else {
                continue;
            };
            // The decision is made; the act stage applies it (and logs and counts it).
            cx.actions.roll_back_canary(RollbackRequest {
                route: t.name.clone(),
                version: v,
                windows: n,
                reason: verdict.reason.clone(),
                evidence: verdict.evidence.clone(),
                at_unix_ms: now,
            });
        }
    }

    /// The canary against the stable arm over one window.
    #[allow(clippy::too_many_arguments)]
    fn judge(
        &self,
        stable: &ArmRecs,
        canary: &ArmRecs,
        stable_w: f64,
        canary_w: f64,
        rule: &RuleSpec,
        (stable_v, canary_v): (&str, &str),
        condition: RollbackOn,
    ) -> Verdict {
        let p = &self.params;
        let ((a, ta), (b, tb)) = (stable.stats(&rule.signal), canary.stats(&rule.signal));
        let share_b = canary_w / (stable_w + canary_w).max(f64::MIN_POSITIVE);
        let base = json!({
            "stable_version": stable_v,
            "canary_version": canary_v,
            "requests_stable": a.requests,
            "requests_canary": b.requests,
            "target_share_canary": share_b,
        });
        let min = p.min_requests.max(1);
        if a.requests < min || b.requests < min {
            return Verdict {
                bad: None,
                reason: format!("fewer than {min} requests on an arm"),
                evidence: base,
            };
        }
        let tuned = ab_noise_floor(p, (&a, ta), (&b, tb), share_b);
        let finding = det::ab_regression(&a, &b, share_b, &tuned);
        let flag = |k: &str| {
            finding
                .as_ref()
                .and_then(|f| f.evidence.get(k))
                .and_then(|v| v.as_bool())
                .unwrap_or(false)
        };
        let (err_a, err_b) = (stable.error_rate(), canary.error_rate());
        let errors = err_b - err_a > self.error_rate_rise;
        let latency = flag("latency_regression");
        let quality = flag("quality_regression") || flag("toxicity_regression");
        let split = flag("split_deviation");
        let regression = errors || latency || quality;
        let bad = match condition {
            RollbackOn::Regression => regression,
            RollbackOn::RegressionAndSplitDeviation => regression && split,
        };
        let mut why = Vec::new();
        if errors {
            why.push(format!(
                "error rate {:.1}% vs {:.1}%",
                err_b * 100.0,
                err_a * 100.0
            ));
        }
        if latency {
            why.push(format!(
                "{} P99 {:.3} s vs {:.3} s",
                rule.signal, b.p99_s, a.p99_s
            ));
        }
        if quality {
            why.push("quality/toxicity regression".to_string());
        }
        if split {
            why.push(format!(
                "split off target ({:.1}% of traffic for {:.1}%)",
                b.requests as f64 / (a.requests + b.requests) as f64 * 100.0,
                share_b * 100.0
            ));
        }
        let mut evidence = base;
        if let Some(m) = evidence.as_object_mut() {
            m.insert("error_rate_stable".into(), json!(err_a));
            m.insert("error_rate_canary".into(), json!(err_b));
            m.insert("error_regression".into(), json!(errors));
            m.insert(format!("p99_{}_stable_s", rule.signal), json!(a.p99_s));
            m.insert(format!("p99_{}_canary_s", rule.signal), json!(b.p99_s));
            m.insert("latency_regression".into(), json!(latency));
            m.insert("quality_regression".into(), json!(quality));
            m.insert("split_deviation".into(), json!(split));
            m.insert("rollback_condition".into(), json!(regression && split));
            m.insert("regression".into(), json!(regression));
            m.insert("p99_increase_required".into(), json!(tuned.p99_increase));
        }
        Verdict {
            bad: Some(bad),
            reason: if why.is_empty() {
                "no regression".into()
            } else {
                why.join(", ")
            },
            evidence,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alerting::engine::inputs::Inputs;
    use crate::alerting::rules::{Rule, RuleConfig, compile_rule};
    use crate::kernel::splits::{RouteConfig, SplitArmConfig};
    use crate::sources::proxy::UpstreamRouter;
    use crate::sources::proxy::config::UpstreamConfig;
    use tokenwatch_core::signals::SignalBoard;

    fn table(windows: u32) -> Arc<SplitTable> {
        let up = |url: &str| UpstreamConfig {
            url: url.into(),
            models: vec!["m".into()],
            runtime: "vllm".into(),
            instance: None,
            tls: None,
        };
        let arm = |upstream: &str, version: &str, weight| SplitArmConfig {
            upstream: upstream.into(),
            version: version.into(),
            weight,
        };
        let mut cfg = RouteConfig {
            name: "chat".into(),
            model: "m".into(),
            split: vec![arm("0", "v1", 80.0), arm("1", "v2", 20.0)],
            sticky: Default::default(),
            rollback: Default::default(),
        };
        cfg.rollback.windows = windows;
        let router = UpstreamRouter::new(&[up("http://127.0.0.1:1"), up("http://127.0.0.1:2")])
            .and_then(|r| r.with_splits(&[cfg]))
            .unwrap();
        router.splits()[0].clone()
    }

    fn rule() -> (CanaryRollback, Rule) {
        let cfg: RuleConfig = serde_saphyr::from_str(
            "{name: c, detector: canary_rollback, window: 10s, params: {min_requests: 15}}",
        )
        .unwrap();
        let rule = compile_rule("alerting.rules[0]", &cfg).unwrap();
        let d = rule.detector_as::<CanaryRollback>().unwrap();
        let own = CanaryRollback {
            params: d.params.clone(),
            error_rate_rise: d.error_rate_rise,
        };
        (own, rule)
    }

    /// One window's records ending at `to`: 80 stable, `canary` canary ones, the canary's
    /// first `failed` failing.
    fn window(inputs: &mut Inputs, to: i64, canary: usize, failed: usize) {
        for i in 0..80 + canary {
            let is_canary = i >= 80;
            inputs.ingest(Rec {
                model: "m".into(),
                ab_group: if is_canary { "v2" } else { "v1" }.into(),
                at_ms: to - 9_000 + i as i64 * 10,
                e2e: 0.1 + (i % 7) as f64 * 0.001,
                ok: !(is_canary && i - 80 < failed),
                ..Rec::default()
            });
        }
    }

    fn eval(
        d: &CanaryRollback,
        rule: &Rule,
        t: &Arc<SplitTable>,
        inputs: &Inputs,
        now: i64,
    ) -> Vec<AnomalyEvent> {
        let board = SignalBoard::default();
        let models = Default::default();
        // The decision goes through the real act stage, acting on a board holding the route.
        let splits = Arc::new(crate::kernel::splits::SplitBoard::default());
        splits.publish(vec![t.clone()]);
        let actions = crate::act::Actuator::new(splits.clone(), None);
        let cx = EvalCtx {
            splits: &splits,
            actions: &actions,
            inputs,
            windows: &Default::default(),
            board: &board,
            new_records: &[],
            spans: &[],
            semantic_drift_models: &models,
            now,
        };
        d.evaluate_tables(std::slice::from_ref(t), &rule.spec, &cx)
    }

    #[test]
    fn two_bad_windows_in_a_row_roll_the_canary_back() {
        let (d, rule) = rule();
        let t = table(2);
        let mut inputs = Inputs::new(600_000, 100_000);
        assert!(eval(&d, &rule, &t, &inputs, 0).is_empty());
        window(&mut inputs, 10_000, 20, 10);
        assert!(eval(&d, &rule, &t, &inputs, 10_000).is_empty());
        assert_eq!(t.control().bad_windows.get("v2"), Some(&1));
        assert_eq!(t.weight_of("v2"), Some(20.0));
        // A window too thin to judge neither counts nor breaks the streak.
        window(&mut inputs, 20_000, 5, 5);
        assert!(eval(&d, &rule, &t, &inputs, 20_000).is_empty());
        assert_eq!(t.control().bad_windows.get("v2"), Some(&1));
        window(&mut inputs, 30_000, 20, 10);
        let ev = eval(&d, &rule, &t, &inputs, 30_000);
        assert_eq!(ev.len(), 1, "{ev:#?}");
        assert_eq!(t.weight_of("v2"), Some(0.0));
        let e = &ev[0];
        assert_eq!(
            (
                e.labels["route"].as_str(),
                e.labels["model_version"].as_str(),
                e.labels["model_id"].as_str()
            ),
            ("chat", "v2", "m")
        );
        assert_eq!(e.evidence["weight_before"], 20.0);
        assert_eq!(e.evidence["window_evidence"]["error_regression"], true);
        assert!(
            e.summary.contains("POST /api/v1/routes/chat/weights"),
            "{}",
            e.summary
        );
        // The alert holds while the canary stays at 0, and ends with the operator's restore.
        assert_eq!(eval(&d, &rule, &t, &inputs, 31_000).len(), 1);
        t.set_weights(&[("v2".into(), 20.0)]).unwrap();
        assert!(eval(&d, &rule, &t, &inputs, 32_000).is_empty());
        let view = t.view();
        assert_eq!(view["last_window"]["arms"][1]["bad"], true, "{view:#}");
        assert_eq!(view["arms"][1]["weight"], 20.0);
    }

    #[test]
    fn a_healthy_canary_or_a_good_window_clears_the_streak() {
        let (d, rule) = rule();
        let t = table(2);
        let mut inputs = Inputs::new(600_000, 100_000);
        eval(&d, &rule, &t, &inputs, 0);
        window(&mut inputs, 10_000, 20, 10);
        eval(&d, &rule, &t, &inputs, 10_000);
        window(&mut inputs, 20_000, 20, 0);
        eval(&d, &rule, &t, &inputs, 20_000);
        assert_eq!(t.control().bad_windows.get("v2"), None);
        let view = t.view();
        assert_eq!(view["last_window"]["arms"][1]["bad"], false, "{view:#}");
        assert!((view["last_window"]["arms"][1]["share"].as_f64().unwrap() - 0.2).abs() < 1e-9);
        window(&mut inputs, 30_000, 20, 10);
        assert!(eval(&d, &rule, &t, &inputs, 30_000).is_empty());
        assert_eq!(t.weight_of("v2"), Some(20.0));
        // Rollback off: bad windows are counted, the weight stays.
        let mut off = table(1);
        Arc::get_mut(&mut off).unwrap().rollback.enabled = false;
        eval(&d, &rule, &off, &inputs, 30_000);
        window(&mut inputs, 40_000, 20, 10);
        assert!(eval(&d, &rule, &off, &inputs, 40_000).is_empty());
        assert_eq!(off.weight_of("v2"), Some(20.0));
        assert_eq!(off.control().bad_windows.get("v2"), Some(&1));
    }
}
