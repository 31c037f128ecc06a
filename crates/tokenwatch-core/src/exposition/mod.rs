// Prometheus text (0.0.4) and OpenMetrics exposition parsing into borrowed metric families.
// Our own parser: speed is a product target (≥ 200 MB/s per core) and the crates are slow —
// `prometheus-parse` 0.2.5, measured in the same run by the exposition benchmark, reads the
// vLLM sample at 0.43–0.48× and the dcgm-exporter sample at 0.06–0.07× this parser's rate.

use std::borrow::Cow;

mod parse;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

pub use parse::parse;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
    GaugeHistogram,
    Summary,
    Info,
    StateSet,
    Unknown,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Label<'a> {
    pub name: &'a str,
    /// Unescaped value; borrowed when the text had no escapes.
    pub value: Cow<'a, str>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Exemplar<'a> {
    pub labels: Vec<Label<'a>>,
    pub value: f64,
    /// Seconds since the epoch, when given.
    pub timestamp: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Sample<'a> {
    /// Full series name as written (e.g. `vllm:e2e_request_latency_seconds_bucket`).
    pub name: &'a str,
    pub labels: Vec<Label<'a>>,
    pub value: f64,
    /// Milliseconds since the epoch (Prometheus text) — OpenMetrics seconds are converted.
    pub timestamp_ms: Option<i64>,
    pub exemplar: Option<Exemplar<'a>>,
}

impl<'a> Sample<'a> {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|l| l.name == name)
            .map(|l| l.value.as_ref())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct MetricFamily<'a> {
    /// Family name from `# TYPE` (for counters in OpenMetrics, without `_total`), or the
    /// sample name when the family was never declared.
    pub name: &'a str,
    pub typ: MetricType,
    pub help: Option<Cow<'a, str>>,
    pub unit: Option<&'a str>,
    /// Every sample of the family in input order, including `_bucket`, `_sum`, `_count`,
    /// `_total`, `_created` and `_info` series.
    pub samples: Vec<Sample<'a>>,
}

impl<'a> MetricFamily<'a> {
    /// What a sample's name adds to the family name: `""`, `"_bucket"`, `"_total"`, ….
    pub fn suffix_of<'s>(&self, sample: &Sample<'s>) -> &'s str {
        sample.name.strip_prefix(self.name).unwrap_or("")
    }

    /// The samples whose name is the family name plus `suffix` (`""` for the bare name).
    pub fn samples_with_suffix<'s>(
        &'s self,
        suffix: &'s str,
    ) -> impl Iterator<Item = &'s Sample<'a>> + 's {
        self.samples.iter().filter(move |s| {
            s.name.len() == self.name.len() + suffix.len()
                && s.name.starts_with(self.name)
                && s.name.ends_with(suffix)
        })
    }
}

impl MetricType {
    /// The OpenMetrics spelling (`unknown` for Prometheus text's `untyped`).
    pub fn as_str(self) -> &'static str {
        match self {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
            MetricType::Histogram => "histogram",
            MetricType::GaugeHistogram => "gaugehistogram",
            MetricType::Summary => "summary",
            MetricType::Info => "info",
            MetricType::StateSet => "stateset",
            MetricType::Unknown => "unknown",
        }
    }

    /// Series-name suffixes that join a family of this type (besides the bare name).
    pub fn suffixes(self) -> &'static [&'static str] {
        parse::suffixes(self)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    PrometheusText,
    OpenMetrics,
}

impl Format {
    /// From an HTTP `Content-Type`: `application/openmetrics-text` → OpenMetrics, else text.
    pub fn from_content_type(content_type: &str) -> Format {
        if content_type
            .trim_start()
            .to_ascii_lowercase()
            .starts_with("application/openmetrics-text")
        {
            Format::OpenMetrics
        } else {
            Format::PrometheusText
        }
    }
}

/// Where and why parsing failed (1-based line and column).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}
