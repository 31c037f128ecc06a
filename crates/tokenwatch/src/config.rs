// Configuration: the `tokenwatch.yaml` schema with its defaults, loading with key-path errors,
// and validation. Every number of the spec that tokenwatch uses is a value here.

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub mod env;

pub use crate::kernel::tls::UpstreamTlsConfig;
pub use crate::sources::proxy::config::{
    ProxyConfig, UpstreamConfig, UpstreamUrl, parse_upstream_url,
};
pub use tokenwatch_store::StoreBackendKind;

pub use crate::kernel::duration::HumanDuration;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: cannot read: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}: {message}")]
    Parse { file: String, message: String },
    /// A `${NAME}` of the file that cannot be expanded (`config::env`).
    #[error("{file}:{line}: {message}")]
    Env {
        file: String,
        line: usize,
        message: String,
    },
    #[error("{file}: {path}: {message}")]
    Invalid {
        file: String,
        path: String,
        message: String,
    },
}

#[derive(Debug, Clone, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// API, `/metrics` and health endpoints.
    pub listen: SocketAddr,
    /// The one data directory (embedded store, tenant salt).
    pub data_dir: PathBuf,
    pub proxy: ProxyConfig,
    pub telemetry: TelemetryConfig,
    pub store: StoreConfig,
    pub aggregation: AggregationConfig,
    pub scrape: crate::sources::scrape::ScrapeConfig,
    pub otlp: crate::sources::otlp::OtlpConfig,
    pub gpu: crate::sources::gpu::GpuConfig,
    pub signals: SignalsConfig,
    pub alerting: crate::alerting::rules::AlertingConfig,
    /// SLOs with error budgets and burn alerts; absent: the spec's defaults (`crate::alerting::slo`).
    pub slos: Option<Vec<crate::alerting::slo::SloConfig>>,
    /// Spend budgets: a daily or monthly amount in US dollars per model, tenant or both, with
    /// burn alerts (`budget_burn`) and gauges; counted from the price table's costs (`pricing`).
    pub budgets: Vec<crate::alerting::budget::BudgetConfig>,
    /// The autoscaling recommendation and the eviction trigger (spec section 6).
    pub scaling: crate::alerting::slo::scaling::ScalingConfig,
    /// Threads: the proxy's own runtime, the analysis threads' priority.
    pub runtime: crate::runtimes::RuntimeConfig,
    /// Bearer tokens with roles, and the opt-out of the off-loopback refusal.
    pub auth: crate::auth::AuthConfig,
    /// The audit log of API requests and configuration changes (JSON lines per day).
    pub audit: crate::audit::AuditConfig,
    /// TLS certificate of the API listener, and of the proxy and OTLP listeners unless they
    /// set their own `tls`.
    pub tls: crate::listen::tls::TlsConfig,
    /// Header size and count allowed per request on the API, proxy and OTLP/HTTP listeners.
    pub limits: crate::listen::limits::LimitsConfig,
    /// Optional capture of prompt and completion text, masked (off by default).
    pub capture: crate::capture::CaptureConfig,
    /// How long captured text is kept, per region.
    pub retention: crate::capture::RetentionConfig,
    /// Where metrics go besides `/metrics`: Prometheus remote write.
    pub export: crate::export::ExportConfig,
    /// How spans map to components for per-trace self time (`traces.components`).
    pub traces: crate::pipeline::trace_components::TracesConfig,
    /// Sources listed by kind: `files` (log files tailed into the template miner).
    pub sources: crate::logs::SourcesConfig,
    /// Log templates mined from OTLP logs and tailed files, and their anomaly tests.
    pub logs: crate::logs::LogsConfig,
    /// Other ids a model goes by (`aliases`), counted under its one id.
    pub models: crate::kernel::models::ModelsConfig,
    /// The price table: USD per million input, cached input, output and reasoning tokens per
    /// model, with per-upstream overrides, inline or from `pricing.file`; each record's
    /// `cost_usd` and the spend series come from it. Never fetched at run time.
    pub pricing: crate::pipeline::pricing::PricingConfig,
    /// How the request path drains on SIGTERM/SIGINT (`delay`, `drain_timeout`).
    pub shutdown: ShutdownConfig,
    /// Which part of tokenwatch this process runs: `all` (default: proxy and analysis in one
    /// process), `proxy` (a thin replica that forwards, times every chunk and ships its request
    /// records to `aggregator`; no store, no detectors) or `aggregator` (no proxy: receives
    /// the replicas' records over OTLP, plus scrapes, OTLP and GPUs; stores, detects, alerts,
    /// serves the API). `--role` sets it.
    pub role: Role,
    /// Where `role: proxy` ships its request records: the aggregator's OTLP receiver, or an
    /// OpenTelemetry Collector in between (`--aggregator URL` sets the endpoint). Read by
    /// `role: proxy` only.
    pub aggregator: Option<crate::export::otlp::ship::AggregatorLinkConfig>,
    /// The values `${NAME}`s of the file were replaced by (not configuration: kept to show
    /// `${NAME}` instead of them in errors).
    #[serde(skip)]
    #[schemars(skip)]
    pub env_values: env::EnvValues,
}

/// `role`: which part of tokenwatch a process runs (see `Config::role`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Proxy and analysis in one process (the embedded default).
    #[default]
    All,
    /// A thin proxy replica: forwards, times every chunk, ships its records to `aggregator`.
    Proxy,
    /// Analysis without a proxy: receives the replicas' records over OTLP.
    Aggregator,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::All, Role::Proxy, Role::Aggregator];

    pub fn name(self) -> &'static str {
        match self {
            Role::All => "all",
            Role::Proxy => "proxy",
            Role::Aggregator => "aggregator",
        }
    }

    /// `all`, `proxy` or `aggregator` (the `--role` flag).
    pub fn parse(s: &str) -> Result<Role, String> {
        Role::ALL
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| format!("{s:?} is not a role: all, proxy or aggregator"))
    }
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SignalsConfig {
    /// Points of history kept per signal series (for detectors and charts).
    pub history_points: usize,
    pub max_series: usize,
    /// Series with no new point for this long are dropped.
    pub stale_after: HumanDuration,
}

impl Default for SignalsConfig {
    fn default() -> Self {
        SignalsConfig {
            history_points: 720,
            max_series: 100_000,
            stale_after: HumanDuration(Duration::from_secs(3600)),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 9464)),
            data_dir: PathBuf::from("./tokenwatch-data"),
            proxy: ProxyConfig::default(),
            telemetry: TelemetryConfig::default(),
            store: StoreConfig::default(),
            aggregation: AggregationConfig::default(),
            scrape: Default::default(),
            otlp: Default::default(),
            gpu: Default::default(),
            signals: SignalsConfig::default(),
            alerting: Default::default(),
            slos: None,
            budgets: Vec::new(),
            scaling: Default::default(),
            runtime: Default::default(),
            auth: Default::default(),
            audit: Default::default(),
            tls: Default::default(),
            limits: Default::default(),
            capture: Default::default(),
            retention: Default::default(),
            export: Default::default(),
            traces: Default::default(),
            sources: Default::default(),
            logs: Default::default(),
            models: Default::default(),
            pricing: Default::default(),
            shutdown: Default::default(),
            role: Role::All,
            aggregator: None,
            env_values: Default::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// Bounded queue between the sources and the pipeline; when full, records are dropped and counted.
    pub queue_capacity: usize,
    /// Most records written to the store in one transaction.
    pub batch_max: usize,
    /// Longest a record waits in the pipeline before it is flushed.
    pub flush_interval: HumanDuration,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            queue_capacity: 65_536,
            batch_max: 1024,
            flush_interval: HumanDuration(Duration::from_millis(100)),
        }
    }
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    pub raw_retention: HumanDuration,
    pub rollup_retention: HumanDuration,
    /// fsync every commit (survives power loss); off: WAL commits survive a process crash.
    pub fsync: bool,
    /// Where the data goes: `sqlite` (the file in `data_dir`) or `clickhouse` (`store.clickhouse`).
    pub backend: StoreBackendKind,
    pub clickhouse: ClickHouseStoreConfig,
    /// Records (and proxy spans) waiting for the store's writer thread, at most; when full,
    /// more are dropped and counted, and the pipeline never waits on the store.
    pub write_queue_records: usize,
    /// This instance's name in shared roll-up keys (instances sharing a ClickHouse database
    /// each need their own); by default derived once from hostname, listen addresses and
    /// `data_dir`, and kept in `data_dir/writer_id`.
    pub writer_id: Option<String>,
    /// How long the writer gathers rows before one insert (`0`: write whatever is queued at
    /// once). Default: `0` for SQLite (a local insert is cheap), `1s` for ClickHouse (each
    /// INSERT costs the server an HTTP request and a new part to merge).
    pub flush_interval: Option<HumanDuration>,
    /// Rows in one insert call, at most (an insert starts early when this many are queued).
    /// Default: `telemetry.batch_max` for SQLite, 16384 for ClickHouse.
    pub batch_rows: Option<usize>,
}

/// ClickHouse's defaults for `store.flush_interval` and `store.batch_rows`: few, large
/// inserts (the store-insert bench: ≈ 7 ms per INSERT, 4.6× SQLite per record at 1,000 rows).
const CLICKHOUSE_FLUSH_INTERVAL: Duration = Duration::from_secs(1);
const CLICKHOUSE_BATCH_ROWS: usize = 16_384;

impl StoreConfig {
    /// `store.flush_interval`, or the backend's default.
    pub fn flush_interval(&self) -> Duration {
        match (&self.flush_interval, self.backend) {
            (Some(d), _) => d.0,
            (None, StoreBackendKind::Sqlite) => Duration::ZERO,
            (None, StoreBackendKind::ClickHouse) => CLICKHOUSE_FLUSH_INTERVAL,
        }
    }

    /// `store.batch_rows`, or the backend's default (`telemetry_batch_max` for SQLite).
    pub fn batch_rows(&self, telemetry_batch_max: usize) -> usize {
        match (self.batch_rows, self.backend) {
            (Some(n), _) => n,
            (None, StoreBackendKind::Sqlite) => telemetry_batch_max,
            (None, StoreBackendKind::ClickHouse) => CLICKHOUSE_BATCH_ROWS,
        }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            raw_retention: HumanDuration(Duration::from_secs(7 * 86_400)),
            rollup_retention: HumanDuration(Duration::from_secs(90 * 86_400)),
            fsync: false,
            backend: StoreBackendKind::Sqlite,
            clickhouse: ClickHouseStoreConfig::default(),
            write_queue_records: 65_536,
            writer_id: None,
            flush_interval: None,
            batch_rows: None,
        }
    }
}

/// `store.clickhouse`: the server's HTTP interface (`http://` or `https://`), database,
/// credentials and retention mode.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClickHouseStoreConfig {
    pub url: String,
    /// Created when missing.
    pub database: String,
    pub user: String,
    /// File holding the password (first line); the password itself is never in the configuration.
    pub password_file: Option<PathBuf>,
    /// Environment variable holding the password (instead of `password_file`).
    pub password_env: Option<String>,
    /// PEM CA certificates trusted for an `https://` url besides the system's roots.
    pub ca_file: Option<PathBuf>,
    /// How long one store operation retries a server that is unreachable or answers 5xx.
    pub retry_for: HumanDuration,
    /// Retention by the tables' `TTL`, run by the server in its merges (true), or by tokenwatch
    /// dropping day partitions and deleting regional text on its retention tick (false).
    pub ttl: bool,
    /// A cluster named in the servers' `remote_servers`: tables are created `ON CLUSTER` as
    /// `Replicated*MergeTree` tables (`<table>_local`, Keeper path
    /// `/clickhouse/tables/{shard}/{database}/{table}`, replica `{replica}`: the servers' macros)
    /// behind `Distributed` tables of the names tokenwatch reads and writes. Unset: one node.
    pub cluster: Option<String>,
}

impl Default for ClickHouseStoreConfig {
    fn default() -> Self {
        let d = tokenwatch_store::ClickHouseConfig::default();
        ClickHouseStoreConfig {
            url: d.url,
            database: d.database,
            user: d.user,
            password_file: None,
            password_env: None,
            ca_file: None,
            retry_for: HumanDuration(d.retry_for),
            ttl: d.ttl,
            cluster: d.cluster,
        }
    }
}

impl StoreConfig {
    /// The backend `open_store` opens, with the SQLite file in `data_dir`.
    pub fn backend(&self, data_dir: &Path) -> tokenwatch_store::StoreBackend {
        match self.backend {
            StoreBackendKind::Sqlite => tokenwatch_store::StoreBackend::Sqlite {
                data_dir: data_dir.to_path_buf(),
            },
            StoreBackendKind::ClickHouse => {
                let c = &self.clickhouse;
                tokenwatch_store::StoreBackend::ClickHouse(tokenwatch_store::ClickHouseConfig {
                    url: c.url.clone(),
                    database: c.database.clone(),
                    user: c.user.clone(),
                    password_file: c.password_file.clone(),
                    password_env: c.password_env.clone(),
                    ca_file: c.ca_file.clone(),
                    retry_for: c.retry_for.0,
                    ttl: c.ttl,
                    cluster: c.cluster.clone(),
                    ..Default::default()
                })
            }
        }
    }
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AggregationConfig {
    /// Series with no data for this long are dropped from memory (their roll-ups stay stored).
    pub idle_series_after: HumanDuration,
    /// Upper bound on in-memory series; new series beyond it are refused and counted.
    pub max_series: usize,
}

impl Default for AggregationConfig {
    fn default() -> Self {
        AggregationConfig {
            idle_series_after: HumanDuration(Duration::from_secs(7200)),
            max_series: 50_000,
        }
    }
}

fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().to_canonical().is_loopback()
}

/// The JSON Schema (draft 2020-12) of `tokenwatch.yaml`, generated from these types: unknown keys
/// are refused as the loader refuses them; cross-field checks stay the loader's (`check-config`).
pub fn json_schema() -> String {
    let mut schema = schemars::schema_for!(Config);
    schema.insert("title".into(), "tokenwatch.yaml".into());
    let mut text = serde_json::to_string_pretty(&schema).unwrap_or_default();
    text.push('\n');
    text
}

impl Config {
    /// The source registry: the sources the configuration asks for, one line each, every
    /// source handed only its own section (and the few it reads beside it).
    pub fn sources(&self) -> anyhow::Result<Vec<Box<dyn crate::sources::Source>>> {
        use crate::sources::{Source, gpu, otlp, posted, proxy, scrape};
        let mut sources: Vec<Box<dyn Source>> = Vec::new();
        sources.push(Box::new(proxy::source::ProxySource::from_config(
            &self.proxy,
            &self.capture,
            &self.limits,
            &self.data_dir,
            self.role == Role::Aggregator,
        )?));
        sources.extend(scrape::from_config(&self.scrape)?);
        sources.extend(otlp::from_config(&self.otlp, &self.limits)?);
        sources.extend(gpu::from_config(&self.gpu)?);
        sources.push(Box::new(posted::Posted));
        Ok(sources)
    }

    /// The effective configuration for snapshots, as JSON, secrets redacted: the tenant salt, the
    /// headers of alert receivers, OTLP export, remote write and the aggregator link
    /// (`Authorization` goes there),
    /// credentials and query strings in their URLs, a webhook's whole path (Slack, Teams and
    /// Discord webhooks carry their token in it) and its PagerDuty routing key.
    pub fn redacted_json(&self) -> serde_json::Value {
        let mut c = self.clone();
        if !c.proxy.tenant_salt.is_empty() {
            c.proxy.tenant_salt = "<redacted>".into();
        }
        let headers = c
            .alerting
            .delivery
            .webhooks
            .iter_mut()
            .map(|w| &mut w.headers)
            .chain(c.export.remote_write.iter_mut().map(|r| &mut r.headers))
            .chain(c.export.otlp.iter_mut().map(|o| &mut o.headers))
            .chain(c.aggregator.iter_mut().map(|a| &mut a.headers));
        for h in headers {
            for v in h.values_mut() {
                *v = "<redacted>".into();
            }
        }
        for w in &mut c.alerting.delivery.webhooks {
            w.url = redact_url(&w.url, false);
            if w.routing_key.is_some() {
                w.routing_key = Some("<redacted>".into());
            }
        }
        let urls = c
            .alerting
            .delivery
            .alertmanagers
            .iter_mut()
            .chain(c.export.remote_write.iter_mut().map(|r| &mut r.url))
            .chain(c.export.otlp.iter_mut().map(|o| &mut o.endpoint))
            .chain(c.aggregator.iter_mut().map(|a| &mut a.endpoint));
        for u in urls {
            *u = redact_url(u, true);
        }
        match serde_json::to_value(&c) {
            Ok(config) => serde_json::json!({ "format": "json", "config": config }),
            // Plain configuration data always serialises; should it not, the snapshot still
            // shows the configuration, as text.
            Err(e) => {
                serde_json::json!({ "format": "rust-debug", "config": format!("{c:#?}"), "error": e.to_string() })
            }
        }
    }

    /// The sections the alert engine starts from.
    pub fn engine_sections(&self) -> crate::alerting::engine::EngineSections<'_> {
        crate::alerting::engine::EngineSections {
            alerting: &self.alerting,
            slos: &self.slos,
            scaling: &self.scaling,
            budgets: &self.budgets,
            traces: &self.traces,
            listen: self.listen,
            data_dir: self.data_dir.clone(),
            raw_retention: self.store.raw_retention.0,
            config_json: self.redacted_json(),
        }
    }

    /// The certificates each listener serves (`tls`, `proxy.tls`, `otlp.tls`).
    pub fn listener_certs(
        &self,
    ) -> Result<crate::listen::tls::ListenerCerts, crate::listen::tls::TlsError> {
        crate::listen::tls::ListenerCerts::new(
            &self.tls,
            self.proxy.tls.as_ref(),
            self.otlp.tls.as_ref(),
        )
    }

    /// What the chosen `role` needs and the rest of the file does not give: `(key, message)`.
    fn role_problem(&self) -> Option<(&'static str, &'static str)> {
        match self.role {
            Role::All => None,
            Role::Proxy if self.aggregator.is_none() => Some((
                "aggregator",
                "role: proxy ships its request records to an aggregator: set aggregator.endpoint (or --aggregator URL)",
            )),
            Role::Proxy if self.proxy.upstreams.is_empty() => Some((
                "proxy.upstreams",
                "role: proxy forwards requests: configure at least one upstream (or --upstream URL)",
            )),
            Role::Proxy if self.proxy.tenant_salt.is_empty() => Some((
                "proxy.tenant_salt",
                "role: proxy needs the salt every replica shares (any secret string), so that one API key is one tenant and one prompt prefix one cache key whichever replica a request reaches",
            )),
            Role::Proxy if self.capture.text => Some((
                "capture.text",
                "role: proxy does not ship captured text to the aggregator: capture text in a role: all process",
            )),
            Role::Proxy => None,
            Role::Aggregator if !self.otlp.enabled => Some((
                "otlp.enabled",
                "role: aggregator receives the proxy replicas' records over OTLP: the receiver must be on (drop --no-otlp)",
            )),
            Role::Aggregator => None,
        }
    }

    /// The first listener bound off loopback without protection: `(key, message)`.
    pub fn exposure_problem(&self) -> Option<(String, String)> {
        if self.auth.allow_unauthenticated {
            return None;
        }
        if self.auth.tokens_file.is_none() {
            let mut guarded = vec![("listen", self.listen)];
            // A proxy replica starts no OTLP receiver.
            if self.otlp.enabled && self.role != Role::Proxy {
                guarded.push(("otlp.grpc_listen", self.otlp.grpc_listen));
                guarded.push(("otlp.http_listen", self.otlp.http_listen));
            }
            if let Some((key, addr)) = guarded.into_iter().find(|(_, a)| !is_loopback(a)) {
                let message = format!(
                    "{addr} is not a loopback address and no auth.tokens_file is set: set auth.tokens_file (or --auth-tokens) or opt out with auth.allow_unauthenticated: true"
                );
                return Some((key.to_string(), message));
            }
        }
        if !self.proxy.upstreams.is_empty()
            && !self.proxy.allow_public
            && !is_loopback(&self.proxy.listen)
        {
            let message = format!(
                "{} is not a loopback address: the proxy checks no tokenwatch token (it forwards each client's own Authorization header to the upstream); set proxy.allow_public: true if the upstream authenticates its clients, or bind the proxy to loopback",
                self.proxy.listen
            );
            return Some(("proxy.listen".into(), message));
        }
        None
    }

    /// Read and validate a configuration file; errors name the file and the key path.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: file.clone(),
            source,
        })?;
        Config::from_yaml(&text, &file)
    }

    pub fn from_yaml(text: &str, file: &str) -> Result<Config, ConfigError> {
        let cfg = Config::parse_yaml(text, file)?;
        cfg.validate(file)?;
        Ok(cfg)
    }

    /// Read a configuration file without `validate` (for command-line flags that override keys
    /// the checks look at, e.g. `--auth-tokens` for a file listening off loopback).
    pub fn load_unvalidated(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: file.clone(),
            source,
        })?;
        Config::parse_yaml(&text, &file)
    }

    fn parse_yaml(text: &str, file: &str) -> Result<Config, ConfigError> {
        Config::parse_yaml_with(text, file, |name| std::env::var(name))
    }

    /// `parse_yaml`, looking `${NAME}`s up with `lookup`.
    fn parse_yaml_with(
        text: &str,
        file: &str,
        lookup: impl Fn(&str) -> Result<String, std::env::VarError>,
    ) -> Result<Config, ConfigError> {
        let (text, env_values) = env::expand(text, lookup).map_err(|e| ConfigError::Env {
            file: file.to_string(),
            line: e.line,
            message: e.message,
        })?;
        let text = text.as_str();
        let mut cfg: Config = if text.trim().is_empty() {
            Config::default()
        } else {
            let mut key_path = String::new();
            serde_saphyr::with_deserializer_from_str(text, |de| {
                serde_path_to_error::deserialize(de).map_err(|e| {
                    key_path = e.path().to_string();
                    e.into_inner()
                })
            })
            .map_err(|e| {
                let at = if key_path.is_empty() || key_path == "." {
                    String::new()
                } else {
                    format!("key {key_path}: ")
                };
                ConfigError::Parse {
                    file: file.to_string(),
                    // A value from the environment is shown as its ${NAME}, never itself.
                    message: env_values.hide(&format!("{at}{e}")),
                }
            })?
        };
        cfg.env_values = env_values;
        Ok(cfg)
    }

    /// Checks that serde cannot express. A value that came from the environment is shown as
    /// its `${NAME}` in the error.
    pub fn validate(&self, file: &str) -> Result<(), ConfigError> {
        self.check(file).map_err(|e| match e {
            ConfigError::Invalid {
                file,
                path,
                message,
            } => ConfigError::Invalid {
                file,
                path,
                message: self.env_values.hide(&message),
            },
            other => other,
        })
    }

    fn check(&self, file: &str) -> Result<(), ConfigError> {
        let invalid = |path: String, message: String| ConfigError::Invalid {
            file: file.to_string(),
            path,
            message,
        };
        // Sizes a start allocates or queues by: refused here, not by an abort at start.
        for (path, value, most) in [
            (
                "telemetry.queue_capacity",
                self.telemetry.queue_capacity,
                1 << 24,
            ),
            ("telemetry.batch_max", self.telemetry.batch_max, 1 << 20),
            (
                "store.write_queue_records",
                self.store.write_queue_records,
                1 << 24,
            ),
            (
                "store.batch_rows",
                self.store.batch_rows.unwrap_or(1),
                1 << 20,
            ),
        ] {
            if value == 0 || value > most {
                return Err(invalid(
                    path.to_string(),
                    format!("{value} is out of range: 1 to {most}"),
                ));
            }
        }
        for (i, prefix) in self.proxy.path_prefixes.iter().enumerate() {
            crate::sources::proxy::endpoint::check_prefix(prefix)
                .map_err(|m| invalid(format!("proxy.path_prefixes[{i}]"), m))?;
        }
        for (i, u) in self.proxy.upstreams.iter().enumerate() {
            let url = parse_upstream_url(&u.url)
                .map_err(|m| invalid(format!("proxy.upstreams[{i}].url"), m))?;
            match (&u.tls, url.https) {
                (Some(_), false) => {
                    let m = format!(
                        "{:?} is plain http: tls applies to https:// upstreams only",
                        u.url
                    );
                    return Err(invalid(format!("proxy.upstreams[{i}].tls"), m));
                }
                (tls, true) => {
                    crate::kernel::tls::UpstreamTls::new(tls.as_ref()).map_err(|e| {
                        invalid(
                            format!("proxy.upstreams[{i}].tls.{}", e.key()),
                            e.to_string(),
                        )
                    })?;
                }
                (None, false) => {}
            }
        }
        crate::kernel::splits::validate(&self.proxy.routes)
            .map_err(|(path, message)| invalid(path, message))?;
        self.scrape
            .static_targets()
            .map_err(|(path, message)| invalid(path, message))?;
        self.models
            .aliases()
            .map_err(|(path, message)| invalid(path, message))?;
        self.models
            .validate_admission()
            .map_err(|(path, message)| invalid(path, message))?;
        crate::pipeline::pricing::PriceTable::load(&self.pricing, &self.proxy.upstreams)
            .map_err(|e| invalid(e.path, e.message))?;
        crate::alerting::budget::validate(&self.budgets)
            .map_err(|(path, message)| invalid(path, message))?;
        let listener_certs = self
            .listener_certs()
            .map_err(|e| invalid(e.key, e.message))?;
        listener_certs
            .check_files()
            .map_err(|e| invalid(e.key, e.message))?;
        if self.telemetry.queue_capacity == 0 {
            return Err(invalid(
                "telemetry.queue_capacity".into(),
                "must be at least 1".into(),
            ));
        }
        if self.store.write_queue_records == 0 {
            return Err(invalid(
                "store.write_queue_records".into(),
                "must be at least 1".into(),
            ));
        }
        if self.store.batch_rows == Some(0) {
            return Err(invalid(
                "store.batch_rows".into(),
                "must be at least 1".into(),
            ));
        }
        if self.telemetry.batch_max == 0 {
            return Err(invalid(
                "telemetry.batch_max".into(),
                "must be at least 1".into(),
            ));
        }
        if self.aggregation.max_series == 0 {
            return Err(invalid(
                "aggregation.max_series".into(),
                "must be at least 1".into(),
            ));
        }
        self.gpu
            .validate()
            .map_err(|(path, message)| invalid(path, message))?;
        self.limits
            .validate()
            .map_err(|(path, message)| invalid(path, message))?;
        self.capture
            .validate()
            .map_err(|(path, message)| invalid(path, message))?;
        self.retention
            .validate()
            .map_err(|(path, message)| invalid(path, message))?;
        self.runtime
            .validate()
            .map_err(|(path, message)| invalid(path.into(), message))?;
        self.logs
            .validate(&self.sources)
            .map_err(|(path, message)| invalid(path, message))?;
        crate::alerting::rules::compile(&self.alerting)
            .map_err(|(path, message)| invalid(path, message))?;
        crate::alerting::slo::validate(&self.slos)
            .map_err(|(path, message)| invalid(path, message))?;
        self.scaling
            .validate()
            .map_err(|(path, message)| invalid(path, message))?;
        self.alerting
            .delivery
            .validate()
            .map_err(|e| invalid("alerting.delivery".into(), e.to_string()))?;
        for (key, value) in [
            ("proxy.tenant_header", &self.proxy.tenant_header),
            ("proxy.ab_group_header", &self.proxy.ab_group_header),
            (
                "proxy.model_version_header",
                &self.proxy.model_version_header,
            ),
            (
                "proxy.prompt_version_header",
                &self.proxy.prompt_version_header,
            ),
        ] {
            if http::HeaderName::from_bytes(value.as_bytes()).is_err() {
                return Err(invalid(
                    key.into(),
                    format!("{value:?} is not a valid HTTP header name"),
                ));
            }
        }
        crate::auth::validate(&self.auth).map_err(|(path, message)| invalid(path, message))?;
        if let Some((path, message)) = self.exposure_problem() {
            return Err(invalid(path, message));
        }
        crate::audit::validate(&self.audit).map_err(|(path, message)| invalid(path, message))?;
        crate::export::remote_write::validate(&self.export.remote_write)
            .map_err(|e| invalid(e.key, e.message))?;
        crate::export::otlp::validate(self.export.otlp.as_ref())
            .map_err(|e| invalid(e.key, e.message))?;
        if let Some(link) = &self.aggregator {
            crate::export::otlp::ship::validate(link).map_err(|e| invalid(e.key, e.message))?;
        }
        if let Some((path, message)) = self.role_problem() {
            return Err(invalid(path.into(), message.into()));
        }
        self.traces
            .validate()
            .map_err(|(path, message)| invalid(path, message))?;
        if self.store.backend == StoreBackendKind::ClickHouse {
            let c = &self.store.clickhouse;
            let https = c.url.starts_with("https://");
            if !c.url.starts_with("http://") && !https {
                return Err(invalid(
                    "store.clickhouse.url".into(),
                    format!(
                        "{:?}: expected http://host:port or https://host:port",
                        c.url
                    ),
                ));
            }
            if let Some(f) = &c.password_file
                && !f.is_file()
            {
                return Err(invalid(
                    "store.clickhouse.password_file".into(),
                    format!("{} is not a readable file", f.display()),
                ));
            }
            if c.password_file.is_some() && c.password_env.is_some() {
                return Err(invalid(
                    "store.clickhouse.password_env".into(),
                    "password_file is set too: keep one".into(),
                ));
            }
            if let Some(f) = &c.ca_file {
                if !https {
                    return Err(invalid(
                        "store.clickhouse.ca_file".into(),
                        format!("set, but the url {:?} is not https://", c.url),
                    ));
                }
                if !f.is_file() {
                    return Err(invalid(
                        "store.clickhouse.ca_file".into(),
                        format!("{} is not a readable file", f.display()),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// `url` without what may be secret in it: credentials (`user:pass@`) and the query string
/// always, the path too unless `keep_path`. Unparseable: redacted whole.
fn redact_url(url: &str, keep_path: bool) -> String {
    let Ok(uri) = url.parse::<http::Uri>() else {
        return "<redacted>".into();
    };
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return "<redacted>".into();
    };
    let host = match authority.port_u16() {
        Some(port) => format!("{}:{port}", authority.host()),
        None => authority.host().to_string(),
    };
    let path = uri.path();
    let path = if keep_path || path == "/" || path.is_empty() {
        path.to_string()
    } else {
        "/<redacted>".into()
    };
    let query = if uri.query().is_some() {
        "?<redacted>"
    } else {
        ""
    };
    format!("{scheme}://{host}{path}{query}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key path a refused configuration names.
    fn refused_at(yaml: &str) -> String {
        match Config::from_yaml(yaml, "t.yaml") {
            Err(ConfigError::Invalid { path, .. }) => path,
            Err(ConfigError::Parse { message, .. }) => format!("parse: {message}"),
            other => panic!("expected a refusal of {yaml:?}, got {other:?}"),
        }
    }

    #[test]
    fn each_role_asks_for_what_it_needs() {
        let up = "proxy:\n  upstreams: [{url: 'http://127.0.0.1:8000'}]\n";
        let salt = "  tenant_salt: s3cret\n";
        let link = "aggregator: {endpoint: 'http://agg:4318'}\n";
        assert_eq!(Config::from_yaml("", "t.yaml").unwrap().role, Role::All);
        assert_eq!(
            refused_at(&format!("role: proxy\n{up}{salt}")),
            "aggregator"
        );
        assert_eq!(
            refused_at(&format!("role: proxy\n{link}")),
            "proxy.upstreams"
        );
        assert_eq!(
            refused_at(&format!("role: proxy\n{up}{link}")),
            "proxy.tenant_salt"
        );
        assert_eq!(
            refused_at(&format!(
                "role: proxy\n{up}{salt}{link}capture: {{text: true}}\n"
            )),
            "capture.text"
        );
        let ok = Config::from_yaml(&format!("role: proxy\n{up}{salt}{link}"), "t.yaml").unwrap();
        assert_eq!(ok.aggregator.unwrap().buffer.capacity, 50_000);
        assert_eq!(
            refused_at("role: aggregator\notlp: {enabled: false}\n"),
            "otlp.enabled"
        );
        // One file for every role: the aggregator ignores `aggregator:` and the upstreams.
        assert!(
            Config::from_yaml(&format!("role: aggregator\n{up}{salt}{link}"), "t.yaml").is_ok()
        );
        assert!(refused_at("role: replica\n").contains("replica"));
        assert_eq!(
            refused_at("aggregator: {endpoint: 'http://agg:4318', buffer: {capacity: 0}}\n"),
            "aggregator.buffer.capacity"
        );
        assert!(
            refused_at("aggregator: {endpoint: 'http://agg:4318', bufer: {}}\n").contains("bufer")
        );
        assert_eq!(Role::parse("proxy"), Ok(Role::Proxy));
        assert!(Role::parse("both").is_err());
    }

    #[test]
    fn empty_file_gives_defaults() {
        let c = Config::from_yaml("", "t.yaml").unwrap();
        assert_eq!(c.listen.port(), 9464);
        assert_eq!(c.proxy.listen.port(), 8080);
        assert_eq!(c.store.raw_retention.0, Duration::from_secs(7 * 86_400));
    }

    #[test]
    fn full_file_parses() {
        let y = "listen: 127.0.0.1:9999\ndata_dir: /tmp/x\nproxy:\n  upstreams:\n    - url: http://127.0.0.1:8000\n      models: [a, b]\n      runtime: vllm\n    - url: http://127.0.0.1:8001\n  idle_timeout: 30s\nstore:\n  raw_retention: 2d\n";
        let c = Config::from_yaml(y, "t.yaml").unwrap();
        assert_eq!(c.proxy.upstreams.len(), 2);
        assert_eq!(c.proxy.upstreams[0].runtime, "vllm");
        assert!(c.proxy.upstreams[1].serves_any_model());
        assert_eq!(c.proxy.idle_timeout.0, Duration::from_secs(30));
        assert_eq!(c.store.raw_retention.0, Duration::from_secs(2 * 86_400));
    }

    #[test]
    fn unknown_key_names_file_and_key() {
        let err = Config::from_yaml("proxy:\n  listn: 1.2.3.4:5\n", "bad.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("bad.yaml"), "{err}");
        assert!(err.contains("listn"), "{err}");
        let err = Config::from_yaml(
            "proxy:\n  upstreams:\n    - url: http://127.0.0.1:1\n      modles: [a]\n",
            "bad.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("key proxy.upstreams[0]") && err.contains("modles"),
            "{err}"
        );
        let err = Config::from_yaml("store:\n  fsync: maybe\n", "bad.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("key store.fsync"), "{err}");
    }

    #[test]
    fn bad_duration_and_url_are_explained() {
        let err = Config::from_yaml("store:\n  raw_retention: 7 weeks\n", "c.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unit must be one of") || err.contains("invalid duration"),
            "{err}"
        );
        let err = Config::from_yaml("proxy:\n  upstreams:\n    - url: ftp://x\n", "c.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("proxy.upstreams[0].url"), "{err}");
    }

    #[test]
    fn https_upstreams_and_their_tls_keys() {
        let c = Config::from_yaml(
            "proxy:\n  upstreams:\n    - url: https://api.example.com/v1/\n",
            "c.yaml",
        )
        .unwrap();
        let u = parse_upstream_url(&c.proxy.upstreams[0].url).unwrap();
        assert!(u.https);
        assert_eq!(
            (u.authority.as_str(), u.base_path.as_str()),
            ("api.example.com", "/v1")
        );
        assert!(!parse_upstream_url("http://127.0.0.1:8000").unwrap().https);
        assert!(parse_upstream_url("https://user@h:1").is_err());
        assert!(parse_upstream_url("https://h:1/?x=1").is_err());

        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.pem");
        let y = format!(
            "proxy:\n  upstreams:\n    - url: https://h:8443\n      tls:\n        ca_file: {}\n",
            missing.display()
        );
        let err = Config::from_yaml(&y, "c.yaml").unwrap_err().to_string();
        assert!(
            err.contains("c.yaml")
                && err.contains("proxy.upstreams[0].tls.ca_file")
                && err.contains("nope.pem"),
            "{err}"
        );

        let y = "proxy:\n  upstreams:\n    - url: https://h:8443\n      tls:\n        server_name: 'bad name'\n";
        let err = Config::from_yaml(y, "c.yaml").unwrap_err().to_string();
        assert!(err.contains("proxy.upstreams[0].tls.server_name"), "{err}");

        let y =
            "proxy:\n  upstreams:\n    - url: https://h:8443\n      tls:\n        ca_fil: x.pem\n";
        let err = Config::from_yaml(y, "c.yaml").unwrap_err().to_string();
        assert!(
            err.contains("key proxy.upstreams[0].tls") && err.contains("ca_fil"),
            "{err}"
        );

        let y =
            "proxy:\n  upstreams:\n    - url: http://h:8000\n      tls:\n        server_name: h\n";
        let err = Config::from_yaml(y, "c.yaml").unwrap_err().to_string();
        assert!(
            err.contains("proxy.upstreams[0].tls") && err.contains("https:// upstreams only"),
            "{err}"
        );
    }

    #[test]
    fn audit_section_defaults_and_checks() {
        let c = Config::from_yaml("data_dir: /d\n", "c.yaml").unwrap();
        assert!(c.audit.enabled);
        assert_eq!(c.audit.retention.0, Duration::from_secs(30 * 86_400));
        assert_eq!(c.audit.dir(&c.data_dir), Path::new("/d/audit"));
        let c = Config::from_yaml(
            "audit:\n  enabled: false\n  retention: 90d\n  dir: /var/log/tw\n",
            "c.yaml",
        )
        .unwrap();
        assert!(!c.audit.enabled);
        assert_eq!(c.audit.dir(&c.data_dir), Path::new("/var/log/tw"));
        let err = Config::from_yaml("audit:\n  retention: 12h\n", "c.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("audit.retention") && err.contains("at least 1d"),
            "{err}"
        );
        let err = Config::from_yaml("audit:\n  retain: 7d\n", "c.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("key audit") && err.contains("retain"), "{err}");
    }

    #[test]
    fn store_backend_defaults_to_sqlite_and_reads_clickhouse_settings() {
        let c = Config::from_yaml("data_dir: /d\n", "c.yaml").unwrap();
        assert_eq!(c.store.backend, StoreBackendKind::Sqlite);
        assert_eq!(
            c.store.backend(Path::new("/d")),
            tokenwatch_store::StoreBackend::Sqlite {
                data_dir: "/d".into()
            }
        );
        let y = "store:\n  backend: clickhouse\n  clickhouse:\n    url: http://10.0.0.5:8123\n    database: tw\n    user: writer\n    retry_for: 3s\n";
        let c = Config::from_yaml(y, "c.yaml").unwrap();
        match c.store.backend(Path::new("/d")) {
            tokenwatch_store::StoreBackend::ClickHouse(ch) => {
                assert_eq!(
                    (ch.url.as_str(), ch.database.as_str(), ch.user.as_str()),
                    ("http://10.0.0.5:8123", "tw", "writer")
                );
                assert_eq!(ch.retry_for, Duration::from_secs(3));
                assert!(ch.ttl, "TTL retention by default");
            }
            other => panic!("{other:?}"),
        }
        // ClickHouse Cloud: https, the password from the environment, TTL off.
        let y = "store:\n  backend: clickhouse\n  clickhouse:\n    url: https://h.clickhouse.cloud:8443\n    password_env: CH_PW\n    ttl: false\n";
        match Config::from_yaml(y, "c.yaml")
            .unwrap()
            .store
            .backend(Path::new("/d"))
        {
            tokenwatch_store::StoreBackend::ClickHouse(ch) => {
                assert_eq!(ch.url, "https://h.clickhouse.cloud:8443");
                assert_eq!(ch.password_env.as_deref(), Some("CH_PW"));
                assert!(!ch.ttl);
            }
            other => panic!("{other:?}"),
        }
        let y = "store:\n  backend: clickhouse\n  clickhouse:\n    url: http://h:8123\n    ca_file: /etc/hostname\n";
        let err = Config::from_yaml(y, "c.yaml").unwrap_err().to_string();
        assert!(
            err.contains("store.clickhouse.ca_file") && err.contains("not https"),
            "{err}"
        );
        let err = Config::from_yaml("store:\n  clickhouse:\n    pasword: x\n", "c.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("key store.clickhouse"), "{err}");
        let err = Config::from_yaml("store:\n  backend: postgres\n", "c.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("key store.backend"), "{err}");
        let y = "store:\n  backend: clickhouse\n  clickhouse:\n    url: ftp://h:8443\n";
        let err = Config::from_yaml(y, "c.yaml").unwrap_err().to_string();
        assert!(err.contains("store.clickhouse.url"), "{err}");
        let y =
            "store:\n  backend: clickhouse\n  clickhouse:\n    password_file: /nonexistent/pw\n";
        let err = Config::from_yaml(y, "c.yaml").unwrap_err().to_string();
        assert!(err.contains("store.clickhouse.password_file"), "{err}");
    }

    #[test]
    fn durations_parse() {
        assert_eq!(
            HumanDuration::parse("250ms").unwrap().0,
            Duration::from_millis(250)
        );
        assert_eq!(
            HumanDuration::parse("2h").unwrap().0,
            Duration::from_secs(7200)
        );
        assert!(HumanDuration::parse("5").is_err());
        assert!(HumanDuration::parse("x5s").is_err());
        assert!(HumanDuration::parse("99999999999999999999d").is_err());
    }

    #[test]
    fn the_snapshot_configuration_is_json_with_its_secrets_redacted() {
        let c = Config::from_yaml(
            "proxy:\n  tenant_salt: pepper\nalerting:\n  delivery:\n    webhooks:\n      - {url: 'http://127.0.0.1:2/h', headers: {Authorization: 'Bearer w'}}\n      - {url: 'https://events.example/v2/enqueue', format: pagerduty, routing_key: 'pd-k3y'}\nexport:\n  otlp: {endpoint: 'http://127.0.0.1:4318', headers: {Authorization: 'Bearer o'}}\n  remote_write:\n    - {url: 'http://127.0.0.1:9090/api/v1/write', headers: {Authorization: 'Bearer r'}}\nstore:\n  raw_retention: 36h\naggregator: {endpoint: 'http://127.0.0.1:4318', headers: {Authorization: 'Bearer g'}}\n",
            "t.yaml",
        )
        .unwrap();
        let v = c.redacted_json();
        assert_eq!(v["format"], "json");
        let text = v.to_string();
        for secret in [
            "pepper", "Bearer w", "Bearer o", "Bearer r", "Bearer g", "pd-k3y",
        ] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert_eq!(v["config"]["store"]["raw_retention"], "36h");
        assert_eq!(
            v["config"]["export"]["otlp"]["headers"]["Authorization"],
            "<redacted>"
        );
    }

    #[test]
    fn values_from_the_environment_never_appear_in_errors() {
        let lookup = |name: &str| match name {
            "UPSTREAM" => Ok("ftp://hunter2-secret-host:21".to_string()),
            "BATCH" => Ok("many-hunter2".to_string()),
            _ => Err(std::env::VarError::NotPresent),
        };
        // A value the parser refuses, and one only the checks refuse.
        let parse =
            Config::parse_yaml_with("telemetry:\n  batch_max: ${BATCH}\n", "t.yaml", lookup)
                .unwrap_err()
                .to_string();
        assert!(
            parse.contains("${BATCH}") && !parse.contains("hunter2"),
            "{parse}"
        );
        let cfg = Config::parse_yaml_with(
            "proxy:\n  upstreams:\n    - {url: '${UPSTREAM}', models: [m]}\n",
            "t.yaml",
            lookup,
        )
        .unwrap();
        let invalid = cfg.validate("t.yaml").unwrap_err().to_string();
        assert!(
            invalid.contains("${UPSTREAM}") && !invalid.contains("hunter2"),
            "{invalid}"
        );
    }

    #[test]
    fn sizes_out_of_range_are_refused_by_name() {
        for (yaml, key) in [
            (
                "telemetry:\n  batch_max: 100000000000000\n",
                "telemetry.batch_max",
            ),
            (
                "telemetry:\n  queue_capacity: 0\n",
                "telemetry.queue_capacity",
            ),
            ("store:\n  batch_rows: 0\n", "store.batch_rows"),
        ] {
            let e = Config::from_yaml(yaml, "t.yaml").unwrap_err().to_string();
            assert!(e.contains(key) && e.contains("out of range"), "{e}");
        }
        assert!(Config::from_yaml("telemetry:\n  batch_max: 4096\n", "t.yaml").is_ok());
    }

    #[test]
    fn urls_lose_credentials_queries_and_webhook_paths() {
        assert_eq!(
            redact_url("https://hooks.slack.com/services/T0/B0/XXXX", false),
            "https://hooks.slack.com/<redacted>"
        );
        assert_eq!(
            redact_url("http://user:pw@am.example:9093/api/v2/alerts?token=s", true),
            "http://am.example:9093/api/v2/alerts?<redacted>"
        );
        assert_eq!(
            redact_url("http://127.0.0.1:4318", true),
            "http://127.0.0.1:4318/"
        );
        assert_eq!(redact_url("not a url", true), "<redacted>");
        let c = Config::from_yaml(
            "alerting:\n  delivery:\n    alertmanagers: ['http://u:secretpw@127.0.0.1:9093']\n    webhooks:\n      - {url: 'https://hooks.example/T/B/secrettoken'}\n",
            "t.yaml",
        )
        .unwrap();
        let text = c.redacted_json().to_string();
        assert!(!text.contains("secret"), "{text}");
    }
}

/// The `shutdown:` section: how the request path drains on SIGTERM or SIGINT.
///
/// ```yaml
/// shutdown:
///   delay: 5s            # /readyz answers 503 at once; the proxy keeps accepting this long
///   drain_timeout: 10m   # then requests and streams in flight get this long to finish
/// ```
///
/// In Kubernetes, `terminationGracePeriodSeconds` must exceed `delay + drain_timeout` plus a
/// few seconds for the flush (or the pod is killed mid-stream), and a `preStop` hook is not
/// needed for the delay: tokenwatch keeps serving through it by itself.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ShutdownConfig {
    /// After the signal, `/readyz` answers 503 at once and the proxy keeps accepting new
    /// connections for this long: the time a load balancer or Kubernetes needs to stop sending.
    /// Only when the proxy runs (collector-only has no request path to drain).
    pub delay: HumanDuration,
    /// Then the proxy stops accepting; requests and streams in flight run to completion for up
    /// to this long (the longest stream you expect), their count logged and in
    /// `tokenwatch_shutdown_in_flight_requests`. A second signal cuts the drain short.
    pub drain_timeout: HumanDuration,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        ShutdownConfig {
            delay: HumanDuration(Duration::from_secs(5)),
            drain_timeout: HumanDuration(Duration::from_secs(600)),
        }
    }
}
