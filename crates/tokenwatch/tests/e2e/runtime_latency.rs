// Runtime-side latency end to end: a collector-only tokenwatch (no proxy, no OTLP) scrapes a
// target serving the recorded real vLLM exposition whose histograms and counters advance by known
// bucket increments each scrape; `/api/v1/latency` (no source asked), `/api/v1/fleet` and the
// model page's `/api/v1/timeseries` answer from the runtime windows, each percentile inside its
// stated bucket and where the increments put it — queue, prefill and decode time too, the two
// last only the runtime measures; `/api/v1/compare` around a deploy marker compares the runtime's
// minutes before and after it.

use crate::common;

use common::metrics_target::MetricsTarget;
use common::*;
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Per scrape: 6 TTFT observations in (0.02, 0.04] and 2 in (0.25, 0.5]; 40 inter-token gaps in
/// (0.01, 0.025]; 8 requests finished (7 `stop`, 1 `error`); 400 prompt and 160 output tokens.
const TTFT_PER_SCRAPE: f64 = 8.0;
const ITL_PER_SCRAPE: f64 = 40.0;
const OUTPUT_TOKENS_PER_SCRAPE: f64 = 160.0;

/// What the increments put each percentile at (linear interpolation inside its bucket, whatever
/// the number of scrapes in the window): (name, value, bucket lower, bucket upper).
const TTFT_EXPECTED: [(&str, f64, f64, f64); 4] = [
    // rank 4 of 8 per scrape, 6 in (0.02, 0.04]: 0.02 + 0.02 · 4/6
    ("p50", 0.02 + 0.02 * 4.0 / 6.0, 0.02, 0.04),
    // rank 7.2 of 8: 1.2 of the 2 in (0.25, 0.5]
    ("p90", 0.25 + 0.25 * 1.2 / 2.0, 0.25, 0.5),
    ("p95", 0.25 + 0.25 * 1.6 / 2.0, 0.25, 0.5),
    ("p99", 0.25 + 0.25 * 1.92 / 2.0, 0.25, 0.5),
];

/// A percentile's name, the value the increments put it at, and its bucket's bounds.
type Expected = (&'static str, f64, f64, f64);

/// Per scrape, the phases inside vLLM (its own buckets 0.3, 0.5, 0.8, 1, 1.5, 2, …): 8 queue
/// waits in (0, 0.3]; 6 prefills in (0, 0.3] and 2 in (0.3, 0.5]; 5 decodes in (0.8, 1] and 3 in
/// (1.5, 2]. What that puts each percentile at: (metric, [(name, value, lower, upper)]).
const PHASES_EXPECTED: [(&str, [Expected; 4]); 3] = [
    (
        "queue",
        [
            ("p50", 0.3 * 4.0 / 8.0, 0.0, 0.3),
            ("p90", 0.3 * 7.2 / 8.0, 0.0, 0.3),
            ("p95", 0.3 * 7.6 / 8.0, 0.0, 0.3),
            ("p99", 0.3 * 7.92 / 8.0, 0.0, 0.3),
        ],
    ),
    (
        "prefill",
        [
            ("p50", 0.3 * 4.0 / 6.0, 0.0, 0.3),
            ("p90", 0.3 + 0.2 * 1.2 / 2.0, 0.3, 0.5),
            ("p95", 0.3 + 0.2 * 1.6 / 2.0, 0.3, 0.5),
            ("p99", 0.3 + 0.2 * 1.92 / 2.0, 0.3, 0.5),
        ],
    ),
    (
        "decode",
        [
            ("p50", 0.8 + 0.2 * 4.0 / 5.0, 0.8, 1.0),
            ("p90", 1.5 + 0.5 * 2.2 / 3.0, 1.5, 2.0),
            ("p95", 1.5 + 0.5 * 2.6 / 3.0, 1.5, 2.0),
            ("p99", 1.5 + 0.5 * 2.92 / 3.0, 1.5, 2.0),
        ],
    ),
];

/// The recorded vLLM exposition (real metric names and labels) after `n` scrapes' increments.
fn vllm_after(text: &str, n: usize) -> String {
    vllm_with(text, n, 0)
}

/// The recorded vLLM exposition after `fast` scrapes' increments as above and `slow` more whose
/// 8 first tokens each all fall in (0.25, 0.5].
fn vllm_with(text: &str, fast: usize, slow: usize) -> String {
    let (n, slow) = (fast as f64, slow as f64);
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let parsed = line
            .rsplit_once(' ')
            .filter(|_| !line.starts_with('#'))
            .and_then(|(series, v)| v.parse::<f64>().ok().map(|v| (series, v)));
        let Some((series, value)) = parsed else {
            out.push_str(line);
            out.push('\n');
            continue;
        };
        let name = series.split('{').next().unwrap_or("");
        let le = series
            .split("le=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .map(|le| {
                if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                }
            })
            .unwrap_or(f64::NAN);
        let step = match name {
            "vllm:time_to_first_token_seconds_bucket" if le >= 0.5 => 8.0,
            "vllm:time_to_first_token_seconds_bucket" if le >= 0.04 => 6.0,
            "vllm:time_to_first_token_seconds_count" => TTFT_PER_SCRAPE,
            "vllm:time_to_first_token_seconds_sum" => 6.0 * 0.03 + 2.0 * 0.4,
            "vllm:inter_token_latency_seconds_bucket" if le >= 0.025 => ITL_PER_SCRAPE,
            "vllm:inter_token_latency_seconds_count" => ITL_PER_SCRAPE,
            "vllm:inter_token_latency_seconds_sum" => ITL_PER_SCRAPE * 0.02,
            "vllm:request_success_total" if series.contains("finished_reason=\"stop\"") => 7.0,
            "vllm:request_success_total" if series.contains("finished_reason=\"error\"") => 1.0,
            "vllm:prompt_tokens_total" => 400.0,
            "vllm:generation_tokens_total" => OUTPUT_TOKENS_PER_SCRAPE,
            "vllm:request_queue_time_seconds_bucket" => 8.0,
            "vllm:request_queue_time_seconds_count" => 8.0,
            "vllm:request_queue_time_seconds_sum" => 8.0 * 0.15,
            "vllm:request_prefill_time_seconds_bucket" if le >= 0.5 => 8.0,
            "vllm:request_prefill_time_seconds_bucket" => 6.0,
            "vllm:request_prefill_time_seconds_count" => 8.0,
            "vllm:request_prefill_time_seconds_sum" => 6.0 * 0.2 + 2.0 * 0.4,
            "vllm:request_decode_time_seconds_bucket" if le >= 2.0 => 8.0,
            "vllm:request_decode_time_seconds_bucket" if le >= 1.0 => 5.0,
            "vllm:request_decode_time_seconds_count" => 8.0,
            "vllm:request_decode_time_seconds_sum" => 5.0 * 0.9 + 3.0 * 1.8,
            _ => 0.0,
        };
        let slow_step = match name {
            "vllm:time_to_first_token_seconds_bucket" if le >= 0.5 => 8.0,
            "vllm:time_to_first_token_seconds_bucket" => 0.0,
            "vllm:time_to_first_token_seconds_sum" => 8.0 * 0.4,
            _ => step,
        };
        out.push_str(&format!(
            "{series} {:?}\n",
            value + step * n + slow_step * slow
        ));
    }
    out
}

async fn json(url: &str) -> Value {
    let r = get(url).await;
    assert_eq!(r.status, 200, "{url}: {}", r.body);
    r.json()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collector_only_latency_and_fleet_come_from_the_runtime_histograms() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/vllm-cpu-metrics.txt"),
    )
    .unwrap();
    let scrapes = Arc::new(AtomicUsize::new(0));
    let served = scrapes.clone();
    let target =
        MetricsTarget::start(move || vllm_after(&text, served.fetch_add(1, Ordering::SeqCst)))
            .await;
    let dir = tempfile::tempdir().unwrap();
    // The success SLO on windows of seconds (budget 10 min, fast pair 20 s / 10 s), so that
    // one failed request in eight burns it at 25 × within the test.
    let config = write_config(
        dir.path(),
        "scrape:\n  interval: 1s\n  timeout: 1s\n\
         alerting:\n  overrides:\n    slo_burn: {params: {min_requests: 10}}\n\
         slos:\n  - name: success\n    objective: success\n    window: 10m\n    \
         burn_windows: {fast_long: 20s, fast_short: 10s, slow_long: 60s, slow_short: 15s}\n",
    );
    let url = format!("http://{}/metrics", target.addr);
    let (tw, api) = start_collector(
        dir.path(),
        &["-c", &config.to_string_lossy(), "--scrape", &url],
    )
    .await;

    // No source asked for: nothing holds records of the model, so the runtime answers.
    let latency = format!("http://{api}/api/v1/latency?model=tinyllama&metric=ttft&window=5m");
    poll_json(&latency, &tw, 30, |v| {
        v["count"].as_u64().unwrap_or(0) >= 3 * TTFT_PER_SCRAPE as u64
    })
    .await;
    let before = target.hits();
    let l = json(&latency).await;
    let after = target.hits();
    assert_eq!(l["source"], "runtime", "{l:#}");
    assert!(
        l["source_chosen"]
            .as_str()
            .is_some_and(|s| s.contains("runtime")),
        "{l:#}"
    );
    assert_eq!(l["metric"], "ttft");
    assert_eq!(l["instances"], serde_json::json!([target.addr.to_string()]));
    // Every scrape after the first adds 8 observations: the count is 8 per scrape counted, and
    // at most one per scrape served (the first is the baseline; one may still be in flight).
    let count = l["count"].as_u64().unwrap();
    assert_eq!(count % TTFT_PER_SCRAPE as u64, 0, "{l:#}");
    let counted = (count / TTFT_PER_SCRAPE as u64) as usize;
    assert!(
        counted < after && counted + 2 >= before,
        "{counted} scrapes counted, {before}..{after} served: {l:#}"
    );
    for (name, value, lower, upper) in TTFT_EXPECTED {
        let got = l[name].as_f64().unwrap_or_else(|| panic!("{name}: {l:#}"));
        let bounds = &l["bucket_bounds"][name];
        assert_eq!(
            (bounds["lower"].as_f64(), bounds["upper"].as_f64()),
            (Some(lower), Some(upper)),
            "{name}: {l:#}"
        );
        assert!(
            lower <= got && got <= upper,
            "{name} {got} outside its bucket: {l:#}"
        );
        assert!(
            close(got, value),
            "{name}: {got}, the increments put it at {value}: {l:#}"
        );
    }

    // ITL: every gap in (0.01, 0.025].
    let itl = json(&format!(
        "http://{api}/api/v1/latency?model=tinyllama&metric=itl&window=5m&source=runtime&by=instance"
    ))
    .await;
    assert_eq!(itl["source"], "runtime");
    assert!(close(itl["p50"].as_f64().unwrap(), 0.0175), "{itl:#}");
    assert_eq!(itl["bucket_bounds"]["p99"]["upper"].as_f64(), Some(0.025));
    assert_eq!(
        itl["groups"][0]["labels"]["instance"],
        target.addr.to_string()
    );
    assert!(itl["count"].as_u64().unwrap() >= 3 * ITL_PER_SCRAPE as u64);
    // The records (source=memory) hold nothing; bad sources and labels keep their 400s.
    let memory = json(&format!("{latency}&source=memory")).await;
    assert_eq!(
        (&memory["source"], &memory["count"]),
        (&"memory".into(), &0.into())
    );
    for (query, says) in [
        ("source=proxy", "memory, store, runtime"),
        ("source=runtime&by=tenant", "model_id, runtime, instance"),
        ("source=runtime&window=6h", "1m, 5m, 1h"),
    ] {
        let r = get(&format!("http://{api}/api/v1/latency?{query}")).await;
        assert_eq!(r.status, 400, "{query}: {}", r.body);
        assert!(r.body.contains(says), "{query}: {}", r.body);
    }

    // Queue, prefill and decode time: the runtime's histograms, where the increments put them.
    // Prefill and decode only the runtime measures: answered from it with or without
    // source=runtime, and a 400 when the records are asked for them; queue time falls back to
    // the runtime as TTFT does (no record carries an x-queue-time).
    for (metric, want) in PHASES_EXPECTED {
        for source in ["", "&source=runtime"] {
            let url = format!(
                "http://{api}/api/v1/latency?model=tinyllama&metric={metric}&window=5m{source}"
            );
            let v = poll_json(&url, &tw, 15, |v| v["count"].as_u64().unwrap_or(0) >= 16).await;
            assert_eq!(
                (&v["source"], &v["metric"]),
                (&"runtime".into(), &metric.into()),
                "{v:#}"
            );
            assert_eq!(v["count"].as_u64().unwrap() % 8, 0, "{v:#}");
            let chosen = v["source_chosen"].as_str();
            match (metric, source) {
                (_, "&source=runtime") => assert_eq!(chosen, None, "{v:#}"),
                ("queue", _) => assert!(
                    chosen.is_some_and(|s| s.contains("no proxy or OTLP record")),
                    "{v:#}"
                ),
                _ => assert!(
                    chosen.is_some_and(|s| s.contains("measured only by the serving runtime")),
                    "{v:#}"
                ),
            }
            for (name, value, lower, upper) in want {
                let bounds = &v["bucket_bounds"][name];
                assert_eq!(
                    (bounds["lower"].as_f64(), bounds["upper"].as_f64()),
                    (Some(lower), Some(upper)),
                    "{metric} {name}: {v:#}"
                );
                let got = v[name].as_f64().unwrap();
                assert!(
                    close(got, value),
                    "{metric} {name}: {got}, the increments put it at {value}: {v:#}"
                );
            }
        }
    }
    for metric in ["prefill", "decode"] {
        for source in ["memory", "store"] {
            let r = get(&format!(
                "http://{api}/api/v1/latency?model=tinyllama&metric={metric}&source={source}"
            ))
            .await;
            assert_eq!(r.status, 400, "{metric} from {source}: {}", r.body);
            assert!(
                r.body.contains("runtime, or no source")
                    && r.body
                        .contains("only by the serving runtime's own histograms"),
                "{}",
                r.body
            );
        }
        // A model no runtime reports: an empty answer from the runtime, saying why.
        let none = json(&format!(
            "http://{api}/api/v1/latency?model=nobody&metric={metric}"
        ))
        .await;
        assert_eq!(
            (&none["source"], &none["count"]),
            (&"runtime".into(), &0.into()),
            "{none:#}"
        );
        assert!(
            none["source_chosen"]
                .as_str()
                .is_some_and(|s| s.contains("vllm:request_prefill_time_seconds"))
        );
    }

    // The fleet row: TTFT/ITL percentiles, rates and errors from the runtime, labelled so.
    let fleet_url = format!("http://{api}/api/v1/fleet");
    let fleet = poll_json(&fleet_url, &tw, 15, |v| {
        v["models"]
            .as_array()
            .and_then(|m| m.iter().find(|r| r["model_id"] == "tinyllama"))
            .is_some_and(|r| r["ttft_p99_s"].is_number() && r["requests_per_s"].is_number())
    })
    .await;
    let row = fleet["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["model_id"] == "tinyllama")
        .unwrap();
    assert_eq!(row["figure_source"], "runtime", "{row:#}");
    assert!(
        close(row["ttft_p50_s"].as_f64().unwrap(), TTFT_EXPECTED[0].1),
        "{row:#}"
    );
    assert!(
        close(row["ttft_p99_s"].as_f64().unwrap(), TTFT_EXPECTED[3].1),
        "{row:#}"
    );
    assert_eq!(
        row["bucket_bounds"]["ttft_p50_s"]["lower"].as_f64(),
        Some(0.02)
    );
    assert_eq!(
        row["bucket_bounds"]["ttft_p50_s"]["upper"].as_f64(),
        Some(0.04)
    );
    assert!(close(row["itl_p50_s"].as_f64().unwrap(), 0.0175), "{row:#}");
    assert!(row["itl_p99_s"].as_f64().unwrap() <= 0.025, "{row:#}");
    // 8 requests and 160 output tokens per scrape, every ~1 s (a loaded machine may stretch
    // the intervals); 1 of the 8 failed.
    let rps = row["requests_per_s"].as_f64().unwrap();
    assert!((2.0..=12.0).contains(&rps), "{rps} req/s: {row:#}");
    let tps = row["output_tokens_per_s"].as_f64().unwrap();
    assert!(
        close(tps / rps, OUTPUT_TOKENS_PER_SCRAPE / TTFT_PER_SCRAPE),
        "{row:#}"
    );
    assert!(
        close(row["error_ratio"].as_f64().unwrap(), 1.0 / 8.0),
        "{row:#}"
    );
    assert!(
        row["kv_cache_usage"].is_number(),
        "still from the gauges: {row:#}"
    );
    // The phases inside the runtime: P50/P90/P99 where the increments put them, with buckets.
    for (metric, want) in PHASES_EXPECTED {
        for (name, value, lower, upper) in want.into_iter().filter(|w| w.0 != "p95") {
            let column = format!("{metric}_{name}_s");
            assert!(
                close(row[&column].as_f64().unwrap(), value),
                "{column}: {row:#}"
            );
            let b = &row["bucket_bounds"][&column];
            assert_eq!(
                (b["lower"].as_f64(), b["upper"].as_f64()),
                (Some(lower), Some(upper)),
                "{column}"
            );
        }
    }

    // `top --once` prints the same row: the model's TTFT and ITL percentiles as the fleet gives
    // them (its name is marked ʳ, runtime figures, unless an alert colours it).
    let out = std::process::Command::new(BIN)
        .args([
            "top", "--once", "--window", "5m", "--size", "200x30", "--url",
        ])
        .arg(format!("http://{api}"))
        .output()
        .unwrap();
    let screen = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "top --once: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = screen
        .lines()
        .find(|l| l.contains("│tinyllama "))
        .unwrap_or_else(|| panic!("no runtime row for tinyllama:\n{screen}"));
    for figure in [
        tokenwatch::top::fmt::latency(row["ttft_p50_s"].as_f64()),
        tokenwatch::top::fmt::latency(row["itl_p50_s"].as_f64()),
    ] {
        assert!(line.contains(&figure), "{figure} not in {line:?}\n{screen}");
    }
    let bad = std::process::Command::new(BIN)
        .args([
            "top",
            "--once",
            "--url",
            "http://127.0.0.1:9",
            "--timeout",
            "1s",
        ])
        .output()
        .unwrap();
    assert!(!bad.status.success(), "no API: top --once fails");

    // The model page's charts: the timeline samples the same figures every 5 s.
    let charts = format!("http://{api}/api/v1/timeseries?model=tinyllama&range=5m");
    let has = |v: &Value, column: &str| {
        v["series"][column]
            .as_array()
            .is_some_and(|s| s.iter().any(Value::is_number))
    };
    let ts = poll_json(&charts, &tw, 15, |v| {
        has(v, "ttft_p99_s")
            && has(v, "itl_p50_s")
            && has(v, "requests_per_s")
            && has(v, "queue_p50_s")
            && has(v, "prefill_p90_s")
            && has(v, "decode_p99_s")
    })
    .await;
    let last = |column: &str| {
        ts["series"][column]
            .as_array()
            .and_then(|s| s.iter().rev().find_map(Value::as_f64))
            .unwrap()
    };
    assert!(
        close(last("prefill_p50_s"), PHASES_EXPECTED[1].1[0].1),
        "{ts:#}"
    );
    assert!(
        close(last("decode_p99_s"), PHASES_EXPECTED[2].1[3].1),
        "{ts:#}"
    );
    assert_eq!(ts["units"]["prefill_p50_s"], "seconds");
    assert_eq!(ts["figure_source"], "runtime", "{ts:#}");

    // The success SLO burns on runtime data alone: 1 of 8 requests failed (12.5 % against a
    // 0.5 % budget, burn 25 ×), counted from the scraped counters, and its page fires.
    let slos_url = format!("http://{api}/api/v1/slos?slo=success&model=tinyllama");
    let slos = poll_json(&slos_url, &tw, 60, |v| {
        v["slos"][0]["alert_state"] == "firing"
    })
    .await;
    let success = &slos["slos"][0];
    assert_eq!(success["counted_from"], "runtime", "{success:#}");
    let (total, bad) = (
        success["total"].as_u64().unwrap(),
        success["bad"].as_u64().unwrap(),
    );
    assert!(
        total >= 16 && total % 8 == 0 && bad * 8 == total,
        "{success:#}"
    );
    let fast = success["burn"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["pair"] == "fast")
        .unwrap();
    assert!(
        fast["burn_rate"]
            .as_f64()
            .is_some_and(|b| (b - 25.0).abs() < 1e-6),
        "{success:#}"
    );
}

/// The simulator's default model (its /metrics name it too).
const SIM_MODEL: &str = "sim-llama-8b";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn where_proxy_and_runtime_both_see_a_model_the_fleet_shows_both_and_their_difference() {
    let dir = tempfile::tempdir().unwrap();
    let (_sim, sim) = start_sim(dir.path(), &[]).await;
    let scrape = format!("http://{sim}/metrics");
    let (tw, api, proxy) =
        run_tokenwatch(dir.path(), &format!("http://{sim}"), &["--scrape", &scrape]).await;
    let body = serde_json::json!({
        "model": SIM_MODEL,
        "stream": true,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hello"}],
    });
    let fleet_url = format!("http://{api}/api/v1/fleet");
    let deadline = Instant::now() + Duration::from_secs(60);
    let row = loop {
        for _ in 0..5 {
            chat_answer(proxy, &body, &[]).await;
        }
        let fleet = json(&fleet_url).await;
        let row = fleet["models"]
            .as_array()
            .and_then(|m| m.iter().find(|r| r["model_id"] == SIM_MODEL).cloned());
        if let Some(row) = row.filter(|r| r["runtime_view"]["ttft_p50_s"]["value"].is_number()) {
            break row;
        }
        assert!(
            Instant::now() < deadline,
            "no runtime view beside the proxy's figures; log:\n{}",
            tw.log_tail(40)
        );
    };
    // The row's figures are the proxy's (client-felt); the runtime's own sit beside them.
    assert_eq!(row["figure_source"], "proxy", "{row:#}");
    for column in ["ttft_p50_s", "ttft_p99_s", "itl_p50_s"] {
        let client = row[column]
            .as_f64()
            .unwrap_or_else(|| panic!("{column}: {row:#}"));
        let runtime = &row["runtime_view"][column];
        let value = runtime["value"].as_f64().unwrap();
        let lower = runtime["bucket"]["lower"].as_f64().unwrap();
        assert!(lower <= value, "{column}: {row:#}");
        let gap = &row["client_minus_runtime"][column];
        assert!(
            close(gap["value"].as_f64().unwrap(), client - value),
            "{column}: {row:#}"
        );
        // Known to the runtime's bucket: between client − upper and client − lower.
        assert!(
            close(gap["at_most"].as_f64().unwrap(), client - lower),
            "{column}: {row:#}"
        );
        if let Some(upper) = runtime["bucket"]["upper"].as_f64() {
            assert!(
                close(gap["at_least"].as_f64().unwrap(), client - upper),
                "{column}: {row:#}"
            );
        }
    }
    // What the client feels of the first token includes what the runtime measured of it:
    // never below the bucket the runtime's median lies in.
    let client = row["ttft_p50_s"].as_f64().unwrap();
    let lower = row["runtime_view"]["ttft_p50_s"]["bucket"]["lower"]
        .as_f64()
        .unwrap();
    assert!(client >= lower, "{row:#}");
    eprintln!(
        "TTFT P50: client-felt {client:.4} s, runtime {} (bucket {}), in front {}",
        row["runtime_view"]["ttft_p50_s"]["value"],
        row["runtime_view"]["ttft_p50_s"]["bucket"],
        row["client_minus_runtime"]["ttft_p50_s"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_around_a_marker_answers_from_the_runtime_for_a_model_no_record_holds() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/vllm-cpu-metrics.txt"),
    )
    .unwrap();
    // The deploy happens at a minute boundary (set below): scrapes served after it add slow
    // first tokens, those before it fast ones.
    let boundary = Arc::new(std::sync::atomic::AtomicI64::new(i64::MAX));
    let (fast, slow) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (b, f, sl) = (boundary.clone(), fast.clone(), slow.clone());
    let target = MetricsTarget::start(move || {
        let (nf, ns) = (f.load(Ordering::SeqCst), sl.load(Ordering::SeqCst));
        let body = vllm_with(&text, nf, ns);
        if now_ms() >= b.load(Ordering::SeqCst) {
            sl.fetch_add(1, Ordering::SeqCst);
        } else {
            f.fetch_add(1, Ordering::SeqCst);
        }
        body
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "scrape:\n  interval: 1s\n  timeout: 1s\n");
    let url = format!("http://{}/metrics", target.addr);
    let (_tw, api) = start_collector(
        dir.path(),
        &["-c", &config.to_string_lossy(), "--scrape", &url],
    )
    .await;
    // The next minute boundary at least 8 s away: five or more scrapes land before it.
    let minute = 60_000;
    let mut at = (now_ms() / minute + 1) * minute;
    if at - now_ms() < 8_000 {
        at += minute;
    }
    boundary.store(at, Ordering::SeqCst);
    let posted = post(
        &format!("http://{api}/api/v1/markers"),
        &format!(r#"{{"kind":"deploy","model":"tinyllama","note":"v2","at_unix_ms":{at}}}"#),
    )
    .await;
    assert_eq!(posted.status, 201, "{}", posted.body);
    let id = posted.json()["id"].as_str().unwrap().to_string();
    let wait_ms = (at + 8_000 - now_ms()).max(0) as u64;
    tokio::time::sleep(Duration::from_millis(wait_ms)).await;
    let compare = json(&format!(
        "http://{api}/api/v1/compare?marker={id}&window=5m"
    ))
    .await;
    assert_eq!(compare["figure_source"], "runtime", "{compare:#}");
    assert!(
        compare["source_chosen"]
            .as_str()
            .is_some_and(|s| s.contains("no proxy or OTLP record")),
        "{compare:#}"
    );
    assert_eq!(compare["before"]["requests"], 0, "no record either side");
    // On a minute boundary: no minute mixes both sides.
    assert_eq!(
        compare["runtime"]["marker_minute_left_out_unix_ms"],
        Value::Null,
        "{compare:#}"
    );
    assert_eq!(
        compare["runtime"]["after"]["first_minute_unix_ms"],
        serde_json::json!(at)
    );
    assert_eq!(
        compare["runtime"]["before"]["instances"],
        serde_json::json!([target.addr.to_string()])
    );
    let signals = compare["signals"].as_array().unwrap();
    let find = |name: &str| {
        signals
            .iter()
            .find(|r| r["signal"] == name)
            .unwrap_or_else(|| panic!("{name}: {compare:#}"))
    };
    let p50 = find("ttft_p50_seconds");
    assert_eq!(
        (&p50["source"], &p50["verdict"]),
        (&"runtime".into(), &"worse".into()),
        "{p50:#}"
    );
    // Each side's P50 in the bucket its increments put it in (a scrape served just before the
    // boundary but stamped after it may carry fast first tokens into the after side: the value
    // moves inside the bucket, the bucket does not).
    for (side, lower, upper) in [("before", 0.02, 0.04), ("after", 0.25, 0.5)] {
        let bucket = &p50["bucket_bounds"][side];
        assert_eq!(
            (bucket["lower"].as_f64(), bucket["upper"].as_f64()),
            (Some(lower), Some(upper)),
            "{side}: {p50:#}"
        );
        let got = p50[side]["value"].as_f64().unwrap();
        assert!(lower <= got && got <= upper, "{side}: {got}: {p50:#}");
        let (lo, hi) = (
            p50[side]["lo"].as_f64().unwrap(),
            p50[side]["hi"].as_f64().unwrap(),
        );
        assert!(lo <= lower + 1e-9 && hi >= upper - 1e-9, "{side}: {p50:#}");
        assert_eq!(p50[side]["n"].as_u64().unwrap() % 8, 0, "{p50:#}");
    }
    // ITL did not change; 1 of 8 requests failed both sides.
    assert_eq!(find("itl_p50_seconds")["verdict"], "no_change");
    let err = find("error_rate");
    assert_eq!(
        (&err["source"], &err["verdict"]),
        (&"runtime".into(), &"no_change".into())
    );
    assert!(
        close(err["after"]["value"].as_f64().unwrap(), 1.0 / 8.0),
        "{err:#}"
    );
    eprintln!(
        "compare: TTFT P50 {} → {} (runtime, {} → {} first tokens)",
        p50["before"]["value"], p50["after"]["value"], p50["before"]["n"], p50["after"]["n"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_aliases_put_scraped_series_and_otlp_records_under_one_model_id() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/vllm-cpu-metrics.txt"),
    )
    .unwrap();
    let scrapes = Arc::new(AtomicUsize::new(0));
    let served = scrapes.clone();
    let target =
        MetricsTarget::start(move || vllm_after(&text, served.fetch_add(1, Ordering::SeqCst)))
            .await;
    let dir = tempfile::tempdir().unwrap();
    // vLLM serves `tinyllama`; an instrumented app names it `tiny-llama-chat`: one model.
    let (tw, api, http) = start_otlp_collector_with(
        dir.path(),
        &format!(
            "scrape:\n  interval: 1s\n  timeout: 1s\n  targets:\n    - url: http://{}/metrics\n\
             models:\n  aliases:\n    meta/tinyllama: [tinyllama, tiny-llama-chat]\n",
            target.addr
        ),
    )
    .await;
    let now_ns = now_ns();
    let span = format!(
        r#"{{"resourceSpans":[{{"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"app"}}}}]}},
        "scopeSpans":[{{"scope":{{"name":"raw"}},"spans":[
          {{"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","name":"chat","kind":3,
            "startTimeUnixNano":"{}","endTimeUnixNano":"{now_ns}",
            "attributes":[{{"key":"gen_ai.operation.name","value":{{"stringValue":"chat"}}}},
              {{"key":"gen_ai.request.model","value":{{"stringValue":"tiny-llama-chat"}}}},
              {{"key":"gen_ai.usage.output_tokens","value":{{"intValue":"12"}}}}]}}]}}]}}]}}"#,
        now_ns - 1_000_000_000
    );
    let r = post(&format!("http://{http}/v1/traces"), &span).await;
    assert_eq!(r.status, 200, "{}", r.body);
    // The record is stored under the model's id.
    let requests = poll_json(
        &format!("http://{api}/api/v1/requests?model=meta/tinyllama"),
        &tw,
        20,
        |v| v["requests"].as_array().is_some_and(|r| !r.is_empty()),
    )
    .await;
    assert_eq!(
        requests["requests"][0]["model_id"], "meta/tinyllama",
        "{requests:#}"
    );
    // The scraped histograms too: the runtime windows answer for the id, not for the alias.
    let latency = format!(
        "http://{api}/api/v1/latency?model=meta/tinyllama&metric=ttft&window=5m&source=runtime"
    );
    poll_json(&latency, &tw, 30, |v| {
        v["count"].as_u64().unwrap_or(0) >= 2 * TTFT_PER_SCRAPE as u64
    })
    .await;
    let alias = json(&format!(
        "http://{api}/api/v1/latency?model=tinyllama&metric=ttft&window=5m&source=runtime"
    ))
    .await;
    assert_eq!(alias["count"], 0, "{alias:#}");
    // One fleet row, with the runtime's figures beside the record's model.
    let fleet = json(&format!("http://{api}/api/v1/fleet")).await;
    let ids: Vec<&str> = fleet["models"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["model_id"].as_str())
        .collect();
    assert_eq!(ids, ["meta/tinyllama"], "{fleet:#}");
    let metrics = get(&format!("http://{api}/metrics")).await.body;
    assert!(
        metrics.lines().any(
            |l| l.starts_with("tokenwatch_runtime_requests_finished_total{")
                && l.contains("model=\"meta/tinyllama\"")
        ),
        "{metrics}"
    );
    assert!(!metrics.contains("model=\"tinyllama\""), "{metrics}");
}
