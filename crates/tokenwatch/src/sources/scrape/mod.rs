// Scrape source: pulls Prometheus/OpenMetrics endpoints of inference runtimes and GPU
// exporters on an interval and maps what it reads onto normalised signals.

pub mod file_sd;
pub mod http_sd;
pub mod identity;
pub mod mapping;
pub mod publish;
pub mod rules;
pub mod shard;
pub mod status;
pub mod tables;
pub mod target;
pub mod versions;
pub mod xid;

use crate::kernel::duration::HumanDuration;
use crate::sources::{Source, SourceContext, SourceHandle, StartFuture};
pub use rules::MappingRule;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use target::{Shared, TargetSpec};
use tokio::task::JoinHandle;

/// The `scrape:` section.
///
/// ```yaml
/// scrape:
///   interval: 5s            # default per target; at least 1s
///   timeout: 3s             # capped at the target's interval
///   targets:
///     - url: http://127.0.0.1:8000/metrics
///       runtime: vllm       # optional: detected from metric names otherwise
///       interval: 1s
///       labels: {instance: vllm-0}
///     - url: http://127.0.0.1:9400/metrics
///       labels: {model_id: llama-3-8b}   # tie this GPU exporter to a model
///   file_sd: [/etc/tokenwatch/targets.json]   # Prometheus file_sd format, JSON or YAML
///   http_sd: [http://sd.internal:8080/targets] # Prometheus http_sd: polled, a JSON list of groups
///   prometheus_targets: [{url: http://prometheus:9090, job: vllm}]   # what a Prometheus discovered
///   mappings: []            # extra rules, see `rules::MappingRule`
///   shard: {index: 0, count: 2}   # scrape only this shard of the targets (`shard::ShardConfig`)
/// ```
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScrapeConfig {
    /// Default interval between scrapes of a target (down to 1s).
    pub interval: HumanDuration,
    /// Default time allowed for one scrape.
    pub timeout: HumanDuration,
    pub targets: Vec<ScrapeTarget>,
    /// Files listing targets as Prometheus `file_sd` does; re-read when they change.
    pub file_sd: Vec<PathBuf>,
    /// How often the file_sd files are checked for changes.
    pub file_sd_refresh: HumanDuration,
    /// Endpoints listing targets as Prometheus `http_sd` does (a JSON list of groups); polled.
    pub http_sd: Vec<String>,
    /// How often each http_sd endpoint (and each `prometheus_targets` server) is polled
    /// (Prometheus's `refresh_interval`).
    pub http_sd_refresh: HumanDuration,
    /// Prometheus servers whose discovered targets (`/api/v1/targets`) are scraped here too.
    pub prometheus_targets: Vec<http_sd::PrometheusTargetsConfig>,
    /// Largest response body accepted from a target.
    pub max_body_bytes: usize,
    /// Window over which runtime-side latency percentiles are computed (from bucket deltas).
    pub latency_window: HumanDuration,
    /// User mapping rules, applied before (and winning over) the built-in tables.
    pub mappings: Vec<MappingRule>,
    /// Split the targets among `count` instances (Prometheus `hashmod` of the address); this
    /// instance scrapes shard `index`. None: every target.
    pub shard: Option<shard::ShardConfig>,
}

impl Default for ScrapeConfig {
    fn default() -> Self {
        ScrapeConfig {
            interval: HumanDuration(Duration::from_secs(5)),
            timeout: HumanDuration(Duration::from_secs(3)),
            targets: Vec::new(),
            file_sd: Vec::new(),
            file_sd_refresh: HumanDuration(Duration::from_secs(5)),
            http_sd: Vec::new(),
            http_sd_refresh: HumanDuration(Duration::from_secs(60)),
            prometheus_targets: Vec::new(),
            max_body_bytes: 32 * 1024 * 1024,
            latency_window: HumanDuration(Duration::from_secs(60)),
            mappings: Vec::new(),
            shard: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ScrapeTarget {
    /// `http://host:port/metrics`
    pub url: String,
    /// Runtime (`vllm`, `tgi`, `sglang`, `triton`, `dcgm`); detected from metric names when absent.
    #[serde(default)]
    pub runtime: Option<String>,
    #[serde(default)]
    pub interval: Option<HumanDuration>,
    #[serde(default)]
    pub timeout: Option<HumanDuration>,
    /// Extra labels attached to everything read from this target. `instance` replaces the
    /// instance (else host:port); `model_id` is the model of series that carry none (GPUs, TGI);
    /// `hostname` (else the URL's host) and `pod` / `namespace` say where a serving runtime
    /// runs, so the GPUs dcgm-exporter reports there are placed on it (one incident per cause).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

impl ScrapeConfig {
    /// The static targets, checked; errors name the key (`scrape.targets[1].interval`).
    pub fn static_targets(&self) -> Result<Vec<TargetSpec>, (String, String)> {
        if self.interval.0 < target::MIN_INTERVAL {
            return Err((
                "scrape.interval".into(),
                format!("{:?} is too short: at least 1s", self.interval.0),
            ));
        }
        if self.timeout.0.is_zero() {
            return Err(("scrape.timeout".into(), "must be more than 0".into()));
        }
        if self.max_body_bytes == 0 {
            return Err(("scrape.max_body_bytes".into(), "must be at least 1".into()));
        }
        if self.latency_window.0 < Duration::from_secs(1) {
            return Err(("scrape.latency_window".into(), "must be at least 1s".into()));
        }
        if self.file_sd_refresh.0 < Duration::from_millis(100) {
            return Err((
                "scrape.file_sd_refresh".into(),
                "must be at least 100ms".into(),
            ));
        }
        if self.http_sd_refresh.0 < Duration::from_millis(100) {
            return Err((
                "scrape.http_sd_refresh".into(),
                "must be at least 100ms".into(),
            ));
        }
        for (i, url) in self.http_sd.iter().enumerate() {
            http_sd::PolledEndpoint::new(url).map_err(|m| (format!("scrape.http_sd[{i}]"), m))?;
        }
        for (i, p) in self.prometheus_targets.iter().enumerate() {
            http_sd::PolledEndpoint::prometheus(p)
                .map_err(|m| (format!("scrape.prometheus_targets[{i}].url"), m))?;
        }
        if let Some(s) = &self.shard {
            s.check().map_err(|e| {
                let key = match e {
                    shard::ShardError::ZeroCount => "scrape.shard.count",
                    _ => "scrape.shard.index",
                };
                (key.to_string(), e.to_string())
            })?;
        }
        for (i, r) in self.mappings.iter().enumerate() {
            r.check()
                .map_err(|m| (format!("scrape.mappings[{i}]"), m))?;
        }
        let mut out: Vec<TargetSpec> = Vec::new();
        for (i, t) in self.targets.iter().enumerate() {
            let spec = TargetSpec::new(
                &t.url,
                t.runtime.clone(),
                t.interval.map_or(self.interval.0, |d| d.0),
                t.timeout.map_or(self.timeout.0, |d| d.0),
                t.labels.clone(),
                "static".into(),
            )
            .map_err(|e| {
                let key = match e {
                    target::SpecError::Interval(_) => "interval",
                    target::SpecError::Timeout => "timeout",
                    _ => "url",
                };
                (format!("scrape.targets[{i}].{key}"), e.to_string())
            })?;
            if out.iter().any(|o| o.url == spec.url) {
                return Err((
                    format!("scrape.targets[{i}].url"),
                    format!("{:?} is listed twice", spec.url),
                ));
            }
            out.push(spec);
        }
        Ok(out)
    }
}

pub fn from_config(sc: &ScrapeConfig) -> anyhow::Result<Vec<Box<dyn Source>>> {
    if sc.targets.is_empty()
        && sc.file_sd.is_empty()
        && sc.http_sd.is_empty()
        && sc.prometheus_targets.is_empty()
    {
        return Ok(Vec::new());
    }
    let targets = sc
        .static_targets()
        .map_err(|(key, msg)| anyhow::anyhow!("configuration {key}: {msg}"))?;
    Ok(vec![Box::new(ScrapeSource {
        cfg: sc.clone(),
        targets,
    })])
}

pub struct ScrapeSource {
    cfg: ScrapeConfig,
    targets: Vec<TargetSpec>,
}

impl Source for ScrapeSource {
    fn name(&self) -> &'static str {
        "scrape"
    }

    fn start(self: Box<Self>, ctx: SourceContext) -> StartFuture {
        Box::pin(async move {
            let ScrapeSource { cfg, targets } = *self;
            let mut rules = cfg.mappings.clone();
            rules.extend(tables::builtin());
            let health = status::Health::default();
            health.register(&ctx.host.metrics);
            let registry = status::Registry::default();
            let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
            connector.set_connect_timeout(Some(cfg.timeout.0));
            connector.set_nodelay(true);
            let client =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .pool_idle_timeout(Duration::from_secs(90))
                    .build(connector);
            let shared = Shared {
                client,
                rules: Arc::new(rules::RuleSet::new(rules)),
                registry: registry.clone(),
                health,
                signals: ctx.signals.board.clone(),
                events: ctx.signals.events.clone(),
                aliases: ctx.signals.model_aliases.clone(),
                versions: versions::ScrapedMarkers::new(ctx.rows.store.clone()),
                window: cfg.latency_window.0,
                max_body: cfg.max_body_bytes,
                shutdown: ctx.host.shutdown.clone(),
            };
            let defaults = file_sd::Defaults {
                interval: cfg.interval.0,
                timeout: cfg.timeout.0,
            };
            let files = cfg
                .file_sd
                .iter()
                .cloned()
                .map(file_sd::WatchedFile::new)
                .collect();
            // Checked with the configuration (`static_targets`).
            let endpoints = cfg
                .http_sd
                .iter()
                .filter_map(|u| http_sd::PolledEndpoint::new(u).ok())
                .chain(
                    cfg.prometheus_targets
                        .iter()
                        .filter_map(|p| http_sd::PolledEndpoint::prometheus(p).ok()),
                )
                .collect();
            ctx.host.components.set("scrape", "ok");
            // A configuration reload sends the new static targets here (`crate::reload`).
            let (targets_tx, targets_rx) = tokio::sync::watch::channel(targets);
            ctx.host.reload.set_scrape_targets(targets_tx);
            let manager = tokio::spawn(manage(
                targets_rx,
                Discovery {
                    files,
                    endpoints,
                    defaults,
                    file_refresh: cfg.file_sd_refresh.0,
                    http_refresh: cfg.http_sd_refresh.0,
                    timeout: cfg.timeout.0,
                    max_body: cfg.max_body_bytes,
                },
                cfg.shard,
                shared,
            ));
            let publisher = tokio::spawn(publish::publish(
                registry.clone(),
                ctx.rows.store.clone(),
                cfg.shard,
                cfg.interval.0.min(Duration::from_secs(5)),
                ctx.host.shutdown.clone(),
            ));
            Ok(SourceHandle {
                request_path: None,
                listening: Vec::new(),
                tasks: vec![manager, publisher],
                routes: Some(status::routes(registry)),
            })
        })
    }
}

/// Where targets are discovered besides the static list: file_sd files, http_sd endpoints and
/// the Prometheus servers whose targets are scraped too.
struct Discovery {
    files: Vec<file_sd::WatchedFile>,
    endpoints: Vec<http_sd::PolledEndpoint>,
    defaults: file_sd::Defaults,
    file_refresh: Duration,
    http_refresh: Duration,
    timeout: Duration,
    max_body: usize,
}

impl Discovery {
    /// Re-read what is due; true when any discovered target changed.
    async fn refresh(&mut self, client: &target::HttpClient) -> bool {
        let mut changed = false;
        for f in &mut self.files {
            changed |= f.refresh(self.defaults);
        }
        let limits = (self.http_refresh, self.timeout, self.max_body);
        for e in &mut self.endpoints {
            changed |= e.refresh(client, self.defaults, limits).await;
        }
        changed
    }

    fn targets(&self) -> impl Iterator<Item = &TargetSpec> {
        let files = self.files.iter().flat_map(|f| f.found.targets.iter());
        files.chain(self.endpoints.iter().flat_map(|e| e.found.targets.iter()))
    }

    /// How long until something is due to be read again.
    fn wait(&self) -> Duration {
        let files = (!self.files.is_empty()).then_some(self.file_refresh);
        let now = std::time::Instant::now();
        let endpoints = self
            .endpoints
            .iter()
            .map(|e| {
                e.due()
                    .map_or(Duration::ZERO, |d| d.saturating_duration_since(now))
            })
            .min();
        files
            .into_iter()
            .chain(endpoints)
            .min()
            .unwrap_or(Duration::from_secs(3600))
    }

    fn publish_status(&self, registry: &status::Registry) {
        if !self.files.is_empty() {
            registry.set_files(
                self.files
                    .iter()
                    .map(|f| status::FileSdStatus {
                        path: f.path.display().to_string(),
                        targets: f.found.targets.len(),
                        last_error: f.found.last_error.clone(),
                        last_loaded: f.found.loaded_at.map(status::rfc3339),
                    })
                    .collect(),
            );
        }
        if !self.endpoints.is_empty() {
            registry.set_endpoints(
                self.endpoints
                    .iter()
                    .map(|e| status::HttpSdStatus {
                        kind: e.kind(),
                        url: e.url.clone(),
                        targets: e.found.targets.len(),
                        last_error: e.found.last_error.clone(),
                        last_loaded: e.found.loaded_at.map(status::rfc3339),
                    })
                    .collect(),
            );
        }
    }
}

/// Keep one task per target: static targets (replaced by configuration reloads) plus whatever
/// the file_sd files and http_sd endpoints list now. A target whose spec is unchanged keeps
/// running (and its state).
async fn manage(
    mut static_targets: tokio::sync::watch::Receiver<Vec<TargetSpec>>,
    mut discovery: Discovery,
    shard: Option<shard::ShardConfig>,
    shared: Shared,
) {
    let mut running: BTreeMap<String, (TargetSpec, JoinHandle<()>)> = BTreeMap::new();
    let mut shutdown = shared.shutdown.clone();
    let mut first = true;
    let mut statics = static_targets.borrow_and_update().clone();
    // Once the reload side is gone (its sender dropped), the static targets stay as they are.
    let mut reloadable = true;
    let mut statics_changed = false;
    loop {
        let mut changed = first || statics_changed;
        statics_changed = false;
        changed |= discovery.refresh(&shared.client).await;
        if changed {
            let mut desired: BTreeMap<String, TargetSpec> = BTreeMap::new();
            for spec in statics.iter().chain(discovery.targets()) {
                desired
                    .entry(spec.url.clone())
                    .or_insert_with(|| spec.clone());
            }
            let desired = split_shard(desired, shard, &shared);
            reconcile(&mut running, desired, &shared);
        }
        discovery.publish_status(&shared.registry);
        first = false;
        let wait = discovery.wait();
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => {}
            r = static_targets.changed(), if reloadable => match r {
                Ok(()) => {
                    statics = static_targets.borrow_and_update().clone();
                    statics_changed = true;
                }
                Err(_) => reloadable = false,
            },
        }
        if *shutdown.borrow() {
            break;
        }
    }
    for (_, (_, handle)) in running {
        let abort = handle.abort_handle();
        if tokio::time::timeout(Duration::from_secs(1), handle)
            .await
            .is_err()
        {
            abort.abort();
        }
    }
}

/// Keeps the targets of this instance's shard; records the others in the status (not errors).
fn split_shard(
    desired: BTreeMap<String, TargetSpec>,
    shard: Option<shard::ShardConfig>,
    shared: &Shared,
) -> BTreeMap<String, TargetSpec> {
    let Some(shard) = shard else {
        shared
            .registry
            .set_shard(None, desired.len(), Vec::new(), &shared.health);
        return desired;
    };
    let mut owned = BTreeMap::new();
    let mut others = Vec::new();
    for (url, spec) in desired {
        let s = shard.shard_of(&shard::address(&spec.uri));
        if s == shard.index {
            owned.insert(url, spec);
        } else {
            others.push(status::OtherShardTarget {
                url,
                instance: spec.instance(),
                shard: s,
                origin: spec.origin,
            });
        }
    }
    shared
        .registry
        .set_shard(Some(shard), owned.len(), others, &shared.health);
    owned
}

fn reconcile(
    running: &mut BTreeMap<String, (TargetSpec, JoinHandle<()>)>,
    desired: BTreeMap<String, TargetSpec>,
    shared: &Shared,
) {
    running.retain(|url, (spec, handle)| {
        let keep = desired.get(url).is_some_and(|d| *d == *spec);
        if !keep {
            handle.abort();
            shared.registry.remove(url, &shared.health);
            tracing::info!(target_url = %url, "scrape target removed");
        }
        keep
    });
    for (url, spec) in desired {
        if running.contains_key(&url) {
            continue;
        }
        tracing::info!(target_url = %url, origin = %spec.origin, interval_s = spec.interval.as_secs_f64(), "scrape target added");
        shared.registry.add(spec.first_status(), &shared.health);
        let handle = tokio::spawn(target::run(spec.clone(), shared.clone()));
        running.insert(url, (spec, handle));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn config_errors_name_the_key() {
        let err = Config::from_yaml(
            "scrape:\n  targets:\n    - url: http://127.0.0.1:1/metrics\n      interval: 500ms\n",
            "c.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("c.yaml")
                && err.contains("scrape.targets[0].interval")
                && err.contains("at least 1s"),
            "{err}"
        );
        let err = Config::from_yaml(
            "scrape:\n  interval: 1s\n  targets:\n    - url: ftp://x\n",
            "c.yaml",
        )
        .unwrap_err();
        assert!(err.to_string().contains("scrape.targets[0].url"), "{err}");
        let err = Config::from_yaml(
            "scrape:\n  mappings:\n    - {metric: x, signal: y, kind: counter_ratio}\n",
            "c.yaml",
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("scrape.mappings[0]: kind counter_ratio needs a denominator"),
            "{err}"
        );
        let mut c = Config::default();
        c.scrape.targets.push(ScrapeTarget {
            url: "http://h:1/m".into(),
            runtime: None,
            interval: Some(HumanDuration(Duration::from_millis(200))),
            timeout: None,
            labels: BTreeMap::new(),
        });
        assert!(
            from_config(&c.scrape)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
                .contains("scrape.targets[0].interval")
        );
        assert!(from_config(&ScrapeConfig::default()).unwrap().is_empty());
    }
}
