// Shared helpers of the simulator's HTTP tests: start `serve` on 127.0.0.1:0, call it
// with a hyper client, split SSE bodies into frames.

use std::net::SocketAddr;
use std::time::Duration;

use axum::http::{Method, Request, StatusCode};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use tokenwatch_sim::{SimArgs, serve};
use tokio::sync::oneshot;

pub struct Sim {
    pub addr: SocketAddr,
    pub client: Client<HttpConnector, Full<Bytes>>,
    _stop: oneshot::Sender<()>,
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

pub fn fast_args(models: &[&str]) -> SimArgs {
    SimArgs {
        ttft_ms: 2.0,
        itl_ms: 1.0,
        max_tokens: 16,
        ..SimArgs::for_test(models)
    }
}

pub async fn start(args: SimArgs) -> Sim {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(serve(args, listener, async move {
        let _ = stopped.await;
    }));
    let client = Client::builder(TokioExecutor::new()).build_http();
    Sim {
        addr,
        client,
        _stop: stop,
    }
}

impl Sim {
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> Reply {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        let req = req
            .header("content-type", "application/json")
            .body(Full::new(body))
            .unwrap();
        let res = tokio::time::timeout(Duration::from_secs(20), self.client.request(req))
            .await
            .expect("response in time")
            .expect("request ok");
        let status = res.status();
        let headers = res.headers().clone();
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        Reply {
            status,
            headers,
            body: String::from_utf8(bytes.to_vec()).unwrap(),
        }
    }

    pub async fn post(&self, path: &str, body: Value) -> Reply {
        self.call(Method::POST, path, Some(body), &[]).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.call(Method::GET, path, None, &[]).await
    }

    pub async fn raw_post(&self, path: &str, body: &'static str) -> Reply {
        let req = Request::post(format!("http://{}{path}", self.addr))
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let res = self.client.request(req).await.unwrap();
        let status = res.status();
        let headers = res.headers().clone();
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        Reply {
            status,
            headers,
            body: String::from_utf8(bytes.to_vec()).unwrap(),
        }
    }
}

pub fn sse_frames(body: &str) -> Vec<&str> {
    body.split("\n\n")
        .filter(|f| !f.is_empty())
        .map(|f| {
            f.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("bad frame {f:?}"))
        })
        .collect()
}

/// Frames of a named-event SSE body (`event: NAME` + `data: JSON`), checking that each
/// event's name matches its `type` and that no `[DONE]` line follows.
pub fn named_events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|f| !f.is_empty())
        .map(|f| {
            let (head, data) = f
                .split_once('\n')
                .unwrap_or_else(|| panic!("bad frame {f:?}"));
            let name = head
                .strip_prefix("event: ")
                .unwrap_or_else(|| panic!("no event line in {f:?}"));
            let data = data
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("no data line in {f:?}"));
            let v: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}"));
            assert_eq!(v["type"], name, "type differs from event name: {f}");
            (name.to_string(), v)
        })
        .collect()
}

impl Sim {
    /// POST a streaming request and time it: (to the response headers, to the first body
    /// bytes that contain a `data:` line, to the end), plus the whole body.
    pub async fn timed_stream(
        &self,
        path: &str,
        body: Value,
    ) -> (Duration, Duration, Duration, String) {
        let req = Request::post(format!("http://{}{path}", self.addr))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let t0 = std::time::Instant::now();
        let res = tokio::time::timeout(Duration::from_secs(20), self.client.request(req))
            .await
            .expect("response in time")
            .expect("request ok");
        let headers_at = t0.elapsed();
        assert_eq!(res.status(), StatusCode::OK);
        let mut body = res.into_body();
        let mut text = String::new();
        let mut first_data = None;
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.expect("body frame").into_data() {
                text.push_str(std::str::from_utf8(&data).unwrap());
                if first_data.is_none() && text.contains("data: ") {
                    first_data = Some(t0.elapsed());
                }
            }
        }
        (
            headers_at,
            first_data.expect("a data line"),
            t0.elapsed(),
            text,
        )
    }
}
