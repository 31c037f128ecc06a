// Known-answer tests of the runtime mapping: per runtime, rates over elapsed time, counter
// resets, ratios, windowed histogram quantiles from bucket deltas, GPU memory derivation.

use super::*;
use crate::sources::scrape::rules::MappingRule;
use crate::sources::scrape::tables::builtin;
use std::borrow::Cow;
use tokenwatch_core::exposition::{Label, MetricType};

type S<'a> = (&'a str, Vec<(&'a str, &'a str)>, f64);

fn fam<'a>(name: &'a str, typ: MetricType, samples: Vec<S<'a>>) -> MetricFamily<'a> {
    MetricFamily {
        name,
        typ,
        help: None,
        unit: None,
        samples: samples
            .into_iter()
            .map(|(n, labels, value)| Sample {
                name: n,
                labels: labels
                    .into_iter()
                    .map(|(k, v)| Label {
                        name: k,
                        value: Cow::Borrowed(v),
                    })
                    .collect(),
                value,
                timestamp_ms: None,
                exemplar: None,
            })
            .collect(),
    }
}

fn mapper(labels: &[(&str, &str)]) -> Mapper {
    let target = TargetIdentity {
        instance: "127.0.0.1:8000".into(),
        runtime: None,
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        url: String::new(),
    };
    Mapper::new(
        Arc::new(RuleSet::new(builtin())),
        target,
        Duration::from_secs(60),
    )
}

fn find<'a>(out: &'a MapOutput, signal: &str, model: &str) -> Option<&'a SignalPoint> {
    out.points
        .iter()
        .find(|p| p.signal == signal && p.model_id == model)
}

fn value(out: &MapOutput, signal: &str, model: &str) -> f64 {
    find(out, signal, model)
        .unwrap_or_else(|| panic!("no {signal} for {model:?} in {:#?}", out.points))
        .value
}

const M: (&str, &str) = ("model_name", "tinyllama");
const E: (&str, &str) = ("engine", "0");

fn vllm_scrape<'a>(
    kv: f64,
    prompt: f64,
    hits: f64,
    queries: f64,
    ttft: [f64; 4],
) -> Vec<MetricFamily<'a>> {
    let les = ["0.1", "0.5", "1.0", "+Inf"];
    let mut buckets: Vec<S<'a>> = les
        .iter()
        .zip(ttft)
        .map(|(le, c)| {
            (
                "vllm:time_to_first_token_seconds_bucket",
                vec![E, ("le", *le), M],
                c,
            )
        })
        .collect();
    buckets.push((
        "vllm:time_to_first_token_seconds_count",
        vec![E, M],
        ttft[3],
    ));
    buckets.push((
        "vllm:time_to_first_token_seconds_sum",
        vec![E, M],
        ttft[3] * 0.4,
    ));
    vec![
        fam(
            "vllm:kv_cache_usage_perc",
            MetricType::Gauge,
            vec![("vllm:kv_cache_usage_perc", vec![E, M], kv)],
        ),
        fam(
            "vllm:num_requests_running",
            MetricType::Gauge,
            vec![
                ("vllm:num_requests_running", vec![E, M], 3.0),
                ("vllm:num_requests_running", vec![("engine", "1"), M], 2.0),
            ],
        ),
        fam(
            "vllm:num_requests_waiting",
            MetricType::Gauge,
            vec![("vllm:num_requests_waiting", vec![E, M], 7.0)],
        ),
        fam(
            "vllm:prompt_tokens",
            MetricType::Counter,
            vec![
                ("vllm:prompt_tokens_total", vec![E, M], prompt),
                ("vllm:prompt_tokens_created", vec![E, M], 1.7e9),
            ],
        ),
        fam(
            "vllm:prefix_cache_hits",
            MetricType::Counter,
            vec![("vllm:prefix_cache_hits_total", vec![E, M], hits)],
        ),
        fam(
            "vllm:prefix_cache_queries",
            MetricType::Counter,
            vec![("vllm:prefix_cache_queries_total", vec![E, M], queries)],
        ),
        fam(
            "vllm:time_to_first_token_seconds",
            MetricType::Histogram,
            buckets,
        ),
    ]
}

#[test]
fn vllm_gauges_rates_ratios_and_quantiles() {
    let mut m = mapper(&[]);
    let t0 = Instant::now();
    let first = m.map(
        &vllm_scrape(0.25, 100.0, 10.0, 100.0, [10.0, 20.0, 30.0, 30.0]),
        t0,
        1_000,
    );
    assert_eq!(first.runtime, "vllm");
    assert!(first.detected);
    assert_eq!(value(&first, names::KV_CACHE_USAGE, "tinyllama"), 0.25);
    assert_eq!(
        value(&first, names::REQUESTS_RUNNING, "tinyllama"),
        5.0,
        "two engines are summed"
    );
    assert_eq!(value(&first, names::REQUESTS_WAITING, "tinyllama"), 7.0);
    assert!(
        find(&first, names::PROMPT_TOKENS_PER_SECOND, "tinyllama").is_none(),
        "no rate before two readings"
    );
    assert!(find(&first, "ttft_p50_seconds", "tinyllama").is_none());
    let p = find(&first, names::KV_CACHE_USAGE, "tinyllama").unwrap();
    assert_eq!(
        (p.source.as_str(), p.runtime.as_str(), p.instance.as_str()),
        ("scrape:vllm", "vllm", "127.0.0.1:8000")
    );
    assert_eq!(p.device_id, "");

    let second = m.map(
        &vllm_scrape(0.5, 300.0, 40.0, 200.0, [10.0, 25.0, 40.0, 40.0]),
        t0 + Duration::from_secs(4),
        5_000,
    );
    assert_eq!(
        value(&second, names::PROMPT_TOKENS_PER_SECOND, "tinyllama"),
        50.0,
        "200 tokens over 4 s"
    );
    assert!(
        (value(&second, names::PREFIX_CACHE_HIT_RATE, "tinyllama") - 0.3).abs() < 1e-12,
        "30 hits / 100 queries"
    );
    // Bucket deltas [0, 5, 10, 10] over bounds [0.1, 0.5, 1.0, +Inf].
    let p50 = find(&second, "ttft_p50_seconds", "tinyllama").unwrap();
    assert!((p50.value - 0.5).abs() < 1e-12, "{p50:?}");
    assert_eq!(p50.notes["bucket_lower"], "0.1");
    assert_eq!(p50.notes["bucket_upper"], "0.5");
    assert_eq!(p50.notes["max_abs_error"], "0.4");
    assert_eq!(p50.notes["observations"], "10");
    assert!((value(&second, "ttft_p90_seconds", "tinyllama") - 0.9).abs() < 1e-12);
    assert!((value(&second, "ttft_mean_seconds", "tinyllama") - 0.4).abs() < 1e-9);

    // The runtime restarted: counters went down. The new reading is the whole increase.
    let third = m.map(
        &vllm_scrape(0.1, 20.0, 1.0, 2.0, [1.0, 1.0, 1.0, 1.0]),
        t0 + Duration::from_secs(6),
        7_000,
    );
    assert_eq!(
        value(&third, names::PROMPT_TOKENS_PER_SECOND, "tinyllama"),
        10.0,
        "20 tokens since the reset over 2 s"
    );
    assert_eq!(
        value(&third, names::PREFIX_CACHE_HIT_RATE, "tinyllama"),
        0.5
    );
    assert!(
        value(&third, "ttft_p99_seconds", "tinyllama") <= 0.1,
        "reset histogram is its own window"
    );
}

#[test]
fn histogram_window_uses_the_reading_from_a_window_ago() {
    let mut m = mapper(&[]);
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    m.map(
        &vllm_scrape(0.0, 0.0, 0.0, 0.0, [0.0, 0.0, 0.0, 0.0]),
        at(0),
        0,
    );
    m.map(
        &vllm_scrape(0.0, 0.0, 0.0, 0.0, [100.0, 100.0, 100.0, 100.0]),
        at(30),
        0,
    );
    // 100 fast observations at t≤30, then 10 slow ones.
    let out = m.map(
        &vllm_scrape(0.0, 0.0, 0.0, 0.0, [100.0, 100.0, 110.0, 110.0]),
        at(70),
        0,
    );
    assert_eq!(
        find(&out, "ttft_p50_seconds", "tinyllama").unwrap().notes["window_s"],
        "70"
    );
    let out = m.map(
        &vllm_scrape(0.0, 0.0, 0.0, 0.0, [100.0, 100.0, 110.0, 110.0]),
        at(100),
        0,
    );
    let p50 = find(&out, "ttft_p50_seconds", "tinyllama").unwrap();
    assert_eq!(p50.notes["window_s"], "70", "base is the reading at t=30");
    assert!(
        p50.value > 0.5,
        "only the 10 slow observations are in the window: {p50:?}"
    );
}

#[test]
fn dcgm_memory_utilisation_and_device_labels() {
    let gpu = vec![
        ("gpu", "0"),
        ("UUID", "GPU-5b4e"),
        ("pci_bus_id", "00000000:00:07.0"),
        ("modelName", "NVIDIA L40S"),
        ("Hostname", "gpu1"),
    ];
    let fams = vec![
        fam(
            "DCGM_FI_DEV_FB_FREE",
            MetricType::Gauge,
            vec![("DCGM_FI_DEV_FB_FREE", gpu.clone(), 45459.0)],
        ),
        fam(
            "DCGM_FI_DEV_FB_USED",
            MetricType::Gauge,
            vec![("DCGM_FI_DEV_FB_USED", gpu.clone(), 1000.0)],
        ),
        fam(
            "DCGM_FI_DEV_FB_RESERVED",
            MetricType::Gauge,
            vec![("DCGM_FI_DEV_FB_RESERVED", gpu.clone(), 608.0)],
        ),
        fam(
            "DCGM_FI_DEV_GPU_UTIL",
            MetricType::Gauge,
            vec![("DCGM_FI_DEV_GPU_UTIL", gpu.clone(), 37.0)],
        ),
        fam(
            "DCGM_FI_DEV_POWER_USAGE",
            MetricType::Gauge,
            vec![("DCGM_FI_DEV_POWER_USAGE", gpu.clone(), 35.686)],
        ),
        fam(
            "DCGM_FI_DEV_GPU_TEMP",
            MetricType::Gauge,
            vec![("DCGM_FI_DEV_GPU_TEMP", gpu, 32.0)],
        ),
    ];
    let out = mapper(&[]).map(&fams, Instant::now(), 1);
    assert_eq!(out.runtime, "dcgm");
    const MIB: f64 = 1048576.0;
    assert_eq!(value(&out, names::GPU_MEMORY_USED_BYTES, ""), 1000.0 * MIB);
    assert_eq!(
        value(&out, names::GPU_MEMORY_TOTAL_BYTES, ""),
        (1000.0 + 45459.0 + 608.0) * MIB
    );
    assert!((value(&out, names::GPU_MEMORY_USED_RATIO, "") - 1000.0 / 47067.0).abs() < 1e-12);
    assert!((value(&out, names::GPU_UTILIZATION, "") - 0.37).abs() < 1e-12);
    assert_eq!(value(&out, names::GPU_TEMPERATURE_CELSIUS, ""), 32.0);
    let p = find(&out, names::GPU_POWER_WATTS, "").unwrap();
    assert_eq!(
        (p.device_id.as_str(), p.instance.as_str(), p.source.as_str()),
        ("GPU-5b4e", "gpu1", "scrape:dcgm")
    );
    assert_eq!(p.notes["pci_bus_id"], "00000000:00:07.0");

    // A target label ties the exporter's GPUs to a model.
    let fams = vec![fam(
        "DCGM_FI_DEV_GPU_UTIL",
        MetricType::Gauge,
        vec![("DCGM_FI_DEV_GPU_UTIL", vec![("UUID", "G")], 50.0)],
    )];
    let out = mapper(&[("model_id", "llama")]).map(&fams, Instant::now(), 1);
    let p = find(&out, names::GPU_UTILIZATION, "llama").unwrap();
    assert_eq!(
        p.instance, "127.0.0.1:8000",
        "no Hostname label: the target's host:port"
    );
}

#[test]
fn gpu_series_next_to_a_single_model_belong_to_it() {
    let fams = vec![
        fam(
            "vllm:num_requests_running",
            MetricType::Gauge,
            vec![(
                "vllm:num_requests_running",
                vec![E, ("model_name", "sim")],
                1.0,
            )],
        ),
        fam(
            "DCGM_FI_DEV_FB_USED",
            MetricType::Gauge,
            vec![("DCGM_FI_DEV_FB_USED", vec![("UUID", "G")], 10.0)],
        ),
    ];
    let out = mapper(&[]).map(&fams, Instant::now(), 1);
    assert_eq!(out.runtime, "vllm");
    assert_eq!(
        find(&out, names::GPU_MEMORY_USED_BYTES, "sim")
            .unwrap()
            .runtime,
        "dcgm"
    );
}

#[test]
fn sglang_tgi_and_triton() {
    let ml = ("model_name", "qwen");
    let fams = vec![
        fam(
            "sglang:token_usage",
            MetricType::Gauge,
            vec![("sglang:token_usage", vec![ml], 0.6)],
        ),
        fam(
            "sglang:cache_hit_rate",
            MetricType::Gauge,
            vec![("sglang:cache_hit_rate", vec![ml], 0.2)],
        ),
        fam(
            "sglang:spec_accept_rate",
            MetricType::Gauge,
            vec![("sglang:spec_accept_rate", vec![ml], 0.7)],
        ),
        fam(
            "sglang:num_queue_reqs",
            MetricType::Gauge,
            vec![("sglang:num_queue_reqs", vec![ml], 4.0)],
        ),
    ];
    let out = mapper(&[]).map(&fams, Instant::now(), 1);
    assert_eq!(out.runtime, "sglang");
    assert_eq!(value(&out, names::KV_CACHE_USAGE, "qwen"), 0.6);
    assert_eq!(value(&out, names::PREFIX_CACHE_HIT_RATE, "qwen"), 0.2);
    assert_eq!(value(&out, names::SPEC_DECODE_ACCEPTANCE_RATE, "qwen"), 0.7);
    assert_eq!(value(&out, names::REQUESTS_WAITING, "qwen"), 4.0);

    let fams = vec![fam(
        "tgi_queue_size",
        MetricType::Gauge,
        vec![("tgi_queue_size", vec![], 2.0)],
    )];
    let mut m = mapper(&[("model_id", "bloom"), ("instance", "tgi-0")]);
    let out = m.map(&fams, Instant::now(), 1);
    let p = find(&out, names::REQUESTS_WAITING, "bloom").unwrap();
    assert_eq!((p.runtime.as_str(), p.instance.as_str()), ("tgi", "tgi-0"));

    let fams = vec![
        fam(
            "nv_trt_llm_kv_cache_block_metrics",
            MetricType::Gauge,
            vec![
                (
                    "nv_trt_llm_kv_cache_block_metrics",
                    vec![("kv_cache_block_type", "used"), ("model", "ens")],
                    90.0,
                ),
                (
                    "nv_trt_llm_kv_cache_block_metrics",
                    vec![("kv_cache_block_type", "fraction"), ("model", "ens")],
                    0.9,
                ),
            ],
        ),
        fam(
            "nv_gpu_memory_used_bytes",
            MetricType::Gauge,
            vec![("nv_gpu_memory_used_bytes", vec![("gpu_uuid", "G1")], 4e9)],
        ),
        fam(
            "nv_gpu_memory_total_bytes",
            MetricType::Gauge,
            vec![("nv_gpu_memory_total_bytes", vec![("gpu_uuid", "G1")], 8e9)],
        ),
    ];
    let out = mapper(&[]).map(&fams, Instant::now(), 1);
    assert_eq!(out.runtime, "triton");
    assert_eq!(
        value(&out, names::KV_CACHE_USAGE, "ens"),
        0.9,
        "only the fraction series"
    );
    let ratio = out
        .points
        .iter()
        .find(|p| p.signal == names::GPU_MEMORY_USED_RATIO)
        .unwrap();
    assert_eq!((ratio.value, ratio.device_id.as_str()), (0.5, "G1"));
}

#[test]
fn itl_falls_back_to_the_old_name_and_user_rules_win() {
    let h = |name: &'static str, c: f64| {
        let b: &'static str = Box::leak(format!("{name}_bucket").into_boxed_str());
        fam(
            name,
            MetricType::Histogram,
            vec![
                (b, vec![("le", "0.05"), M], c),
                (b, vec![("le", "+Inf"), M], c),
            ],
        )
    };
    let mut m = mapper(&[]);
    let t0 = Instant::now();
    m.map(&[h("vllm:time_per_output_token_seconds", 0.0)], t0, 0);
    let out = m.map(
        &[h("vllm:time_per_output_token_seconds", 10.0)],
        t0 + Duration::from_secs(1),
        0,
    );
    assert!(value(&out, "itl_p50_seconds", "tinyllama") <= 0.05);

    let mut user = MappingRule::new("my_kv", names::KV_CACHE_USAGE, RuleKind::Gauge);
    user.scale = 0.01;
    let mut rules = vec![user];
    rules.extend(builtin());
    let target = TargetIdentity {
        instance: "x:1".into(),
        runtime: Some("custom".into()),
        labels: BTreeMap::new(),
        url: String::new(),
    };
    let mut m = Mapper::new(
        Arc::new(RuleSet::new(rules)),
        target,
        Duration::from_secs(60),
    );
    let fams = vec![
        fam("my_kv", MetricType::Gauge, vec![("my_kv", vec![M], 40.0)]),
        fam(
            "vllm:kv_cache_usage_perc",
            MetricType::Gauge,
            vec![("vllm:kv_cache_usage_perc", vec![M], 0.9)],
        ),
    ];
    let out = m.map(&fams, Instant::now(), 0);
    assert_eq!((out.runtime.as_str(), out.detected), ("custom", false));
    let kv: Vec<_> = out
        .points
        .iter()
        .filter(|p| p.signal == names::KV_CACHE_USAGE)
        .collect();
    assert_eq!(kv.len(), 1);
    assert_eq!((kv[0].value, kv[0].source.as_str()), (0.4, "scrape:custom"));
}

/// The real dcgm-exporter sample (4.x, `Hostname`, not in Kubernetes mode).
const DCGM_SAMPLE: &str = include_str!("../../../../../fixtures/dcgm-exporter.txt");
const DCGM_UUID: &str = "GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43";

fn map_text(m: &mut Mapper, text: &str, at_ms: i64) -> MapOutput {
    let fams = tokenwatch_core::exposition::parse(
        text,
        tokenwatch_core::exposition::Format::PrometheusText,
    )
    .expect("exposition");
    m.map(&fams, Instant::now(), at_ms)
}

fn device<'a>(out: &'a MapOutput, signal: &str) -> &'a SignalPoint {
    out.points
        .iter()
        .find(|p| p.signal == signal && p.device_id == DCGM_UUID)
        .unwrap_or_else(|| panic!("no {signal} in {:#?}", out.points))
}

#[test]
fn dcgm_real_sample_profiling_ratios_and_host() {
    let out = map_text(&mut mapper(&[]), DCGM_SAMPLE, 1);
    assert_eq!(out.runtime, "dcgm");
    assert_eq!(device(&out, names::GPU_GR_ENGINE_ACTIVE_RATIO).value, 0.0);
    assert_eq!(device(&out, names::GPU_TENSOR_ACTIVE_RATIO).value, 0.0);
    assert_eq!(device(&out, names::GPU_DRAM_ACTIVE_RATIO).value, 0.000131);
    // SM active / occupancy are commented out of the default counters: not in the sample.
    assert!(
        !out.points
            .iter()
            .any(|p| p.signal == names::GPU_SM_ACTIVE_RATIO)
    );
    let p = device(&out, names::GPU_DRAM_ACTIVE_RATIO);
    assert_eq!(
        (p.instance.as_str(), p.source.as_str(), p.model_id.as_str()),
        ("gpu1-wl8sg", "scrape:dcgm", "")
    );
    assert_eq!(
        p.notes,
        BTreeMap::from(
            [
                ("gpu", "0"),
                ("pci_bus_id", "00000000:00:07.0"),
                ("modelName", "NVIDIA L40S"),
                ("hostname", "gpu1-wl8sg"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
        ),
        "not in Kubernetes mode: no pod"
    );
    assert!(out.events.is_empty());
}

/// The sample as dcgm-exporter writes it in Kubernetes mode (4.5+: `hostname`, then the pod the
/// GPU is assigned to), with the profiling fields the default counters leave out and the XID
/// fields: the last code, and the window count of one code.
fn dcgm_kubernetes(pod: &str, xid: u32, count: Option<f64>) -> String {
    let k8s = format!(
        r#"hostname="gpu1-wl8sg",container="{c}",namespace="{n}",pod="{pod}""#,
        c = if pod.is_empty() { "" } else { "vllm" },
        n = if pod.is_empty() { "" } else { "serving" }
    );
    let labels = format!(
        r#"gpu="0",UUID="{DCGM_UUID}",pci_bus_id="00000000:00:07.0",device="nvidia0",modelName="NVIDIA L40S",{k8s},DCGM_FI_DRIVER_VERSION="595.58.03""#
    );
    let mut text = DCGM_SAMPLE.replace(r#"Hostname="gpu1-wl8sg""#, &k8s);
    text.push_str(&format!(
        "# TYPE DCGM_FI_PROF_SM_ACTIVE gauge\nDCGM_FI_PROF_SM_ACTIVE{{{labels}}} 0.812000\n\
         # TYPE DCGM_FI_PROF_SM_OCCUPANCY gauge\nDCGM_FI_PROF_SM_OCCUPANCY{{{labels}}} 0.406000\n\
         # TYPE DCGM_FI_DEV_XID_ERRORS gauge\nDCGM_FI_DEV_XID_ERRORS{{{labels}}} {xid}\n\
         # TYPE DCGM_EXP_XID_ERRORS_COUNT gauge\n"
    ));
    match count {
        Some(c) => text.push_str(&format!(
            "DCGM_EXP_XID_ERRORS_COUNT{{{labels},window_size_in_ms=\"300000\",xid=\"{xid}\"}} {c}\n"
        )),
        None => text.push_str(&format!(
            "DCGM_EXP_XID_ERRORS_COUNT{{{labels},window_size_in_ms=\"300000\"}} 0\n"
        )),
    }
    text
}

#[test]
fn dcgm_kubernetes_mode_keeps_the_pod_and_xid_errors_become_events() {
    let mut m = mapper(&[]);
    let out = map_text(&mut m, &dcgm_kubernetes("vllm-0", 0, None), 1);
    let p = device(&out, names::GPU_SM_ACTIVE_RATIO);
    assert_eq!(p.value, 0.812);
    assert_eq!(device(&out, names::GPU_SM_OCCUPANCY_RATIO).value, 0.406);
    assert_eq!(
        (
            p.notes["pod"].as_str(),
            p.notes["namespace"].as_str(),
            p.notes["container"].as_str(),
            p.notes["hostname"].as_str()
        ),
        ("vllm-0", "serving", "vllm", "gpu1-wl8sg")
    );
    assert_eq!(
        p.instance, "gpu1-wl8sg",
        "lowercase hostname names the instance too"
    );
    assert_eq!(device(&out, names::GPU_XID_LAST_CODE).value, 0.0);
    assert!(out.events.is_empty(), "the first scrape is history");

    // XID 79: the last code changes and the window count of code 79 appears.
    let out = map_text(&mut m, &dcgm_kubernetes("vllm-0", 79, Some(1.0)), 2);
    assert_eq!(device(&out, names::GPU_XID_LAST_CODE).value, 79.0);
    assert_eq!(out.events.len(), 1, "{:#?}", out.events);
    let e = &out.events[0];
    assert_eq!(e.detector, "gpu_xid_error");
    assert_eq!(
        (
            e.labels["xid"].as_str(),
            e.labels["pod"].as_str(),
            e.labels["device_id"].as_str(),
            e.labels["instance"].as_str()
        ),
        ("79", "vllm-0", DCGM_UUID, "gpu1-wl8sg")
    );
    assert_eq!(e.evidence["meaning"], "GPU has fallen off the bus");
    assert_eq!(
        e.evidence["reported_by"],
        serde_json::json!(["DCGM_FI_DEV_XID_ERRORS", "DCGM_EXP_XID_ERRORS_COUNT"])
    );
    assert_eq!(e.at_unix_ms, 2);
    // Nothing new on the next scrape.
    assert!(
        map_text(&mut m, &dcgm_kubernetes("vllm-0", 79, Some(1.0)), 3)
            .events
            .is_empty()
    );

    // A GPU no pod holds: dcgm-exporter writes empty strings, which are dropped.
    let out = map_text(&mut mapper(&[]), &dcgm_kubernetes("", 0, None), 1);
    let notes = &device(&out, names::GPU_UTILIZATION).notes;
    for l in ["pod", "namespace", "container"] {
        assert!(!notes.contains_key(l), "{l} in {notes:?}");
    }
}

/// A vLLM exposition with `ok` + `err` finished requests and TTFT observations per bucket.
fn vllm_counts_text(ok: f64, err: f64, abort: f64, ttft: [f64; 3]) -> String {
    let m = "model_name=\"m\",engine=\"0\"";
    let (b1, b2, b3) = (ttft[0], ttft[0] + ttft[1], ttft[0] + ttft[1] + ttft[2]);
    format!(
        "# TYPE vllm:request_success_total counter\n\
         vllm:request_success_total{{{m},finished_reason=\"stop\"}} {ok}\n\
         vllm:request_success_total{{{m},finished_reason=\"error\"}} {err}\n\
         vllm:request_success_total{{{m},finished_reason=\"abort\"}} {abort}\n\
         # TYPE vllm:time_to_first_token_seconds histogram\n\
         vllm:time_to_first_token_seconds_bucket{{{m},le=\"0.1\"}} {b1}\n\
         vllm:time_to_first_token_seconds_bucket{{{m},le=\"1.0\"}} {b2}\n\
         vllm:time_to_first_token_seconds_bucket{{{m},le=\"+Inf\"}} {b3}\n\
         vllm:time_to_first_token_seconds_sum{{{m}}} 1.0\n\
         vllm:time_to_first_token_seconds_count{{{m}}} {b3}\n"
    )
}

#[test]
fn per_scrape_counts_of_requests_errors_and_latency_buckets() {
    let mut m = mapper(&[]);
    let t0 = Instant::now();
    let scrape = |m: &mut Mapper, text: &str, at: Duration, at_ms: i64| {
        let f = tokenwatch_core::exposition::parse(
            text,
            tokenwatch_core::exposition::Format::PrometheusText,
        )
        .unwrap();
        m.map(&f, t0 + at, at_ms)
    };
    let first = scrape(
        &mut m,
        &vllm_counts_text(100.0, 2.0, 5.0, [90.0, 10.0, 4.0]),
        Duration::ZERO,
        1_000,
    );
    assert!(
        first.counts.is_empty(),
        "the first scrape has nothing to count against"
    );
    let second = scrape(
        &mut m,
        &vllm_counts_text(130.0, 7.0, 9.0, [110.0, 15.0, 8.0]),
        Duration::from_secs(2),
        3_000,
    );
    assert_eq!(second.counts.len(), 1);
    let c = &second.counts[0];
    assert_eq!(
        (c.model_id.as_str(), c.instance.as_str(), c.runtime.as_str()),
        ("m", "127.0.0.1:8000", "vllm")
    );
    assert_eq!((c.at_unix_ms, c.interval_ms), (3_000, 2_000));
    // Finished: every reason (30 + 5 + 4); failed: `error` only (aborts are clients cancelling).
    assert_eq!(c.finished, Some(39.0));
    assert_eq!(c.failed, Some(5.0));
    let h = c.histogram("ttft").expect("ttft");
    assert_eq!(h.cumulative, vec![20.0, 25.0, 29.0]);
    assert_eq!(h.count, 29.0);
    // A missed scrape: the next interval is longer and counts everything since.
    let third = scrape(
        &mut m,
        &vllm_counts_text(190.0, 7.0, 9.0, [160.0, 25.0, 8.0]),
        Duration::from_secs(32),
        33_000,
    );
    assert_eq!(third.counts[0].interval_ms, 30_000);
    assert_eq!(third.counts[0].finished, Some(60.0));
    assert_eq!(third.counts[0].failed, Some(0.0));
    assert_eq!(
        third.counts[0].histogram("ttft").unwrap().cumulative,
        vec![50.0, 60.0, 60.0]
    );
    // A restart: counters start again; the new readings are the increase.
    let fourth = scrape(
        &mut m,
        &vllm_counts_text(3.0, 1.0, 0.0, [2.0, 1.0, 1.0]),
        Duration::from_secs(33),
        34_000,
    );
    assert_eq!(fourth.counts[0].finished, Some(4.0));
    assert_eq!(fourth.counts[0].failed, Some(1.0));
    assert_eq!(
        fourth.counts[0].histogram("ttft").unwrap().cumulative,
        vec![2.0, 3.0, 4.0]
    );
}

#[test]
fn per_scrape_counts_carry_prompt_and_output_tokens() {
    let mut m = mapper(&[]);
    let t0 = Instant::now();
    let text = |prompt: f64, output: f64| {
        let l = "model_name=\"m\",engine=\"0\"";
        format!(
            "# TYPE vllm:prompt_tokens_total counter\n\
             vllm:prompt_tokens_total{{{l}}} {prompt}\n\
             # TYPE vllm:generation_tokens_total counter\n\
             vllm:generation_tokens_total{{{l}}} {output}\n"
        )
    };
    let mut scrape = |body: String, at_s: u64| {
        let f = tokenwatch_core::exposition::parse(
            &body,
            tokenwatch_core::exposition::Format::PrometheusText,
        )
        .unwrap();
        m.map(&f, t0 + Duration::from_secs(at_s), at_s as i64 * 1000)
    };
    assert!(scrape(text(100.0, 1000.0), 0).counts.is_empty());
    let out = scrape(text(160.0, 1900.0), 2);
    assert_eq!(out.counts.len(), 1);
    assert_eq!(out.counts[0].prompt_tokens, Some(60.0));
    assert_eq!(out.counts[0].output_tokens, Some(900.0));
    assert_eq!(out.counts[0].finished, None, "no request counter exposed");
}

fn mapper_at(url: &str, labels: &[(&str, &str)]) -> Mapper {
    let target = TargetIdentity {
        instance: url
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap_or_default()
            .into(),
        runtime: None,
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        url: url.into(),
    };
    Mapper::new(
        Arc::new(RuleSet::new(builtin())),
        target,
        Duration::from_secs(60),
    )
}

#[test]
fn scrapes_say_where_each_replica_and_gpu_run() {
    use tokenwatch_core::placement::Placement;
    let mut place = Placement::default();
    // dcgm-exporter in Kubernetes mode on its own endpoint: the GPU of pod serving/vllm-0.
    let dcgm = "http://10.1.0.2:9400/metrics";
    let out = map_text(
        &mut mapper_at(dcgm, &[]),
        &dcgm_kubernetes("vllm-0", 0, None),
        1,
    );
    let gpus: Vec<_> = out
        .placed
        .iter()
        .filter(|p| !p.device_id.is_empty())
        .collect();
    assert_eq!(
        gpus.len(),
        1,
        "one place per GPU, not per signal: {:#?}",
        out.placed
    );
    let g = gpus[0];
    assert_eq!(
        (
            g.instance.as_str(),
            g.device_id.as_str(),
            g.model_id.as_str()
        ),
        ("gpu1-wl8sg", DCGM_UUID, "")
    );
    assert_eq!(
        (
            g.site.host.as_str(),
            g.site.pod.as_deref(),
            g.site.namespace.as_deref()
        ),
        ("gpu1-wl8sg", Some("vllm-0"), Some("serving"))
    );
    assert_eq!(g.site.target, dcgm);
    for p in out.placed {
        place.observe(p, 1);
    }
    // Two vLLM replicas on pod IPs, their pods named by service discovery's target labels.
    for (ip, pod) in [("10.2.0.11", "vllm-0"), ("10.2.0.12", "vllm-1")] {
        let url = format!("http://{ip}:8000/metrics");
        let mut m = mapper_at(&url, &[("pod", pod), ("namespace", "serving")]);
        let out = map_text(&mut m, &vllm_counts_text(1.0, 0.0, 0.0, [1.0, 0.0, 0.0]), 1);
        assert_eq!(out.placed.len(), 1, "{:#?}", out.placed);
        let s = &out.placed[0];
        assert_eq!(
            (
                s.model_id.as_str(),
                s.instance.as_str(),
                s.device_id.as_str()
            ),
            ("m", format!("{ip}:8000").as_str(), "")
        );
        assert_eq!(
            (s.site.host.as_str(), s.site.pod.as_deref()),
            (ip, Some(pod))
        );
        for p in out.placed {
            place.observe(p, 1);
        }
    }
    let served = place.served_by("gpu1-wl8sg", DCGM_UUID);
    assert_eq!(served.len(), 1, "{served:?}");
    assert_eq!(
        (served[0].model_id.as_str(), served[0].instance.as_str()),
        ("m", "10.2.0.11:8000")
    );
    // A configured `hostname` names a target's host instead of its URL's.
    let mut m = mapper_at(
        "http://127.0.0.1:8000/vllm/metrics",
        &[("hostname", "GPU-Host-A")],
    );
    let out = map_text(&mut m, &vllm_counts_text(1.0, 0.0, 0.0, [1.0, 0.0, 0.0]), 1);
    assert_eq!(out.placed[0].site.host, "gpu-host-a");
}
