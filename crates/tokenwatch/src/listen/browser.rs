// What a browser could be made to send, refused on the API and OTLP/HTTP listeners, tokens or
// not (issue 35 item 9):
// - DNS rebinding: a listener bound to loopback answers only requests whose `Host` names
//   loopback (`localhost`, `*.localhost`, an IP address) or `auth.allowed_hosts`; a foreign
//   page whose name was rebound to 127.0.0.1 sends its own name and is refused (403), reads
//   included.
// - Cross-site writes (CSRF): a state-changing request (any method but GET, HEAD, OPTIONS)
//   that carries a foreign `Origin` (or, without one, `Sec-Fetch-Site: cross-site`) is refused
//   (403) unless the origin is in `auth.allowed_origins`. Clients that are not browsers send
//   neither header and pass.
// - On the API port, a write with a body must be JSON (`application/json` or
//   `application/*+json`, else 415): the content types a page may send cross-site without a
//   CORS preflight (`text/plain`, forms) never reach a handler.
// Each refusal is counted in `tokenwatch_rejected_requests_total{listener, reason}` and the
// first of each reason per listener is logged as a warning.

use super::limits::{Guard, Reason};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, Method, StatusCode, header};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Longest `Host`, `Origin` or content type quoted in an answer or the log.
const MAX_QUOTED: usize = 128;

/// `auth.allowed_hosts` and `auth.allowed_origins`, parsed (`BrowserPolicy::from_lists`).
#[derive(Debug, Clone, Default)]
pub struct BrowserPolicy {
    /// `*` in `allowed_hosts`: every `Host` is taken.
    any_host: bool,
    /// Host names taken besides loopback's, lowercase, without a trailing dot.
    hosts: Arc<[String]>,
    origins: Arc<[Origin]>,
}

/// An origin: scheme, host and port (the scheme's default when the origin names none).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Origin {
    scheme: String,
    host: String,
    port: u16,
}

impl Origin {
    /// `scheme://host[:port]` (an `Origin` header's value); None for `null`, a path, or a
    /// scheme other than http and https.
    fn parse(s: &str) -> Option<Origin> {
        let (scheme, rest) = s.split_once("://")?;
        let scheme = scheme.to_ascii_lowercase();
        let default_port = match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            _ => return None,
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let (host, port) = split_host_port(rest)?;
        Some(Origin {
            scheme,
            host,
            port: port.unwrap_or(default_port),
        })
    }
}

/// `host[:port]` or `[v6][:port]` → (the host lowercase, without brackets or a trailing dot;
/// the port if named); None when it is not one.
fn split_host_port(s: &str) -> Option<(String, Option<u16>)> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        host.parse::<std::net::Ipv6Addr>().ok()?;
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':')?)),
        }
    } else {
        match s.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (s, None),
        }
    };
    let port = match port {
        Some(p) => Some(p.parse::<u16>().ok()?),
        None => None,
    };
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    let valid = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b':'));
    valid.then_some((host, port))
}

/// A host no page can rebind to a loopback listener: an IP address (a page whose origin is an
/// address reached that address, not a name resolved anew), `localhost` and its subdomains
/// (browsers resolve them to loopback themselves; no public zone serves them).
fn is_unrebindable(host: &str) -> bool {
    host.parse::<IpAddr>().is_ok() || host == "localhost" || host.ends_with(".localhost")
}

impl BrowserPolicy {
    /// `auth.allowed_hosts` and `auth.allowed_origins`; errors name the key and the entry at
    /// fault.
    pub fn from_lists(
        allowed_hosts: &[String],
        allowed_origins: &[String],
    ) -> Result<BrowserPolicy, (String, String)> {
        let mut policy = BrowserPolicy::default();
        let mut hosts = Vec::new();
        for (i, h) in allowed_hosts.iter().enumerate() {
            if h == "*" {
                policy.any_host = true;
                continue;
            }
            match split_host_port(h) {
                Some((host, None)) => hosts.push(host),
                _ => {
                    return Err((
                        format!("auth.allowed_hosts[{i}]"),
                        format!(
                            "{h:?} is not a host name: give the name clients use (e.g. tokenwatch.example.com, no scheme, port or path), or \"*\" for any"
                        ),
                    ));
                }
            }
        }
        let mut origins = Vec::new();
        for (i, o) in allowed_origins.iter().enumerate() {
            let Some(origin) = Origin::parse(o) else {
                return Err((
                    format!("auth.allowed_origins[{i}]"),
                    format!(
                        "{o:?} is not an origin: give scheme://host[:port] with http or https, no path (e.g. https://grafana.example.com)"
                    ),
                ));
            };
            origins.push(origin);
        }
        policy.hosts = hosts.into();
        policy.origins = origins.into();
        Ok(policy)
    }

    fn host_allowed(&self, host: &str) -> bool {
        self.any_host || is_unrebindable(host) || self.hosts.iter().any(|h| h == host)
    }
}

/// One listener's checks (`protect` layers them onto its router).
#[derive(Clone)]
pub struct BrowserGuard {
    policy: BrowserPolicy,
    /// Whether `Host` is checked: the listener is bound to loopback, or hosts are listed.
    check_host: bool,
    /// Whether a write's body must be JSON (the API port).
    json_writes: bool,
    /// The listener's name and its refusal counter.
    limits: Guard,
    /// Whether each reason was warned about (foreign host, foreign origin, not JSON).
    warned: Arc<[AtomicBool; 3]>,
}

/// Why `BrowserGuard::check` refused a request.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Refusal {
    ForeignHost(String),
    ForeignOrigin(String),
    NotJson(String),
}

impl Refusal {
    fn reason(&self) -> Reason {
        match self {
            Refusal::ForeignHost(_) => Reason::ForeignHost,
            Refusal::ForeignOrigin(_) => Reason::ForeignOrigin,
            Refusal::NotJson(_) => Reason::NotJson,
        }
    }

    fn slot(&self) -> usize {
        match self {
            Refusal::ForeignHost(_) => 0,
            Refusal::ForeignOrigin(_) => 1,
            Refusal::NotJson(_) => 2,
        }
    }
}

/// `s` cut to `MAX_QUOTED` characters.
fn quoted(s: &str) -> String {
    match s.char_indices().nth(MAX_QUOTED) {
        None => s.to_string(),
        Some((i, _)) => format!("{}…", &s[..i]),
    }
}

fn header_str<'a>(headers: &'a HeaderMap, name: &header::HeaderName) -> Option<&'a str> {
    headers.get(name).map(|v| v.to_str().unwrap_or("\u{fffd}"))
}

/// Whether a content type is JSON (`application/json`, `application/*+json`; parameters such
/// as `charset` ignored).
fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || essence
            .strip_prefix("application/")
            .is_some_and(|sub| sub.ends_with("+json"))
}

impl BrowserGuard {
    /// The checks of the listener bound to `bound`, counted under `limits`' listener name.
    pub fn new(
        policy: &BrowserPolicy,
        bound: SocketAddr,
        json_writes: bool,
        limits: &Guard,
    ) -> BrowserGuard {
        BrowserGuard {
            check_host: !policy.any_host && (bound.ip().is_loopback() || !policy.hosts.is_empty()),
            policy: policy.clone(),
            json_writes,
            limits: limits.clone(),
            warned: Arc::default(),
        }
    }

    /// The host and port a request was sent to: `Host` (HTTP/1.1), else the URI's authority
    /// (HTTP/2's `:authority`); None when it names none or cannot be read.
    fn target<B>(req: &http::Request<B>) -> Option<Result<(String, Option<u16>), String>> {
        let raw = match req.headers().get(header::HOST) {
            Some(v) => v.to_str().unwrap_or("\u{fffd}").to_string(),
            None => req.uri().authority()?.as_str().to_string(),
        };
        Some(split_host_port(&raw).ok_or(raw))
    }

    fn check<B: http_body::Body>(&self, req: &http::Request<B>) -> Option<Refusal> {
        // The probes answer whatever names them (a sidecar's or an orchestrator's probe).
        let read = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
        let path = req.uri().path();
        if read && (path == "/healthz" || path == "/readyz") {
            return None;
        }
        let target = Self::target(req);
        if self.check_host {
            match &target {
                Some(Ok((host, _))) if !self.policy.host_allowed(host) => {
                    return Some(Refusal::ForeignHost(host.clone()));
                }
                Some(Err(raw)) => return Some(Refusal::ForeignHost(raw.clone())),
                _ => {}
            }
        }
        if read {
            return None;
        }
        let headers = req.headers();
        if let Some(origin) = header_str(headers, &header::ORIGIN) {
            let same = match (Origin::parse(origin), &target) {
                (Some(o), Some(Ok((host, port)))) => {
                    o.host == *host && port.is_none_or(|p| p == o.port)
                }
                _ => false,
            };
            let allowed = Origin::parse(origin).is_some_and(|o| self.policy.origins.contains(&o));
            if !same && !allowed {
                return Some(Refusal::ForeignOrigin(origin.to_string()));
            }
        } else if headers
            .get("sec-fetch-site")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"cross-site"))
        {
            return Some(Refusal::ForeignOrigin(
                "(none; Sec-Fetch-Site: cross-site)".into(),
            ));
        }
        if self.json_writes && !req.body().is_end_stream() {
            let ct = header_str(headers, &header::CONTENT_TYPE);
            if !ct.is_some_and(is_json) {
                return Some(Refusal::NotJson(ct.unwrap_or("(none)").to_string()));
            }
        }
        None
    }

    fn refuse(&self, what: &str, refusal: &Refusal) -> Response {
        let listener = self.limits.listener;
        let (status, kind, key, message, quoted_value) = match refusal {
            Refusal::ForeignHost(host) => {
                let host = quoted(host);
                (
                    StatusCode::FORBIDDEN,
                    "foreign_host",
                    "auth.allowed_hosts",
                    format!(
                        "{what} names host {host:?}: this listener is bound to loopback and answers loopback names (localhost, an IP address) and auth.allowed_hosts only, so that a web page whose name was rebound to 127.0.0.1 (DNS rebinding) cannot reach it; add the name to auth.allowed_hosts if it is yours"
                    ),
                    host,
                )
            }
            Refusal::ForeignOrigin(origin) => {
                let origin = quoted(origin);
                (
                    StatusCode::FORBIDDEN,
                    "foreign_origin",
                    "auth.allowed_origins",
                    format!(
                        "{what} comes from a page of another origin ({origin}): writes are taken from tokenwatch's own pages and from clients that send no Origin (curl, SDKs, collectors); add the origin to auth.allowed_origins to let its pages write"
                    ),
                    origin,
                )
            }
            Refusal::NotJson(ct) => {
                let ct = quoted(ct);
                (
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "unsupported_media_type",
                    "Content-Type",
                    format!(
                        "{what} takes a JSON body (Content-Type: application/json), not {ct:?}; send JSON, or no body where none is needed"
                    ),
                    ct,
                )
            }
        };
        self.limits.count(refusal.reason());
        if !self.warned[refusal.slot()].swap(true, Ordering::Relaxed) {
            tracing::warn!(
                listener,
                request = what,
                value = %quoted_value,
                "request refused ({}); later ones are counted in tokenwatch_rejected_requests_total{{reason=\"{}\"}}, not logged",
                key,
                refusal.reason().label()
            );
        }
        let body = serde_json::json!({ "error": { "type": kind, "message": message, "key": key } });
        (status, axum::Json(body)).into_response()
    }
}

async fn browser_guard(State(guard): State<BrowserGuard>, req: Request, next: Next) -> Response {
    match guard.check(&req) {
        None => next.run(req).await,
        Some(refusal) => {
            let what = format!("{} {}", req.method(), req.uri().path());
            guard.refuse(&quoted(&what), &refusal)
        }
    }
}

/// `router` with `guard`'s checks in front of every route.
pub fn protect(router: axum::Router, guard: BrowserGuard) -> axum::Router {
    router.layer(axum::middleware::from_fn_with_state(guard, browser_guard))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::telemetry::Metrics;
    use crate::listen::limits::LimitsConfig;
    use axum::body::Body;

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn guard(hosts: &[&str], origins: &[&str], bound: &str, json: bool) -> (BrowserGuard, Metrics) {
        let policy = BrowserPolicy::from_lists(&strings(hosts), &strings(origins)).unwrap();
        let metrics = Metrics::new();
        let limits = Guard::new("api", &LimitsConfig::default(), &metrics);
        (
            BrowserGuard::new(&policy, bound.parse().unwrap(), json, &limits),
            metrics,
        )
    }

    fn req(method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Request {
        let mut b = http::Request::builder().method(method).uri(path);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let body = if body.is_empty() {
            Body::empty()
        } else {
            Body::from(body.to_string())
        };
        b.body(body).unwrap()
    }

    fn reason(g: &BrowserGuard, r: &Request) -> Option<&'static str> {
        g.check(r).map(|x| x.reason().label())
    }

    #[test]
    fn a_loopback_listener_answers_loopback_names_and_listed_hosts_only() {
        let (g, _) = guard(&["tw.example.com"], &[], "127.0.0.1:9464", true);
        for host in [
            "127.0.0.1:9464",
            "localhost:9464",
            "LOCALHOST.:9464",
            "app.localhost:9464",
            "[::1]:9464",
            "localhost",
            "tw.example.com",
            "tw.example.com:443",
            "10.1.2.3:9464",
        ] {
            assert_eq!(
                reason(&g, &req("GET", "/api/v1/fleet", &[("host", host)], "")),
                None,
                "{host}"
            );
        }
        for host in [
            "evil.example:9464",
            "localhost.evil.example",
            "tw.example.com.evil.example",
            "[nope]:1",
            "a b",
            "x:notaport",
        ] {
            assert_eq!(
                reason(&g, &req("GET", "/metrics", &[("host", host)], "")),
                Some("foreign_host"),
                "{host}"
            );
        }
        // The probes answer any name; a request without a host (HTTP/1.0) is not a browser's.
        let probe = req("GET", "/readyz", &[("host", "evil.example")], "");
        assert_eq!(reason(&g, &probe), None);
        assert_eq!(reason(&g, &req("GET", "/metrics", &[], "")), None);
        // HTTP/2 names its host in the URI's authority.
        let h2 = req("GET", "http://evil.example:9464/metrics", &[], "");
        assert_eq!(reason(&g, &h2), Some("foreign_host"));
    }

    #[test]
    fn an_exposed_listener_checks_hosts_only_when_some_are_listed() {
        let (open, _) = guard(&[], &[], "0.0.0.0:9464", true);
        let r = req("GET", "/metrics", &[("host", "tokenwatch.svc:9464")], "");
        assert_eq!(reason(&open, &r), None);
        let (listed, _) = guard(&["tw.example.com"], &[], "0.0.0.0:9464", true);
        assert_eq!(reason(&listed, &r), Some("foreign_host"));
        let (any, _) = guard(&["*"], &[], "127.0.0.1:9464", true);
        assert_eq!(reason(&any, &r), None);
    }

    #[test]
    fn writes_from_foreign_pages_are_refused_and_the_same_origin_or_listed_ones_pass() {
        let (g, _) = guard(
            &[],
            &["https://grafana.example.com"],
            "127.0.0.1:9464",
            true,
        );
        let host = ("host", "127.0.0.1:9464");
        let json = ("content-type", "application/json");
        let post = |origin: Option<&str>| {
            let mut h = vec![host, json];
            if let Some(o) = origin {
                h.push(("origin", o));
            }
            reason(&g, &req("POST", "/api/v1/markers", &h, "{}"))
        };
        assert_eq!(post(None), None, "curl and SDKs send no Origin");
        assert_eq!(
            post(Some("http://127.0.0.1:9464")),
            None,
            "the UI's own page"
        );
        assert_eq!(post(Some("https://grafana.example.com")), None);
        assert_eq!(post(Some("https://grafana.example.com:443/")), None);
        for foreign in [
            "https://evil.example",
            "http://127.0.0.1:3000",
            "http://localhost:9464",
            "null",
            "chrome-extension://abc",
            "https://grafana.example.com:8443",
        ] {
            assert_eq!(post(Some(foreign)), Some("foreign_origin"), "{foreign}");
        }
        let fetch_meta = req(
            "POST",
            "/-/reload",
            &[host, ("sec-fetch-site", "cross-site")],
            "",
        );
        assert_eq!(reason(&g, &fetch_meta), Some("foreign_origin"));
        // Reads are not writes: a foreign page's GET is CORS's business (no CORS is answered).
        let get = req(
            "GET",
            "/api/v1/fleet",
            &[host, ("origin", "https://evil.example")],
            "",
        );
        assert_eq!(reason(&g, &get), None);
        // Behind a proxy keeping the name (Host without a port), the names are compared.
        let proxied = req(
            "POST",
            "/api/v1/markers",
            &[("host", "localhost"), ("origin", "https://localhost"), json],
            "{}",
        );
        assert_eq!(reason(&g, &proxied), None);
    }

    #[test]
    fn the_api_port_takes_json_bodies_only() {
        let (g, _) = guard(&[], &[], "127.0.0.1:9464", true);
        let host = ("host", "127.0.0.1:9464");
        let post = |ct: Option<&str>, body: &str| {
            let mut h = vec![host];
            if let Some(ct) = ct {
                h.push(("content-type", ct));
            }
            reason(&g, &req("POST", "/api/v1/feedback", &h, body))
        };
        assert_eq!(post(Some("application/json"), "[]"), None);
        assert_eq!(post(Some("Application/JSON; charset=utf-8"), "[]"), None);
        assert_eq!(post(Some("application/merge-patch+json"), "{}"), None);
        assert_eq!(post(None, ""), None, "POST /-/reload needs no body");
        assert_eq!(post(Some("text/plain"), ""), None, "an empty body");
        for ct in [
            Some("text/plain"),
            Some("application/x-www-form-urlencoded"),
            Some("multipart/form-data; boundary=x"),
            Some("text/json"),
            None,
        ] {
            assert_eq!(
                post(ct, "{\"a\":1}"),
                Some("unsupported_media_type"),
                "{ct:?}"
            );
        }
        // OTLP/HTTP checks its own content types (protobuf too).
        let (otlp, _) = guard(&[], &[], "127.0.0.1:4318", false);
        let r = req(
            "POST",
            "/v1/traces",
            &[host, ("content-type", "application/x-protobuf")],
            "x",
        );
        assert_eq!(reason(&otlp, &r), None);
    }

    #[tokio::test]
    async fn refusals_are_json_naming_the_key_and_counted() {
        let (g, metrics) = guard(&[], &[], "127.0.0.1:9464", true);
        let app = protect(
            axum::Router::new().route("/-/reload", axum::routing::post(|| async { "done" })),
            g,
        );
        let call = |headers: Vec<(&'static str, &'static str)>, body: &'static str| {
            let app = app.clone();
            async move {
                let r = req("POST", "/-/reload", &headers, body);
                let resp = tower_service::Service::call(&mut app.clone(), r)
                    .await
                    .unwrap();
                let status = resp.status();
                let bytes = axum::body::to_bytes(resp.into_body(), 1 << 16)
                    .await
                    .unwrap();
                (status, String::from_utf8_lossy(&bytes).into_owned())
            }
        };
        let (s, body) = call(vec![("host", "evil.example:9464")], "").await;
        assert_eq!(s, StatusCode::FORBIDDEN);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["error"]["type"], "foreign_host");
        assert_eq!(v["error"]["key"], "auth.allowed_hosts");
        assert!(body.contains("evil.example"), "{body}");
        let (s, body) = call(
            vec![
                ("host", "127.0.0.1:9464"),
                ("origin", "https://evil.example"),
            ],
            "",
        )
        .await;
        assert_eq!(s, StatusCode::FORBIDDEN);
        assert!(body.contains("auth.allowed_origins"), "{body}");
        let (s, _) = call(
            vec![("host", "127.0.0.1:9464"), ("content-type", "text/plain")],
            "{}",
        )
        .await;
        assert_eq!(s, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let (s, body) = call(vec![("host", "127.0.0.1:9464")], "").await;
        assert_eq!((s, body.as_str()), (StatusCode::OK, "done"));
        let text = metrics.encode();
        for reason in ["foreign_host", "foreign_origin", "unsupported_media_type"] {
            let line = format!(
                "tokenwatch_rejected_requests_total{{listener=\"api\",reason=\"{reason}\"}} 1"
            );
            assert!(text.contains(&line), "{line} in\n{text}");
        }
    }

    #[test]
    fn listed_hosts_and_origins_are_checked_at_load() {
        let bad = |hosts: &[&str], origins: &[&str]| {
            BrowserPolicy::from_lists(&strings(hosts), &strings(origins))
                .err()
                .map(|(k, _)| k)
        };
        assert_eq!(
            bad(&["tw.example.com", "*"], &["http://localhost:3000"]),
            None
        );
        assert_eq!(
            bad(&["https://tw.example.com"], &[]).as_deref(),
            Some("auth.allowed_hosts[0]")
        );
        assert_eq!(
            bad(&["ok", "tw.example.com:9464"], &[]).as_deref(),
            Some("auth.allowed_hosts[1]")
        );
        assert_eq!(
            bad(&[], &["grafana.example.com"]).as_deref(),
            Some("auth.allowed_origins[0]")
        );
        assert_eq!(
            bad(&[], &["https://g.example.com/path"]).as_deref(),
            Some("auth.allowed_origins[0]")
        );
        assert_eq!(
            bad(&[], &["ftp://g.example.com"]).as_deref(),
            Some("auth.allowed_origins[0]")
        );
    }
}
