// Exposition parsing throughput: the real vLLM and dcgm-exporter samples scaled to ~10,000 series,
// our parser against the `prometheus-parse` crate and a naive lines()+split tokenizer in the same
// run. `cargo bench --bench exposition`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use tokenwatch_core::exposition::{Format, parse};

const TARGET_SERIES: usize = 10_000;
const ROUND: Duration = Duration::from_secs(1);
const ROUNDS: usize = 5;

fn fixture(name: &str) -> String {
    let path = format!("{}/../../fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// Replaces the value of `label="..."` in `line`, if present.
fn set_label(line: &str, label: &str, value: &str) -> Option<String> {
    let key = format!("{label}=\"");
    let start = line.find(&key)? + key.len();
    let end = start + line[start..].find('"')?;
    Some(format!("{}{value}{}", &line[..start], &line[end..]))
}

/// Varies one series per replica: `model_name="m{i}"`, `gpu="{i}"`, else an added `replica` label.
fn replica_line(line: &str, i: usize) -> String {
    if let Some(l) = set_label(line, "model_name", &format!("m{i}")) {
        return l;
    }
    if let Some(l) = set_label(line, "gpu", &i.to_string()) {
        return l;
    }
    match line.find(['{', ' ']) {
        Some(at) if line.as_bytes()[at] == b'{' => {
            format!("{}{{replica=\"{i}\",{}", &line[..at], &line[at + 1..])
        }
        Some(at) => format!("{}{{replica=\"{i}\"}}{}", &line[..at], &line[at..]),
        None => line.to_string(),
    }
}

/// Keeps each family's HELP/TYPE once and repeats its samples until ~10,000 series.
fn scale(text: &str) -> (String, usize) {
    let series = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .count();
    let replicas = TARGET_SERIES.div_ceil(series);
    let mut out = String::with_capacity(text.len() * replicas);
    let mut block: Vec<&str> = Vec::new();
    let flush = |block: &mut Vec<&str>, out: &mut String| {
        for i in 0..replicas {
            for line in block.iter() {
                out.push_str(&replica_line(line, i));
                out.push('\n');
            }
        }
        block.clear();
    };
    for line in text.lines() {
        if line.starts_with('#') {
            flush(&mut block, &mut out);
            out.push_str(line);
            out.push('\n');
        } else if !line.is_empty() {
            block.push(line);
        }
    }
    flush(&mut block, &mut out);
    (out, series * replicas)
}

type NaiveSample<'a> = (&'a str, Vec<(&'a str, &'a str)>, f64);

/// The in-run baseline: what a quick `lines()` + `split` tokenizer does, with no validation,
/// no escapes, no family grouping (label values with ',' would even split wrongly).
fn naive(text: &str) -> Vec<NaiveSample<'_>> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (series, rest) = match line.rfind('}') {
            Some(i) => line.split_at(i + 1),
            None => line.split_once(' ').unwrap_or((line, "")),
        };
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        let labels = labels
            .trim_end_matches('}')
            .split(',')
            .filter_map(|pair| pair.split_once('='))
            .map(|(k, v)| (k, v.trim_matches('"')))
            .collect();
        let value = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN);
        out.push((name, labels, value));
    }
    out
}

/// Runs `f` repeatedly for one round of [`ROUND`]; returns MB/s (10^6 bytes) on one core.
fn round(bytes: usize, f: &mut impl FnMut() -> usize) -> f64 {
    let start = Instant::now();
    let mut iterations = 0u64;
    while start.elapsed() < ROUND {
        black_box(f());
        iterations += 1;
    }
    (bytes as f64 * iterations as f64) / start.elapsed().as_secs_f64() / 1e6
}

/// Median and best MB/s over [`ROUNDS`] rounds of each parser, the parsers interleaved so that
/// background load hits all alike.
fn measure<const N: usize>(
    bytes: usize,
    mut parsers: [&mut dyn FnMut() -> usize; N],
) -> [(f64, f64); N] {
    for _ in 0..3 {
        for f in parsers.iter_mut() {
            black_box(f());
        }
    }
    let mut rates: [Vec<f64>; N] = std::array::from_fn(|_| Vec::new());
    for _ in 0..ROUNDS {
        for (f, r) in parsers.iter_mut().zip(rates.iter_mut()) {
            r.push(round(bytes, f));
        }
    }
    rates.map(|mut v| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[v.len() - 1])
    })
}

/// The `prometheus-parse` crate as its users call it: lines as owned strings into
/// `Scrape::parse`; returns the samples it kept.
fn crate_parse(text: &str) -> usize {
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    prometheus_parse::Scrape::parse(lines).map_or(0, |s| s.samples.len())
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument selects inputs by name.
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "exposition parsing, one thread; median (best) of {ROUNDS} x {}s rounds; {cpus} CPUs, load average {}",
        ROUND.as_secs(),
        load.join(" ")
    );
    println!(
        "{:<6} {:>7} {:>9} {:>18} {:>22} {:>18} {:>14} {:>9} {:>9}",
        "input",
        "series",
        "bytes",
        "ours MB/s",
        "prometheus-parse MB/s",
        "naive MB/s",
        "ours series/s",
        "vs crate",
        "vs naive"
    );
    for (label, file) in [("vllm", "vllm-metrics.txt"), ("dcgm", "dcgm-exporter.txt")] {
        if filter.as_deref().is_some_and(|f| !label.contains(f)) {
            continue;
        }
        let (text, series) = scale(&fixture(file));
        let parsed = parse(&text, Format::PrometheusText).expect("scaled sample parses");
        let parsed_series: usize = parsed.iter().map(|f| f.samples.len()).sum();
        assert_eq!(parsed_series, series);
        assert_eq!(naive(&text).len(), series);
        // The crate keeps every sample line it can read (a histogram's buckets folded into one
        // sample per series), so its count differs; it must read the input.
        assert!(crate_parse(&text) > 0, "prometheus-parse read no sample");
        let [(ours, ours_best), (krate, krate_best), (base, base_best)] = measure(
            text.len(),
            [
                &mut || parse(black_box(&text), Format::PrometheusText).map_or(0, |f| f.len()),
                &mut || crate_parse(black_box(&text)),
                &mut || naive(black_box(&text)).len(),
            ],
        );
        let series_per_s = ours * 1e6 / text.len() as f64 * series as f64;
        println!(
            "{label:<6} {series:>7} {:>9} {:>18} {:>22} {:>18} {series_per_s:>14.0} {:>8.2}x {:>8.2}x",
            text.len(),
            format!("{ours:.1} ({ours_best:.1})"),
            format!("{krate:.1} ({krate_best:.1})"),
            format!("{base:.1} ({base_best:.1})"),
            ours / krate,
            ours / base
        );
    }
}
