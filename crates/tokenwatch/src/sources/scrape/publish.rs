// Publishing this instance's scrape targets to the shared store, so every instance sharing it
// lists the whole fleet (`GET /api/v1/fleet`): the rows, with the shard that scrapes them.

use super::shard::ShardConfig;
use super::status::{Registry, TargetStatus};
use std::sync::Arc;
use std::time::Duration;
use tokenwatch_store::{ScrapeTargetRow, Store};
use tokio::sync::watch;

/// The rows this instance publishes for the targets it scrapes (`store.upsert_scrape_targets`).
pub fn rows(
    targets: &[TargetStatus],
    shard: Option<ShardConfig>,
    now_unix_ms: i64,
) -> Vec<ScrapeTargetRow> {
    let shard = shard.unwrap_or(ShardConfig { index: 0, count: 1 });
    targets
        .iter()
        .map(|t| ScrapeTargetRow {
            url: t.url.clone(),
            instance: t.instance.clone(),
            runtime: t.runtime.clone(),
            health: t.health.to_string(),
            last_error: t.last_error.clone(),
            last_scrape_unix_ms: t
                .last_scrape
                .as_deref()
                .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
                .map(|d| d.timestamp_millis()),
            shard_index: shard.index,
            shard_count: shard.count,
            updated_unix_ms: now_unix_ms,
        })
        .collect()
}

/// Publish this instance's targets to the store every `period`, so that every instance sharing
/// the store lists the whole fleet (`GET /api/v1/fleet`). Failures are logged, never fatal.
pub async fn publish(
    registry: Registry,
    store: Arc<dyn Store>,
    shard: Option<ShardConfig>,
    period: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        if *shutdown.borrow() {
            return;
        }
        let (targets, _) = registry.snapshot();
        let rows = rows(&targets, shard, chrono::Utc::now().timestamp_millis());
        let store = store.clone();
        let result = tokio::task::spawn_blocking(move || store.upsert_scrape_targets(&rows)).await;
        match result {
            Ok(Ok(())) => {
                if failing {
                    tracing::info!("publishing scrape targets to the store works again");
                }
                failing = false;
            }
            Ok(Err(e)) => {
                if !failing {
                    tracing::warn!(error = %e, "publishing scrape targets to the store failed");
                }
                failing = true;
            }
            Err(e) => tracing::warn!(error = %e, "publishing scrape targets: task failed"),
        }
    }
}
