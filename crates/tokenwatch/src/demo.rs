// `tokenwatch demo`: a simulated fleet (two models, each on its own simulator), the proxy in
// front of it, built-in traffic, and a fault switched on after a minute; stops on Ctrl-C.

use crate::app::{RunningApp, shutdown_signal};
use crate::config::{Config, UpstreamConfig};
use crate::traffic::{self, TrafficConfig};
use anyhow::Context;
use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// API, /metrics and health endpoints.
    #[arg(long, default_value = "127.0.0.1:9464")]
    listen: SocketAddr,
    /// Proxy listener (point your own OpenAI client here too).
    #[arg(long, default_value = "127.0.0.1:8080")]
    proxy_listen: SocketAddr,
    /// OTLP/gRPC listener (send your own OpenTelemetry data here too).
    #[arg(long, default_value = "127.0.0.1:4317")]
    otlp_grpc_listen: SocketAddr,
    /// OTLP/HTTP listener.
    #[arg(long, default_value = "127.0.0.1:4318")]
    otlp_http_listen: SocketAddr,
    /// Data directory [default: a fresh directory under the system temp dir]
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Requests per second sent by the built-in traffic generator.
    #[arg(long, default_value_t = 8.0)]
    rps: f64,
    /// When to switch the fault on (e.g. 60s); 0s switches it on at once.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    fault_after: Duration,
    /// The fault to switch on, in simulator syntax (NAME[:k=v,...]).
    #[arg(long, default_value = "kv_leak")]
    fault: String,
    /// Stop by itself after this long (default: run until Ctrl-C).
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::kernel::duration::HumanDuration::parse(s).map(|d| d.0)
}

/// The simulated fleet: one simulator per model, with different speeds.
const FLEET: [(&str, &str, &str); 2] = [
    ("llama-3.1-8b-instruct", "40", "12"),
    ("qwen2.5-14b-instruct", "70", "20"),
];

#[derive(Parser)]
struct SimCli {
    #[command(flatten)]
    args: tokenwatch_sim::SimArgs,
}

struct SimInstance {
    model: String,
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

async fn start_sim(
    model: &str,
    ttft: &str,
    itl: &str,
    seed: u64,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<SimInstance> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .context("binding a simulator port")?;
    let addr = listener.local_addr()?;
    let seed = seed.to_string();
    let listen = addr.to_string();
    let cli = SimCli::try_parse_from([
        "sim",
        "--listen",
        &listen,
        "--model",
        model,
        "--ttft-ms",
        ttft,
        "--itl-ms",
        itl,
        "--seed",
        &seed,
        "--prefill-ms-per-token",
        "0.04",
        // Headroom like a provisioned vLLM: at the demo's rate a model keeps ~15–25 sequences
        // running, and the simulator's defaults (32 slots, 4096 KV blocks) would put the healthy
        // model at its batch limit whenever long prompts' prefills stall decoding or the host's
        // CPU is busy — its queue, and so its P99 TTFT, would then climb past the L1 threshold.
        "--max-num-seqs",
        "64",
        "--kv-blocks",
        "8192",
    ])
    .context("building the simulator arguments")?;
    let mut stop = stop;
    let shutdown = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    let name = model.to_string();
    let task = tokio::spawn(async move {
        if let Err(e) = tokenwatch_sim::serve(cli.args, listener, shutdown).await {
            tracing::error!(model = %name, error = %e, "simulator stopped");
        }
    });
    Ok(SimInstance {
        model: model.to_string(),
        addr,
        task,
    })
}

async fn enable_fault(sim: &SimInstance, spec: &str) -> anyhow::Result<()> {
    use http_body_util::{BodyExt, Full};
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let body = serde_json::json!({ "spec": spec }).to_string();
    let req = http::Request::post(format!("http://{}/admin/faults", sim.addr))
        .header("content-type", "application/json")
        .body(Full::new(bytes::Bytes::from(body)))?;
    let resp = client
        .request(req)
        .await
        .context("calling the simulator admin endpoint")?;
    let status = resp.status();
    let text = resp
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    anyhow::ensure!(
        status.is_success(),
        "simulator refused fault {spec:?}: {status} {}",
        String::from_utf8_lossy(&text)
    );
    Ok(())
}

/// How long each part of the demo gets to stop by itself once Ctrl-C arrives.
const STOP_GRACE: Duration = Duration::from_secs(5);

async fn within_grace(task: tokio::task::JoinHandle<()>) {
    let abort = task.abort_handle();
    if tokio::time::timeout(STOP_GRACE, task).await.is_err() {
        abort.abort();
    }
}

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    tokenwatch_sim::parse_fault(&args.fault)
        .map_err(|e| anyhow::anyhow!("--fault {:?}: {e}", args.fault))?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut sims = Vec::new();
    for (i, (model, ttft, itl)) in FLEET.iter().enumerate() {
        sims.push(start_sim(model, ttft, itl, 42 + i as u64, stop_rx.clone()).await?);
    }
    let data_dir = args.data_dir.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("tokenwatch-demo-{}", std::process::id()))
    });
    let mut cfg = Config {
        listen: args.listen,
        data_dir: data_dir.clone(),
        ..Config::default()
    };
    cfg.proxy.listen = args.proxy_listen;
    // The demo stops its own traffic first: no load balancer to wait for, nothing long to drain.
    cfg.shutdown.delay = crate::kernel::duration::HumanDuration(std::time::Duration::ZERO);
    cfg.shutdown.drain_timeout =
        crate::kernel::duration::HumanDuration(std::time::Duration::from_secs(5));
    cfg.otlp.grpc_listen = args.otlp_grpc_listen;
    cfg.otlp.http_listen = args.otlp_http_listen;
    cfg.proxy.upstreams = sims
        .iter()
        .map(|s| UpstreamConfig {
            url: format!("http://{}", s.addr),
            models: vec![s.model.clone()],
            runtime: "sim".into(),
            instance: Some(format!("sim-{}", s.addr.port())),
            tls: None,
        })
        .collect();
    // Demo prices (an in-house cost per million tokens, made up), so the Spend page has figures.
    for (model, _, _) in FLEET {
        cfg.pricing.models.insert(
            model.to_string(),
            crate::pipeline::pricing::ModelPrice {
                input: 0.20,
                cached_input: Some(0.05),
                output: 0.80,
                reasoning: None,
            },
        );
    }
    // Also scrape each simulator's vLLM-style /metrics, so runtime-side signals (KV cache,
    // queue, GPU memory following the leak) show up next to what the proxy measures.
    cfg.scrape.targets = sims
        .iter()
        .map(|s| crate::sources::scrape::ScrapeTarget {
            url: format!("http://{}/metrics", s.addr),
            runtime: Some("vllm".into()),
            interval: Some(crate::kernel::duration::HumanDuration(Duration::from_secs(
                2,
            ))),
            timeout: None,
            labels: [("instance".to_string(), format!("sim-{}", s.addr.port()))]
                .into_iter()
                .collect(),
        })
        .collect();
    let app = RunningApp::start(cfg).await?;
    let proxy = app.proxy_addr.context("the demo proxy did not start")?;
    let api = app.api_addr;
    let first = &sims[0].model;
    println!("tokenwatch demo is running\n");
    println!("  >> open http://{api}/  (web UI: fleet, latency, GPU memory, alerts, requests)");
    println!("     or, in a terminal: tokenwatch top --url http://{api}\n");
    println!(
        "  fleet:      {}",
        sims.iter()
            .map(|s| format!("{} (sim on {})", s.model, s.addr))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "  proxy:      http://{proxy}/v1  (OpenAI-compatible; traffic at {} req/s is flowing through it)",
        args.rps
    );
    println!("  metrics:    http://{api}/metrics");
    println!("  latency:    http://{api}/api/v1/latency?model={first}&metric=ttft&window=1m");
    println!(
        "  by tenant:  http://{api}/api/v1/latency?model={first}&metric=itl&window=5m&by=tenant"
    );
    println!("  requests:   http://{api}/api/v1/requests?model={first}&limit=10");
    println!(
        "  signals:    http://{api}/api/v1/signals?model={first}  (KV cache, queue, GPU memory, scraped)"
    );
    println!("  targets:    http://{api}/api/v1/targets");
    println!("  SLOs:       http://{api}/api/v1/slos  (error budget and burn rate per model)");
    println!("  alerts:     http://{api}/api/v1/alerts");
    println!("  data dir:   {}", data_dir.display());
    // Every address bound, as `run`'s start line names them (what port 0 picked).
    println!("  listening:  {}", app.listening_line());
    println!(
        "\n  fault {:?} switches on for {first} in {:?}. Ctrl-C stops.\n",
        args.fault, args.fault_after
    );

    let traffic = tokio::spawn(traffic::run(
        TrafficConfig {
            proxy,
            models: sims.iter().map(|s| s.model.clone()).collect(),
            requests_per_second: args.rps,
            max_in_flight: 256,
            seed: 7,
        },
        stop_rx.clone(),
    ));

    let fault_at = tokio::time::sleep(args.fault_after);
    tokio::pin!(fault_at);
    let mut fault_done = false;
    let until = async {
        match args.duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(until);
    let signal = shutdown_signal();
    tokio::pin!(signal);
    loop {
        tokio::select! {
            _ = &mut fault_at, if !fault_done => {
                fault_done = true;
                match enable_fault(&sims[0], &args.fault).await {
                    Ok(()) => println!("  >> fault {:?} is now ON for {} — watch it: http://{api}/#/model/{}", args.fault, sims[0].model, sims[0].model),
                    Err(e) => eprintln!("  could not switch the fault on: {e:#}"),
                }
            }
            _ = &mut until => break,
            _ = &mut signal => break,
        }
    }
    println!("stopping…");
    let _ = stop_tx.send(true);
    // Requests stuck behind a fault (a full, leaking KV cache never admits them) must not hold
    // the demo open: every part gets a bounded grace, then is cut off.
    within_grace(traffic).await;
    app.shutdown().await;
    for s in sims {
        within_grace(s.task).await;
    }
    println!("stopped; data kept in {}", data_dir.display());
    Ok(())
}
