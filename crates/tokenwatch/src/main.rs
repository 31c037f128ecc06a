// The `tokenwatch` binary: command-line parsing and dispatch to `run`, `sim`, `demo`, `top`, `rules`,
// `dashboards`, `completions`, `check-config`. Errors reach the user here, with their full context.

#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use tokenwatch::config::{Config, UpstreamConfig, UpstreamTlsConfig};
use tokenwatch::{app, demo};

/// What `tokenwatch --version` prints after the name: the version, the git commit it was built
/// from and the cargo features it was built with (recorded by build.rs).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("TOKENWATCH_GIT_COMMIT"),
    "; features: ",
    env!("TOKENWATCH_FEATURES"),
    ")"
);

#[derive(Parser)]
#[command(
    name = "tokenwatch",
    version = VERSION,
    about = "Token-level observability and alerting for LLM inference fleets"
)]
struct Cli {
    /// Log filter (RUST_LOG syntax), e.g. `info` or `tokenwatch=debug`.
    #[arg(long, global = true, env = "TOKENWATCH_LOG", default_value = "info")]
    log: String,
    /// Log line format: `text` for people, `json` (one object per line) for log collectors.
    #[arg(
        long,
        global = true,
        value_enum,
        env = "TOKENWATCH_LOG_FORMAT",
        default_value = "text"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run tokenwatch: the streaming proxy (when an upstream is set), the pipeline and the API.
    Run(RunArgs),
    /// Run the simulated OpenAI-compatible inference server.
    Sim(tokenwatch_sim::SimArgs),
    /// Start a simulated fleet, the proxy in front of it and traffic, on embedded defaults.
    Demo(demo::DemoArgs),
    /// Live terminal view of a running tokenwatch: per-model latency, rates, KV cache, GPU memory, alerts.
    Top(tokenwatch::top::TopArgs),
    /// Validate a configuration file without starting anything.
    CheckConfig {
        /// The YAML file to check [env: TOKENWATCH_CONFIG].
        #[arg(env = "TOKENWATCH_CONFIG", hide_env = true)]
        file: PathBuf,
        /// Check it as `run --role ROLE` would read it (one file can serve every role).
        #[arg(long, value_name = "ROLE", value_parser = tokenwatch::config::Role::parse)]
        role: Option<tokenwatch::config::Role>,
    },
    /// Alerting rules for other systems.
    Rules {
        #[command(subcommand)]
        command: RulesCommand,
    },
    /// Print a shell completion script, e.g. `tokenwatch completions bash > /etc/bash_completion.d/tokenwatch`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Dashboards for other systems.
    Dashboards {
        #[command(subcommand)]
        command: DashboardsCommand,
    },
    /// Print the JSON Schema of tokenwatch.yaml (for editors; also published as
    /// `schemas/tokenwatch.schema.json`).
    Schema {
        /// Write to this file instead of standard output.
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
}

/// Transparent huge pages off for this process, first thing (before the allocator has touched
/// much): mimalloc asks for them on its arenas (`madvise(MADV_HUGEPAGE)`), so the kernel backs
/// each 2 MiB region the heap touches with a whole huge page. Measured on `tokenwatch run` (proxy
/// bench, 1,000 held streams): 32 of the 35 MiB of anonymous memory when idle were huge pages, a
/// held stream on new connections cost 63 KiB instead of 38, and the peak RSS was 174 MiB instead
/// of 103. The heap here is many small objects touched sparsely, where huge pages save little TLB
/// work and cost that RSS.
#[cfg(target_os = "linux")]
fn transparent_huge_pages_off() -> std::io::Result<()> {
    rustix::thread::disable_transparent_huge_pages(true).map_err(std::io::Error::from)
}

#[cfg(not(target_os = "linux"))]
fn transparent_huge_pages_off() -> std::io::Result<()> {
    Ok(())
}

#[derive(Subcommand)]
enum DashboardsCommand {
    /// Write a dashboard over tokenwatch's /metrics and the runtimes' own metrics, e.g. Grafana JSON.
    Export {
        #[arg(long, value_enum, default_value = "grafana")]
        format: DashboardFormat,
        /// Output file [default: standard output].
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum DashboardFormat {
    Grafana,
}

#[derive(Subcommand)]
enum RulesCommand {
    /// Write the threshold rules PromQL can express, e.g. as a Prometheus alerting rules file.
    Export {
        #[arg(long, value_enum, default_value = "prometheus")]
        format: RulesFormat,
        /// Configuration file whose rules are exported [default: the built-in rules].
        #[arg(short, long, env = "TOKENWATCH_CONFIG")]
        config: Option<PathBuf>,
        /// Output file [default: standard output].
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum RulesFormat {
    Prometheus,
}

#[derive(clap::Args, Clone)]
struct RunArgs {
    /// Configuration file (YAML); flags below override it.
    #[arg(short, long, env = "TOKENWATCH_CONFIG")]
    config: Option<PathBuf>,
    /// API, /metrics and health endpoints [default: 127.0.0.1:9464]
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Proxy listener [default: 127.0.0.1:8080]
    #[arg(long)]
    proxy_listen: Option<SocketAddr>,
    /// Default upstream, e.g. http://127.0.0.1:8000 (added after the configured routes).
    #[arg(long)]
    upstream: Option<String>,
    /// Runtime label of --upstream (vllm, tgi, sglang, triton, sim, openai).
    #[arg(long, default_value = "openai")]
    upstream_runtime: String,
    /// PEM file of CA certificates trusted for an https --upstream, besides the system's roots.
    #[arg(long, value_name = "FILE", requires = "upstream")]
    upstream_ca_file: Option<PathBuf>,
    /// Data directory [default: ./tokenwatch-data]
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Scrape this Prometheus/OpenMetrics endpoint (repeatable), e.g. http://127.0.0.1:8000/metrics
    #[arg(long = "scrape", value_name = "URL")]
    scrape: Vec<String>,
    /// Scrape only shard INDEX of COUNT of the targets (Prometheus `hashmod` of the target address),
    /// e.g. 0/2 and 1/2 on two instances; sets scrape.shard.
    #[arg(long, value_name = "INDEX/COUNT", value_parser = tokenwatch::sources::scrape::shard::ShardConfig::parse)]
    shard: Option<tokenwatch::sources::scrape::shard::ShardConfig>,
    /// OTLP/gRPC listener [default: 127.0.0.1:4317]
    #[arg(long)]
    otlp_grpc_listen: Option<SocketAddr>,
    /// OTLP/HTTP listener [default: 127.0.0.1:4318]
    #[arg(long)]
    otlp_http_listen: Option<SocketAddr>,
    /// Do not start the OTLP receiver.
    #[arg(long)]
    no_otlp: bool,
    /// Send alerts to this Alertmanager (API v2), e.g. http://127.0.0.1:9093 (repeatable).
    #[arg(long = "alertmanager", value_name = "URL")]
    alertmanager: Vec<String>,
    /// Send what /metrics serves to this Prometheus remote-write endpoint every 15 s, e.g.
    /// http://127.0.0.1:9090/api/v1/write (repeatable; settings: export.remote_write).
    #[arg(long = "remote-write", value_name = "URL")]
    remote_write: Vec<String>,
    /// Keep records, roll-ups, spans, logs and alerts in ClickHouse at this HTTP URL, e.g.
    /// http://127.0.0.1:8123 (sets store.backend: clickhouse and store.clickhouse.url).
    #[arg(long, value_name = "URL")]
    clickhouse_url: Option<String>,
    /// TLS certificate chain (PEM) of the API, proxy and OTLP listeners; sets tls.cert_file.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert; sets tls.key_file.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Bearer tokens, one `ROLE TOKEN [NAME]` per line (roles read, admin, ingest); sets auth.tokens_file.
    #[arg(long, value_name = "FILE")]
    auth_tokens: Option<PathBuf>,
    /// What this process runs: all (proxy and analysis, the default), proxy (a thin replica that
    /// ships its records to --aggregator) or aggregator (no proxy; receives the replicas'
    /// records over OTLP); sets role.
    #[arg(long, value_name = "ROLE", value_parser = tokenwatch::config::Role::parse)]
    role: Option<tokenwatch::config::Role>,
    /// Where a proxy replica ships its records: the aggregator's OTLP/HTTP receiver (or an
    /// OpenTelemetry Collector's), e.g. http://tokenwatch-aggregator:4318; sets aggregator.endpoint.
    #[arg(long, value_name = "URL")]
    aggregator: Option<String>,
}

impl RunArgs {
    fn into_config(self) -> anyhow::Result<Config> {
        // Validated once the flags are applied: they may fix what the file alone lacks.
        let mut cfg = match &self.config {
            Some(path) => Config::load_unvalidated(path)?,
            None => Config::default(),
        };
        if let Some(l) = self.listen {
            cfg.listen = l;
        }
        if let Some(l) = self.proxy_listen {
            cfg.proxy.listen = l;
        }
        if let Some(d) = self.data_dir {
            cfg.data_dir = d;
        }
        for url in self.scrape {
            cfg.scrape
                .targets
                .push(tokenwatch::sources::scrape::ScrapeTarget {
                    url,
                    runtime: None,
                    interval: None,
                    timeout: None,
                    labels: Default::default(),
                });
        }
        if let Some(s) = self.shard {
            cfg.scrape.shard = Some(s);
        }
        if let Some(l) = self.otlp_grpc_listen {
            cfg.otlp.grpc_listen = l;
        }
        if let Some(l) = self.otlp_http_listen {
            cfg.otlp.http_listen = l;
        }
        if self.no_otlp {
            cfg.otlp.enabled = false;
        }
        cfg.alerting
            .delivery
            .alertmanagers
            .extend(self.alertmanager);
        cfg.export.remote_write.extend(
            self.remote_write
                .into_iter()
                .map(tokenwatch::export::remote_write::RemoteWriteConfig::new),
        );
        if let Some(url) = self.clickhouse_url {
            cfg.store.backend = tokenwatch::config::StoreBackendKind::ClickHouse;
            cfg.store.clickhouse.url = url;
        }
        if let (Some(cert), Some(key)) = (self.tls_cert, self.tls_key) {
            cfg.tls.cert_file = Some(cert);
            cfg.tls.key_file = Some(key);
        }
        if let Some(file) = self.auth_tokens {
            cfg.auth.tokens_file = Some(file);
        }
        if let Some(role) = self.role {
            cfg.role = role;
        }
        if let Some(url) = self.aggregator {
            match &mut cfg.aggregator {
                Some(link) => link.endpoint = url,
                None => {
                    cfg.aggregator = Some(
                        tokenwatch::export::otlp::ship::AggregatorLinkConfig::new(url),
                    )
                }
            }
        }
        if let Some(url) = self.upstream {
            if let Some(file) = &self.upstream_ca_file {
                let tls = UpstreamTlsConfig {
                    ca_file: Some(file.clone()),
                    ..Default::default()
                };
                tokenwatch::kernel::tls::UpstreamTls::new(Some(&tls))
                    .map_err(|e| anyhow::anyhow!("--upstream-ca-file: {e}"))?;
                anyhow::ensure!(
                    url.starts_with("https://"),
                    "--upstream-ca-file applies to an https:// --upstream, not {url:?}"
                );
            }
            cfg.proxy.upstreams.push(UpstreamConfig {
                url,
                models: vec!["*".into()],
                runtime: self.upstream_runtime,
                instance: None,
                tls: self.upstream_ca_file.map(|f| UpstreamTlsConfig {
                    ca_file: Some(f),
                    ..Default::default()
                }),
            });
        }
        let source = match &self.config {
            Some(path) => format!("{} with the command line", path.display()),
            None => "command line".to_string(),
        };
        cfg.validate(&source).map_err(anyhow::Error::from)?;
        Ok(cfg)
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn init_logging(filter: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only on a terminal: a file, a pipe or a log collector gets plain text.
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()));
    match format {
        LogFormat::Text => fmt.init(),
        // `timestamp`, `level`, `message` and the event's fields at the top level of each line.
        LogFormat::Json => fmt.json().flatten_event(true).init(),
    }
}

fn main() -> std::process::ExitCode {
    let thp = transparent_huge_pages_off();
    let cli = Cli::parse();
    init_logging(&cli.log, cli.log_format);
    if let Err(e) = thp {
        tracing::debug!(error = %e, "could not turn transparent huge pages off; RSS may be higher");
    }
    let result = match cli.command {
        Command::CheckConfig { file, role } => check_config(&file, role),
        Command::Rules { command } => rules_command(command),
        Command::Dashboards { command } => dashboards_command(command),
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut <Cli as clap::CommandFactory>::command(),
                "tokenwatch",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Command::Schema { output } => {
            let text = tokenwatch::config::json_schema();
            match output {
                Some(path) => std::fs::write(&path, text)
                    .with_context(|| format!("writing {}", path.display())),
                None => {
                    print!("{text}");
                    Ok(())
                }
            }
        }
        command => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")
            .and_then(|rt| rt.block_on(run_async(command))),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tokenwatch: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn check_config(
    file: &std::path::Path,
    role: Option<tokenwatch::config::Role>,
) -> anyhow::Result<()> {
    use tokenwatch::config::Role;
    let mut cfg = Config::load_unvalidated(file)?;
    if let Some(role) = role {
        cfg.role = role;
    }
    cfg.validate(&file.display().to_string())?;
    match cfg.role {
        // No upstream: `run` starts no proxy (unless `--upstream` adds one on its command line).
        Role::All if cfg.proxy.upstreams.is_empty() => println!(
            "{}: OK (collector-only: no upstream route, no proxy; API on {}, OTLP {})",
            file.display(),
            cfg.listen,
            if cfg.otlp.enabled {
                format!("on {} and {}", cfg.otlp.grpc_listen, cfg.otlp.http_listen)
            } else {
                "off".to_string()
            }
        ),
        Role::All => println!(
            "{}: OK ({} upstream route(s), API on {}, proxy on {})",
            file.display(),
            cfg.proxy.upstreams.len(),
            cfg.listen,
            cfg.proxy.listen
        ),
        Role::Proxy => println!(
            "{}: OK (role proxy: {} upstream route(s), proxy on {}, API on {}, records shipped to {})",
            file.display(),
            cfg.proxy.upstreams.len(),
            cfg.proxy.listen,
            cfg.listen,
            cfg.aggregator.as_ref().map_or("", |a| a.endpoint.as_str())
        ),
        Role::Aggregator => println!(
            "{}: OK (role aggregator: no proxy, API on {}, OTLP on {} and {})",
            file.display(),
            cfg.listen,
            cfg.otlp.grpc_listen,
            cfg.otlp.http_listen
        ),
    }
    Ok(())
}

fn rules_command(command: RulesCommand) -> anyhow::Result<()> {
    let RulesCommand::Export {
        format: RulesFormat::Prometheus,
        config,
        output,
    } = command;
    let cfg = match &config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    let specs = tokenwatch::alerting::promexport::configured::rules_for_config(&cfg.alerting)
        .map_err(|(path, msg)| anyhow::anyhow!("{path}: {msg}"))?;
    let text = tokenwatch::alerting::promexport::export_prometheus_rules(&specs);
    match output {
        Some(path) => {
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?
        }
        None => print!("{text}"),
    }
    Ok(())
}

fn dashboards_command(command: DashboardsCommand) -> anyhow::Result<()> {
    let DashboardsCommand::Export {
        format: DashboardFormat::Grafana,
        output,
    } = command;
    let text = tokenwatch::dashboards::grafana::render();
    match output {
        Some(path) => {
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?
        }
        None => print!("{text}"),
    }
    Ok(())
}

/// What `run` and `demo` create — the store, snapshots, keys and salt, the audit log, the
/// spool — is readable by tokenwatch's own user only (directories 0700, files 0600): records
/// carry tenants, models and request metadata, captured text and keys are secrets, and nothing
/// else on the host needs to read them (a backup running as the same user still can).
fn private_files() {
    #[cfg(unix)]
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
}

async fn run_async(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run(args) => {
            private_files();
            // A reload builds the configuration again as this start does: file, then flags.
            let reload = args.config.clone().map(|file| {
                let args = args.clone();
                let load: tokenwatch::reload::ConfigLoader =
                    std::sync::Arc::new(move || args.clone().into_config());
                tokenwatch::reload::ConfigSource { file, load }
            });
            let cfg = args.into_config()?;
            let app = app::RunningApp::start_with_reload(cfg, reload).await?;
            tracing::info!(api = %app.api_addr, proxy = ?app.proxy_addr, listening = %app.listening_line(), "tokenwatch running");
            app::shutdown_signal().await;
            tracing::info!("shutting down");
            // A second SIGTERM or Ctrl-C cuts the drain short.
            app.shutdown_or_cut(app::shutdown_signal()).await;
            Ok(())
        }
        Command::Sim(args) => tokenwatch_sim::run(args).await.map_err(anyhow::Error::from),
        Command::Demo(args) => {
            private_files();
            demo::run(args).await
        }
        Command::Top(args) => tokenwatch::top::run(args).await,
        Command::CheckConfig { .. }
        | Command::Rules { .. }
        | Command::Dashboards { .. }
        | Command::Completions { .. }
        | Command::Schema { .. } => unreachable!("handled before the runtime starts"),
    }
}
