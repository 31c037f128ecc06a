// End to end through the real binaries: with a known price table (`pricing`), known traffic
// through the proxy (a prompt read from the simulator's prefix cache the second time, reasoning
// tokens, three tenants, a model the table leaves out) gives the same spend, to the cent, in the
// stored records (`cost_usd`), on `/metrics` (`tokenwatch_spend_usd_total`) and from
// `GET /api/v1/spend` (which the UI's spend page shows); the unpriced model's requests are
// counted, at no cost. A budget the traffic overspends pages (`budget_burn`) and its gauges
// show the same spend, again after a restart (seeded from the stored records).

use crate::common;

use common::*;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// Prices (USD per million tokens) large enough that every request costs cents.
const CONFIG: &str = "\
export:
  prometheus:
    tenant_label: true
pricing:
  models:
    m-a: {input: 3000, cached_input: 300, output: 15000}
    m-b: {input: 500, output: 1500, reasoning: 4000}
budgets:
  - {name: acme-monthly, amount_usd: 0.5, tenant: acme}
  - {name: everything, amount_usd: 100000}
";

/// (input, cached input, output, reasoning) USD per million tokens, as in `CONFIG`.
fn rates(model: &str) -> Option<[f64; 4]> {
    match model {
        "m-a" => Some([3000.0, 300.0, 15000.0, 15000.0]),
        "m-b" => Some([500.0, 500.0, 1500.0, 4000.0]),
        _ => None,
    }
}

/// What a stored record should cost, from its own token counts.
fn expected_cost(r: &Value) -> Option<f64> {
    let [input, cached_input, output, reasoning] = rates(r["model_id"].as_str()?)?;
    let n = |k: &str| r[k].as_u64().unwrap_or(0) as f64;
    let (prompt, cached) = (n("prompt_tokens"), n("cached_input_tokens"));
    let (out, thinking) = (n("output_tokens"), n("reasoning_tokens"));
    Some(
        ((prompt - cached) * input
            + cached * cached_input
            + (out - thinking) * output
            + thinking * reasoning)
            / 1e6,
    )
}

async fn chat(
    proxy: SocketAddr,
    id: &str,
    model: &str,
    prompt: &str,
    stream: bool,
    auth: (&str, &str),
) {
    let body = json!({
        "model": model, "stream": stream, "max_tokens": 8,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": prompt}],
    });
    chat_answer(proxy, &body, &[("x-request-id", id), auth]).await;
}

fn cents(usd: f64) -> i64 {
    (usd * 100.0).round() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_traffic_gives_one_spend_in_the_records_the_metrics_and_the_api() {
    let config_dir = tempfile::tempdir().unwrap();
    let config = write_config(config_dir.path(), CONFIG);
    let config = config.to_string_lossy().into_owned();
    let sim_args = [
        "--model",
        "m-a",
        "--model",
        "m-b",
        "--model",
        "m-free",
        "--ttft-ms",
        "5",
        "--itl-ms",
        "1",
        "--reasoning-tokens",
        "3",
        "--enable-prompt-tokens-details",
    ];
    let mut stack = Stack::start_restartable(&sim_args, &["-c", &config]).await;
    let (proxy, api) = (stack.proxy, stack.api);
    let long_prompt = "Summarise the quarterly report on inference spend. ".repeat(24);
    let acme = ("x-tenant-id", "acme");
    let globex = ("x-tenant-id", "globex");
    let keyed = ("authorization", "Bearer sk-test-spend");
    // The same long prompt twice: the second is read from the prefix cache.
    chat(proxy, "sp-1", "m-a", &long_prompt, false, acme).await;
    chat(proxy, "sp-2", "m-a", &long_prompt, true, acme).await;
    chat(proxy, "sp-3", "m-b", "How much did we spend?", true, globex).await;
    chat(proxy, "sp-4", "m-b", "And last week?", false, keyed).await;
    chat(proxy, "sp-5", "m-free", "Free of charge?", true, acme).await;

    let mut records = BTreeMap::new();
    for id in ["sp-1", "sp-2", "sp-3", "sp-4", "sp-5"] {
        records.insert(id, stored_record(api, id, &stack.tw).await);
    }
    let cached = records["sp-2"]["cached_input_tokens"].as_u64().unwrap_or(0);
    assert!(
        cached > 0,
        "the repeated prompt was not read from the cache: {}",
        records["sp-2"]
    );
    assert!(
        cached < records["sp-2"]["prompt_tokens"].as_u64().unwrap(),
        "{}",
        records["sp-2"]
    );
    assert_eq!(
        records["sp-3"]["reasoning_tokens"], 3,
        "{}",
        records["sp-3"]
    );
    let tenant_of_key = records["sp-4"]["tenant"].as_str().unwrap().to_string();
    assert!(tenant_of_key.starts_with("key-"), "{tenant_of_key}");

    // Each record's cost is its tokens at the table's prices.
    let mut by_model: BTreeMap<String, f64> = BTreeMap::new();
    let mut by_tenant: BTreeMap<String, f64> = BTreeMap::new();
    for (id, r) in &records {
        let want = expected_cost(r);
        let got = r["cost_usd"].as_f64();
        match (want, got) {
            (Some(w), Some(g)) => assert!((w - g).abs() < 1e-9, "{id}: {g} != {w}: {r}"),
            (None, None) => {}
            _ => panic!("{id}: cost {got:?}, expected {want:?}: {r}"),
        }
        let cost = want.unwrap_or(0.0);
        *by_model
            .entry(r["model_id"].as_str().unwrap().into())
            .or_default() += cost;
        *by_tenant
            .entry(r["tenant"].as_str().unwrap().into())
            .or_default() += cost;
    }
    assert!(records["sp-5"]["cost_usd"].is_null(), "{}", records["sp-5"]);
    let total: f64 = by_model.values().sum();
    assert!(
        total > 1.0,
        "the prices make this traffic cost dollars: {total}"
    );

    // /metrics: the spend counters (by model, by tenant) and the unpriced request.
    let metrics_url = format!("http://{api}/metrics");
    wait_metric_sum(
        &metrics_url,
        "tokenwatch_spend_usd_total",
        20,
        &stack.tw,
        |v| cents(v) == cents(total),
    )
    .await;
    let text = get(&metrics_url).await.body;
    let spend_where = |label: &str, value: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with("tokenwatch_spend_usd_total{"))
            .filter(|l| l.contains(&format!("{label}=\"{value}\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    for (model, usd) in &by_model {
        assert_eq!(
            cents(spend_where("gen_ai_request_model", model)),
            cents(*usd),
            "{model}:\n{text}"
        );
    }
    for (tenant, usd) in &by_tenant {
        assert_eq!(
            cents(spend_where("tenant", tenant)),
            cents(*usd),
            "{tenant}:\n{text}"
        );
    }
    let free_spend_lines = text
        .lines()
        .filter(|l| l.starts_with("tokenwatch_spend_usd_total{") && l.contains("\"m-free\""))
        .count();
    assert_eq!(
        free_spend_lines, 0,
        "an unpriced model has no spend series:\n{text}"
    );
    assert_eq!(
        metric_value(
            &text,
            "tokenwatch_unpriced_requests_total{model=\"m-free\"}"
        ),
        Some(1.0),
        "{text}"
    );

    // The API, from the stored records.
    for (by, key, want) in [
        ("model", "model", &by_model),
        ("tenant", "tenant", &by_tenant),
    ] {
        let r = get(&format!("http://{api}/api/v1/spend?by={by}")).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        assert_eq!(cents(v["cost_usd"].as_f64().unwrap()), cents(total), "{v}");
        assert_eq!(
            (v["requests"].as_u64(), v["unpriced_requests"].as_u64()),
            (Some(5), Some(1)),
            "{v}"
        );
        let groups: BTreeMap<String, f64> = v["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| {
                (
                    g[key].as_str().unwrap().to_string(),
                    g["cost_usd"].as_f64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            groups.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            "{v}"
        );
        for (k, usd) in want {
            assert_eq!(cents(groups[k]), cents(*usd), "{by} {k}: {v}");
        }
    }
    let free = get(&format!("http://{api}/api/v1/spend?by=model"))
        .await
        .json();
    let free = free["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["model"] == "m-free")
        .cloned();
    assert_eq!(
        free,
        Some(json!({"model": "m-free", "cost_usd": 0.0, "requests": 1, "unpriced_requests": 1}))
    );
    let bad = get(&format!("http://{api}/api/v1/spend?by=instance")).await;
    assert_eq!(bad.status, 400, "{}", bad.body);

    // The UI's spend page is served, linked, and reads the same endpoint.
    let page = get(&format!("http://{api}/ui/pages/spend.js")).await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("'/api/v1/spend'"), "{}", page.body);
    assert!(page.body.contains("'/api/v1/budgets'"), "{}", page.body);
    let index = get(&format!("http://{api}/")).await;
    assert!(index.body.contains("href=\"#/spend\""), "{}", index.body);

    // Budgets: acme's $0.50 is overspent and pages, saying so; the fleet-wide one is not.
    let acme = by_tenant["acme"];
    assert!(acme > 0.5, "the traffic overspends acme's budget: {acme}");
    let spent_series = "tokenwatch_budget_spent_usd{budget=\"acme-monthly\",period=\"monthly\"}";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let alert = loop {
        let found = alerts(api)
            .await
            .into_iter()
            .find(|a| a["rule"] == "budget_burn" && a["labels"]["budget"] == "acme-monthly");
        if let Some(a) = found {
            break a;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no budget alert; log:\n{}",
            stack.tw.log_tail(40)
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    let text = serde_json::to_string(&alert).unwrap();
    assert!(text.contains("budget acme-monthly is spent"), "{text}");
    assert!(
        alerts(api)
            .await
            .iter()
            .all(|a| a["labels"]["budget"] != "everything"),
        "a budget on pace does not page"
    );
    // The engine counts records as they reach it: wait for the last of them.
    let everything = "tokenwatch_budget_spent_usd{budget=\"everything\",period=\"monthly\"}";
    let text = wait_series_cents(&metrics_url, everything, cents(total), &stack.tw).await;
    assert_eq!(
        metric_value(&text, spent_series).map(cents),
        Some(cents(acme)),
        "{text}"
    );
    let exhaustion =
        "tokenwatch_budget_time_to_exhaustion_seconds{budget=\"acme-monthly\",period=\"monthly\"}";
    assert_eq!(metric_value(&text, exhaustion), Some(0.0), "{text}");
    // The spend, unpriced and budget families are well-formed exposition.
    promtool_check_metrics(&text);
    // The API reads the budgets from the stored records: the same spend.
    let budgets = get(&format!("http://{api}/api/v1/budgets")).await.json();
    let acme_budget = budgets["budgets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "acme-monthly")
        .cloned()
        .unwrap_or_else(|| panic!("{budgets}"));
    assert_eq!(
        cents(acme_budget["spent_usd"].as_f64().unwrap()),
        cents(acme),
        "{acme_budget}"
    );
    assert_eq!(
        (
            &acme_budget["tenant"],
            &acme_budget["spent"],
            &acme_budget["time_to_exhaustion_s"]
        ),
        (&json!("acme"), &json!(true), &json!(0.0)),
        "{acme_budget}"
    );

    // After a restart the period's spend is read back from the stored records.
    assert!(stack.tw.terminate().success(), "{}", stack.tw.log());
    stack.restart_tokenwatch();
    wait_ready(&format!("http://{api}/readyz"), &stack.tw).await;
    let text = wait_series_cents(&metrics_url, everything, cents(total), &stack.tw).await;
    assert_eq!(
        metric_value(&text, spent_series).map(cents),
        Some(cents(acme)),
        "{text}"
    );
}

/// Polls `/metrics` until `series` reads `want` cents (30 s at most); returns the exposition.
async fn wait_series_cents(url: &str, series: &str, want: i64, tw: &Proc) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let text = get(url).await.body;
        let got = metric_value(&text, series).map(cents);
        if got == Some(want) {
            return text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{series} reads {got:?} cents, not {want}; log:\n{}",
            tw.log_tail(40)
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_prices_its_fleet() {
    let dir = tempfile::tempdir().unwrap();
    let (demo, api, _) = start_demo(dir.path(), &["--rps", "20"]).await;
    let spend = wait_metric_sum(
        &format!("http://{api}/metrics"),
        "tokenwatch_spend_usd_total",
        30,
        &demo,
        |v| v > 0.0,
    )
    .await;
    assert!(spend > 0.0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let v = get(&format!("http://{api}/api/v1/spend?by=model"))
            .await
            .json();
        let priced: Vec<&str> = v["groups"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|g| g["cost_usd"].as_f64().is_some_and(|c| c > 0.0))
            .filter_map(|g| g["model"].as_str())
            .collect();
        if priced == ["llama-3.1-8b-instruct", "qwen2.5-14b-instruct"] {
            assert_eq!(v["unpriced_requests"], 0, "{v}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{v}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
