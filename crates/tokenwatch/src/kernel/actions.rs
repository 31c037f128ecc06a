// The action port: what a detector may ask to change in the world it watches. Detectors decide;
// the act stage (`crate::act`) acts, holding the handles it acts on (the proxy's live route
// weights), injected at assembly. A detector sees only this trait, so nothing before the act
// stage can change a route by itself, and a test or a process without a proxy passes `NoActions`.

use super::splits::Rollback;

/// A canary to take out of its route: its weight goes to 0 and the route keeps why.
#[derive(Debug, Clone, PartialEq)]
pub struct RollbackRequest {
    /// The route's name (`proxy.routes[].name`).
    pub route: String,
    /// The canary arm's version.
    pub version: String,
    /// Consecutive bad windows behind the decision.
    pub windows: u32,
    pub reason: String,
    pub evidence: serde_json::Value,
    pub at_unix_ms: i64,
}

/// What the act stage does on a detector's decision.
pub trait Actions: Send + Sync {
    /// Roll a canary back; the rollback as recorded on its route, or None when it was not
    /// applied (no such route or arm, already at 0, the only arm with weight left, or actions
    /// switched off).
    fn roll_back_canary(&self, request: RollbackRequest) -> Option<Rollback>;
}

/// No handles: every action is refused (a process without a proxy, an engine-level test).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoActions;

impl Actions for NoActions {
    fn roll_back_canary(&self, _request: RollbackRequest) -> Option<Rollback> {
        None
    }
}
