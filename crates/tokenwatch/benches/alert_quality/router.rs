// The load balancer in front of a model's replicas (an Ingress, a mesh sidecar, nginx with a
// `random` upstream): every HTTP request goes to a replica drawn at random and its response
// streams back as it comes. Whoever sits in front (tokenwatch's proxy, or clients) sees one
// upstream; only the replicas' own /metrics say which of them served what.
//
// Per request, not per connection: an L4 balancer (kube-proxy) behind a pooling client pins
// every request of a kept-alive connection to one replica, so a replica can see no traffic at
// all — real, but then there is nothing to detect on it.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::serve::ListenerExt;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::task::JoinHandle;

pub struct Router {
    pub addr: SocketAddr,
    /// Requests forwarded so far, per backend (in the order given).
    pub requests: Arc<Vec<AtomicU64>>,
    task: JoinHandle<()>,
}

#[derive(Clone)]
struct Shared {
    backends: Arc<Vec<SocketAddr>>,
    requests: Arc<Vec<AtomicU64>>,
    /// The draw of a replica per request (seeded: a run can be replayed).
    rng: Arc<Mutex<StdRng>>,
    client: Client<HttpConnector, Body>,
}

async fn forward(State(s): State<Shared>, mut req: Request) -> Response {
    let i = s
        .rng
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .random_range(0..s.backends.len());
    s.requests[i].fetch_add(1, Ordering::Relaxed);
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let Ok(uri) = format!("http://{}{path}", s.backends[i]).parse() else {
        return (http::StatusCode::BAD_REQUEST, "bad path").into_response();
    };
    *req.uri_mut() = uri;
    req.headers_mut().remove(http::header::HOST);
    match s.client.request(req).await {
        Ok(resp) => {
            let (parts, body) = resp.into_parts();
            Response::from_parts(parts, Body::new(body.map_err(axum::Error::new)))
        }
        Err(e) => (http::StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}

impl Router {
    pub async fn start(backends: Vec<SocketAddr>, seed: u64) -> Router {
        assert!(!backends.is_empty(), "a router needs at least one backend");
        let requests: Arc<Vec<AtomicU64>> =
            Arc::new(backends.iter().map(|_| AtomicU64::new(0)).collect());
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let shared = Shared {
            backends: Arc::new(backends),
            requests: requests.clone(),
            rng: Arc::new(Mutex::new(StdRng::seed_from_u64(seed))),
            client: Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector),
        };
        let app = axum::Router::new().fallback(forward).with_state(shared);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the router");
        let addr = listener.local_addr().expect("router address");
        let task = tokio::spawn(async move {
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let _ = axum::serve(listener, app).await;
        });
        Router {
            addr,
            requests,
            task,
        }
    }

    pub fn line(&self) -> String {
        let v: Vec<String> = self
            .requests
            .iter()
            .map(|c| c.load(Ordering::Relaxed).to_string())
            .collect();
        format!("requests per replica: {}", v.join("/"))
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        self.task.abort();
    }
}
