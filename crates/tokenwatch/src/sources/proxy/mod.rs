// The streaming proxy source (spec 1.1): forwards requests to OpenAI-compatible upstreams,
// streams responses back untouched, and records one `RequestRecord` per LLM request.

pub mod config;
pub mod endpoint;
pub mod identity;
mod models;
pub mod prefix;
mod route;
pub mod source;
use crate::kernel::splits as split;
pub mod sse;
mod tap;

pub use route::Router as UpstreamRouter;

use crate::kernel::queue::TelemetryQueue;
use crate::listen::limits::BodyReadError;
use crate::sources::proxy::config::ProxyConfig;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::{Client, ResponseFuture};
use hyper_util::rt::TokioExecutor;
use identity::TraceParent;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tap::{InFlight, TapBody};
use tokenwatch_core::clock::now_unix_ms;
use tokenwatch_core::model::{ErrorClass, ProxySpan, RequestRecord, SeriesLabels};
use tokio::time::Instant;

pub use tokenwatch_core::model::UNKNOWN_MODEL;
const REQUEST_ID: &str = "x-request-id";
const TRACEPARENT: &str = "traceparent";

pub struct ProxyState {
    /// The client for plain-http upstreams (HTTP/1.1).
    client: Client<HttpConnector, Full<Bytes>>,
    /// The routes and their HTTPS clients, read once per request: a configuration reload
    /// swaps them (`swap_routes`) while requests in flight keep the set they started with.
    routing: RwLock<Arc<Routing>>,
    /// How the HTTPS clients of new routes are built.
    client_builder: hyper_util::client::legacy::Builder,
    connect_timeout: Duration,
    queue: TelemetryQueue,
    salt: Vec<u8>,
    tenant_header: String,
    ab_group_header: String,
    model_version_header: String,
    prompt_version_header: String,
    /// `proxy.path_prefixes`, normalised (see `endpoint::llm_endpoint`).
    path_prefixes: Vec<String>,
    response_timeout: Duration,
    idle_timeout: Duration,
    max_body: usize,
    /// The bytes of request bodies held at once over all connections
    /// (`limits.max_buffered_body_bytes`).
    body_budget: crate::listen::limits::BodyBudget,
    /// Text capture settings, when `capture.text` is on.
    capture: Option<crate::capture::CaptureConfig>,
    /// Where the routes' splits are published (the rollback controller and the API read them).
    splits: Arc<split::SplitBoard>,
    /// Responses being forwarded now (`in_flight`; shutdown drains them).
    active: Arc<std::sync::atomic::AtomicUsize>,
}

impl ProxyState {
    pub fn new(
        cfg: &ProxyConfig,
        routes: UpstreamRouter,
        queue: TelemetryQueue,
        salt: Vec<u8>,
        splits: Arc<split::SplitBoard>,
    ) -> ProxyState {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(cfg.connect_timeout.0));
        let mut builder = Client::builder(TokioExecutor::new());
        builder
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(1024);
        let client = builder.build(connector);
        splits.publish(routes.splits().to_vec());
        let routing = Routing::new(routes, &builder, cfg.connect_timeout.0);
        ProxyState {
            client,
            routing: RwLock::new(Arc::new(routing)),
            client_builder: builder,
            connect_timeout: cfg.connect_timeout.0,
            queue,
            salt,
            tenant_header: cfg.tenant_header.to_ascii_lowercase(),
            ab_group_header: cfg.ab_group_header.to_ascii_lowercase(),
            model_version_header: cfg.model_version_header.to_ascii_lowercase(),
            prompt_version_header: cfg.prompt_version_header.to_ascii_lowercase(),
            path_prefixes: endpoint::normalised_prefixes(&cfg.path_prefixes),
            response_timeout: cfg.response_timeout.0,
            idle_timeout: cfg.idle_timeout.0,
            max_body: cfg.max_request_body_bytes,
            body_budget: crate::listen::limits::BodyBudget::new(
                crate::listen::limits::LimitsConfig::default().max_buffered_body_bytes,
            ),
            capture: None,
            splits,
            active: Arc::default(),
        }
    }

    /// Hold at most this budget of request bodies at once (`limits.max_buffered_body_bytes`).
    pub fn with_body_budget(mut self, budget: crate::listen::limits::BodyBudget) -> ProxyState {
        self.body_budget = budget;
        self
    }

    /// Keep each LLM request's body and response bytes for text capture (`capture.text`).
    pub fn with_capture(mut self, cfg: &crate::capture::CaptureConfig) -> ProxyState {
        self.capture = (cfg.text || cfg.embeddings.enabled).then(|| cfg.clone());
        self
    }

    /// Every route back to its configured weights (a reload that kept the routes: undoes
    /// rollbacks and weights set through the API).
    pub fn reset_weights(&self) {
        self.splits.reset_all();
    }

    /// The routes new requests take now.
    /// Requests (and streams) the proxy is forwarding now, over every upstream: from the
    /// upstream's answer until its body has been sent (or dropped).
    pub fn in_flight(&self) -> usize {
        self.active.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn routing(&self) -> Arc<Routing> {
        self.routing
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Route new requests by `routes` from now on (a configuration reload). Requests in flight
    /// keep the routes they were given; upstreams present in both sets keep their in-flight
    /// counts, so the balancing stays right while old streams finish.
    pub fn swap_routes(&self, mut routes: UpstreamRouter) {
        let old = self.routing();
        routes.keep_counts_from(&old.routes);
        self.splits.publish(routes.splits().to_vec());
        let next = Arc::new(Routing::new(
            routes,
            &self.client_builder,
            self.connect_timeout,
        ));
        *self.routing.write().unwrap_or_else(|p| p.into_inner()) = next;
    }

    /// Send a request to `route`'s upstream: over its HTTPS client for an https upstream (HTTP/2
    /// when ALPN picks it), else over the shared plain-http client.
    fn send(
        &self,
        routing: &Routing,
        route: &route::Route,
        req: http::Request<Full<Bytes>>,
    ) -> ResponseFuture {
        match routing.https.get(route.index()) {
            Some(Some(c)) => c.request(req),
            _ => self.client.request(req),
        }
    }
}

/// One generation of routes: the router and one HTTPS client per https upstream.
pub struct Routing {
    routes: UpstreamRouter,
    /// By `Route::index` (`None` for plain http).
    https: Box<[Option<crate::kernel::tls::HttpsClient>]>,
    /// When these routes were loaded (Unix seconds): `created` of the proxy's model list.
    loaded_unix_s: i64,
}

impl Routing {
    fn new(
        routes: UpstreamRouter,
        builder: &hyper_util::client::legacy::Builder,
        connect_timeout: Duration,
    ) -> Routing {
        let https = routes
            .routes()
            .iter()
            .map(|r| r.tls().map(|t| t.client(builder, connect_timeout)))
            .collect();
        Routing {
            routes,
            https,
            loaded_unix_s: now_unix_ms() / 1000,
        }
    }

    pub fn router(&self) -> &UpstreamRouter {
        &self.routes
    }
}

pub fn router(state: Arc<ProxyState>) -> axum::Router {
    axum::Router::new().fallback(handle).with_state(state)
}

/// The LLM call a request is when it becomes a record (a POST to an endpoint
/// `endpoint::llm_endpoint` recognises); everything else is passed through untouched.
fn llm_call(
    method: &http::Method,
    path: &str,
    prefixes: &[String],
) -> Option<endpoint::LlmEndpoint> {
    if method == http::Method::POST {
        endpoint::llm_endpoint(path, prefixes)
    } else {
        None
    }
}

#[derive(serde::Deserialize, Default)]
struct Peek {
    model: Option<String>,
    #[serde(default)]
    stream: bool,
    /// The leading bytes of the prompt, for the prefix-cache key (never stored).
    #[serde(default, deserialize_with = "prefix::messages")]
    messages: prefix::PromptHead,
    #[serde(default, deserialize_with = "prefix::prompt")]
    prompt: prefix::PromptHead,
    /// Responses: `input` (a string or input items) and `instructions`.
    #[serde(default, deserialize_with = "prefix::input")]
    input: prefix::PromptHead,
    #[serde(default, deserialize_with = "prefix::system")]
    instructions: prefix::PromptHead,
    /// Anthropic Messages: `system` (a string or text blocks), beside `messages`.
    #[serde(default, deserialize_with = "prefix::system")]
    system: prefix::PromptHead,
}

impl Peek {
    /// The prefix-cache key from the prompt fields of the request's API.
    fn prefix_key(&self, format: sse::StreamFormat, salt: &[u8]) -> Option<u64> {
        use prefix::PromptHead;
        match format {
            sse::StreamFormat::OpenAi => self.messages.key(salt).or_else(|| self.prompt.key(salt)),
            sse::StreamFormat::Responses => {
                PromptHead::after_system(&self.instructions, &self.input).key(salt)
            }
            sse::StreamFormat::Anthropic => {
                PromptHead::after_system(&self.system, &self.messages).key(salt)
            }
        }
    }
}

const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-authenticate",
    "proxy-authorization",
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in listed {
        headers.remove(n);
    }
    for n in HOP_BY_HOP {
        headers.remove(n);
    }
}

/// An OpenAI-shaped JSON error, for failures where the upstream gave no answer.
fn error_response(status: StatusCode, class: &str, message: &str, request_id: &str) -> Response {
    let body = serde_json::json!({
        "error": { "message": message, "type": class, "code": status.as_u16(), "request_id": request_id }
    });
    let mut resp = Response::new(Body::from(body.to_string()));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Ok(v) = HeaderValue::from_str(request_id) {
        h.insert(REQUEST_ID, v);
    }
    resp
}

fn valid_request_id(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(REQUEST_ID)?.to_str().ok()?.trim();
    (!v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .then(|| v.to_string())
}

async fn handle(State(st): State<Arc<ProxyState>>, req: Request) -> Response {
    let started = Instant::now();
    let arrival_unix_ms = now_unix_ms();
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let call = llm_call(&parts.method, &path, &st.path_prefixes);
    let format = call.as_ref().map(|c| c.format);
    let llm = format.is_some();
    let request_id = valid_request_id(&parts.headers).unwrap_or_else(identity::new_request_id);

    // The body is held against the budget until the upstream has answered (it has been sent).
    let (body, _body_held) = match st.body_budget.read(Body::new(body), st.max_body).await {
        Ok(b) => b,
        Err(BodyReadError::OverBudget) => return st.body_budget.refusal(),
        Err(BodyReadError::TooLarge) => {
            let msg = format!(
                "the request body is over the limit of {} bytes (proxy.max_request_body_bytes)",
                st.max_body
            );
            let resp = error_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request_too_large",
                &msg,
                &request_id,
            );
            return crate::listen::limits::mark_body_too_large(resp);
        }
        Err(BodyReadError::Read(e)) => {
            let msg = format!("could not read the request body: {e}");
            return error_response(StatusCode::BAD_REQUEST, "bad_request", &msg, &request_id);
        }
    };
    let mut peek: Peek = if llm {
        serde_json::from_slice(&body).unwrap_or_default()
    } else {
        Peek::default()
    };
    // An Azure OpenAI deployment is the model of a body that names none.
    if peek.model.as_deref().is_none_or(str::is_empty)
        && let Some(d) = call.as_ref().and_then(|c| c.deployment.clone())
    {
        peek.model = Some(d);
    }

    // An LLM request's own span (built on the pipeline thread from the record): a child of the
    // caller's span when it sent a traceparent, else the root of a new trace. The upstream gets
    // the proxy's span as its parent. Other requests pass the caller's traceparent on as it is.
    let incoming = parts
        .headers
        .get(TRACEPARENT)
        .and_then(|v| v.to_str().ok())
        .and_then(TraceParent::parse);
    let (trace, caller_span, rewrite) = match incoming {
        Some(tp) if llm => {
            let (own, caller) = tp.child();
            (own, caller, true)
        }
        Some(tp) => (tp, String::new(), false),
        None => (TraceParent::generate(), String::new(), true),
    };
    if rewrite && let Ok(v) = HeaderValue::from_str(&trace.header_value()) {
        parts.headers.insert(TRACEPARENT, v);
    }

    let mut record = RequestRecord {
        request_id: request_id.clone(),
        trace_id: trace.trace_id,
        span: ProxySpan {
            span_id: trace.parent_id,
            parent_span_id: caller_span,
            response_model: String::new(),
        },
        labels: SeriesLabels {
            model_id: peek
                .model
                .clone()
                .filter(|m| !m.is_empty())
                .unwrap_or_else(|| UNKNOWN_MODEL.into()),
            runtime: String::new(),
            instance: String::new(),
            tenant: identity::tenant_of(&parts.headers, &st.tenant_header, &st.salt),
            ab_group: identity::header_label(&parts.headers, &st.ab_group_header),
            model_version: identity::header_label(&parts.headers, &st.model_version_header),
        },
        prompt_version: identity::header_label(&parts.headers, &st.prompt_version_header),
        endpoint: call
            .as_ref()
            .map_or_else(|| path.clone(), |c| c.endpoint.to_string()),
        stream: peek.stream,
        arrival_unix_ms,
        prefix_key: format.and_then(|f| peek.prefix_key(f, &st.salt)),
        ..Default::default()
    };

    // `slot` counts the request in its upstream pool until the response body is dropped.
    let routing = st.routing();
    let Some((route, slot, version)) = routing
        .routes
        .route_for(peek.model.as_deref(), &record.labels.tenant)
    else {
        if parts.method == http::Method::GET && path == models::MODELS_PATH {
            // No upstream takes requests without a model: the routes say which models there are.
            return models::list(&routing.routes, routing.loaded_unix_s);
        }
        // The name as the client sent it, cut: an answer does not echo megabytes back.
        let mut named = record.labels.model_id.clone();
        crate::kernel::telemetry::cap_label(&mut named, 256);
        let msg = format!("no upstream is configured for model {named:?} (proxy.upstreams)");
        if llm {
            record.status = 502;
            InFlight {
                record,
                started,
                queue: st.queue.clone(),
                raw: None,
            }
            .submit(Some(ErrorClass::NoRoute));
        }
        return error_response(StatusCode::BAD_GATEWAY, "no_route", &msg, &request_id);
    };
    record.labels.runtime = route.runtime.clone();
    record.labels.instance = route.instance.clone();
    if let Some(v) = version {
        // A split's arm: its version is the record's, and the arm is its A/B group.
        record.labels.model_version = v.to_string();
        record.labels.ab_group = v.to_string();
    }
    let raw = match (&st.capture, format) {
        (Some(c), Some(f)) => {
            let region = c.region_of(&parts.headers, &record.labels.tenant);
            Some(Box::new(crate::kernel::raw_text::RawText::new(
                f,
                region,
                body.clone(),
            )))
        }
        _ => None,
    };

    let uri = match route.uri_for(&parts.uri) {
        Ok(u) => u,
        Err(e) => return error_response(StatusCode::BAD_REQUEST, "bad_request", &e, &request_id),
    };
    let mut headers = std::mem::take(&mut parts.headers);
    strip_hop_by_hop(&mut headers);
    headers.remove(http::header::HOST);
    headers.remove(http::header::CONTENT_LENGTH);
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        headers.insert(REQUEST_ID, v);
    }
    let mut upstream_req = http::Request::new(Full::new(body));
    *upstream_req.method_mut() = parts.method.clone();
    *upstream_req.uri_mut() = uri;
    *upstream_req.headers_mut() = headers;

    let outcome =
        tokio::time::timeout(st.response_timeout, st.send(&routing, route, upstream_req)).await;
    let upstream = match outcome {
        Ok(Ok(resp)) => resp,
        Ok(Err(e)) => {
            let (class, what) = if e.is_connect() {
                (ErrorClass::UpstreamConnect, "could not connect to")
            } else {
                (ErrorClass::UpstreamReset, "lost the connection to")
            };
            let cause = std::error::Error::source(&e)
                .map(|s| s.to_string())
                .unwrap_or_else(|| e.to_string());
            let msg = format!(
                "tokenwatch {what} upstream {} before it answered: {cause}",
                route.instance
            );
            let flight = InFlight {
                record,
                started,
                queue: st.queue.clone(),
                raw,
            };
            return fail(llm, flight, class, &msg, &request_id);
        }
        Err(_) => {
            let msg = format!(
                "upstream {} sent no response headers within {:?} (proxy.response_timeout)",
                route.instance, st.response_timeout
            );
            let flight = InFlight {
                record,
                started,
                queue: st.queue.clone(),
                raw,
            };
            return fail(llm, flight, ErrorClass::UpstreamTimeout, &msg, &request_id);
        }
    };

    let (mut up_parts, up_body) = upstream.into_parts();
    strip_hop_by_hop(&mut up_parts.headers);
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        up_parts.headers.insert(REQUEST_ID, v);
    }
    let Some(format) = format else {
        return Response::from_parts(up_parts, Body::new(up_body));
    };

    let status = up_parts.status;
    record.status = status.as_u16();
    record.upstream_headers_s = Some(started.elapsed().as_secs_f64());
    record.queue_s = up_parts
        .headers
        .get("x-queue-time")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|ms| ms.is_finite() && *ms >= 0.0)
        .map(|ms| ms / 1000.0);
    if status.is_server_error() {
        record.error_class = Some(ErrorClass::Upstream5xx);
    } else if status.is_client_error() {
        record.error_class = Some(ErrorClass::Upstream4xx);
    }
    let content_type = up_parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    let event_stream = content_type.starts_with("text/event-stream");
    let json = content_type.starts_with("application/json");
    let flight = InFlight {
        record,
        started,
        queue: st.queue.clone(),
        raw,
    };
    let tapped = TapBody::new(
        up_body,
        flight,
        format,
        event_stream,
        json,
        st.idle_timeout,
        [slot, Some(route::Slot::enter(&st.active))],
    );
    Response::from_parts(up_parts, Body::new(tapped))
}

fn fail(
    llm: bool,
    mut flight: InFlight,
    class: ErrorClass,
    msg: &str,
    request_id: &str,
) -> Response {
    tracing::debug!(request_id, class = class.name(), "{msg}");
    if llm {
        flight.record.status = 502;
        flight.submit(Some(class));
    }
    error_response(StatusCode::BAD_GATEWAY, class.name(), msg, request_id)
}
