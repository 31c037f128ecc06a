// Span sampling benchmark (issue 13 item 4): on a generated trace set whose critical paths are
// known, the share of critical paths the tail sampler keeps, the volume reduction and its speed.
//
// Run: `cargo bench -p tokenwatch --bench span_sampling`. Knobs (environment variables, defaults
// in brackets):
//   TW_BENCH_TRACES [20000]   traces generated
//   TW_BENCH_SEED [13]        generator seed
//   TW_BENCH_BASE_RATE [the `traces.sampling.base_rate` default]
//   TW_BENCH_OUT [<workspace>/target/bench-span-sampling.md]
//
// Traces: a spine of depth 2–8 (gateway → agent → router → LLM call → engine …) with fan-outs
// hanging off it (retrieval, tool and embedding calls, 4–32 children, a few of them with a
// sub-tree of their own) that join again in their parent. Durations are log-normal per
// component (σ 0.6) with a Pareto tail on 3 % of spans. 3 % of traces carry one error span at a
// random place, 3 % have one component slowed 8–20×. Ground truth, from the generation: every
// error span, every slowed span and every span with two or more children (fan-in) is critical;
// its critical path is the span and all its ancestors. A path counts as kept when every span of
// it is stored. Both passes buffer spans per trace id as the sampler thread does; the baseline
// then keeps everything, the sampler decides each trace (`Sampler::decide`).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Instant;
use tokenwatch::pipeline::span_sampler::{Sampler, SamplingConfig};
use tokenwatch_store::SpanRow;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a valid value")),
        Err(_) => default,
    }
}

/// (service, span name, median seconds) along the spine, by depth.
const SPINE: [(&str, &str, f64); 9] = [
    ("gateway", "POST /v1/chat/completions", 0.004),
    ("agent", "agent.step", 0.002),
    ("router", "route", 0.001),
    ("llm-client", "chat gpt-oss", 0.003),
    ("vllm", "llm_request", 0.050),
    ("vllm", "scheduler.queue", 0.010),
    ("vllm", "model.prefill", 0.030),
    ("vllm", "model.decode", 0.200),
    ("vllm", "detokenize", 0.002),
];
/// Components of fan-out children.
const FAN: [(&str, &str, f64); 4] = [
    ("retriever", "vector.search", 0.015),
    ("tools", "tool.call", 0.040),
    ("embedder", "embed.chunk", 0.008),
    ("cache", "kv.lookup", 0.001),
];

struct Generated {
    spans: Vec<SpanRow>,
    /// Indices of the ground-truth critical spans.
    critical: Vec<usize>,
    /// Parent index of each span.
    parent: Vec<Option<usize>>,
}

struct Gen {
    rng: StdRng,
    next_id: u64,
}

impl Gen {
    fn id(&mut self) -> String {
        self.next_id += 1;
        format!("{:016x}", self.next_id.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }

    fn normal(&mut self) -> f64 {
        let u1: f64 = self.rng.random::<f64>().max(1e-12);
        let u2: f64 = self.rng.random();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// A heavy-tailed duration around `median` seconds.
    fn duration(&mut self, median: f64) -> f64 {
        let mut d = median * (0.6 * self.normal()).exp();
        if self.rng.random::<f64>() < 0.03 {
            let u: f64 = self.rng.random::<f64>().max(1e-9);
            d *= u.powf(-1.0 / 1.5);
        }
        d
    }

    fn trace(&mut self, t: usize) -> Generated {
        let trace_id = format!("{:032x}", (t as u128 + 1) * 0x1000_0000_0000_0001);
        let mut spans: Vec<SpanRow> = Vec::new();
        let mut parent: Vec<Option<usize>> = Vec::new();
        let depth = self.rng.random_range(2..=8usize);
        let mut push = |g: &mut Gen, p: Option<usize>, comp: (&'static str, &'static str, f64)| {
            let secs = g.duration(comp.2);
            let parent_id = p
                .map(|i: usize| spans[i].span_id.clone())
                .unwrap_or_default();
            spans.push(SpanRow {
                trace_id: trace_id.clone(),
                span_id: g.id(),
                parent_span_id: parent_id,
                name: comp.1.into(),
                service_name: comp.0.into(),
                kind: 2,
                start_unix_nano: 1_700_000_000_000_000_000 + t as i64 * 1_000_000_000,
                end_unix_nano: 1_700_000_000_000_000_000
                    + t as i64 * 1_000_000_000
                    + (secs * 1e9) as i64,
                attributes_json: "{}".into(),
                ..SpanRow::default()
            });
            parent.push(p);
            spans.len() - 1
        };
        let mut prev = push(self, None, SPINE[0]);
        for d in 1..=depth {
            let here = push(self, Some(prev), SPINE[d.min(SPINE.len() - 1)]);
            if self.rng.random::<f64>() < 0.35 {
                let comp = FAN[self.rng.random_range(0..FAN.len())];
                let k = self.rng.random_range(4..=32usize);
                for _ in 0..k {
                    let child = push(self, Some(here), comp);
                    if self.rng.random::<f64>() < 0.05 {
                        let sub = FAN[self.rng.random_range(0..FAN.len())];
                        for _ in 0..self.rng.random_range(1..=3usize) {
                            push(self, Some(child), sub);
                        }
                    }
                }
            }
            prev = here;
        }
        let n = spans.len();
        let mut critical = Vec::new();
        if self.rng.random::<f64>() < 0.03 {
            let i = self.rng.random_range(0..n);
            spans[i].status_code = 2;
            critical.push(i);
        }
        if self.rng.random::<f64>() < 0.03 {
            let pick = self.rng.random_range(0..n);
            let (svc, name) = (spans[pick].service_name.clone(), spans[pick].name.clone());
            let factor = self.rng.random_range(8.0..20.0);
            for (i, s) in spans.iter_mut().enumerate() {
                if s.service_name == svc && s.name == name {
                    let d = (s.end_unix_nano - s.start_unix_nano) as f64 * factor;
                    s.end_unix_nano = s.start_unix_nano + d as i64;
                    critical.push(i);
                }
            }
        }
        let mut children = vec![0usize; n];
        for p in parent.iter().flatten() {
            children[*p] += 1;
        }
        critical.extend((0..n).filter(|i| children[*i] >= 2));
        critical.sort_unstable();
        critical.dedup();
        Generated {
            spans,
            critical,
            parent,
        }
    }
}

/// Spans grouped per trace as the sampler thread buffers them.
fn buffer(spans: Vec<SpanRow>) -> Vec<Vec<SpanRow>> {
    let mut by_trace: HashMap<String, Vec<SpanRow>> = HashMap::new();
    let mut order = Vec::new();
    for s in spans {
        match by_trace.get_mut(s.trace_id.as_str()) {
            Some(v) => v.push(s),
            None => {
                order.push(s.trace_id.clone());
                by_trace.insert(s.trace_id.clone(), vec![s]);
            }
        }
    }
    order
        .into_iter()
        .filter_map(|t| by_trace.remove(&t))
        .collect()
}

fn main() {
    let defaults = SamplingConfig::default();
    let n_traces: usize = env_or("TW_BENCH_TRACES", 20_000).max(1);
    let seed: u64 = env_or("TW_BENCH_SEED", 13);
    let base_rate: f64 = env_or("TW_BENCH_BASE_RATE", defaults.base_rate);
    let out = env_or(
        "TW_BENCH_OUT",
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../target/bench-span-sampling.md"
        )
        .to_string(),
    );
    let cfg = SamplingConfig {
        enabled: true,
        base_rate,
        ..defaults
    };

    let mut generator = Gen {
        rng: StdRng::seed_from_u64(seed),
        next_id: seed,
    };
    let traces: Vec<Generated> = (0..n_traces).map(|t| generator.trace(t)).collect();
    let all: Vec<SpanRow> = traces
        .iter()
        .flat_map(|g| g.spans.iter().cloned())
        .collect();
    let total = all.len();

    // Baseline: buffer per trace, keep everything.
    let input = all.clone();
    let started = Instant::now();
    let mut kept_all = 0usize;
    for trace in buffer(input) {
        kept_all += trace.len();
        std::hint::black_box(&trace);
    }
    let baseline_s = started.elapsed().as_secs_f64();
    assert_eq!(kept_all, total);

    // The sampler, on the same stream.
    let input = all.clone();
    let mut sampler = Sampler::new(&cfg);
    let started = Instant::now();
    let mut kept: Vec<SpanRow> = Vec::new();
    for trace in buffer(input) {
        kept.extend(sampler.decide(trace).kept);
    }
    let sampler_s = started.elapsed().as_secs_f64();

    let kept_ids: std::collections::HashSet<(&str, &str)> = kept
        .iter()
        .map(|s| (s.trace_id.as_str(), s.span_id.as_str()))
        .collect();
    let (mut paths, mut paths_kept) = (0usize, 0usize);
    let mut by_kind: HashMap<&str, (usize, usize)> = HashMap::new();
    for g in &traces {
        let stored = |i: usize| {
            kept_ids.contains(&(g.spans[i].trace_id.as_str(), g.spans[i].span_id.as_str()))
        };
        let mut children = vec![0usize; g.spans.len()];
        for p in g.parent.iter().flatten() {
            children[*p] += 1;
        }
        for &c in &g.critical {
            let kind = if g.spans[c].status_code == 2 {
                "error"
            } else if children[c] >= 2 {
                "fan-in"
            } else {
                "slow component"
            };
            let mut ok = stored(c);
            let mut cur = g.parent[c];
            while let Some(p) = cur {
                ok &= stored(p);
                cur = g.parent[p];
            }
            paths += 1;
            paths_kept += usize::from(ok);
            let e = by_kind.entry(kind).or_insert((0, 0));
            e.0 += 1;
            e.1 += usize::from(ok);
        }
    }
    let share = paths_kept as f64 / paths.max(1) as f64;
    let reduction = total as f64 / kept.len().max(1) as f64;
    let estimated: f64 = kept
        .iter()
        .filter_map(|s| {
            let v: serde_json::Value = serde_json::from_str(&s.attributes_json).ok()?;
            v["tokenwatch.sampling.weight"].as_f64()
        })
        .sum();

    let mut md = String::new();
    let _ = writeln!(md, "# Span sampling\n");
    let _ = writeln!(
        md,
        "{n_traces} generated traces, {total} spans (seed {seed}); `base_rate` {base_rate}, warm-up {} spans per component; {} components. Build: {}.\n",
        cfg.warmup_spans,
        sampler.components(),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    let _ = writeln!(md, "| measure | value | target |");
    let _ = writeln!(md, "|---|---:|---:|");
    let _ = writeln!(
        md,
        "| critical paths kept | {:.2} % ({paths_kept} of {paths}) | ≥ 99 % |",
        share * 100.0
    );
    for kind in ["error", "slow component", "fan-in"] {
        if let Some((n, k)) = by_kind.get(kind) {
            let _ = writeln!(
                md,
                "| … {kind} | {:.2} % ({k} of {n}) | |",
                *k as f64 / (*n).max(1) as f64 * 100.0
            );
        }
    }
    let _ = writeln!(md, "| spans stored | {} of {total} | |", kept.len());
    let _ = writeln!(md, "| volume reduction | {reduction:.2}× | ≥ 4× |");
    let _ = writeln!(
        md,
        "| spans re-estimated from weights | {:.0} ({:+.1} % of {total}) | |",
        estimated,
        (estimated / total as f64 - 1.0) * 100.0
    );
    let _ = writeln!(
        md,
        "| sampler throughput | {:.0} spans/s | |",
        total as f64 / sampler_s
    );
    let _ = writeln!(
        md,
        "| keep-everything baseline | {:.0} spans/s | |",
        total as f64 / baseline_s
    );
    print!("{md}");
    if let Some(dir) = std::path::Path::new(&out).parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    match std::fs::write(&out, &md) {
        Ok(()) => eprintln!("written to {out}"),
        Err(e) => eprintln!("could not write {out}: {e}"),
    }
}
