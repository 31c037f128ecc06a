// A built-in traffic generator for the demo: streaming chat and completion requests with
// varied prompt lengths, tenants, A/B groups and prompt versions, at a steady request rate.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Semaphore, watch};

const WORDS: [&str; 16] = [
    "explain",
    "the",
    "latency",
    "of",
    "a",
    "transformer",
    "serving",
    "stack",
    "with",
    "paged",
    "attention",
    "and",
    "continuous",
    "batching",
    "for",
    "tenants",
];
const TENANTS: [&str; 3] = ["acme", "globex", "initech"];

pub struct TrafficConfig {
    pub proxy: SocketAddr,
    pub models: Vec<String>,
    pub requests_per_second: f64,
    pub max_in_flight: usize,
    pub seed: u64,
}

fn prompt(rng: &mut StdRng) -> String {
    // Prompt length from ~16 to ~6000 tokens, most of them short (median ~70), so every
    // context bucket gets traffic while a healthy simulator stays well below KV-cache capacity.
    let u: f64 = rng.random();
    let tokens = 16f64 * (375f64).powf(u * u);
    // About 1.5 tokens per word of this vocabulary, so prompts stay within the model's context.
    let words = ((tokens / 1.5) as usize).max(4);
    (0..words)
        .map(|_| WORDS[rng.random_range(0..WORDS.len())])
        .collect::<Vec<_>>()
        .join(" ")
}

fn request_body(rng: &mut StdRng, model: &str) -> (String, String) {
    let text = prompt(rng);
    // One output cap for all requests: lengths then follow the serving model's own
    // distribution, so a length outlier means the outputs really changed.
    let max_tokens = 256;
    if rng.random_bool(0.8) {
        let body = serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": text}],
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_tokens": max_tokens,
        });
        ("/v1/chat/completions".into(), body.to_string())
    } else {
        let body = serde_json::json!({"model": model, "prompt": text, "stream": true, "max_tokens": max_tokens});
        ("/v1/completions".into(), body.to_string())
    }
}

/// Send traffic until `stop` turns true.
pub async fn run(cfg: TrafficConfig, mut stop: watch::Receiver<bool>) {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let permits = Arc::new(Semaphore::new(cfg.max_in_flight));
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let period = Duration::from_secs_f64(1.0 / cfg.requests_per_second.max(0.1));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            continue;
        };
        let model = &cfg.models[rng.random_range(0..cfg.models.len())];
        let (path, body) = request_body(&mut rng, model);
        let tenant = TENANTS[rng.random_range(0..TENANTS.len())];
        let ab = if rng.random_bool(0.9) { "a" } else { "b" };
        let prompt_version = if rng.random_bool(0.5) { "v1" } else { "v2" };
        let req = http::Request::post(format!("http://{}{}", cfg.proxy, path))
            .header("content-type", "application/json")
            .header("authorization", "Bearer demo-key")
            .header("x-tenant-id", tenant)
            .header("x-ab-group", ab)
            .header("x-prompt-version", prompt_version)
            .body(Full::new(Bytes::from(body)));
        let Ok(req) = req else { continue };
        let client = client.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match client.request(req).await {
                Ok(resp) => {
                    let _ = resp.into_body().collect().await;
                }
                Err(e) => tracing::debug!(error = %e, "demo request failed"),
            }
        });
    }
}
