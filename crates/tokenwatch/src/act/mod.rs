// The act stage: what tokenwatch changes in the world when a detector decides. It owns the
// handles actions need — the proxy's live route weights — injected at assembly, and reaches
// detectors only through the action port (`kernel::actions::Actions`). Every action is logged
// and counted in `tokenwatch_actions_total{action, outcome}`.
//
// Actions: canary rollback (`canary`). The scaling recommendation and the eviction ranking are
// published for HPA/KEDA and the API (`slo::scaling`); tokenwatch does not scale or evict by
// itself.

mod canary;

use crate::kernel::actions::{Actions, RollbackRequest};
use crate::kernel::splits::{Rollback, SplitBoard};
use crate::kernel::telemetry::Metrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::sync::Arc;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabels {
    action: String,
    outcome: String,
}

/// The act stage: the handles, and the count of what it did.
pub struct Actuator {
    splits: Arc<SplitBoard>,
    counted: Family<ActionLabels, Counter>,
}

impl Actuator {
    /// Acts on `splits` (the proxy's routes), counting into `metrics` when given.
    pub fn new(splits: Arc<SplitBoard>, metrics: Option<&Metrics>) -> Actuator {
        let counted = Family::<ActionLabels, Counter>::default();
        if let Some(m) = metrics {
            m.register(
                "tokenwatch_actions",
                "Actions taken on a detector's decision, by action and outcome (applied, or refused: no such route or arm, already at 0, or the last arm with weight)",
                counted.clone(),
            );
        }
        Actuator { splits, counted }
    }

    fn count(&self, action: &str, applied: bool) {
        self.counted
            .get_or_create(&ActionLabels {
                action: action.to_string(),
                outcome: if applied { "applied" } else { "refused" }.to_string(),
            })
            .inc();
    }
}

impl Actions for Actuator {
    fn roll_back_canary(&self, request: RollbackRequest) -> Option<Rollback> {
        let done = canary::roll_back(&self.splits, &request);
        self.count("canary_rollback", done.is_some());
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::splits::{RouteConfig, SplitArmConfig, SplitTable};

    fn route() -> Arc<SplitTable> {
        let arm = |upstream: &str, version: &str, weight| SplitArmConfig {
            upstream: upstream.into(),
            version: version.into(),
            weight,
        };
        let cfg = RouteConfig {
            name: "chat".into(),
            model: "m".into(),
            split: vec![arm("stable", "v1", 90.0), arm("canary", "v2", 10.0)],
            sticky: Default::default(),
            rollback: Default::default(),
        };
        Arc::new(SplitTable::new("proxy.routes[0]", &cfg, &[("stable", 0), ("canary", 1)]).unwrap())
    }

    fn request(route: &str, version: &str) -> RollbackRequest {
        RollbackRequest {
            route: route.into(),
            version: version.into(),
            windows: 2,
            reason: "error rate 12 % against 1 %".into(),
            evidence: serde_json::json!({"canary_error_rate": 0.12}),
            at_unix_ms: 1_000,
        }
    }

    #[test]
    fn a_rollback_sets_the_canary_to_zero_on_the_live_route_and_is_counted() {
        let board = Arc::new(SplitBoard::default());
        board.publish(vec![route()]);
        let metrics = Metrics::default();
        let act = Actuator::new(board.clone(), Some(&metrics));
        let done = act
            .roll_back_canary(request("chat", "v2"))
            .expect("applied");
        assert_eq!((done.version.as_str(), done.weight_before), ("v2", 10.0));
        let t = board.get("chat").unwrap();
        assert_eq!(t.weight_of("v2"), Some(0.0));
        assert_eq!(t.control().rolled_back.len(), 1);
        // Again: already at 0. An unknown route, an unknown arm, the last arm with weight: refused.
        assert!(act.roll_back_canary(request("chat", "v2")).is_none());
        assert!(act.roll_back_canary(request("nope", "v2")).is_none());
        assert!(act.roll_back_canary(request("chat", "v9")).is_none());
        assert!(act.roll_back_canary(request("chat", "v1")).is_none());
        assert_eq!(t.weight_of("v1"), Some(90.0));
        let text = metrics.encode();
        assert!(
            text.contains(
                r#"tokenwatch_actions_total{action="canary_rollback",outcome="applied"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"tokenwatch_actions_total{action="canary_rollback",outcome="refused"} 4"#
            ),
            "{text}"
        );
    }
}
