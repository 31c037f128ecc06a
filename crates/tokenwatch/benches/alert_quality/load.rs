// Load as hard as real traffic: Poisson arrivals whose rate swings (sinusoid + bounded random
// walk), log-normal prompts with a Pareto tail, log-normal max_tokens, a drifting model mix.

use super::fleet::Entry;
use super::procs::client;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{Semaphore, watch};

#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// Models and their mean share of the traffic.
    pub models: Vec<(String, f64)>,
    /// Mean requests per second over all models.
    pub mean_rps: f64,
    /// Amplitude of the sinusoidal swing of the rate (0.3 = ±30 %).
    pub swing: f64,
    pub swing_period_s: f64,
    /// Largest excursion of the random walk on top of the sinusoid (0.1 = ±10 %).
    pub walk: f64,
    /// The rate never leaves mean × [1 − limit, 1 + limit].
    pub limit: f64,
    /// Model shares drift by up to this much (absolute) over `swing_period_s × 2.7`.
    pub mix_drift: f64,
    /// Prompt tokens: log-normal (median, sigma), and a Pareto tail (share, scale, alpha).
    pub prompt_median: f64,
    pub prompt_sigma: f64,
    pub prompt_tail: (f64, f64, f64),
    pub prompt_max: f64,
    /// max_tokens: log-normal (median, sigma), clamped to [min, max].
    pub max_tokens_median: f64,
    pub max_tokens_sigma: f64,
    pub max_tokens_range: (u32, u32),
    pub max_in_flight: usize,
    pub seed: u64,
}

impl LoadSpec {
    /// The benchmark's default: ±40 % swings, long-tailed prompts and outputs.
    pub fn heavy(models: &[(&str, f64)], mean_rps: f64, seed: u64) -> LoadSpec {
        LoadSpec {
            models: models.iter().map(|(m, s)| (m.to_string(), *s)).collect(),
            mean_rps,
            swing: 0.3,
            swing_period_s: 240.0,
            walk: 0.1,
            limit: 0.4,
            mix_drift: 0.1,
            prompt_median: 180.0,
            prompt_sigma: 1.0,
            prompt_tail: (0.04, 900.0, 1.3),
            prompt_max: 6000.0,
            max_tokens_median: 160.0,
            max_tokens_sigma: 0.8,
            max_tokens_range: (8, 2048),
            max_in_flight: 512,
            seed,
        }
    }
}

/// What the generator did; read while it runs.
#[derive(Debug, Default)]
pub struct LoadStats {
    pub sent: AtomicU64,
    pub ok: AtomicU64,
    /// Non-2xx answers and transport failures.
    pub failed: AtomicU64,
    /// Arrivals skipped because `max_in_flight` requests were open.
    pub skipped: AtomicU64,
}

impl LoadStats {
    pub fn line(&self) -> String {
        format!(
            "{} sent, {} ok, {} failed, {} skipped (in-flight cap)",
            self.sent.load(Ordering::Relaxed),
            self.ok.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
            self.skipped.load(Ordering::Relaxed)
        )
    }
}

fn normal(rng: &mut StdRng) -> f64 {
    let u1: f64 = rng.random::<f64>().max(1e-12);
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

const WORDS: [&str; 24] = [
    "summarise",
    "the",
    "incident",
    "report",
    "for",
    "our",
    "gpu",
    "cluster",
    "and",
    "list",
    "every",
    "latency",
    "regression",
    "seen",
    "after",
    "the",
    "rollout",
    "of",
    "paged",
    "attention",
    "with",
    "speculative",
    "decoding",
    "please",
];
const SYSTEM: [&str; 5] = [
    "You are a helpful assistant.",
    "You are a support agent for an online shop. Answer briefly and politely.",
    "You are a senior SRE. Explain causes and give concrete next steps.",
    "Translate the user's text into French, keeping the formatting.",
    "You write SQL for a PostgreSQL 16 database. Answer with one query only.",
];

/// Text of about `tokens` tokens (the simulator counts 4 characters per token).
fn text(rng: &mut StdRng, tokens: usize) -> String {
    let chars = tokens * 4;
    let mut s = String::with_capacity(chars + 16);
    while s.len() < chars {
        s.push_str(WORDS[rng.random_range(0..WORDS.len())]);
        s.push(' ');
    }
    s
}

struct Shape {
    start: tokio::time::Instant,
    walk: f64,
    phase: f64,
}

impl Shape {
    /// The rate multiplier now, advancing the random walk by `dt` seconds.
    fn factor(&mut self, spec: &LoadSpec, rng: &mut StdRng, dt: f64) -> f64 {
        let t = self.start.elapsed().as_secs_f64();
        // A mean-reverting walk (about 2 minutes) bounded by ±walk.
        self.walk += -self.walk * dt / 120.0 + spec.walk * 0.25 * dt.sqrt() * normal(rng);
        self.walk = self.walk.clamp(-spec.walk, spec.walk);
        let sin = (std::f64::consts::TAU * t / spec.swing_period_s + self.phase).sin();
        (1.0 + spec.swing * sin + self.walk).clamp(1.0 - spec.limit, 1.0 + spec.limit)
    }

    /// Model shares now: each drifts slowly around its mean share.
    fn pick_model<'a>(&self, spec: &'a LoadSpec, rng: &mut StdRng) -> &'a str {
        let t = self.start.elapsed().as_secs_f64();
        let period = spec.swing_period_s * 2.7;
        let weights: Vec<f64> = spec
            .models
            .iter()
            .enumerate()
            .map(|(i, (_, share))| {
                let d =
                    spec.mix_drift * (std::f64::consts::TAU * t / period + i as f64 * 2.1).sin();
                (share + d).max(0.02)
            })
            .collect();
        let mut u = rng.random::<f64>() * weights.iter().sum::<f64>();
        for (i, w) in weights.iter().enumerate() {
            if u < *w {
                return &spec.models[i].0;
            }
            u -= w;
        }
        &spec.models[spec.models.len() - 1].0
    }
}

fn request(spec: &LoadSpec, rng: &mut StdRng, model: &str) -> (&'static str, String, String) {
    let prompt = if rng.random_bool(spec.prompt_tail.0) {
        let (_, scale, alpha) = spec.prompt_tail;
        scale * rng.random::<f64>().max(1e-9).powf(-1.0 / alpha)
    } else {
        spec.prompt_median * (spec.prompt_sigma * normal(rng)).exp()
    };
    let prompt = prompt.clamp(4.0, spec.prompt_max) as usize;
    let (lo, hi) = spec.max_tokens_range;
    let max_tokens = (spec.max_tokens_median * (spec.max_tokens_sigma * normal(rng)).exp())
        .clamp(f64::from(lo), f64::from(hi)) as u32;
    let tenant = format!("tenant-{}", (rng.random::<f64>().powi(2) * 8.0) as u32);
    if rng.random_bool(0.85) {
        let system = SYSTEM[(rng.random::<f64>().powi(2) * SYSTEM.len() as f64) as usize];
        let body = serde_json::json!({
            "model": model,
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_tokens": max_tokens,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": text(rng, prompt)},
            ],
        });
        ("/v1/chat/completions", body.to_string(), tenant)
    } else {
        let body = serde_json::json!({
            "model": model, "stream": true, "max_tokens": max_tokens, "prompt": text(rng, prompt),
        });
        ("/v1/completions", body.to_string(), tenant)
    }
}

/// The address for one request to `model`: the proxy, or one of the model's replicas at random.
fn target(entry: &Entry, model: &str, rng: &mut StdRng) -> Option<SocketAddr> {
    match entry {
        Entry::One(a) => Some(*a),
        Entry::PerModel(m) => {
            let v = m.get(model).filter(|v| !v.is_empty())?;
            Some(v[rng.random_range(0..v.len())])
        }
    }
}

/// Send traffic to `entry` until `stop` turns true.
pub fn spawn(entry: Entry, spec: LoadSpec, mut stop: watch::Receiver<bool>) -> Arc<LoadStats> {
    let stats = Arc::new(LoadStats::default());
    let st = stats.clone();
    tokio::spawn(async move {
        let c = client();
        let permits = Arc::new(Semaphore::new(spec.max_in_flight));
        let mut rng = StdRng::seed_from_u64(spec.seed);
        let mut shape = Shape {
            start: tokio::time::Instant::now(),
            walk: 0.0,
            phase: rng.random::<f64>() * std::f64::consts::TAU,
        };
        let mut dt = 0.0;
        loop {
            let rate = (spec.mean_rps * shape.factor(&spec, &mut rng, dt)).max(0.01);
            // Exponential inter-arrival time at the current rate.
            dt = -rng.random::<f64>().max(1e-12).ln() / rate;
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs_f64(dt)) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                st.skipped.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let model = shape.pick_model(&spec, &mut rng).to_string();
            let (path, body, tenant) = request(&spec, &mut rng, &model);
            let Some(to) = target(&entry, &model, &mut rng) else {
                continue;
            };
            let req = http::Request::post(format!("http://{to}{path}"))
                .header("content-type", "application/json")
                .header("authorization", format!("Bearer sk-{tenant}"))
                .body(Full::new(Bytes::from(body)));
            let Ok(req) = req else { continue };
            st.sent.fetch_add(1, Ordering::Relaxed);
            let (c, st) = (c.clone(), st.clone());
            tokio::spawn(async move {
                let _permit = permit;
                let done = tokio::time::timeout(Duration::from_secs(180), async {
                    let resp = c.request(req).await.map_err(|_| ())?;
                    let ok = resp.status().is_success();
                    resp.into_body().collect().await.map_err(|_| ())?;
                    Ok::<bool, ()>(ok)
                })
                .await;
                match done {
                    Ok(Ok(true)) => st.ok.fetch_add(1, Ordering::Relaxed),
                    _ => st.failed.fetch_add(1, Ordering::Relaxed),
                };
            });
        }
    });
    stats
}
