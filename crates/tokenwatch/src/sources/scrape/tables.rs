// Built-in mapping tables: the real metric names of vLLM, SGLang, TGI, Triton (+TensorRT-LLM)
// and dcgm-exporter, and the normalised signal each one feeds. Earlier rules win (fallbacks last).

use super::rules::{Aggregate, MappingRule, RuleKind};

/// Extra device signals read from dcgm-exporter (the total is derived from them).
pub const GPU_MEMORY_FREE_BYTES: &str = "gpu_memory_free_bytes";
pub const GPU_MEMORY_RESERVED_BYTES: &str = "gpu_memory_reserved_bytes";

use tokenwatch_core::signals::names as n;

/// Runtime named by a metric name's prefix, if any.
pub fn runtime_of(metric: &str) -> Option<&'static str> {
    if metric.starts_with("vllm:") {
        Some("vllm")
    } else if metric.starts_with("sglang:") {
        Some("sglang")
    } else if metric.starts_with("tgi_") {
        Some("tgi")
    } else if metric.starts_with("nv_") {
        Some("triton")
    } else if metric.starts_with("DCGM_FI_") {
        Some("dcgm")
    } else {
        None
    }
}

/// Every built-in rule, in priority order.
pub fn builtin() -> Vec<MappingRule> {
    let mut v = Vec::new();
    vllm(&mut v);
    sglang(&mut v);
    tgi(&mut v);
    triton(&mut v);
    dcgm(&mut v);
    v
}

struct T<'a> {
    out: &'a mut Vec<MappingRule>,
    model_label: Option<&'static str>,
}

impl T<'_> {
    fn push(&mut self, metric: &str, signal: &str, kind: RuleKind) -> &mut MappingRule {
        let mut r = MappingRule::new(metric, signal, kind);
        r.model_label = self.model_label.map(str::to_string);
        self.out.push(r);
        self.out.last_mut().expect("just pushed")
    }
    fn gauge(&mut self, metric: &str, signal: &str) -> &mut MappingRule {
        self.push(metric, signal, RuleKind::Gauge)
    }
    fn fraction(&mut self, metric: &str, signal: &str) -> &mut MappingRule {
        let r = self.push(metric, signal, RuleKind::Gauge);
        r.aggregate = Aggregate::Mean;
        r
    }
    fn rate(&mut self, metric: &str, signal: &str) -> &mut MappingRule {
        self.push(metric, signal, RuleKind::CounterRate)
    }
    fn ratio(&mut self, metric: &str, denominator: &str, signal: &str) {
        self.push(metric, signal, RuleKind::CounterRatio)
            .denominator = Some(denominator.into());
    }
    fn hist(&mut self, metric: &str, signal: &str) -> &mut MappingRule {
        self.push(metric, signal, RuleKind::Histogram)
    }
}

fn vllm(out: &mut Vec<MappingRule>) {
    let mut t = T {
        out,
        model_label: Some("model_name"),
    };
    t.fraction("vllm:kv_cache_usage_perc", n::KV_CACHE_USAGE);
    t.fraction("vllm:gpu_cache_usage_perc", n::KV_CACHE_USAGE);
    t.ratio(
        "vllm:prefix_cache_hits",
        "vllm:prefix_cache_queries",
        n::PREFIX_CACHE_HIT_RATE,
    );
    t.ratio(
        "vllm:gpu_prefix_cache_hits",
        "vllm:gpu_prefix_cache_queries",
        n::PREFIX_CACHE_HIT_RATE,
    );
    t.ratio(
        "vllm:spec_decode_num_accepted_tokens",
        "vllm:spec_decode_num_draft_tokens",
        n::SPEC_DECODE_ACCEPTANCE_RATE,
    );
    t.rate("vllm:num_preemptions", n::PREEMPTIONS_PER_SECOND);
    t.gauge("vllm:num_requests_running", n::REQUESTS_RUNNING);
    t.gauge("vllm:num_requests_waiting", n::REQUESTS_WAITING);
    t.rate("vllm:request_success", n::REQUESTS_PER_SECOND);
    // Failed by the engine; `abort` is left out: clients cancelling is not a server fault.
    t.rate("vllm:request_success", n::REQUEST_ERRORS_PER_SECOND)
        .match_labels(&[("finished_reason", "error")]);
    t.rate("vllm:prompt_tokens", n::PROMPT_TOKENS_PER_SECOND);
    t.rate("vllm:generation_tokens", n::OUTPUT_TOKENS_PER_SECOND);
    t.hist("vllm:time_to_first_token_seconds", "ttft");
    t.hist("vllm:inter_token_latency_seconds", "itl");
    t.hist("vllm:time_per_output_token_seconds", "itl");
    t.hist("vllm:e2e_request_latency_seconds", "e2e");
    t.hist("vllm:request_queue_time_seconds", "queue");
    t.hist("vllm:request_prefill_time_seconds", "prefill");
    t.hist("vllm:request_decode_time_seconds", "decode");
    t.hist("vllm:request_inference_time_seconds", "inference");
    t.hist("vllm:request_time_per_output_token_seconds", "tpot");
}

fn sglang(out: &mut Vec<MappingRule>) {
    let mut t = T {
        out,
        model_label: Some("model_name"),
    };
    t.fraction("sglang:token_usage", n::KV_CACHE_USAGE);
    t.fraction("sglang:cache_hit_rate", n::PREFIX_CACHE_HIT_RATE);
    t.fraction("sglang:spec_accept_rate", n::SPEC_DECODE_ACCEPTANCE_RATE);
    // SGLang reports requests retracted (its preemption) as a gauge per logging interval.
    t.gauge("sglang:num_retracted_reqs", n::PREEMPTIONS_PER_SECOND);
    t.gauge("sglang:num_running_reqs", n::REQUESTS_RUNNING);
    t.gauge("sglang:num_queue_reqs", n::REQUESTS_WAITING);
    t.rate("sglang:num_requests", n::REQUESTS_PER_SECOND);
    t.rate("sglang:prompt_tokens", n::PROMPT_TOKENS_PER_SECOND);
    t.rate("sglang:generation_tokens", n::OUTPUT_TOKENS_PER_SECOND);
    t.hist("sglang:time_to_first_token_seconds", "ttft");
    t.hist("sglang:inter_token_latency_seconds", "itl");
    t.hist("sglang:time_per_output_token_seconds", "itl");
    t.hist("sglang:e2e_request_latency_seconds", "e2e");
    t.hist("sglang:queue_time_seconds", "queue");
}

fn tgi(out: &mut Vec<MappingRule>) {
    // TGI metrics carry no model label: the model comes from the target's `model_id` label.
    let mut t = T {
        out,
        model_label: Some(""),
    };
    t.gauge("tgi_batch_current_size", n::REQUESTS_RUNNING);
    t.gauge("tgi_queue_size", n::REQUESTS_WAITING);
    t.rate("tgi_request_count", n::REQUESTS_PER_SECOND);
    t.rate("tgi_request_failure", n::REQUEST_ERRORS_PER_SECOND);
    t.rate("tgi_request_input_length_sum", n::PROMPT_TOKENS_PER_SECOND);
    t.rate(
        "tgi_request_generated_tokens_sum",
        n::OUTPUT_TOKENS_PER_SECOND,
    );
    t.hist("tgi_request_duration", "e2e");
    t.hist("tgi_request_queue_duration", "queue");
    // Inference time / generated tokens: includes prefill, the closest TGI has to ITL.
    t.hist("tgi_request_mean_time_per_token_duration", "itl");
}

fn triton(out: &mut Vec<MappingRule>) {
    let mut t = T {
        out,
        model_label: Some("model"),
    };
    t.fraction("nv_trt_llm_kv_cache_block_metrics", n::KV_CACHE_USAGE)
        .match_labels(&[("kv_cache_block_type", "fraction")]);
    t.gauge("nv_trt_llm_request_metrics", n::REQUESTS_RUNNING)
        .match_labels(&[("request_type", "active")]);
    t.gauge("nv_trt_llm_request_metrics", n::REQUESTS_WAITING)
        .match_labels(&[("request_type", "waiting")]);
    t.gauge("nv_inference_pending_request_count", n::REQUESTS_WAITING);
    t.rate("nv_inference_request_success", n::REQUESTS_PER_SECOND);
    t.hist("nv_inference_first_response_histogram_ms", "ttft")
        .scale = 0.001;
    let mut e2e = MappingRule::new(
        "nv_inference_request_duration_us",
        "e2e_mean_seconds",
        RuleKind::CounterRatio,
    );
    e2e.denominator = Some("nv_inference_request_success".into());
    e2e.scale = 1e-6;
    e2e.model_label = Some("model".into());
    t.out.push(e2e);
    let mut q = MappingRule::new(
        "nv_inference_queue_duration_us",
        "queue_mean_seconds",
        RuleKind::CounterRatio,
    );
    q.denominator = Some("nv_inference_request_success".into());
    q.scale = 1e-6;
    q.model_label = Some("model".into());
    t.out.push(q);
    let gpu = |metric: &str, signal: &str, agg: Aggregate| {
        let mut r = MappingRule::new(metric, signal, RuleKind::Gauge);
        r.device_label = Some("gpu_uuid".into());
        r.aggregate = agg;
        r
    };
    t.out.push(gpu(
        "nv_gpu_utilization",
        n::GPU_UTILIZATION,
        Aggregate::Mean,
    ));
    t.out.push(gpu(
        "nv_gpu_memory_used_bytes",
        n::GPU_MEMORY_USED_BYTES,
        Aggregate::Sum,
    ));
    t.out.push(gpu(
        "nv_gpu_memory_total_bytes",
        n::GPU_MEMORY_TOTAL_BYTES,
        Aggregate::Sum,
    ));
    t.out.push(gpu(
        "nv_gpu_power_usage",
        n::GPU_POWER_WATTS,
        Aggregate::Sum,
    ));
}

/// Framebuffer fields are MiB; `gpu_memory_total_bytes` is derived as used + free + reserved.
/// Profiling (`DCGM_FI_PROF_*`) fields are ratios 0..1 already. XID errors also become anomaly
/// events (`super::xid`); the last code is kept as a signal too.
fn dcgm(out: &mut Vec<MappingRule>) {
    const MIB: f64 = 1024.0 * 1024.0;
    let mut gpu = |metric: &str, signal: &str, scale: f64| {
        let mut r = MappingRule::new(metric, signal, RuleKind::Gauge);
        r.device_label = Some("UUID".into());
        r.model_label = Some(String::new());
        r.runtime = Some("dcgm".into());
        r.scale = scale;
        r.aggregate = if signal == n::GPU_XID_LAST_CODE {
            // MIG instances of one GPU share its UUID: any code is worth more than their mean.
            Aggregate::Max
        } else {
            Aggregate::Mean
        };
        out.push(r);
    };
    gpu("DCGM_FI_DEV_FB_USED", n::GPU_MEMORY_USED_BYTES, MIB);
    gpu("DCGM_FI_DEV_FB_FREE", GPU_MEMORY_FREE_BYTES, MIB);
    gpu("DCGM_FI_DEV_FB_RESERVED", GPU_MEMORY_RESERVED_BYTES, MIB);
    gpu("DCGM_FI_DEV_GPU_UTIL", n::GPU_UTILIZATION, 0.01);
    gpu("DCGM_FI_DEV_GPU_TEMP", n::GPU_TEMPERATURE_CELSIUS, 1.0);
    gpu("DCGM_FI_DEV_POWER_USAGE", n::GPU_POWER_WATTS, 1.0);
    gpu("DCGM_FI_PROF_SM_ACTIVE", n::GPU_SM_ACTIVE_RATIO, 1.0);
    gpu("DCGM_FI_PROF_SM_OCCUPANCY", n::GPU_SM_OCCUPANCY_RATIO, 1.0);
    gpu(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        n::GPU_TENSOR_ACTIVE_RATIO,
        1.0,
    );
    gpu("DCGM_FI_PROF_DRAM_ACTIVE", n::GPU_DRAM_ACTIVE_RATIO, 1.0);
    gpu(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        n::GPU_GR_ENGINE_ACTIVE_RATIO,
        1.0,
    );
    gpu("DCGM_FI_DEV_XID_ERRORS", n::GPU_XID_LAST_CODE, 1.0);
}

impl MappingRule {
    fn match_labels(&mut self, pairs: &[(&str, &str)]) {
        for (k, v) in pairs {
            self.match_labels.insert((*k).to_string(), (*v).to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_runtimes_by_prefix() {
        assert_eq!(runtime_of("vllm:num_requests_running"), Some("vllm"));
        assert_eq!(runtime_of("sglang:token_usage"), Some("sglang"));
        assert_eq!(runtime_of("tgi_queue_size"), Some("tgi"));
        assert_eq!(runtime_of("nv_gpu_utilization"), Some("triton"));
        assert_eq!(runtime_of("DCGM_FI_DEV_FB_USED"), Some("dcgm"));
        assert_eq!(runtime_of("process_cpu_seconds_total"), None);
    }

    #[test]
    fn builtin_rules_are_valid() {
        for r in builtin() {
            r.check().unwrap_or_else(|e| panic!("{}: {e}", r.metric));
        }
    }
}
