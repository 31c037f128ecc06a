// Per-trace latency attribution by self time: each span mapped to a component (configurable
// rules, then built-in ones), engine spans split by their own queue/prefill/decode timings.

//! A span's self time is its duration less the union of its children's intervals (clipped to
//! it). The span's component comes from the first matching rule of `traces.components`, then of
//! the built-in rules: the proxy's own spans → `proxy` (proxy and network time), names with
//! `detokeniz`/`postprocess`/`post_process` → `post_processing`, `tokeniz` → `tokenizer`,
//! `router`/`routing` → `router`, `prefill` → `prefill`, `decode` → `decode`, `queue`/`schedul`
//! → `queue`, and any other span of a GenAI server (`gen_ai.*` attributes, or vLLM's
//! `llm_request`) → `engine`; else the span's service name (or `other`). Spans carrying the
//! runtime's own timings (vLLM and SGLang: `gen_ai.latency.time_in_queue`,
//! `gen_ai.latency.time_in_model_prefill`, `gen_ai.latency.time_in_model_decode`, seconds) give
//! that much of their self time to `queue`, `prefill` and `decode` (in that order, never more
//! than the self time); the rest stays with the span's component.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use tokenwatch_store::SpanRow;

/// `traces:` in the configuration.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TracesConfig {
    /// Rules mapping spans to components, tried in order before the built-in ones.
    pub components: Vec<ComponentRule>,
    /// Tail-based sampling of stored spans (`crate::pipeline::span_sampler`).
    pub sampling: crate::pipeline::span_sampler::SamplingConfig,
}

/// One `traces.components[]` rule: every condition given must hold.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ComponentRule {
    pub component: String,
    /// The span's name contains this (case-insensitive).
    #[serde(default)]
    pub name: Option<String>,
    /// The span's resource `service.name` is this.
    #[serde(default)]
    pub service: Option<String>,
    /// The span carries this attribute.
    #[serde(default)]
    pub attribute: Option<String>,
}

impl TracesConfig {
    /// Check the rules; errors name the key.
    pub fn validate(&self) -> Result<(), (String, String)> {
        self.sampling.validate()?;
        for (i, r) in self.components.iter().enumerate() {
            let key = |k: &str| format!("traces.components[{i}].{k}");
            if r.component.trim().is_empty() {
                return Err((key("component"), "must not be empty".into()));
            }
            if r.name.is_none() && r.service.is_none() && r.attribute.is_none() {
                return Err((
                    key("name"),
                    "a rule needs at least one of name, service or attribute".into(),
                ));
            }
            if r.name.as_deref().is_some_and(|n| n.is_empty()) {
                return Err((key("name"), "must not be empty".into()));
            }
        }
        Ok(())
    }
}

/// The vLLM/SGLang span attributes carved out of a span's self time, and their components.
pub const RUNTIME_TIMINGS: [(&str, &str); 3] = [
    ("gen_ai.latency.time_in_queue", "queue"),
    ("gen_ai.latency.time_in_model_prefill", "prefill"),
    ("gen_ai.latency.time_in_model_decode", "decode"),
];

/// Built-in name rules: (substring of the lowercase name, component), first match wins.
const NAME_RULES: [(&str, &str); 11] = [
    ("detokeniz", "post_processing"),
    ("postprocess", "post_processing"),
    ("post_process", "post_processing"),
    ("post-process", "post_processing"),
    ("tokeniz", "tokenizer"),
    ("router", "router"),
    ("routing", "router"),
    ("prefill", "prefill"),
    ("decode", "decode"),
    ("queue", "queue"),
    ("schedul", "queue"),
];

/// The rules in force: the configured ones, then the built-in ones.
#[derive(Debug, Clone, Default)]
pub struct ComponentMap {
    rules: Vec<ComponentRule>,
}

/// One span's attribution.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SpanSelfTime {
    pub component: String,
    pub self_ms: f64,
}

/// A component's share of one trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ComponentTime {
    pub component: String,
    pub self_ms: f64,
    /// Of the trace's total self time, 0–1.
    pub share: f64,
    /// Spans that gave it time.
    pub spans: usize,
}

/// A trace's attribution: per span (by span id) and per component (largest first).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attribution {
    pub total_ms: f64,
    pub components: Vec<ComponentTime>,
    #[serde(skip)]
    pub spans: HashMap<String, SpanSelfTime>,
}

fn attributes(span: &SpanRow) -> serde_json::Map<String, serde_json::Value> {
    match serde_json::from_str(&span.attributes_json) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    }
}

impl ComponentMap {
    pub fn new(cfg: &TracesConfig) -> ComponentMap {
        let rules = cfg
            .components
            .iter()
            .map(|r| ComponentRule {
                name: r.name.as_ref().map(|n| n.to_lowercase()),
                ..r.clone()
            })
            .collect();
        ComponentMap { rules }
    }

    /// The component of `span` (whose attributes are `attrs`).
    pub fn component_of(
        &self,
        span: &SpanRow,
        attrs: &serde_json::Map<String, serde_json::Value>,
    ) -> String {
        let name = span.name.to_lowercase();
        for r in &self.rules {
            let ok = r.name.as_ref().is_none_or(|n| name.contains(n.as_str()))
                && r.service.as_ref().is_none_or(|s| *s == span.service_name)
                && r.attribute.as_ref().is_none_or(|a| attrs.contains_key(a));
            if ok {
                return r.component.clone();
            }
        }
        if span.service_name == crate::pipeline::proxy_span::SERVICE_NAME
            && attrs.contains_key("tokenwatch.request_id")
        {
            return "proxy".into();
        }
        if let Some((_, c)) = NAME_RULES.iter().find(|(n, _)| name.contains(n)) {
            return (*c).into();
        }
        if name == "llm_request" || attrs.keys().any(|k| k.starts_with("gen_ai.")) {
            return "engine".into();
        }
        if span.service_name.is_empty() {
            "other".into()
        } else {
            span.service_name.clone()
        }
    }

    /// Self time per span and per component of the spans of one trace.
    pub fn attribute(&self, spans: &[SpanRow]) -> Attribution {
        let mut children: HashMap<&str, Vec<(i64, i64)>> = HashMap::new();
        for s in spans {
            if !s.parent_span_id.is_empty() && s.parent_span_id != s.span_id {
                children
                    .entry(s.parent_span_id.as_str())
                    .or_default()
                    .push((s.start_unix_nano, s.end_unix_nano));
            }
        }
        let mut per_span = HashMap::new();
        let mut totals: BTreeMap<String, (f64, usize)> = BTreeMap::new();
        let add = |c: &str, ms: f64, totals: &mut BTreeMap<String, (f64, usize)>| {
            if ms > 0.0 {
                let e = totals.entry(c.to_string()).or_insert((0.0, 0));
                e.0 += ms;
                e.1 += 1;
            }
        };
        for s in spans {
            let (start, end) = (s.start_unix_nano, s.end_unix_nano.max(s.start_unix_nano));
            let covered = children
                .get(s.span_id.as_str())
                .map(|c| covered_ns(start, end, c))
                .unwrap_or(0);
            let self_ms = (end - start - covered).max(0) as f64 / 1e6;
            let attrs = attributes(s);
            let component = self.component_of(s, &attrs);
            let mut rest = self_ms;
            for (key, part) in RUNTIME_TIMINGS {
                let secs = attrs
                    .get(key)
                    .and_then(|v| v.as_f64().or_else(|| v.as_str()?.parse().ok()));
                if let Some(secs) = secs.filter(|v| v.is_finite() && *v > 0.0) {
                    let ms = (secs * 1e3).min(rest);
                    add(part, ms, &mut totals);
                    rest -= ms;
                }
            }
            add(&component, rest, &mut totals);
            per_span.insert(s.span_id.clone(), SpanSelfTime { component, self_ms });
        }
        let total_ms: f64 = totals.values().map(|(ms, _)| ms).sum();
        let mut components: Vec<ComponentTime> = totals
            .into_iter()
            .map(|(component, (self_ms, spans))| ComponentTime {
                component,
                self_ms,
                share: if total_ms > 0.0 {
                    self_ms / total_ms
                } else {
                    0.0
                },
                spans,
            })
            .collect();
        components.sort_by(|a, b| {
            b.self_ms
                .total_cmp(&a.self_ms)
                .then_with(|| a.component.cmp(&b.component))
        });
        Attribution {
            total_ms,
            components,
            spans: per_span,
        }
    }
}

/// Nanoseconds of `[start, end)` covered by the union of `intervals`.
fn covered_ns(start: i64, end: i64, intervals: &[(i64, i64)]) -> i64 {
    let mut clipped: Vec<(i64, i64)> = intervals
        .iter()
        .map(|(a, b)| ((*a).max(start), (*b).min(end)))
        .filter(|(a, b)| b > a)
        .collect();
    clipped.sort_unstable();
    let mut covered = 0;
    let mut cur: Option<(i64, i64)> = None;
    for (a, b) in clipped {
        match cur {
            Some((ca, cb)) if a <= cb => cur = Some((ca, cb.max(b))),
            Some((ca, cb)) => {
                covered += cb - ca;
                cur = Some((a, b));
            }
            None => cur = Some((a, b)),
        }
    }
    if let Some((ca, cb)) = cur {
        covered += cb - ca;
    }
    covered
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i64 = 1_000_000;

    fn span(
        id: &str,
        parent: &str,
        name: &str,
        service: &str,
        start_ms: i64,
        end_ms: i64,
        attrs: &str,
    ) -> SpanRow {
        SpanRow {
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            span_id: id.into(),
            parent_span_id: parent.into(),
            name: name.into(),
            service_name: service.into(),
            start_unix_nano: start_ms * MS,
            end_unix_nano: end_ms * MS,
            attributes_json: attrs.into(),
            ..Default::default()
        }
    }

    fn ms(a: &Attribution, c: &str) -> f64 {
        a.components
            .iter()
            .find(|x| x.component == c)
            .map(|x| x.self_ms)
            .unwrap_or(0.0)
    }

    #[test]
    fn self_time_goes_to_components_and_runtime_timings_split_the_engine() {
        // proxy 0–100 ⊃ api server 5–98 ⊃ {tokenize 6–10, llm_request 10–90 (queue 20 ms,
        // prefill 15 ms, decode 40 ms), detokenize 90–95}.
        let spans = vec![
            span(
                "p",
                "caller",
                "chat m1",
                "tokenwatch",
                0,
                100,
                r#"{"tokenwatch.request_id":"r1","gen_ai.operation.name":"chat"}"#,
            ),
            span("s", "p", "POST /v1/chat/completions", "vllm", 5, 98, "{}"),
            span("t", "s", "tokenize", "vllm", 6, 10, "{}"),
            span(
                "e",
                "s",
                "llm_request",
                "vllm",
                10,
                90,
                r#"{"gen_ai.latency.time_in_queue":0.02,"gen_ai.latency.time_in_model_prefill":0.015,"gen_ai.latency.time_in_model_decode":0.04}"#,
            ),
            span("d", "s", "detokenize", "vllm", 90, 95, "{}"),
        ];
        let a = ComponentMap::default().attribute(&spans);
        let close = |x: f64, y: f64| (x - y).abs() < 1e-6;
        assert!(close(a.total_ms, 100.0), "{a:?}");
        assert!(close(ms(&a, "proxy"), 7.0), "{a:?}");
        assert!(
            close(ms(&a, "vllm"), 4.0),
            "the API server's own time, named by its service: {a:?}"
        );
        assert!(close(ms(&a, "tokenizer"), 4.0));
        assert!(
            close(ms(&a, "queue"), 20.0)
                && close(ms(&a, "prefill"), 15.0)
                && close(ms(&a, "decode"), 40.0)
        );
        assert!(
            close(ms(&a, "engine"), 5.0),
            "the rest of llm_request: {a:?}"
        );
        assert!(close(ms(&a, "post_processing"), 5.0));
        assert_eq!(a.components[0].component, "decode", "largest first");
        assert!(close(
            a.components.iter().map(|c| c.share).sum::<f64>(),
            1.0
        ));
        assert_eq!(
            a.spans["e"],
            SpanSelfTime {
                component: "engine".into(),
                self_ms: 80.0
            }
        );
        assert_eq!(a.spans["p"].component, "proxy");
    }

    #[test]
    fn overlapping_children_count_once_and_timings_never_exceed_self_time() {
        let spans = vec![
            span("r", "", "handler", "api", 0, 100, "{}"),
            span("a", "r", "a", "api", 10, 50, "{}"),
            span("b", "r", "b", "api", 30, 70, "{}"),
            span("c", "r", "c", "api", 90, 150, "{}"),
            span(
                "q",
                "",
                "llm_request",
                "sglang",
                0,
                10,
                r#"{"gen_ai.latency.time_in_queue":"0.5"}"#,
            ),
        ];
        let a = ComponentMap::default().attribute(&spans);
        assert_eq!(
            a.spans["r"].self_ms, 30.0,
            "0–10, 70–90: children 10–70 and 90–100 covered"
        );
        assert_eq!(a.spans["q"].self_ms, 10.0);
        assert_eq!(ms(&a, "queue"), 10.0, "capped at the span's self time");
        assert_eq!(ms(&a, "engine"), 0.0);
    }

    #[test]
    fn configured_rules_come_first_and_are_checked() {
        let cfg: TracesConfig = serde_json::from_str(
            r#"{"components": [{"component": "router", "service": "gateway"},
                               {"component": "guardrails", "name": "Moderation", "attribute": "policy"}]}"#,
        )
        .unwrap();
        cfg.validate().unwrap();
        let m = ComponentMap::new(&cfg);
        let s = span("a", "", "anything", "gateway", 0, 1, "{}");
        assert_eq!(m.component_of(&s, &attributes(&s)), "router");
        let s = span(
            "b",
            "",
            "run moderation",
            "app",
            0,
            1,
            r#"{"policy":"strict"}"#,
        );
        assert_eq!(m.component_of(&s, &attributes(&s)), "guardrails");
        let s = span("c", "", "run moderation", "app", 0, 1, "{}");
        assert_eq!(
            m.component_of(&s, &attributes(&s)),
            "app",
            "every condition must hold"
        );
        let bad: TracesConfig =
            serde_json::from_str(r#"{"components": [{"component": "x"}]}"#).unwrap();
        assert_eq!(bad.validate().unwrap_err().0, "traces.components[0].name");
        let bad: TracesConfig =
            serde_json::from_str(r#"{"components": [{"component": " ", "name": "x"}]}"#).unwrap();
        assert_eq!(
            bad.validate().unwrap_err().0,
            "traces.components[0].component"
        );
        assert!(
            serde_json::from_str::<TracesConfig>(
                r#"{"components": [{"component": "x", "nme": "y"}]}"#
            )
            .is_err()
        );
    }
}
