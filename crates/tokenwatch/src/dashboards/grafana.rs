// The Grafana dashboard (`tokenwatch dashboards export --format grafana`): rows of panels over
// tokenwatch's `/metrics` and the runtimes' own metrics (vLLM, DCGM), as dashboard JSON. The
// fleet and latency panels read both the proxy's request series and the runtimes' histograms
// and counters tokenwatch re-exports (`tokenwatch_runtime_*`), so they have data collector-only
// (no proxy) too, and the model and instance variables list what either sees.
//
// Prometheus must scrape tokenwatch with `honor_labels: true`: tokenwatch's request series carry
// the upstream's `instance` (by default the upstream URL's `host:port`, which is also the
// `instance` Prometheus gives the runtime's own target), so `$instance` selects the same
// replica in both. Every query here is run against a real Prometheus by
// tests/e2e/grafana_dashboard.rs, which fails naming the panel of any query without data.

use serde_json::{Value, json};

/// Grafana's dashboard schema version the JSON follows (Grafana 10.4 / 11).
pub const SCHEMA_VERSION: u32 = 39;
/// The dashboard's fixed uid, so re-imports replace it.
pub const UID: &str = "tokenwatch-fleet";
/// The datasource variable every panel and template variable reads from.
pub const DATASOURCE_VAR: &str = "DS_PROMETHEUS";

/// The model label of tokenwatch's request series: the GenAI conventions' `gen_ai.request.model`.
const MODEL: &str = "gen_ai_request_model";
/// Selector of tokenwatch's request series (labels of `kernel::telemetry::RequestLabels`).
const TW: &str = r#"gen_ai_request_model=~"$model", instance=~"$instance""#;
/// Selector of the normalised signals tokenwatch exports (`tokenwatch_kv_cache_usage_ratio`…).
const SIG: &str = r#"model=~"$model", instance=~"$instance""#;
/// Selector of vLLM's own series (`model_name` is the served model name).
const VLLM: &str = r#"model_name=~"$model", instance=~"$instance""#;
/// Grafana's rate window, which adapts to the scrape interval and the zoom.
const RATE: &str = "$__rate_interval";
/// Every series tokenwatch exports from the runtimes' own metrics (labels `model`, `runtime`,
/// `instance`), whatever runtime: the re-exported histograms and counters and the normalised
/// queue gauges.
const RUNTIME_SERIES: &str = r#"__name__=~"tokenwatch_runtime_.+""#;

/// How a panel draws its targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PanelKind {
    TimeSeries,
    Stat,
    Table,
    Heatmap,
}

impl PanelKind {
    fn grafana_type(self) -> &'static str {
        match self {
            PanelKind::TimeSeries => "timeseries",
            PanelKind::Stat => "stat",
            PanelKind::Table => "table",
            PanelKind::Heatmap => "heatmap",
        }
    }
}

/// One PromQL query of a panel.
#[derive(Clone, Debug)]
pub struct Target {
    pub expr: String,
    pub legend: String,
}

/// One panel: what it shows and its queries.
#[derive(Clone, Debug)]
pub struct Panel {
    pub title: &'static str,
    pub description: &'static str,
    pub kind: PanelKind,
    /// Grafana unit id (`s`, `reqps`, `percentunit`, `mbytes`, `short`…).
    pub unit: &'static str,
    /// Width in Grafana's 24-column grid.
    pub width: u32,
    pub targets: Vec<Target>,
    /// Threshold lines drawn on a time series (value, colour).
    pub thresholds: Vec<(f64, &'static str)>,
}

/// A titled row of panels.
#[derive(Clone, Debug)]
pub struct Row {
    pub title: &'static str,
    pub panels: Vec<Panel>,
}

/// A template variable.
#[derive(Clone, Debug)]
pub enum Variable {
    /// The Prometheus datasource.
    Datasource {
        name: &'static str,
        label: &'static str,
    },
    /// Values of a label (`label_values(series, label)`), multi-select with "All" = `.*`.
    LabelValues {
        name: &'static str,
        label: &'static str,
        series: String,
        label_name: &'static str,
    },
    /// Values of `label_name` on the series an instant query returns (`query_result(expr)`
    /// with a regex picking the label), multi-select with "All" = `.*`: a union of series whose
    /// label names differ.
    QueryResult {
        name: &'static str,
        label: &'static str,
        expr: String,
        label_name: &'static str,
    },
    /// A fixed list of values with a default.
    Custom {
        name: &'static str,
        label: &'static str,
        values: &'static [&'static str],
        default: &'static str,
    },
}

impl Variable {
    pub fn name(&self) -> &'static str {
        match self {
            Variable::Datasource { name, .. }
            | Variable::LabelValues { name, .. }
            | Variable::QueryResult { name, .. }
            | Variable::Custom { name, .. } => name,
        }
    }
}

/// One query as a test or a user sees it: the panel it belongs to and its PromQL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PanelQuery {
    pub row: String,
    pub panel: String,
    pub ref_id: String,
    pub expr: String,
}

fn target(expr: String, legend: &str) -> Target {
    Target {
        expr,
        legend: legend.to_string(),
    }
}

fn panel(
    title: &'static str,
    description: &'static str,
    kind: PanelKind,
    unit: &'static str,
    width: u32,
    targets: Vec<Target>,
) -> Panel {
    Panel {
        title,
        description,
        kind,
        unit,
        width,
        targets,
        thresholds: Vec::new(),
    }
}

/// `rate(metric{selector}[window])` summed by `by`.
fn sum_rate(by: &str, metric: &str, selector: &str, window: &str) -> String {
    format!("sum by ({by}) (rate({metric}{{{selector}}}[{window}]))")
}

/// The `q` quantile of a histogram's `_bucket` series, per `by`.
fn quantile(q: f64, histogram: &str, by: &str, selector: &str) -> String {
    format!(
        "histogram_quantile({q}, {})",
        sum_rate(
            &format!("le, {by}"),
            &format!("{histogram}_bucket"),
            selector,
            RATE
        )
    )
}

/// P50, P90 and P99 targets of a histogram, per `by`.
fn percentiles(histogram: &str, by: &str, selector: &str) -> Vec<Target> {
    [(0.5, "p50"), (0.9, "p90"), (0.99, "p99")]
        .into_iter()
        .map(|(q, name)| {
            target(
                quantile(q, histogram, by, selector),
                &format!("{{{{{by}}}}} {name}"),
            )
        })
        .collect()
}

/// P50 and P99 targets of a runtime histogram tokenwatch re-exports, per model, labelled as the
/// runtime's.
fn runtime_percentiles(histogram: &str) -> Vec<Target> {
    [(0.5, "p50"), (0.99, "p99")]
        .into_iter()
        .map(|(q, name)| {
            target(
                quantile(q, histogram, "model", SIG),
                &format!("{{{{model}}}} {name} (runtime)"),
            )
        })
        .collect()
}

/// Failed share of the requests the runtimes finished, per model, from their own counters; 0 for
/// a model without failures.
fn runtime_error_ratio(window: &str) -> String {
    let all = sum_rate(
        "model",
        "tokenwatch_runtime_requests_finished_total",
        SIG,
        window,
    );
    let failed = sum_rate(
        "model",
        "tokenwatch_runtime_requests_failed_total",
        SIG,
        window,
    );
    format!("({failed} or ({all} * 0)) / {all}")
}

/// Failed share of tokenwatch's requests per model over `window`; 0 (not "no data") for a
/// model without errors.
fn error_ratio(window: &str) -> String {
    let all = sum_rate(MODEL, "tokenwatch_requests_total", TW, window);
    let failed = sum_rate(
        MODEL,
        "tokenwatch_requests_total",
        &format!(r#"{TW}, error_type!="""#),
        window,
    );
    format!("({failed} or ({all} * 0)) / {all}")
}

/// The dashboard's template variables, in order.
pub fn variables() -> Vec<Variable> {
    vec![
        Variable::Datasource {
            name: DATASOURCE_VAR,
            label: "Prometheus",
        },
        // The proxy's models (`gen_ai_request_model`) and the runtimes' (`model`), one list.
        Variable::QueryResult {
            name: "model",
            label: "Model",
            expr: format!(
                r#"group by (model) (label_join(tokenwatch_requests_total, "model", "", "{MODEL}")) or group by (model) ({{{RUNTIME_SERIES}, model!=""}})"#
            ),
            label_name: "model",
        },
        Variable::QueryResult {
            name: "instance",
            label: "Instance",
            expr: format!(
                r#"group by (instance) (tokenwatch_requests_total{{{MODEL}=~"$model"}}) or group by (instance) ({{{RUNTIME_SERIES}, model=~"$model"}})"#
            ),
            label_name: "instance",
        },
        Variable::Custom {
            name: "slo_objective",
            label: "Success objective",
            values: &["0.99", "0.995", "0.999", "0.9999"],
            default: "0.995",
        },
    ]
}

/// The dashboard's rows and panels.
pub fn rows() -> Vec<Row> {
    use PanelKind::*;
    let tw_req = "tokenwatch_requests_total";
    // Token usage is a histogram: its `_sum` counts tokens, its `_count` requests.
    let tokens = "gen_ai_client_token_usage_sum";
    let token_requests = "gen_ai_client_token_usage_count";
    let mut burn = panel(
        "Error-ratio burn rate",
        "From the request counters: error ratio divided by the error budget (1 − $slo_objective) over 5m, 30m, 1h and 6h. Lines: the multi-window alert thresholds (14.4× over 1h and 5m, 6× over 6h and 30m), as tokenwatch's slo_burn rule uses.",
        TimeSeries,
        "short",
        16,
        ["5m", "30m", "1h", "6h"]
            .into_iter()
            .map(|w| {
                target(
                    format!("{} / (1 - $slo_objective)", error_ratio(w)),
                    &format!("{{{{gen_ai_request_model}}}} {w}"),
                )
            })
            .collect(),
    );
    burn.thresholds = vec![(6.0, "orange"), (14.4, "red")];
    vec![
        Row {
            title: "Fleet",
            panels: vec![
                panel(
                    "Requests per second",
                    "Requests seen by tokenwatch's proxy or OTLP receiver, per model, and (runtime) those the runtimes finished by their own counters, as tokenwatch scraped them.",
                    TimeSeries,
                    "reqps",
                    8,
                    vec![
                        target(sum_rate(MODEL, tw_req, TW, RATE), "{{gen_ai_request_model}}"),
                        target(
                            sum_rate("model", "tokenwatch_runtime_requests_finished_total", SIG, RATE),
                            "{{model}} (runtime)",
                        ),
                    ],
                ),
                panel(
                    "Error rate",
                    "Share of requests that ended in an error, per model; (runtime): requests the runtime failed over those it finished, by its own counters.",
                    TimeSeries,
                    "percentunit",
                    8,
                    vec![
                        target(error_ratio(RATE), "{{gen_ai_request_model}}"),
                        target(runtime_error_ratio(RATE), "{{model}} (runtime)"),
                    ],
                ),
                panel(
                    "Responses by outcome",
                    "Requests per second by error type (`ok` for successful ones).",
                    TimeSeries,
                    "reqps",
                    8,
                    vec![target(
                        format!(
                            r#"label_replace({}, "error_type", "ok", "error_type", "")"#,
                            sum_rate(&format!("{MODEL}, error_type"), tw_req, TW, RATE)
                        ),
                        "{{gen_ai_request_model}} {{error_type}}",
                    )],
                ),
                panel(
                    "Tokens per second",
                    "Input and output tokens processed, per model; (runtime): prompt and output tokens by the runtime's own counters.",
                    TimeSeries,
                    "short",
                    12,
                    vec![
                        target(
                            sum_rate(&format!("{MODEL}, gen_ai_token_type"), tokens, TW, RATE),
                            "{{gen_ai_request_model}} {{gen_ai_token_type}}",
                        ),
                        target(
                            sum_rate("model", "tokenwatch_runtime_prompt_tokens_total", SIG, RATE),
                            "{{model}} input (runtime)",
                        ),
                        target(
                            sum_rate("model", "tokenwatch_runtime_output_tokens_total", SIG, RATE),
                            "{{model}} output (runtime)",
                        ),
                    ],
                ),
                panel(
                    "Runtime batch and queue",
                    "Sequences running and requests waiting in the runtime (vLLM).",
                    TimeSeries,
                    "short",
                    12,
                    vec![
                        target(format!("sum by (model_name) (vllm:num_requests_running{{{VLLM}}})"), "{{model_name}} running"),
                        target(format!("sum by (model_name) (vllm:num_requests_waiting{{{VLLM}}})"), "{{model_name}} waiting"),
                    ],
                ),
            ],
        },
        Row {
            title: "Latency per model",
            panels: vec![
                panel(
                    "Time to first token",
                    "From the request's arrival at the proxy to its first content-bearing chunk (what clients feel); (runtime): the runtime's own TTFT histogram as tokenwatch scraped it, any runtime, known to its bucket — the only lines collector-only.",
                    TimeSeries,
                    "s",
                    8,
                    [
                        percentiles("gen_ai_server_time_to_first_token_seconds", MODEL, TW),
                        runtime_percentiles("tokenwatch_runtime_time_to_first_token_seconds"),
                    ]
                    .concat(),
                ),
                panel(
                    "Inter-token latency",
                    "Time per output token after the first, per streamed request; (runtime): the runtime's own inter-token histogram as tokenwatch scraped it.",
                    TimeSeries,
                    "s",
                    8,
                    [
                        percentiles("gen_ai_server_time_per_output_token_seconds", MODEL, TW),
                        runtime_percentiles("tokenwatch_runtime_inter_token_latency_seconds"),
                    ]
                    .concat(),
                ),
                panel(
                    "End-to-end duration",
                    "From the request's arrival to the end of its response; (runtime): the runtime's own end-to-end histogram as tokenwatch scraped it.",
                    TimeSeries,
                    "s",
                    8,
                    [
                        percentiles("gen_ai_server_request_duration_seconds", MODEL, TW),
                        runtime_percentiles("tokenwatch_runtime_request_duration_seconds"),
                    ]
                    .concat(),
                ),
                panel(
                    "Time to first token reported by the runtime",
                    "vLLM's own TTFT histogram: compare with the proxy's view to see network and queueing in front of the runtime.",
                    TimeSeries,
                    "s",
                    12,
                    vec![
                        target(quantile(0.5, "vllm:time_to_first_token_seconds", "model_name", VLLM), "{{model_name}} p50"),
                        target(quantile(0.99, "vllm:time_to_first_token_seconds", "model_name", VLLM), "{{model_name}} p99"),
                    ],
                ),
                panel(
                    "Queue time in the runtime",
                    "Time requests waited in the runtime's scheduler queue: vLLM's own series, and (runtime) any runtime's queue histogram as tokenwatch scraped it.",
                    TimeSeries,
                    "s",
                    12,
                    [
                        vec![
                            target(quantile(0.5, "vllm:request_queue_time_seconds", "model_name", VLLM), "{{model_name}} p50"),
                            target(quantile(0.99, "vllm:request_queue_time_seconds", "model_name", VLLM), "{{model_name}} p99"),
                        ],
                        runtime_percentiles("tokenwatch_runtime_queue_time_seconds"),
                    ]
                    .concat(),
                ),
            ],
        },
        Row {
            title: "Context length",
            panels: vec![
                panel(
                    "Prompt length distribution",
                    "Requests per prompt-length bucket (tokens), from the runtime's histogram.",
                    Heatmap,
                    "short",
                    12,
                    vec![target(
                        format!("sum by (le) (increase(vllm:request_prompt_tokens_bucket{{{VLLM}}}[{RATE}]))"),
                        "{{le}}",
                    )],
                ),
                panel(
                    "Prompt and output length",
                    "Percentiles of prompt and generated tokens per request, from the runtime.",
                    TimeSeries,
                    "short",
                    12,
                    vec![
                        target(quantile(0.5, "vllm:request_prompt_tokens", "model_name", VLLM), "{{model_name}} prompt p50"),
                        target(quantile(0.99, "vllm:request_prompt_tokens", "model_name", VLLM), "{{model_name}} prompt p99"),
                        target(quantile(0.5, "vllm:request_generation_tokens", "model_name", VLLM), "{{model_name}} output p50"),
                        target(quantile(0.99, "vllm:request_generation_tokens", "model_name", VLLM), "{{model_name}} output p99"),
                    ],
                ),
                panel(
                    "Tokens per request",
                    "Mean input and output tokens per request seen by tokenwatch.",
                    TimeSeries,
                    "short",
                    24,
                    ["input", "output"]
                        .into_iter()
                        .map(|kind| {
                            target(
                                format!(
                                    "{} / {}",
                                    sum_rate(MODEL, tokens, &format!(r#"{TW}, gen_ai_token_type="{kind}""#), RATE),
                                    sum_rate(MODEL, token_requests, &format!(r#"{TW}, gen_ai_token_type="{kind}""#), RATE)
                                ),
                                &format!("{{{{gen_ai_request_model}}}} {kind}"),
                            )
                        })
                        .collect(),
                ),
            ],
        },
        Row {
            title: "KV cache and GPU memory",
            panels: vec![
                panel(
                    "KV cache usage",
                    "Share of the runtime's KV-cache blocks in use (vLLM; `gpu_cache_usage_perc` on versions before 0.9).",
                    TimeSeries,
                    "percentunit",
                    8,
                    vec![target(
                        format!("max by (model_name, instance) (vllm:kv_cache_usage_perc{{{VLLM}}} or vllm:gpu_cache_usage_perc{{{VLLM}}})"),
                        "{{model_name}} {{instance}}",
                    )],
                ),
                panel(
                    "Preemptions per second",
                    "Sequences the runtime preempted for lack of KV-cache space.",
                    TimeSeries,
                    "short",
                    8,
                    vec![target(sum_rate("model_name", "vllm:num_preemptions_total", VLLM, RATE), "{{model_name}}")],
                ),
                panel(
                    "Prefix cache hit ratio",
                    "Prompt tokens served from the runtime's prefix cache.",
                    TimeSeries,
                    "percentunit",
                    8,
                    vec![target(
                        format!(
                            "{} / {}",
                            sum_rate("model_name", "vllm:prefix_cache_hits_total", VLLM, RATE),
                            sum_rate("model_name", "vllm:prefix_cache_queries_total", VLLM, RATE)
                        ),
                        "{{model_name}}",
                    )],
                ),
                panel(
                    "GPU memory used",
                    "Framebuffer memory in use per GPU (dcgm-exporter, MiB).",
                    TimeSeries,
                    "mbytes",
                    8,
                    vec![target("max by (Hostname, gpu) (DCGM_FI_DEV_FB_USED)".into(), "{{Hostname}} GPU {{gpu}}")],
                ),
                panel(
                    "GPU memory used (share)",
                    "Used framebuffer over used + free per GPU: a steady climb with flat traffic is a leak.",
                    TimeSeries,
                    "percentunit",
                    8,
                    vec![target(
                        "max by (Hostname, gpu) (DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE))".into(),
                        "{{Hostname}} GPU {{gpu}}",
                    )],
                ),
                panel(
                    "GPU utilisation",
                    "Share of time a kernel ran on the GPU (dcgm-exporter).",
                    TimeSeries,
                    "percent",
                    8,
                    vec![target("max by (Hostname, gpu) (DCGM_FI_DEV_GPU_UTIL)".into(), "{{Hostname}} GPU {{gpu}}")],
                ),
                panel(
                    "KV cache usage, any runtime",
                    "tokenwatch's normalised KV-cache signal (vLLM, SGLang, TensorRT-LLM… scraped or received over OTLP), per model and instance.",
                    TimeSeries,
                    "percentunit",
                    12,
                    vec![target(
                        format!("max by (model, instance) (tokenwatch_kv_cache_usage_ratio{{{SIG}}})"),
                        "{{model}} {{instance}}",
                    )],
                ),
                panel(
                    "Runtime queue, any runtime",
                    "tokenwatch's normalised queue signals: requests running and waiting in the runtimes, per model.",
                    TimeSeries,
                    "short",
                    12,
                    vec![
                        target(format!("sum by (model) (tokenwatch_runtime_requests_running{{{SIG}}})"), "{{model}} running"),
                        target(format!("sum by (model) (tokenwatch_runtime_requests_waiting{{{SIG}}})"), "{{model}} waiting"),
                    ],
                ),
            ],
        },
        Row {
            title: "SLO",
            panels: vec![
                burn,
                panel(
                    "First token within 1 s",
                    "Share of requests whose time to first token was at most 1 s.",
                    TimeSeries,
                    "percentunit",
                    8,
                    vec![target(
                        format!(
                            "{} / {}",
                            sum_rate(
                                MODEL,
                                "gen_ai_server_time_to_first_token_seconds_bucket",
                                &format!(r#"{TW}, le=~"1(\\.0)?""#),
                                RATE
                            ),
                            sum_rate(MODEL, "gen_ai_server_time_to_first_token_seconds_count", TW, RATE)
                        ),
                        "{{gen_ai_request_model}}",
                    )],
                ),
                panel(
                    "SLO burn rate",
                    "tokenwatch's SLOs (the `slos:` configuration): error-budget burn rate per SLO, model and window; 1 spends the budget in exactly the SLO's window.",
                    TimeSeries,
                    "short",
                    12,
                    vec![target(
                        r#"max by (slo, model, window) (tokenwatch_slo_burn_rate{model=~"$model"})"#.into(),
                        "{{slo}} {{model}} {{window}}",
                    )],
                ),
                panel(
                    "SLO error budget remaining",
                    "Share of each SLO's error budget left over its window (1 untouched, 0 spent, below 0 overspent).",
                    TimeSeries,
                    "percentunit",
                    12,
                    vec![target(
                        r#"min by (slo, model) (tokenwatch_slo_error_budget_remaining_ratio{model=~"$model"})"#.into(),
                        "{{slo}} {{model}}",
                    )],
                ),
            ],
        },
        Row {
            title: "Alerts",
            panels: vec![
                panel(
                    "Firing alerts",
                    "tokenwatch alerts firing now, by severity.",
                    Stat,
                    "short",
                    6,
                    vec![target(r#"sum by (severity) (tokenwatch_alerts{state="firing"})"#.into(), "{{severity}}")],
                ),
                panel(
                    "Open incidents",
                    "Incidents (groups of related alerts) with recent activity.",
                    Stat,
                    "short",
                    6,
                    vec![target("sum(tokenwatch_alert_incidents_open)".into(), "incidents")],
                ),
                panel(
                    "Alerts by rule",
                    "tokenwatch's alerts by rule, severity and state (pending, firing, recently resolved).",
                    Table,
                    "short",
                    12,
                    vec![target("sum by (rule, severity, state) (tokenwatch_alerts)".into(), "")],
                ),
            ],
        },
        Row {
            title: "tokenwatch",
            panels: vec![
                panel(
                    "Telemetry queue fill",
                    "Records waiting for the pipeline over the queue's capacity; records are dropped (requests are not) when full.",
                    TimeSeries,
                    "percentunit",
                    8,
                    vec![target("tokenwatch_telemetry_queue_depth / tokenwatch_telemetry_queue_capacity".into(), "{{instance}}")],
                ),
                panel(
                    "Pipeline and dropped records",
                    "Records processed and dropped per second.",
                    TimeSeries,
                    "short",
                    8,
                    vec![
                        target(format!("sum by (instance) (rate(tokenwatch_pipeline_records_total[{RATE}]))"), "{{instance}} processed"),
                        target(format!("sum by (instance) (rate(tokenwatch_telemetry_dropped_records_total[{RATE}]))"), "{{instance}} dropped"),
                    ],
                ),
                panel(
                    "Scrape targets up",
                    "Runtime /metrics endpoints tokenwatch scrapes, 1 when the last scrape succeeded.",
                    TimeSeries,
                    "short",
                    8,
                    vec![target("tokenwatch_scrape_up".into(), "{{target}}")],
                ),
            ],
        },
    ]
}

/// Every query of the dashboard, with its row, panel and Grafana `refId`.
pub fn queries() -> Vec<PanelQuery> {
    rows()
        .into_iter()
        .flat_map(|row| {
            row.panels.into_iter().flat_map(move |p| {
                let row = row.title.to_string();
                p.targets
                    .into_iter()
                    .enumerate()
                    .map(move |(i, t)| PanelQuery {
                        row: row.clone(),
                        panel: p.title.to_string(),
                        ref_id: ref_id(i),
                        expr: t.expr,
                    })
            })
        })
        .collect()
}

/// Grafana's refIds: A, B, … Z, AA, AB ….
fn ref_id(i: usize) -> String {
    let letter = |n: usize| char::from(b'A' + (n % 26) as u8);
    if i < 26 {
        letter(i).to_string()
    } else {
        format!("{}{}", letter(i / 26 - 1), letter(i))
    }
}

fn datasource() -> Value {
    json!({ "type": "prometheus", "uid": format!("${{{DATASOURCE_VAR}}}") })
}

const PANEL_HEIGHT: u32 = 8;
const GRID_WIDTH: u32 = 24;

fn panel_json(p: &Panel, id: u32, x: u32, y: u32) -> Value {
    let ds = datasource();
    let targets: Vec<Value> = p
        .targets
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let (format, instant) = match p.kind {
                PanelKind::Heatmap => ("heatmap", false),
                PanelKind::Table => ("table", true),
                _ => ("time_series", false),
            };
            json!({
                "refId": ref_id(i),
                "datasource": ds,
                "editorMode": "code",
                "expr": t.expr,
                "legendFormat": t.legend,
                "format": format,
                "instant": instant,
                "range": !instant,
            })
        })
        .collect();
    let mut steps = vec![json!({ "color": "green", "value": null })];
    steps.extend(
        p.thresholds
            .iter()
            .map(|(v, c)| json!({ "color": c, "value": v })),
    );
    let mut defaults = json!({
        "unit": p.unit,
        "thresholds": { "mode": "absolute", "steps": steps },
    });
    let options = match p.kind {
        PanelKind::TimeSeries => {
            defaults["custom"] = json!({
                "drawStyle": "line",
                "lineWidth": 1,
                "fillOpacity": 10,
                "showPoints": "never",
                "spanNulls": false,
                "thresholdsStyle": { "mode": if p.thresholds.is_empty() { "off" } else { "line" } },
            });
            defaults["color"] = json!({ "mode": "palette-classic" });
            json!({
                "legend": { "displayMode": "list", "placement": "bottom", "showLegend": true },
                "tooltip": { "mode": "multi", "sort": "desc" },
            })
        }
        PanelKind::Stat => json!({
            "reduceOptions": { "calcs": ["lastNotNull"], "fields": "", "values": false },
            "colorMode": "value",
            "graphMode": "area",
            "justifyMode": "auto",
            "orientation": "auto",
            "textMode": "auto",
        }),
        PanelKind::Table => json!({ "showHeader": true, "cellHeight": "sm" }),
        PanelKind::Heatmap => json!({
            "calculate": false,
            "cellGap": 1,
            "color": { "mode": "scheme", "scheme": "Oranges", "steps": 64 },
            "yAxis": { "axisPlacement": "left", "unit": p.unit },
            "rowsFrame": { "layout": "auto" },
            "tooltip": { "mode": "single", "yHistogram": true },
            "legend": { "show": true },
        }),
    };
    let mut v = json!({
        "id": id,
        "type": p.kind.grafana_type(),
        "title": p.title,
        "description": p.description,
        "datasource": ds,
        "gridPos": { "h": PANEL_HEIGHT, "w": p.width, "x": x, "y": y },
        "fieldConfig": { "defaults": defaults, "overrides": [] },
        "options": options,
        "targets": targets,
    });
    if p.kind == PanelKind::Table {
        v["transformations"] = json!([{
            "id": "organize",
            "options": { "excludeByName": { "Time": true } },
        }]);
    }
    v
}

/// A multi-value query variable with "All" (`label_values` or `query_result`; `regex` picks
/// the value out of a `query_result` line).
fn query_variable(name: &str, label: &str, query: &str, regex: String) -> Value {
    json!({
        "name": name,
        "label": label,
        "type": "query",
        "datasource": datasource(),
        "definition": query,
        "query": { "query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery" },
        "refresh": 2,
        "multi": true,
        "includeAll": true,
        "allValue": ".*",
        "current": { "selected": true, "text": ["All"], "value": ["$__all"] },
        "options": [],
        "regex": regex,
        "sort": 1,
        "hide": 0,
    })
}

fn variable_json(v: &Variable) -> Value {
    match v {
        Variable::Datasource { name, label } => json!({
            "name": name,
            "label": label,
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "hide": 0,
            "includeAll": false,
            "multi": false,
            "options": [],
            "refresh": 1,
            "regex": "",
        }),
        Variable::LabelValues {
            name,
            label,
            series,
            label_name,
        } => {
            let query = format!("label_values({series}, {label_name})");
            query_variable(name, label, &query, String::new())
        }
        Variable::QueryResult {
            name,
            label,
            expr,
            label_name,
        } => {
            let query = format!("query_result({expr})");
            query_variable(name, label, &query, format!("/{label_name}=\"([^\"]+)\"/"))
        }
        Variable::Custom {
            name,
            label,
            values,
            default,
        } => json!({
            "name": name,
            "label": label,
            "type": "custom",
            "query": values.join(","),
            "current": { "selected": true, "text": default, "value": default },
            "options": values
                .iter()
                .map(|v| json!({ "selected": v == default, "text": v, "value": v }))
                .collect::<Vec<_>>(),
            "multi": false,
            "includeAll": false,
            "hide": 0,
        }),
    }
}

/// The dashboard as Grafana JSON: rows laid out top to bottom, panels left to right.
pub fn dashboard() -> Value {
    let mut panels = Vec::new();
    let mut id = 0;
    let mut y = 0;
    for row in rows() {
        id += 1;
        panels.push(json!({
            "id": id,
            "type": "row",
            "title": row.title,
            "collapsed": false,
            "gridPos": { "h": 1, "w": GRID_WIDTH, "x": 0, "y": y },
            "panels": [],
        }));
        y += 1;
        let mut x = 0;
        for p in &row.panels {
            if x + p.width > GRID_WIDTH {
                x = 0;
                y += PANEL_HEIGHT;
            }
            id += 1;
            panels.push(panel_json(p, id, x, y));
            x += p.width;
        }
        y += PANEL_HEIGHT;
    }
    json!({
        "annotations": { "list": [{
            "builtIn": 1,
            "datasource": { "type": "grafana", "uid": "-- Grafana --" },
            "enable": true,
            "hide": true,
            "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts",
            "type": "dashboard",
        }]},
        "description": "LLM inference fleet: traffic, per-model latency, context length, KV cache and GPU memory, SLO burn and alerts, from tokenwatch and the runtimes' own metrics. Generated by `tokenwatch dashboards export --format grafana`.",
        "editable": true,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": null,
        "links": [],
        "panels": panels,
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "tags": ["tokenwatch", "llm", "inference"],
        "templating": { "list": variables().iter().map(variable_json).collect::<Vec<_>>() },
        "time": { "from": "now-1h", "to": "now" },
        "timepicker": {},
        "timezone": "",
        "title": "tokenwatch: LLM inference fleet",
        "uid": UID,
        "version": 1,
        "weekStart": "",
    })
}

/// The dashboard JSON, pretty-printed with a final newline.
pub fn render() -> String {
    let mut s = serde_json::to_string_pretty(&dashboard()).unwrap_or_default();
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn panels_have_unique_ids_and_targets_unique_ref_ids() {
        let d = dashboard();
        let panels = d["panels"].as_array().unwrap();
        let ids: HashSet<u64> = panels.iter().map(|p| p["id"].as_u64().unwrap()).collect();
        assert_eq!(ids.len(), panels.len());
        let mut n = 0;
        for p in panels.iter().filter(|p| p["type"] != "row") {
            let targets = p["targets"].as_array().unwrap();
            assert!(!targets.is_empty(), "{} has no query", p["title"]);
            let refs: HashSet<&str> = targets
                .iter()
                .map(|t| t["refId"].as_str().unwrap())
                .collect();
            assert_eq!(refs.len(), targets.len(), "{}", p["title"]);
            n += targets.len();
            assert_eq!(p["datasource"]["uid"], "${DS_PROMETHEUS}");
        }
        assert_eq!(n, queries().len());
    }

    #[test]
    fn panels_fit_the_grid_without_overlapping() {
        let d = dashboard();
        let mut cells = HashSet::new();
        for p in d["panels"].as_array().unwrap() {
            let g = &p["gridPos"];
            let (x, y, w, h) = (
                g["x"].as_u64().unwrap(),
                g["y"].as_u64().unwrap(),
                g["w"].as_u64().unwrap(),
                g["h"].as_u64().unwrap(),
            );
            assert!(x + w <= 24, "{} overflows the grid", p["title"]);
            for cx in x..x + w {
                for cy in y..y + h {
                    assert!(
                        cells.insert((cx, cy)),
                        "{} overlaps another panel at ({cx}, {cy})",
                        p["title"]
                    );
                }
            }
        }
    }

    #[test]
    fn queries_use_the_template_variables_and_balanced_brackets() {
        let qs = queries();
        assert!(
            qs.iter()
                .any(|q| q.expr.contains("$model") && q.expr.contains("$instance"))
        );
        assert!(qs.iter().any(|q| q.expr.contains("$slo_objective")));
        for q in &qs {
            for (open, close) in [('(', ')'), ('{', '}'), ('[', ']')] {
                assert_eq!(
                    q.expr.matches(open).count(),
                    q.expr.matches(close).count(),
                    "{}: {}",
                    q.panel,
                    q.expr
                );
            }
            // Every `$name` is a dashboard variable or one of Grafana's own.
            for var in q.expr.split('$').skip(1) {
                let name: String = var
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                assert!(
                    name == "__rate_interval" || variables().iter().any(|v| v.name() == name),
                    "{}: unknown variable ${name}",
                    q.panel
                );
            }
        }
        assert_eq!(ref_id(0), "A");
        assert_eq!(ref_id(25), "Z");
        assert_eq!(ref_id(26), "AA");
    }

    #[test]
    fn json_has_the_grafana_essentials() {
        let d: Value = serde_json::from_str(&render()).unwrap();
        assert_eq!(d["schemaVersion"], SCHEMA_VERSION);
        assert_eq!(d["uid"], UID);
        let vars: Vec<&str> = d["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            vars,
            ["DS_PROMETHEUS", "model", "instance", "slo_objective"]
        );
        let model = &d["templating"]["list"][1];
        let definition = model["definition"].as_str().unwrap();
        assert!(
            definition.starts_with("query_result(")
                && definition.contains("tokenwatch_requests_total")
                && definition.contains("tokenwatch_runtime_"),
            "the proxy's and the runtimes' models: {definition}"
        );
        assert_eq!(model["regex"], r#"/model="([^"]+)"/"#);
        // Every latency panel has the runtime's lines beside the proxy's.
        for panel in [
            "Time to first token",
            "Inter-token latency",
            "End-to-end duration",
        ] {
            let exprs: Vec<String> = queries()
                .into_iter()
                .filter(|q| q.panel == panel)
                .map(|q| q.expr)
                .collect();
            assert!(
                exprs.iter().any(|e| e.contains("gen_ai_server_"))
                    && exprs.iter().any(|e| e.contains("tokenwatch_runtime_")),
                "{panel}: {exprs:?}"
            );
        }
    }
}
