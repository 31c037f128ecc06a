// Canary rollback, the action: the named route's canary goes to weight 0 on the table the proxy
// picks from, and the route keeps the rollback (why, when, the weight before) for the API and the
// alert. The decision — which canary, after how many bad windows — is the `canary_rollback`
// detector's.

use crate::kernel::actions::RollbackRequest;
use crate::kernel::splits::{Rollback, SplitBoard};

/// Applies `request` to its route on `splits`; None when it could not be applied.
pub(super) fn roll_back(splits: &SplitBoard, request: &RollbackRequest) -> Option<Rollback> {
    let Some(table) = splits.get(&request.route) else {
        tracing::warn!(route = %request.route, version = %request.version, "canary rollback refused: no such route");
        return None;
    };
    let done = table.roll_back(
        &request.version,
        request.windows,
        request.reason.clone(),
        request.evidence.clone(),
        request.at_unix_ms,
    );
    match &done {
        Some(rb) => tracing::warn!(
            route = %request.route,
            version = %rb.version,
            weight_before = rb.weight_before,
            reason = %rb.reason,
            "canary rolled back: weight set to 0"
        ),
        None => tracing::info!(
            route = %request.route,
            version = %request.version,
            "canary rollback not applied: unknown arm, already at 0, or the last arm with weight"
        ),
    }
    done
}
