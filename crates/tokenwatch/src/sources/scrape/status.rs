// Target health as Prometheus keeps it: the `tokenwatch_scrape_*` series in `/metrics` and
// the per-target status behind `GET /api/v1/targets`.

use super::shard::ShardConfig;
use axum::extract::State;
use axum::response::{IntoResponse, Json};
use axum::routing::get;
use chrono::{DateTime, SecondsFormat, Utc};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::Serialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpLabels {
    pub target: String,
    pub runtime: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetLabel {
    pub target: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    pub target: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShardLabel {
    pub shard: String,
}

/// The scrape health series, registered in tokenwatch's `/metrics`.
#[derive(Clone, Default)]
pub struct Health {
    pub up: Family<UpLabels, Gauge>,
    /// Discovered targets by the shard that owns them (`scrape.shard`; all in `0` without it).
    pub shard_targets: Family<ShardLabel, Gauge>,
    pub duration: Family<TargetLabel, Gauge<f64, AtomicU64>>,
    pub samples: Family<TargetLabel, Gauge>,
    pub failures: Family<FailureLabels, Counter>,
}

impl Health {
    pub fn register(&self, metrics: &crate::kernel::telemetry::Metrics) {
        metrics.register(
            "tokenwatch_scrape_up",
            "1 when the last scrape of the target succeeded, else 0",
            self.up.clone(),
        );
        metrics.register(
            "tokenwatch_scrape_duration_seconds",
            "Duration of the last scrape of the target",
            self.duration.clone(),
        );
        metrics.register(
            "tokenwatch_scrape_samples_scraped",
            "Samples the last successful scrape of the target returned",
            self.samples.clone(),
        );
        metrics.register(
            "tokenwatch_scrape_shard_targets",
            "Discovered scrape targets by the shard (scrape.shard index) that scrapes them",
            self.shard_targets.clone(),
        );
        // prometheus-client appends `_total` to counters.
        metrics.register(
            "tokenwatch_scrape_failures",
            "Failed scrapes, by reason",
            self.failures.clone(),
        );
    }
}

/// Result of one scrape.
#[derive(Debug)]
pub enum Outcome {
    Up {
        runtime: String,
        detected: bool,
        samples: usize,
    },
    Down {
        reason: &'static str,
        error: String,
    },
}

#[derive(Debug, Clone, Serialize)]
pub struct TargetStatus {
    pub url: String,
    pub instance: String,
    pub runtime: String,
    /// `configured`, `detected`, or `unknown` before the first successful scrape.
    pub runtime_from: &'static str,
    pub labels: BTreeMap<String, String>,
    pub origin: String,
    /// `up`, `down` or `unknown` (not scraped yet).
    pub health: &'static str,
    pub last_error: Option<String>,
    pub last_scrape: Option<String>,
    pub last_scrape_duration_s: Option<f64>,
    pub samples: usize,
    pub interval_s: f64,
    pub timeout_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct FileSdStatus {
    pub path: String,
    pub targets: usize,
    pub last_error: Option<String>,
    pub last_loaded: Option<String>,
}

/// An http_sd endpoint's (or a Prometheus's) part of `GET /api/v1/targets`.
#[derive(Debug, Clone, Serialize)]
pub struct HttpSdStatus {
    /// `http_sd` or `prometheus`.
    #[serde(skip)]
    pub kind: &'static str,
    pub url: String,
    pub targets: usize,
    pub last_error: Option<String>,
    pub last_loaded: Option<String>,
}

/// A discovered target left to another shard's instance.
#[derive(Debug, Clone, Serialize)]
pub struct OtherShardTarget {
    pub url: String,
    pub instance: String,
    /// The shard index that scrapes it.
    pub shard: u64,
    pub origin: String,
}

#[derive(Default)]
struct Inner {
    targets: BTreeMap<String, TargetStatus>,
    files: Vec<FileSdStatus>,
    endpoints: Vec<HttpSdStatus>,
    shard: Option<ShardConfig>,
    other_shards: Vec<OtherShardTarget>,
}

/// The shard part of `GET /api/v1/targets`.
#[derive(Debug, Clone, Serialize)]
pub struct ShardStatus {
    pub index: u64,
    pub count: u64,
    /// Targets this instance scrapes (listed under `targets`).
    pub owned: usize,
    /// Targets other shards scrape (listed under `other_shards`, not scraped here).
    pub other: usize,
}

/// Status of every active target. Locked only for short, synchronous updates and reads.
#[derive(Clone, Default)]
pub struct Registry(Arc<Mutex<Inner>>);

pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Start tracking a target (its first status: `TargetSpec::first_status`), its `up` at 0.
    pub fn add(&self, status: TargetStatus, health: &Health) {
        health
            .up
            .get_or_create(&UpLabels {
                target: status.url.clone(),
                runtime: status.runtime.clone(),
            })
            .set(0);
        self.lock().targets.insert(status.url.clone(), status);
    }

    /// Forget a target and its health series (it left discovery).
    pub fn remove(&self, url: &str, health: &Health) {
        let Some(st) = self.lock().targets.remove(url) else {
            return;
        };
        health.up.remove(&UpLabels {
            target: url.into(),
            runtime: st.runtime,
        });
        let t = TargetLabel { target: url.into() };
        health.duration.remove(&t);
        health.samples.remove(&t);
        for reason in [
            "connect",
            "timeout",
            "http_status",
            "body_too_large",
            "body",
            "parse",
        ] {
            health.failures.remove(&FailureLabels {
                target: url.into(),
                reason: reason.into(),
            });
        }
    }

    pub fn record(&self, url: &str, health: &Health, outcome: Outcome, duration: Duration) {
        let mut inner = self.lock();
        // A target removed while its last scrape was finishing: leave no series behind.
        let Some(st) = inner.targets.get_mut(url) else {
            return;
        };
        let t = TargetLabel { target: url.into() };
        health
            .duration
            .get_or_create(&t)
            .set(duration.as_secs_f64());
        st.last_scrape = Some(rfc3339(Utc::now()));
        st.last_scrape_duration_s = Some(duration.as_secs_f64());
        match outcome {
            Outcome::Up {
                runtime,
                detected,
                samples,
            } => {
                if runtime != st.runtime {
                    health.up.remove(&UpLabels {
                        target: url.into(),
                        runtime: st.runtime.clone(),
                    });
                    st.runtime = runtime;
                }
                if detected {
                    st.runtime_from = "detected";
                }
                st.health = "up";
                st.last_error = None;
                st.samples = samples;
                health.samples.get_or_create(&t).set(samples as i64);
                health
                    .up
                    .get_or_create(&UpLabels {
                        target: url.into(),
                        runtime: st.runtime.clone(),
                    })
                    .set(1);
            }
            Outcome::Down { reason, error } => {
                st.health = "down";
                st.last_error = Some(error);
                health
                    .up
                    .get_or_create(&UpLabels {
                        target: url.into(),
                        runtime: st.runtime.clone(),
                    })
                    .set(0);
                health
                    .failures
                    .get_or_create(&FailureLabels {
                        target: url.into(),
                        reason: reason.into(),
                    })
                    .inc();
            }
        }
    }

    /// The split of the discovered targets: `owned` kept here, `others` left to other shards.
    pub fn set_shard(
        &self,
        shard: Option<ShardConfig>,
        owned: usize,
        others: Vec<OtherShardTarget>,
        health: &Health,
    ) {
        let index = shard.map_or(0, |s| s.index);
        let mut counts: BTreeMap<u64, i64> = (0..shard.map_or(1, |s| s.count.min(1024)))
            .map(|i| (i, 0))
            .collect();
        counts.insert(index, owned as i64);
        for o in &others {
            *counts.entry(o.shard).or_default() += 1;
        }
        for (s, n) in counts {
            health
                .shard_targets
                .get_or_create(&ShardLabel {
                    shard: s.to_string(),
                })
                .set(n);
        }
        let mut inner = self.lock();
        inner.shard = shard;
        inner.other_shards = others;
    }

    /// This instance's shard and the targets other shards scrape.
    pub fn shard(&self) -> (Option<ShardStatus>, Vec<OtherShardTarget>) {
        let inner = self.lock();
        let status = inner.shard.map(|s| ShardStatus {
            index: s.index,
            count: s.count,
            owned: inner.targets.len(),
            other: inner.other_shards.len(),
        });
        (status, inner.other_shards.clone())
    }

    pub fn set_files(&self, files: Vec<FileSdStatus>) {
        self.lock().files = files;
    }

    pub fn set_endpoints(&self, endpoints: Vec<HttpSdStatus>) {
        self.lock().endpoints = endpoints;
    }

    /// The http_sd endpoints' status.
    pub fn endpoints(&self) -> Vec<HttpSdStatus> {
        self.lock().endpoints.clone()
    }

    pub fn snapshot(&self) -> (Vec<TargetStatus>, Vec<FileSdStatus>) {
        let inner = self.lock();
        (
            inner.targets.values().cloned().collect(),
            inner.files.clone(),
        )
    }
}

/// `GET /api/v1/targets`: every target with its health, as Prometheus's targets page.
pub fn routes(registry: Registry) -> axum::Router {
    axum::Router::new()
        .route("/api/v1/targets", get(targets))
        .with_state(registry)
}

async fn targets(State(registry): State<Registry>) -> impl IntoResponse {
    let (targets, files) = registry.snapshot();
    let endpoints = registry.endpoints();
    let (shard, other_shards) = registry.shard();
    let up = targets.iter().filter(|t| t.health == "up").count();
    Json(json!({
        "count": targets.len(),
        "up": up,
        "targets": targets,
        "file_sd": files,
        "http_sd": endpoints.iter().filter(|e| e.kind == "http_sd").collect::<Vec<_>>(),
        "prometheus_targets": endpoints.iter().filter(|e| e.kind == "prometheus").collect::<Vec<_>>(),
        "shard": shard,
        "other_shards": other_shards,
    }))
}
