// From the `/metrics` text to remote-write series: every sample (histogram buckets, sums and
// counts are series of their own) stamped with the snapshot's time, split into shards and sends.

use super::proto::{Label, Sample, TimeSeries, WriteRequest};
use std::hash::{Hash, Hasher};
use tokenwatch_core::exposition::{self, Format, ParseError};

/// Every sample of a Prometheus text (0.0.4) exposition as one time series: labels
/// `__name__` plus the sample's own, then each external label the sample does not carry
/// (a series' own `instance` wins over an external one, as in Prometheus). Labels with an
/// empty value are left out (in Prometheus an empty label is an absent one); labels are sorted
/// by name, as the remote-write spec requires. A sample without its own timestamp gets
/// `timestamp_ms`.
pub fn series_from_exposition(
    text: &str,
    timestamp_ms: i64,
    external: &[Label],
) -> Result<Vec<TimeSeries>, ParseError> {
    let families = exposition::parse(text, Format::PrometheusText)?;
    let mut out = Vec::with_capacity(families.iter().map(|f| f.samples.len()).sum());
    for family in &families {
        for s in &family.samples {
            let mut labels = Vec::with_capacity(1 + s.labels.len() + external.len());
            labels.push(Label {
                name: "__name__".into(),
                value: s.name.to_string(),
            });
            for l in &s.labels {
                if !l.value.is_empty() && l.name != "__name__" {
                    labels.push(Label {
                        name: l.name.to_string(),
                        value: l.value.to_string(),
                    });
                }
            }
            for e in external {
                if !e.value.is_empty() && !labels.iter().any(|l| l.name == e.name) {
                    labels.push(e.clone());
                }
            }
            sort_labels(&mut labels);
            out.push(TimeSeries {
                labels,
                samples: vec![Sample {
                    value: s.value,
                    timestamp: s.timestamp_ms.unwrap_or(timestamp_ms),
                }],
            });
        }
    }
    Ok(out)
}

/// Sort by name (byte order, so `__name__` precedes every lowercase name) and keep the first
/// of repeated names.
pub fn sort_labels(labels: &mut Vec<Label>) {
    labels.sort_by(|a, b| a.name.cmp(&b.name));
    labels.dedup_by(|b, a| a.name == b.name);
}

/// The shard a series is always sent by, so that one series' samples leave in order even
/// when several requests of an endpoint are in flight at once.
pub fn shard_of(labels: &[Label], shards: usize) -> usize {
    if shards <= 1 {
        return 0;
    }
    let mut h = std::hash::DefaultHasher::new();
    labels.hash(&mut h);
    (h.finish() % shards as u64) as usize
}

/// The requests of one snapshot, per shard: each series goes to its shard, and each request
/// carries at most `max_samples` samples (at least one series).
pub fn split(series: Vec<TimeSeries>, shards: usize, max_samples: usize) -> Vec<Vec<WriteRequest>> {
    let shards = shards.max(1);
    let max_samples = max_samples.max(1);
    let mut out: Vec<Vec<WriteRequest>> = (0..shards).map(|_| Vec::new()).collect();
    let mut open: Vec<(WriteRequest, usize)> =
        (0..shards).map(|_| (WriteRequest::default(), 0)).collect();
    for ts in series {
        let shard = shard_of(&ts.labels, shards);
        let (req, n) = &mut open[shard];
        if *n > 0 && *n + ts.samples.len() > max_samples {
            out[shard].push(std::mem::take(req));
            *n = 0;
        }
        *n += ts.samples.len();
        req.timeseries.push(ts);
    }
    for (shard, (req, n)) in open.into_iter().enumerate() {
        if n > 0 {
            out[shard].push(req);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(name: &str, value: &str) -> Label {
        Label {
            name: name.into(),
            value: value.into(),
        }
    }

    fn find<'a>(series: &'a [TimeSeries], want: &[(&str, &str)]) -> &'a TimeSeries {
        series
            .iter()
            .find(|t| {
                t.labels
                    .iter()
                    .map(|l| (l.name.as_str(), l.value.as_str()))
                    .eq(want.iter().copied())
            })
            .unwrap_or_else(|| panic!("no series {want:?} in {:?}", names(series)))
    }

    fn names(series: &[TimeSeries]) -> Vec<Vec<(String, String)>> {
        series
            .iter()
            .map(|t| {
                t.labels
                    .iter()
                    .map(|l| (l.name.clone(), l.value.clone()))
                    .collect()
            })
            .collect()
    }

    const TEXT: &str = "\
# HELP tokenwatch_requests Requests seen by the proxy.
# TYPE tokenwatch_requests counter
tokenwatch_requests_total{gen_ai_request_model=\"m1\",gen_ai_provider_name=\"sim\",instance=\"127.0.0.1:8000\",ab_group=\"\"} 3
# HELP tokenwatch_telemetry_queue_depth Records waiting.
# TYPE tokenwatch_telemetry_queue_depth gauge
tokenwatch_telemetry_queue_depth 7
# HELP gen_ai_server_time_to_first_token_seconds TTFT.
# TYPE gen_ai_server_time_to_first_token_seconds histogram
gen_ai_server_time_to_first_token_seconds_sum{gen_ai_request_model=\"m1\"} 0.25
gen_ai_server_time_to_first_token_seconds_count{gen_ai_request_model=\"m1\"} 2
gen_ai_server_time_to_first_token_seconds_bucket{le=\"0.1\",gen_ai_request_model=\"m1\"} 1
gen_ai_server_time_to_first_token_seconds_bucket{le=\"+Inf\",gen_ai_request_model=\"m1\"} 2
stamped{a=\"b\"} 1.5 1700000000000
";

    #[test]
    fn counter_gauge_and_histogram_become_series_with_sorted_labels() {
        let ext = [
            l("instance", "tw-1"),
            l("job", "tokenwatch"),
            l("Zone", "eu"),
        ];
        let s = series_from_exposition(TEXT, 42, &ext).unwrap();
        assert_eq!(s.len(), 7, "{:?}", names(&s));
        // The series' own instance wins; the empty ab_group is left out; byte order puts
        // `Zone` before `__name__`.
        let req = find(
            &s,
            &[
                ("Zone", "eu"),
                ("__name__", "tokenwatch_requests_total"),
                ("gen_ai_provider_name", "sim"),
                ("gen_ai_request_model", "m1"),
                ("instance", "127.0.0.1:8000"),
                ("job", "tokenwatch"),
            ],
        );
        assert_eq!(
            req.samples,
            vec![Sample {
                value: 3.0,
                timestamp: 42
            }]
        );
        let gauge = find(
            &s,
            &[
                ("Zone", "eu"),
                ("__name__", "tokenwatch_telemetry_queue_depth"),
                ("instance", "tw-1"),
                ("job", "tokenwatch"),
            ],
        );
        assert_eq!(gauge.samples[0].value, 7.0);
        let inf = find(
            &s,
            &[
                ("Zone", "eu"),
                (
                    "__name__",
                    "gen_ai_server_time_to_first_token_seconds_bucket",
                ),
                ("gen_ai_request_model", "m1"),
                ("instance", "tw-1"),
                ("job", "tokenwatch"),
                ("le", "+Inf"),
            ],
        );
        assert_eq!(inf.samples[0].value, 2.0);
        let sum = find(
            &s,
            &[
                ("Zone", "eu"),
                ("__name__", "gen_ai_server_time_to_first_token_seconds_sum"),
                ("gen_ai_request_model", "m1"),
                ("instance", "tw-1"),
                ("job", "tokenwatch"),
            ],
        );
        assert_eq!(sum.samples[0].value, 0.25);
        let stamped = find(
            &s,
            &[
                ("Zone", "eu"),
                ("__name__", "stamped"),
                ("a", "b"),
                ("instance", "tw-1"),
                ("job", "tokenwatch"),
            ],
        );
        assert_eq!(
            stamped.samples[0].timestamp, 1_700_000_000_000,
            "a sample's own timestamp is kept"
        );
        for t in &s {
            assert!(
                t.labels.windows(2).all(|w| w[0].name < w[1].name),
                "{:?}",
                names(std::slice::from_ref(t))
            );
        }
    }

    #[test]
    fn the_metrics_exposition_converts_with_its_genai_labels() {
        use crate::export::prometheus::MetricsSink;
        use crate::kernel::telemetry::Metrics;
        use crate::pipeline::RecordSink;
        use tokenwatch_core::model::{RequestRecord, SeriesLabels};
        let m = std::sync::Arc::new(Metrics::new());
        let record = RequestRecord {
            labels: SeriesLabels {
                model_id: "m1".into(),
                runtime: "vllm".into(),
                instance: "gpu-1:8000".into(),
                ..Default::default()
            },
            endpoint: "/v1/embeddings".into(),
            status: 200,
            end_s: 0.5,
            prompt_tokens: Some(20),
            ..Default::default()
        };
        MetricsSink(m.clone()).consume(&[record]).unwrap();
        let s = series_from_exposition(&m.encode(), 7, &[l("job", "tokenwatch")]).unwrap();
        let tokens = find(
            &s,
            &[
                ("__name__", "gen_ai_client_token_usage_bucket"),
                ("gen_ai_operation_name", "embeddings"),
                ("gen_ai_provider_name", "vllm"),
                ("gen_ai_request_model", "m1"),
                ("gen_ai_response_model", "m1"),
                ("gen_ai_token_type", "input"),
                ("instance", "gpu-1:8000"),
                ("job", "tokenwatch"),
                ("le", "64"),
            ],
        );
        assert_eq!(tokens.samples[0].value, 1.0);
        // A successful request's duration has no error_type label at all.
        let duration = find(
            &s,
            &[
                ("__name__", "gen_ai_server_request_duration_seconds_count"),
                ("gen_ai_operation_name", "embeddings"),
                ("gen_ai_provider_name", "vllm"),
                ("gen_ai_request_model", "m1"),
                ("gen_ai_response_model", "m1"),
                ("instance", "gpu-1:8000"),
                ("job", "tokenwatch"),
            ],
        );
        assert_eq!(duration.samples[0].value, 1.0);
    }

    #[test]
    fn an_empty_external_label_adds_nothing_and_bad_text_is_an_error() {
        let s = series_from_exposition("up 1\n", 1, &[l("job", "")]).unwrap();
        assert_eq!(
            names(&s),
            vec![vec![("__name__".to_string(), "up".to_string())]]
        );
        assert!(series_from_exposition("up{ 1\n", 1, &[]).is_err());
    }

    #[test]
    fn sorting_keeps_the_first_of_repeated_names() {
        let mut labels = vec![l("b", "1"), l("__name__", "x"), l("a", "2"), l("b", "3")];
        sort_labels(&mut labels);
        assert_eq!(labels, vec![l("__name__", "x"), l("a", "2"), l("b", "1")]);
    }

    #[test]
    fn split_keeps_each_series_on_one_shard_and_bounds_requests() {
        let series: Vec<TimeSeries> = (0..50)
            .map(|i| TimeSeries {
                labels: vec![l("__name__", &format!("m{i}"))],
                samples: vec![Sample {
                    value: 1.0,
                    timestamp: 1,
                }],
            })
            .collect();
        let per_shard = split(series.clone(), 3, 4);
        assert_eq!(per_shard.len(), 3);
        let mut seen = 0;
        for (shard, reqs) in per_shard.iter().enumerate() {
            for r in reqs {
                assert!((1..=4).contains(&r.sample_count()));
                for t in &r.timeseries {
                    assert_eq!(shard_of(&t.labels, 3), shard);
                    seen += 1;
                }
            }
        }
        assert_eq!(seen, 50);
        assert!(
            per_shard.iter().all(|r| !r.is_empty()),
            "50 series spread over 3 shards"
        );
        let one = split(series, 1, 2000);
        assert_eq!(
            (one.len(), one[0].len(), one[0][0].sample_count()),
            (1, 1, 50)
        );
        assert!(split(Vec::new(), 2, 10).iter().all(Vec::is_empty));
    }
}
