// Prometheus text format 0.0.4 for all engines: vLLM V1 families (real names,
// labels, bucket boundaries) followed by dcgm-exporter style GPU series.

use std::fmt::Write;

use super::histogram::Histogram;
use super::stats::{EngineStats, FinishReason};
use crate::engine::EngineConfig;
use crate::gpu::reading;

/// What one scrape renders: each engine's config and stats, plus GPU identity labels.
pub struct MetricsInput<'a> {
    pub engines: Vec<(&'a EngineConfig, EngineStats)>,
    pub hostname: &'a str,
    pub gpu_name: &'a str,
}

/// Escape a label value (backslash, double quote, newline).
pub fn escape_label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Python-style float text as prometheus_client writes it ("98.0", "0.001", "+Inf").
fn py_float(v: f64) -> String {
    if v.is_infinite() {
        return if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    if v.is_nan() {
        return "NaN".into();
    }
    if v.fract() == 0.0 && v.abs() < 1e16 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

struct Out(String);

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: &str) {
        let body: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
            .collect();
        let _ = writeln!(self.0, "{name}{{{}}} {value}", body.join(","));
    }
}

const GAUGES: &[(&str, &str)] = &[
    (
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
    ),
    (
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
    ),
    (
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
    ),
];

const COUNTERS: &[(&str, &str)] = &[
    (
        "vllm:prefix_cache_queries_total",
        "Prefix cache queries, in terms of number of queried tokens.",
    ),
    (
        "vllm:prefix_cache_hits_total",
        "Prefix cache hits, in terms of number of cached tokens.",
    ),
    (
        "vllm:num_preemptions_total",
        "Cumulative number of preemption from the engine.",
    ),
    (
        "vllm:prompt_tokens_total",
        "Number of prefill tokens processed.",
    ),
    (
        "vllm:generation_tokens_total",
        "Number of generation tokens processed.",
    ),
];

const HISTOGRAMS: &[(&str, &str)] = &[
    (
        "vllm:request_prompt_tokens",
        "Number of prefill tokens processed.",
    ),
    (
        "vllm:request_generation_tokens",
        "Number of generation tokens processed.",
    ),
    (
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
    ),
    (
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
    ),
    (
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
    ),
    (
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
    ),
    (
        "vllm:request_inference_time_seconds",
        "Histogram of time spent in RUNNING phase for request.",
    ),
    (
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
    ),
    (
        "vllm:request_decode_time_seconds",
        "Histogram of time spent in DECODE phase for request.",
    ),
];

fn gauge_value(name: &str, st: &EngineStats) -> String {
    match name {
        "vllm:num_requests_running" => py_float(st.running as f64),
        "vllm:num_requests_waiting" => py_float(st.waiting as f64),
        _ => py_float(st.kv_usage()),
    }
}

fn counter_value(name: &str, st: &EngineStats) -> u64 {
    match name {
        "vllm:prefix_cache_queries_total" => st.prefix_queries,
        "vllm:prefix_cache_hits_total" => st.prefix_hits,
        "vllm:num_preemptions_total" => st.preemptions,
        "vllm:prompt_tokens_total" => st.prompt_tokens,
        _ => st.generation_tokens,
    }
}

fn histogram_of<'s>(name: &str, st: &'s EngineStats) -> &'s Histogram {
    match name {
        "vllm:request_prompt_tokens" => &st.prompt_len,
        "vllm:request_generation_tokens" => &st.generation_len,
        "vllm:time_to_first_token_seconds" => &st.ttft,
        "vllm:inter_token_latency_seconds" => &st.itl,
        "vllm:e2e_request_latency_seconds" => &st.e2e,
        "vllm:request_queue_time_seconds" => &st.queue,
        "vllm:request_inference_time_seconds" => &st.inference,
        "vllm:request_prefill_time_seconds" => &st.prefill,
        _ => &st.decode,
    }
}

fn render_vllm(out: &mut Out, input: &MetricsInput<'_>) {
    let base = |cfg: &EngineConfig| {
        [
            ("engine", "0".to_string()),
            ("model_name", cfg.model.clone()),
        ]
    };
    for (name, help) in GAUGES {
        out.family(name, "gauge", help);
        for (cfg, st) in &input.engines {
            let [e, m] = base(cfg);
            out.sample(name, &[(e.0, &e.1), (m.0, &m.1)], &gauge_value(name, st));
        }
    }
    for (name, help) in COUNTERS {
        out.family(name, "counter", help);
        for (cfg, st) in &input.engines {
            let [e, m] = base(cfg);
            let v = py_float(counter_value(name, st) as f64);
            out.sample(name, &[(e.0, &e.1), (m.0, &m.1)], &v);
        }
    }
    let name = "vllm:request_success_total";
    out.family(name, "counter", "Count of successfully processed requests.");
    for (cfg, st) in &input.engines {
        for r in FinishReason::ALL {
            let v = py_float(st.finished(r) as f64);
            out.sample(
                name,
                &[
                    ("engine", "0"),
                    ("finished_reason", r.as_str()),
                    ("model_name", &cfg.model),
                ],
                &v,
            );
        }
    }
    for (name, help) in HISTOGRAMS {
        out.family(name, "histogram", help);
        for (cfg, st) in &input.engines {
            render_histogram(out, name, &cfg.model, histogram_of(name, st));
        }
    }
    let name = "vllm:cache_config_info";
    out.family(name, "gauge", "Information of the LLMEngine CacheConfig");
    for (cfg, _) in &input.engines {
        let block_size = cfg.block_size.to_string();
        let blocks = cfg.kv_blocks.to_string();
        let labels = [
            ("block_size", block_size.as_str()),
            ("cache_dtype", "auto"),
            ("enable_prefix_caching", "True"),
            ("engine", "0"),
            ("gpu_memory_utilization", "0.9"),
            ("model_name", cfg.model.as_str()),
            ("num_cpu_blocks", "None"),
            ("num_gpu_blocks", blocks.as_str()),
        ];
        out.sample(name, &labels, "1.0");
    }
}

fn render_histogram(out: &mut Out, name: &str, model: &str, h: &Histogram) {
    let bucket = format!("{name}_bucket");
    for (le, count) in h.cumulative() {
        let le = py_float(le);
        out.sample(
            &bucket,
            &[("engine", "0"), ("le", &le), ("model_name", model)],
            &py_float(count as f64),
        );
    }
    let total = py_float(h.count() as f64);
    out.sample(
        &bucket,
        &[("engine", "0"), ("le", "+Inf"), ("model_name", model)],
        &total,
    );
    out.sample(
        &format!("{name}_count"),
        &[("engine", "0"), ("model_name", model)],
        &total,
    );
    out.sample(
        &format!("{name}_sum"),
        &[("engine", "0"), ("model_name", model)],
        &py_float(h.sum()),
    );
}

fn render_dcgm(out: &mut Out, input: &MetricsInput<'_>) {
    let readings: Vec<_> = input
        .engines
        .iter()
        .map(|(cfg, st)| reading(cfg, st))
        .collect();
    type Field = (
        &'static str,
        &'static str,
        fn(&crate::gpu::GpuReading) -> String,
    );
    let fields: [Field; 5] = [
        ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", |r| {
            r.temp_c.to_string()
        }),
        ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", |r| {
            format!("{:.6}", r.power_w)
        }),
        ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", |r| {
            r.util_pct.to_string()
        }),
        (
            "DCGM_FI_DEV_FB_FREE",
            "Framebuffer memory free (in MiB).",
            |r| r.fb_free_mib().to_string(),
        ),
        (
            "DCGM_FI_DEV_FB_USED",
            "Framebuffer memory used (in MiB).",
            |r| r.fb_used_mib().to_string(),
        ),
    ];
    for (name, help, value) in fields {
        out.family(name, "gauge", help);
        for r in &readings {
            let gpu = r.index.to_string();
            let labels = [
                ("gpu", gpu.as_str()),
                ("UUID", r.uuid.as_str()),
                ("pci_bus_id", r.pci_bus_id.as_str()),
                ("device", r.device.as_str()),
                ("modelName", input.gpu_name),
                ("Hostname", input.hostname),
            ];
            out.sample(name, &labels, &value(r));
        }
    }
}

/// Which exporter's series a metrics body holds: both (`/metrics`, one endpoint as the bench
/// scrapes it), or one of them, as a real host exposes vLLM's and dcgm-exporter's on separate
/// ports (`/vllm/metrics`, `/dcgm/metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exporters {
    Both,
    Vllm,
    Dcgm,
}

/// The whole `/metrics` body.
pub fn render_metrics(input: &MetricsInput<'_>) -> String {
    render_exporters(input, Exporters::Both)
}

/// The body of one exporter's endpoint, or of both.
pub fn render_exporters(input: &MetricsInput<'_>, which: Exporters) -> String {
    let mut out = Out(String::with_capacity(16 * 1024));
    if which != Exporters::Dcgm {
        render_vllm(&mut out, input);
    }
    if which != Exporters::Vllm {
        render_dcgm(&mut out, input);
    }
    out.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_floats() {
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(
            (py_float(98.0), py_float(0.001), py_float(f64::INFINITY)),
            ("98.0".into(), "0.001".into(), "+Inf".into())
        );
    }
}
