// The fleet under test: one `tokenwatch sim` process per (model, instance) with its own speed,
// slow speed drift and seed, one `tokenwatch run` scraping them all (and, in the proxied
// topologies, proxying them), and a real Alertmanager.

use super::procs::{self, Proc, client, free_addr, http, wait_ready};
use super::router::Router;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

/// One simulated inference server: one model on one instance.
#[derive(Debug, Clone)]
pub struct InstanceSpec {
    pub model: String,
    /// The `instance` label tokenwatch gives it (proxy route and scrape target).
    pub name: String,
    pub ttft_ms: f64,
    pub itl_ms: f64,
    /// Slow speed drift (`tokenwatch sim --speed-drift`, fraction; 0 = none) and its main
    /// period (`--speed-drift-period`, seconds).
    pub speed_drift: f64,
    pub speed_drift_period_s: f64,
    pub seed: u64,
}

/// How traffic reaches the replicas and what tokenwatch sees of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Topology {
    /// tokenwatch's proxy routes to every instance by name (one upstream per instance).
    PerInstance,
    /// Each model's replicas sit behind one load balancer (a replica drawn at random per
    /// request): the proxy has one upstream per model and only the scraped metrics tell
    /// replicas apart.
    OneUpstream,
    /// No proxy: clients call the replicas directly (client-side balancing); tokenwatch only
    /// scrapes them.
    CollectorOnly,
}

impl Topology {
    pub const ALL: [Topology; 3] = [
        Topology::PerInstance,
        Topology::OneUpstream,
        Topology::CollectorOnly,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Topology::PerInstance => "one route per instance",
            Topology::OneUpstream => "replicas behind one upstream",
            Topology::CollectorOnly => "collector-only (no proxy)",
        }
    }
}

/// The `instance` label of a model's Service in the one-upstream topology: it stands for the
/// whole model (every replica), so an alert naming it names no particular replica.
pub const SERVICE_PREFIX: &str = "svc-";

pub fn service_name(model: &str) -> String {
    format!("{SERVICE_PREFIX}{model}")
}

/// Where the load generator sends a request for a model.
#[derive(Debug, Clone)]
pub enum Entry {
    /// One address for every model (tokenwatch's proxy).
    One(SocketAddr),
    /// Per model, its replicas (or its Service): a request goes to one drawn at random.
    PerModel(BTreeMap<String, Vec<SocketAddr>>),
}

#[derive(Debug, Clone)]
pub struct FleetSpec {
    pub topology: Topology,
    pub instances: Vec<InstanceSpec>,
    /// Scrape interval of every simulator (seconds, ≥ 1).
    pub scrape_interval_s: u32,
    /// KV-cache blocks per simulator.
    pub kv_blocks: u32,
    /// Labels Alertmanager groups by (tokenwatch sends the incident as `incident_id`).
    pub group_by: Vec<String>,
    /// Extra YAML appended under `alerting:` (overrides, rules), already indented by two spaces.
    pub alerting_extra: String,
}

impl FleetSpec {
    /// `layout`: (model, instances). Each instance gets its own speed (±20 % around the base,
    /// deterministic) so instances of one model differ the way real nodes do, and drifts slowly
    /// around it (±15 %, its own main period of 4–7 min, phases from its seed).
    pub fn new(layout: &[(&str, usize)], seed: u64) -> FleetSpec {
        let mut instances = Vec::new();
        for (m, (model, n)) in layout.iter().enumerate() {
            let short = model.rsplit('-').next().unwrap_or(model);
            for i in 0..*n {
                let k = (m * 7 + i * 3) % 9;
                let speed = 0.82 + 0.045 * k as f64;
                let drift_period_s = 240.0 + 30.0 * ((m * 5 + i * 3) % 7) as f64;
                instances.push(InstanceSpec {
                    model: model.to_string(),
                    name: format!("{short}-{i}"),
                    ttft_ms: (45.0 + 10.0 * m as f64) * speed,
                    itl_ms: (9.0 + 2.0 * m as f64) * (2.0 - speed),
                    speed_drift: 0.15,
                    speed_drift_period_s: drift_period_s,
                    seed: seed.wrapping_mul(1000).wrapping_add((m * 100 + i) as u64),
                });
            }
        }
        FleetSpec {
            topology: Topology::PerInstance,
            instances,
            scrape_interval_s: 1,
            kv_blocks: 8192,
            group_by: vec!["incident_id".into()],
            alerting_extra: String::new(),
        }
    }

    pub fn models(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for i in &self.instances {
            if !out.contains(&i.model) {
                out.push(i.model.clone());
            }
        }
        out
    }
}

pub struct Sim {
    pub spec: InstanceSpec,
    pub addr: SocketAddr,
    pub proc: Proc,
}

pub struct Fleet {
    pub sims: Vec<Sim>,
    pub tokenwatch: Proc,
    pub api: SocketAddr,
    /// tokenwatch's proxy listener; None in the collector-only topology.
    pub proxy: Option<SocketAddr>,
    /// The Services of the one-upstream topology, per model.
    pub routers: BTreeMap<String, Router>,
    pub alertmanager: Proc,
    pub am: SocketAddr,
    /// The data, configuration and logs of every process; removed on drop.
    pub dir: tempfile::TempDir,
}

fn tokenwatch_config(
    spec: &FleetSpec,
    sims: &[Sim],
    routers: &BTreeMap<String, Router>,
    am: SocketAddr,
) -> String {
    let mut y = String::new();
    match spec.topology {
        Topology::PerInstance => {
            y.push_str("proxy:\n  upstreams:\n");
            for s in sims {
                y.push_str(&format!(
                    "    - {{url: 'http://{}', models: ['{}'], runtime: vllm, instance: '{}'}}\n",
                    s.addr, s.spec.model, s.spec.name
                ));
            }
        }
        Topology::OneUpstream => {
            y.push_str("proxy:\n  upstreams:\n");
            for (model, r) in routers {
                y.push_str(&format!(
                    "    - {{url: 'http://{}', models: ['{model}'], runtime: vllm, instance: '{}'}}\n",
                    r.addr,
                    service_name(model)
                ));
            }
        }
        Topology::CollectorOnly => {}
    }
    y.push_str(&format!(
        "scrape:\n  interval: {}s\n  targets:\n",
        spec.scrape_interval_s
    ));
    for s in sims {
        y.push_str(&format!(
            "    - {{url: 'http://{}/metrics', runtime: vllm, labels: {{instance: '{}'}}}}\n",
            s.addr, s.spec.name
        ));
    }
    y.push_str(&format!(
        "alerting:\n  delivery:\n    alertmanagers: ['http://{am}']\n    resend_interval: 5s\n{}",
        spec.alerting_extra
    ));
    y
}

impl Fleet {
    pub async fn start(spec: &FleetSpec) -> Fleet {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let mut sims = Vec::new();
        for inst in &spec.instances {
            let addr = free_addr();
            let args: Vec<String> = vec![
                "sim".into(),
                "--listen".into(),
                addr.to_string(),
                "--model".into(),
                inst.model.clone(),
                "--ttft-ms".into(),
                format!("{:.1}", inst.ttft_ms),
                "--itl-ms".into(),
                format!("{:.2}", inst.itl_ms),
                "--speed-drift".into(),
                format!("{}", inst.speed_drift),
                "--speed-drift-period".into(),
                format!("{}", inst.speed_drift_period_s),
                "--seed".into(),
                inst.seed.to_string(),
                "--kv-blocks".into(),
                spec.kv_blocks.to_string(),
                "--instance-name".into(),
                inst.name.clone(),
            ];
            let proc = Proc::start(&format!("sim-{}", inst.name), procs::BIN, &args, d);
            sims.push(Sim {
                spec: inst.clone(),
                addr,
                proc,
            });
        }
        for s in &sims {
            wait_ready(&format!("http://{}/v1/models", s.addr), &s.proc).await;
        }
        let group_by: Vec<&str> = spec.group_by.iter().map(String::as_str).collect();
        let (alertmanager, am) = procs::start_alertmanager(d, None, &group_by).await;
        let mut routers = BTreeMap::new();
        if spec.topology == Topology::OneUpstream {
            for (k, model) in spec.models().into_iter().enumerate() {
                let backends: Vec<SocketAddr> = sims
                    .iter()
                    .filter(|s| s.spec.model == model)
                    .map(|s| s.addr)
                    .collect();
                let seed = spec.instances[0].seed.wrapping_add(k as u64);
                routers.insert(model, Router::start(backends, seed).await);
            }
        }
        let cfg = d.join("tokenwatch.yaml");
        std::fs::write(&cfg, tokenwatch_config(spec, &sims, &routers, am))
            .expect("write tokenwatch.yaml");
        let api = free_addr();
        let proxy = (spec.topology != Topology::CollectorOnly).then(free_addr);
        let mut args: Vec<String> = vec![
            "run".into(),
            "-c".into(),
            cfg.display().to_string(),
            "--listen".into(),
            api.to_string(),
            "--data-dir".into(),
            d.join("data").display().to_string(),
            "--no-otlp".into(),
        ];
        if let Some(p) = proxy {
            args.extend(["--proxy-listen".into(), p.to_string()]);
        }
        let tokenwatch = Proc::start("tokenwatch", procs::BIN, &args, d);
        wait_ready(&format!("http://{api}/readyz"), &tokenwatch).await;
        Fleet {
            sims,
            tokenwatch,
            api,
            proxy,
            routers,
            alertmanager,
            am,
            dir,
        }
    }

    /// Where clients send each model's requests in this topology.
    pub fn entry(&self) -> Entry {
        if let Some(p) = self.proxy {
            return Entry::One(p);
        }
        let mut by_model: BTreeMap<String, Vec<SocketAddr>> = BTreeMap::new();
        for s in &self.sims {
            by_model
                .entry(s.spec.model.clone())
                .or_default()
                .push(s.addr);
        }
        Entry::PerModel(by_model)
    }

    pub fn sim(&self, instance: &str) -> &Sim {
        self.sims
            .iter()
            .find(|s| s.spec.name == instance)
            .unwrap_or_else(|| panic!("no simulator named {instance}"))
    }

    /// Switch a fault on (`spec` as `tokenwatch sim --fault` takes it) on one instance.
    pub async fn enable_fault(&self, instance: &str, spec: &str) -> Result<(), String> {
        let s = self.sim(instance);
        let body = serde_json::json!({ "spec": spec }).to_string();
        match http(
            &client(),
            "POST",
            &format!("http://{}/admin/faults", s.addr),
            Some(body),
        )
        .await?
        {
            (200, _) => Ok(()),
            (status, body) => Err(format!(
                "{instance}: enabling {spec:?} answered {status}: {body}"
            )),
        }
    }

    /// Switch a fault (by name) off on one instance.
    pub async fn disable_fault(&self, instance: &str, name: &str) -> Result<(), String> {
        let s = self.sim(instance);
        match http(
            &client(),
            "DELETE",
            &format!("http://{}/admin/faults/{name}", s.addr),
            None,
        )
        .await?
        {
            (200, _) => Ok(()),
            (status, body) => Err(format!(
                "{instance}: disabling {name} answered {status}: {body}"
            )),
        }
    }

    /// Every process's log (for failure messages), tokenwatch's first.
    pub fn logs_tail(&self, lines: usize) -> String {
        let mut out = String::new();
        let procs = std::iter::once(&self.tokenwatch)
            .chain(std::iter::once(&self.alertmanager))
            .chain(self.sims.iter().map(|s| &s.proc));
        for p in procs {
            let log = p.log();
            let tail: Vec<&str> = log.lines().rev().take(lines).collect();
            out.push_str(&format!("--- {} (last {} lines)\n", p.name, tail.len()));
            for l in tail.iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}
