// Before/after comparison around a marker: latency quantiles, error rate and tokens per request
// from request records — or, for a model no record holds, latency quantiles and error rate from
// the runtime's own histograms and counters, each with its bucket — and the normalised signals'
// history, each with a 95 % interval and a verdict.

use super::stats::{
    Better, Estimate, histogram_quantile_ci, mean_ci, quantile_ci, verdict, wilson,
};
use serde::Serialize;
use tokenwatch_core::histogram::BucketQuantile;
use tokenwatch_core::model::RequestRecord;
use tokenwatch_core::runtime_latency::RuntimeSpan;

/// The bucket a runtime percentile lies in, and the largest error that allows (`None`: the +Inf
/// bucket, unbounded).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Bucket {
    pub lower: f64,
    pub upper: Option<f64>,
    pub max_abs_error: Option<f64>,
}

impl From<BucketQuantile> for Bucket {
    fn from(q: BucketQuantile) -> Bucket {
        let finite = |v: f64| v.is_finite().then_some(v);
        Bucket {
            lower: q.bucket_lower,
            upper: finite(q.bucket_upper),
            max_abs_error: finite(q.max_abs_error()),
        }
    }
}

/// The buckets of a runtime percentile's estimates before and after.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BucketSides {
    pub before: Option<Bucket>,
    pub after: Option<Bucket>,
}

/// One signal before and after.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SignalComparison {
    pub signal: String,
    /// `records` (request records) or the normalised signal's source (`scrape:vllm`, `otlp`…).
    pub source: String,
    pub unit: &'static str,
    /// Which way is good: `lower`, `higher` or `neither`.
    pub better: &'static str,
    pub before: Option<Estimate>,
    pub after: Option<Estimate>,
    /// after − before of the point estimates.
    pub delta: Option<f64>,
    /// `better`, `worse`, `changed` (no good direction), `no_change` (intervals overlap) or
    /// `insufficient_data`.
    pub verdict: &'static str,
    /// Runtime percentiles only: the bucket each estimate lies in (its interval `lo`–`hi` is
    /// already widened to the buckets; `hi` null: the +Inf bucket).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bucket_bounds: Option<BucketSides>,
}

fn better_name(b: Better) -> &'static str {
    match b {
        Better::Lower => "lower",
        Better::Higher => "higher",
        Better::Neither => "neither",
    }
}

fn row(
    signal: String,
    source: &str,
    unit: &'static str,
    better: Better,
    before: Option<Estimate>,
    after: Option<Estimate>,
) -> SignalComparison {
    SignalComparison {
        verdict: verdict(before.as_ref(), after.as_ref(), better),
        delta: before.zip(after).map(|(b, a)| a.value - b.value),
        signal,
        source: source.into(),
        unit,
        better: better_name(better),
        before,
        after,
        bucket_bounds: None,
    }
}

/// Inter-token gaps of one record, seconds (consecutive content chunks).
fn gaps(r: &RequestRecord) -> impl Iterator<Item = f64> + '_ {
    r.chunk_offsets_us
        .windows(2)
        .map(|w| f64::from(w[1].saturating_sub(w[0])) / 1e6)
}

/// TTFT, ITL and E2E P50/P95 of the successful requests, the error rate of all, and prompt and
/// output tokens per successful request.
pub fn compare_records(before: &[RequestRecord], after: &[RequestRecord]) -> Vec<SignalComparison> {
    type Values = fn(&[&RequestRecord]) -> Vec<f64>;
    fn ok(rs: &[RequestRecord]) -> Vec<&RequestRecord> {
        rs.iter().filter(|r| r.is_success()).collect()
    }
    let (b_ok, a_ok) = (ok(before), ok(after));
    let latencies: [(&str, Values); 3] = [
        ("ttft", |rs| {
            rs.iter().filter_map(|r| r.first_token_s).collect()
        }),
        ("itl", |rs| rs.iter().flat_map(|r| gaps(r)).collect()),
        ("e2e", |rs| rs.iter().map(|r| r.end_s).collect()),
    ];
    let mut out = Vec::new();
    for (metric, values) in latencies {
        let (bv, av) = (values(&b_ok), values(&a_ok));
        for (q, p) in [("p50", 0.5), ("p95", 0.95)] {
            out.push(row(
                format!("{metric}_{q}_seconds"),
                "records",
                "seconds",
                Better::Lower,
                quantile_ci(&bv, p),
                quantile_ci(&av, p),
            ));
        }
    }
    let errors = |rs: &[RequestRecord]| {
        let n = rs.len() as u64;
        wilson(rs.iter().filter(|r| !r.is_success()).count() as u64, n)
    };
    out.push(row(
        "error_rate".into(),
        "records",
        "ratio",
        Better::Lower,
        errors(before),
        errors(after),
    ));
    type Count = fn(&RequestRecord) -> Option<u64>;
    let tokens: [(&str, Count); 2] = [
        ("output_tokens_per_request", |r| r.output_tokens),
        ("prompt_tokens_per_request", |r| r.prompt_tokens),
    ];
    for (name, get) in tokens {
        let vals = |rs: &[&RequestRecord]| {
            rs.iter()
                .filter_map(|r| get(r))
                .map(|t| t as f64)
                .collect::<Vec<_>>()
        };
        out.push(row(
            name.into(),
            "records",
            "tokens",
            Better::Neither,
            mean_ci(&vals(&b_ok)),
            mean_ci(&vals(&a_ok)),
        ));
    }
    out
}

/// The scraped histogram signals compared, with the name of their rows.
const RUNTIME_LATENCIES: [(&str, &str); 3] = [("ttft", "ttft"), ("itl", "itl"), ("e2e", "e2e")];

/// TTFT, ITL and E2E P50/P95 from the runtime's histograms of each side (source `runtime`, each
/// with its bucket), and the error rate from its failed / finished counters, where it reports
/// them: the rows [`compare_records`] gives, for a model no record holds.
pub fn compare_runtime(before: &RuntimeSpan, after: &RuntimeSpan) -> Vec<SignalComparison> {
    let mut out = Vec::new();
    for (signal, metric) in RUNTIME_LATENCIES {
        let (bh, ah) = (before.histograms.get(signal), after.histograms.get(signal));
        for (q, p) in [("p50", 0.5), ("p95", 0.95)] {
            let b = bh.and_then(|h| histogram_quantile_ci(h, p));
            let a = ah.and_then(|h| histogram_quantile_ci(h, p));
            let mut r = row(
                format!("{metric}_{q}_seconds"),
                "runtime",
                "seconds",
                Better::Lower,
                b.map(|(e, _)| e),
                a.map(|(e, _)| e),
            );
            r.bucket_bounds = Some(BucketSides {
                before: b.map(|(_, q)| q.into()),
                after: a.map(|(_, q)| q.into()),
            });
            out.push(r);
        }
    }
    let errors = |s: &RuntimeSpan| {
        let (finished, failed) = (s.finished?, s.failed?);
        let n = finished.max(0.0).round() as u64;
        wilson(failed.max(0.0).round() as u64, n)
    };
    out.push(row(
        "error_rate".into(),
        "runtime",
        "ratio",
        Better::Lower,
        errors(before),
        errors(after),
    ));
    out
}

/// Which way is good for a normalised signal, by name.
pub fn signal_direction(signal: &str) -> Better {
    const HIGHER: [&str; 2] = ["prefix_cache_hit_rate", "spec_decode_acceptance_rate"];
    const LOWER: [&str; 5] = [
        "kv_cache_usage",
        "preemptions_per_second",
        "requests_waiting",
        "gpu_temperature_celsius",
        "gpu_memory_used_ratio",
    ];
    if HIGHER.contains(&signal) {
        Better::Higher
    } else if LOWER.contains(&signal) || signal.ends_with("_seconds") || signal.contains("error") {
        Better::Lower
    } else {
        Better::Neither
    }
}

/// One normalised signal's points (all instances of the model together) before and after: the
/// mean of the points with a normal interval. Points of a time series are correlated, so the
/// interval is narrower than an independent sample's would be; the verdict is a screening hint.
pub fn compare_signal(
    signal: &str,
    source: &str,
    before: &[f64],
    after: &[f64],
) -> SignalComparison {
    row(
        signal.to_string(),
        source,
        "value",
        signal_direction(signal),
        mean_ci(before),
        mean_ci(after),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(ttft: f64, ok: bool, tokens: u64) -> RequestRecord {
        RequestRecord {
            first_token_s: Some(ttft),
            end_s: ttft + 0.5,
            chunk_offsets_us: vec![(ttft * 1e6) as u32, (ttft * 1e6) as u32 + 20_000],
            output_tokens: Some(tokens),
            status: if ok { 200 } else { 503 },
            error_class: (!ok).then_some(tokenwatch_core::model::ErrorClass::Upstream5xx),
            ..Default::default()
        }
    }

    fn find<'a>(rows: &'a [SignalComparison], name: &str) -> &'a SignalComparison {
        rows.iter().find(|r| r.signal == name).unwrap()
    }

    #[test]
    fn slower_after_is_worse_and_same_gaps_are_no_change() {
        let before: Vec<_> = (0..100)
            .map(|i| rec(0.1 + f64::from(i) * 0.001, true, 50))
            .collect();
        let after: Vec<_> = (0..100)
            .map(|i| {
                rec(
                    0.4 + f64::from(i) * 0.001,
                    i % 2 == 0,
                    50 + u64::from(i as u8 % 3),
                )
            })
            .collect();
        let rows = compare_records(&before, &after);
        let ttft = find(&rows, "ttft_p95_seconds");
        assert_eq!(ttft.verdict, "worse", "{ttft:?}");
        assert!(ttft.after.unwrap().lo > ttft.before.unwrap().hi);
        assert_eq!(find(&rows, "ttft_p50_seconds").verdict, "worse");
        assert_eq!(find(&rows, "itl_p50_seconds").verdict, "no_change");
        let err = find(&rows, "error_rate");
        assert_eq!(
            (
                err.verdict,
                err.before.unwrap().value,
                err.after.unwrap().value
            ),
            ("worse", 0.0, 0.5)
        );
        let tok = find(&rows, "output_tokens_per_request");
        assert_eq!((tok.better, tok.verdict), ("neither", "changed"));
        assert_eq!(
            find(&rows, "prompt_tokens_per_request").verdict,
            "insufficient_data"
        );
    }

    fn span(ttft_per_bucket: [f64; 4], finished: f64, failed: f64) -> RuntimeSpan {
        use tokenwatch_core::histogram::CumulativeHistogram;
        let h = CumulativeHistogram::from_bucket_counts(
            &[0.04, 0.25, 0.5, f64::INFINITY],
            &ttft_per_bucket,
        );
        RuntimeSpan {
            finished: Some(finished),
            failed: Some(failed),
            histograms: [("ttft".to_string(), h)].into(),
            ..Default::default()
        }
    }

    #[test]
    fn runtime_histograms_compare_with_their_buckets_as_the_interval() {
        // Before: 40 first tokens ≤ 0.04 s; after: 40 in (0.25, 0.5]; 40 of 400 requests failed.
        let before = span([40.0, 0.0, 0.0, 0.0], 400.0, 0.0);
        let after = span([0.0, 0.0, 40.0, 0.0], 400.0, 40.0);
        let rows = compare_runtime(&before, &after);
        let p50 = find(&rows, "ttft_p50_seconds");
        assert_eq!(
            (p50.source.as_str(), p50.verdict),
            ("runtime", "worse"),
            "{p50:?}"
        );
        let (b, a) = (p50.before.unwrap(), p50.after.unwrap());
        assert_eq!(
            (b.lo, b.hi, b.n),
            (0.0, 0.04, 40),
            "the bucket is the interval"
        );
        assert_eq!((a.lo, a.hi), (0.25, 0.5));
        assert!(b.lo <= b.value && b.value <= b.hi && a.lo <= a.value && a.value <= a.hi);
        let buckets = p50.bucket_bounds.unwrap();
        assert_eq!(buckets.after.unwrap().upper, Some(0.5));
        assert_eq!(buckets.before.unwrap().lower, 0.0);
        // The same histogram both sides: no change; ITL and E2E not reported: no data.
        let same = compare_runtime(&before, &before);
        assert_eq!(find(&same, "ttft_p95_seconds").verdict, "no_change");
        assert_eq!(find(&rows, "itl_p50_seconds").verdict, "insufficient_data");
        let err = find(&rows, "error_rate");
        assert_eq!((err.source.as_str(), err.verdict), ("runtime", "worse"));
        assert_eq!(err.after.unwrap().value, 0.1);
        // A tail in the +Inf bucket: unbounded above, serialised as null.
        let tail = span([20.0, 0.0, 0.0, 20.0], 40.0, 0.0);
        let rows = compare_runtime(&before, &tail);
        let p95 = find(&rows, "ttft_p95_seconds");
        assert!(p95.after.unwrap().hi.is_infinite());
        assert_eq!(
            p95.bucket_bounds.unwrap().after.unwrap().max_abs_error,
            None
        );
        let json = serde_json::to_value(p95).unwrap();
        assert_eq!(json["after"]["hi"], serde_json::Value::Null);
        assert_eq!(
            json["bucket_bounds"]["after"]["upper"],
            serde_json::Value::Null
        );
        assert!(
            serde_json::to_value(find(&compare_records(&[], &[]), "ttft_p50_seconds"))
                .unwrap()
                .get("bucket_bounds")
                .is_none()
        );
    }

    #[test]
    fn signal_directions() {
        assert_eq!(signal_direction("ttft_p99_seconds"), Better::Lower);
        assert_eq!(signal_direction("prefix_cache_hit_rate"), Better::Higher);
        assert_eq!(signal_direction("requests_per_second"), Better::Neither);
        let c = compare_signal(
            "kv_cache_usage",
            "scrape:vllm",
            &[0.5, 0.52, 0.51],
            &[0.9, 0.91, 0.92],
        );
        assert_eq!((c.verdict, c.source.as_str()), ("worse", "scrape:vllm"));
    }
}
