// `tokenwatch dashboards export --format grafana` checked against a real Prometheus (Debian
// `prometheus`): it scrapes a running `tokenwatch demo` and the demo's simulators (vLLM and
// dcgm-exporter metrics) every second, and every template variable and panel query of the
// exported dashboard must parse and return data, or the test fails naming the panel. Collector-
// only (tokenwatch scraping a simulator, no proxy; Prometheus scraping tokenwatch alone), the
// variables must list the model and every fleet and latency query over the runtime's series
// must return data.

use crate::common;

use common::prometheus::Prometheus;
use common::{BIN, Proc, get, start_demo_with_leak};
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The simulator's default model (its /metrics name it too).
const SIM_MODEL: &str = "sim-llama-8b";

/// How long every query gets to return data: the demo's kv_leak fault must have raised a
/// firing alert by then (the alert panels need one).
const DATA_DEADLINE: Duration = Duration::from_secs(240);
/// What Grafana's `$__rate_interval` becomes (4 × the 1 s scrape interval would do; a minute
/// keeps every rate defined while the demo warms up).
const RATE_INTERVAL: &str = "1m";

/// Prometheus scraping tokenwatch's API (`honor_labels`, as the dashboard expects) and the
/// runtimes' targets every second.
async fn start_prometheus(
    dir: &Path,
    tokenwatch: SocketAddr,
    runtimes: &[SocketAddr],
) -> Prometheus {
    let targets = |addrs: &[SocketAddr]| {
        addrs
            .iter()
            .map(|a| format!("'{a}'"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Prometheus::start(
        dir,
        &format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n\
             scrape_configs:\n\
             \x20 - job_name: tokenwatch\n    honor_labels: true\n    static_configs: [{{targets: [{}]}}]\n\
             \x20 - job_name: runtimes\n    static_configs: [{{targets: [{}]}}]\n",
            targets(&[tokenwatch]),
            targets(runtimes)
        ),
    )
    .await
}

/// The queries the dashboard's panels and variables run.
impl Prometheus {
    /// An instant query: `Ok(result)` when it parsed, `Err(the error)` when Prometheus refused it.
    async fn query(&self, promql: &str) -> Result<Vec<Value>, String> {
        let q: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("query", promql)
            .finish();
        let r = get(&format!("{}/api/v1/query?{q}", self.url)).await;
        let v: Value = serde_json::from_str(&r.body)
            .map_err(|e| format!("HTTP {}: {e}: {}", r.status, r.body))?;
        if v["status"] != "success" {
            return Err(format!(
                "HTTP {}: {} {}",
                r.status, v["errorType"], v["error"]
            ));
        }
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    /// Values of `label` on the series matching `selector`.
    async fn label_values(&self, selector: &str, label: &str) -> Result<Vec<String>, String> {
        let q: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("match[]", selector)
            .finish();
        let r = get(&format!("{}/api/v1/label/{label}/values?{q}", self.url)).await;
        let v: Value = serde_json::from_str(&r.body)
            .map_err(|e| format!("HTTP {}: {e}: {}", r.status, r.body))?;
        if v["status"] != "success" {
            return Err(format!("HTTP {}: {}", r.status, v["error"]));
        }
        Ok(v["data"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(String::from))
            .collect())
    }
}

/// One panel query of the exported JSON.
struct Query {
    panel: String,
    ref_id: String,
    expr: String,
}

/// Every target of every panel (rows' nested panels included).
fn panel_queries(dashboard: &Value) -> Vec<Query> {
    fn walk(panels: &[Value], out: &mut Vec<Query>) {
        for p in panels {
            for t in p["targets"].as_array().into_iter().flatten() {
                out.push(Query {
                    panel: p["title"].as_str().unwrap_or("?").to_string(),
                    ref_id: t["refId"].as_str().unwrap_or("?").to_string(),
                    expr: t["expr"]
                        .as_str()
                        .unwrap_or_else(|| panic!("{}: a target without expr", p["title"]))
                        .to_string(),
                });
            }
            walk(
                p["panels"].as_array().map(Vec::as_slice).unwrap_or(&[]),
                out,
            );
        }
    }
    let mut out = Vec::new();
    walk(dashboard["panels"].as_array().expect("panels"), &mut out);
    out
}

/// Replace `$name` / `${name}` by the values in `vars` (longest names first) and Grafana's
/// `$__rate_interval`.
fn substitute(expr: &str, vars: &BTreeMap<String, String>) -> String {
    let mut s = expr.replace("$__rate_interval", RATE_INTERVAL);
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    for n in names {
        s = s
            .replace(&format!("${{{n}}}"), &vars[n])
            .replace(&format!("${n}"), &vars[n]);
    }
    assert!(!s.contains('$'), "a variable left in {s:?} (from {expr:?})");
    s
}

/// The values a template variable's query finds: `label_values(SERIES, LABEL)` through the
/// label values API, `query_result(EXPR)` as an instant query whose series' labels the
/// variable's regex (`/LABEL="([^"]+)"/`) picks. Sorted, without duplicates.
async fn variable_values(
    prom: &Prometheus,
    v: &Value,
    vars: &BTreeMap<String, String>,
) -> Result<Vec<String>, String> {
    let q = v["query"]["query"]
        .as_str()
        .or(v["query"].as_str())
        .expect("a variable query");
    if let Some(expr) = q
        .trim()
        .strip_prefix("query_result(")
        .and_then(|s| s.strip_suffix(')'))
    {
        let regex = v["regex"].as_str().unwrap_or_default();
        let label = regex
            .strip_prefix('/')
            .and_then(|r| r.strip_suffix(r#"="([^"]+)"/"#))
            .unwrap_or_else(|| panic!("a query_result variable picks one label: {regex:?}"));
        let result = prom.query(&substitute(expr, vars)).await?;
        let mut values: Vec<String> = result
            .iter()
            .filter_map(|s| s["metric"][label].as_str().map(String::from))
            .collect();
        values.sort();
        values.dedup();
        return Ok(values);
    }
    let (series, label) = parse_label_values(q);
    prom.label_values(&substitute(&series, vars), &label).await
}

/// `label_values(SERIES, LABEL)` → (SERIES, LABEL).
fn parse_label_values(q: &str) -> (String, String) {
    let inner = q
        .trim()
        .strip_prefix("label_values(")
        .and_then(|s| s.strip_suffix(')'))
        .unwrap_or_else(|| panic!("not label_values(…): {q}"));
    let (series, label) = inner
        .rsplit_once(',')
        .unwrap_or_else(|| panic!("label_values without a label: {q}"));
    (series.trim().to_string(), label.trim().to_string())
}

/// The demo's simulator addresses, from its start-up banner (`fleet: M (sim on ADDR), …`).
async fn demo_sims(demo: &Proc) -> Vec<SocketAddr> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = demo.log();
        if let Some(line) = log.lines().find(|l| l.trim_start().starts_with("fleet:")) {
            let addrs: Vec<SocketAddr> = line
                .split("(sim on ")
                .skip(1)
                .filter_map(|s| s.split(')').next()?.parse().ok())
                .collect();
            assert_eq!(addrs.len(), 2, "simulators in {line:?}");
            return addrs;
        }
        assert!(
            Instant::now() < deadline,
            "no fleet line in the demo's output:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_query_returns_data_from_a_real_prometheus() {
    let dir = tempfile::tempdir().unwrap();
    let (demo, api, _otlp_http) = start_demo_with_leak(dir.path(), "0s").await;
    let sims = demo_sims(&demo).await;
    let prom = start_prometheus(dir.path(), api, &sims).await;

    // The dashboard as the CLI writes it.
    let file = dir.path().join("dashboard.json");
    let out = Command::new(BIN)
        .args(["dashboards", "export", "--format", "grafana", "-o"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "export failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).expect("dashboard JSON");
    let queries = panel_queries(&dashboard);
    assert_eq!(
        queries.len(),
        tokenwatch::dashboards::grafana::queries().len(),
        "queries in the JSON vs the definition"
    );
    assert!(queries.len() >= 20, "only {} queries", queries.len());

    let deadline = Instant::now() + DATA_DEADLINE;
    let context = |prom: &Prometheus| {
        let tail = |s: String| {
            s.lines()
                .rev()
                .take(30)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n")
        };
        format!(
            "--- demo log tail ---\n{}\n--- prometheus log tail ---\n{}",
            tail(demo.log()),
            tail(prom.log())
        )
    };

    // Template variables: label_values must find values; the first model is used below.
    let mut all = BTreeMap::new();
    let mut one_model = None;
    for v in dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list")
    {
        let name = v["name"].as_str().unwrap().to_string();
        match v["type"].as_str().unwrap() {
            "datasource" => assert_eq!(v["query"], "prometheus", "{name}"),
            "custom" => {
                all.insert(
                    name,
                    v["current"]["value"]
                        .as_str()
                        .expect("a default value")
                        .to_string(),
                );
            }
            "query" => {
                let q = &v["query"];
                let values = loop {
                    let got = variable_values(&prom, v, &all)
                        .await
                        .unwrap_or_else(|e| panic!("variable {name}: {q}: {e}"));
                    if !got.is_empty() {
                        break got;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "variable {name}: {q} found no values\n{}",
                        context(&prom)
                    );
                    tokio::time::sleep(Duration::from_secs(1)).await;
                };
                if name == "model" {
                    one_model = Some(values[0].clone());
                }
                assert_eq!(v["allValue"], ".*", "{name}");
                all.insert(name, ".*".to_string());
            }
            other => panic!("variable {name}: unexpected type {other}"),
        }
    }
    let one_model = one_model.expect("a `model` variable");
    let mut per_model = all.clone();
    per_model.insert("model".into(), one_model.clone());

    // Every query, with every variable at "All" and with one model selected: parses at once,
    // returns data within the deadline.
    let mut pending: Vec<(String, String)> = Vec::new();
    for q in &queries {
        for (vars, which) in [(&all, "all"), (&per_model, one_model.as_str())] {
            let label = format!("panel {:?} query {} ({which})", q.panel, q.ref_id);
            pending.push((label, substitute(&q.expr, vars)));
        }
    }
    let total = pending.len();
    loop {
        let mut still = Vec::new();
        for (label, promql) in pending {
            match prom.query(&promql).await {
                Err(e) => panic!("{label} does not parse: {e}\n{promql}"),
                Ok(r) if r.is_empty() => still.push((label, promql)),
                Ok(_) => {}
            }
        }
        pending = still;
        if pending.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            let missing: Vec<String> = pending.iter().map(|(l, q)| format!("  {l}: {q}")).collect();
            panic!(
                "{} of {total} queries returned no data within {DATA_DEADLINE:?}:\n{}\n{}",
                missing.len(),
                missing.join("\n"),
                context(&prom)
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

#[test]
fn export_writes_to_stdout_or_a_file_and_refuses_unknown_formats() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d.json");
    let to_file = Command::new(BIN)
        .args(["dashboards", "export", "--format", "grafana", "--output"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(to_file.status.success() && to_file.stdout.is_empty());
    let to_stdout = Command::new(BIN)
        .args(["dashboards", "export"])
        .output()
        .unwrap();
    assert!(to_stdout.status.success());
    assert_eq!(
        std::fs::read(&file).unwrap(),
        to_stdout.stdout,
        "grafana is the default format"
    );
    let d: Value = serde_json::from_slice(&to_stdout.stdout).unwrap();
    assert_eq!(d["uid"], tokenwatch::dashboards::grafana::UID);

    let bad = Command::new(BIN)
        .args(["dashboards", "export", "--format", "kibana"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && err.contains("kibana") && err.contains("grafana"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collector_only_the_fleet_and_latency_panels_have_data_from_the_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let (_sim, sim) = common::start_sim(dir.path(), &[]).await;
    let config = common::write_config(dir.path(), "scrape:\n  interval: 1s\n  timeout: 1s\n");
    let scrape = format!("http://{sim}/metrics");
    let (tw, api) = common::start_collector(
        dir.path(),
        &["-c", &config.to_string_lossy(), "--scrape", &scrape],
    )
    .await;
    // Prometheus scrapes tokenwatch alone: the runtime's figures reach it only through tokenwatch.
    let prom = start_prometheus(dir.path(), api, &[]).await;
    // Streamed chat requests straight to the simulator (no proxy) until the test ends.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let traffic = common::chat_traffic(sim, SIM_MODEL, 2, stop.clone(), done.clone());
    let dashboard: Value =
        serde_json::from_str(&tokenwatch::dashboards::grafana::render()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    let context = |prom: &Prometheus| {
        format!(
            "--- tokenwatch log tail ---\n{}\n--- prometheus log ---\n{}",
            tw.log_tail(30),
            prom.log()
        )
    };
    // The model and instance variables list the runtime's model and the simulator.
    let mut vars: BTreeMap<String, String> = BTreeMap::from([
        ("model".to_string(), ".*".to_string()),
        ("instance".to_string(), ".*".to_string()),
        ("slo_objective".to_string(), "0.995".to_string()),
    ]);
    for v in dashboard["templating"]["list"].as_array().unwrap() {
        let name = v["name"].as_str().unwrap();
        let want = match name {
            "model" => SIM_MODEL.to_string(),
            "instance" => sim.to_string(),
            _ => continue,
        };
        loop {
            let got = variable_values(&prom, v, &vars)
                .await
                .unwrap_or_else(|e| panic!("variable {name}: {e}"));
            if got.contains(&want) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "variable {name} lists {got:?}, not {want}\n{}",
                context(&prom)
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    vars.insert("model".into(), SIM_MODEL.into());
    // Every query of the fleet and latency rows over the runtime's series returns data for the
    // model; the proxy's own series have none here.
    let queries: Vec<Query> = panel_queries(&dashboard)
        .into_iter()
        .filter(|q| q.expr.contains("tokenwatch_runtime_"))
        .collect();
    let panels: std::collections::BTreeSet<&str> =
        queries.iter().map(|q| q.panel.as_str()).collect();
    for want in [
        "Requests per second",
        "Error rate",
        "Tokens per second",
        "Time to first token",
        "Inter-token latency",
        "End-to-end duration",
        "Queue time in the runtime",
    ] {
        assert!(
            panels.contains(want),
            "{want} has no runtime query: {panels:?}"
        );
    }
    let mut pending: Vec<(String, String)> = queries
        .iter()
        .map(|q| {
            (
                format!("panel {:?} query {}", q.panel, q.ref_id),
                substitute(&q.expr, &vars),
            )
        })
        .collect();
    loop {
        let mut still = Vec::new();
        for (label, promql) in pending {
            match prom.query(&promql).await {
                Err(e) => panic!("{label} does not parse: {e}\n{promql}"),
                Ok(r) if r.is_empty() => still.push((label, promql)),
                Ok(r) => {
                    for series in &r {
                        assert_eq!(series["metric"]["model"], SIM_MODEL, "{label}: {r:?}");
                    }
                }
            }
        }
        pending = still;
        if pending.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            let missing: Vec<String> = pending.iter().map(|(l, q)| format!("  {l}: {q}")).collect();
            panic!(
                "{} runtime queries returned no data collector-only ({} requests sent):\n{}\n{}",
                missing.len(),
                done.load(std::sync::atomic::Ordering::Relaxed),
                missing.join("\n"),
                context(&prom)
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let ttft = prom
        .query(&format!(
            "histogram_quantile(0.5, sum by (le) (rate(tokenwatch_runtime_time_to_first_token_seconds_bucket{{model=\"{SIM_MODEL}\"}}[1m])))"
        ))
        .await
        .unwrap();
    let p50: f64 = ttft[0]["value"][1].as_str().unwrap().parse().unwrap();
    assert!(p50 > 0.0 && p50 < 10.0, "runtime TTFT P50 {p50}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in traffic {
        let _ = t.await;
    }
}
