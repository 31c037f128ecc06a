// The HTTP side of authentication: which role each API route needs, and the axum layers that
// answer 401 / 403 with a JSON error on the API port and the OTLP/HTTP listener, naming the
// caller (`Caller`) in the request's and the response's extensions for the audit log.

use super::{AuthHandle, Denied, Listener, Role};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Routes that take data in: they need `ingest` (an `admin` token also passes).
const INGEST_PATHS: &[&str] = &["/api/v1/embeddings", "/api/v1/feedback", "/api/v1/scores"];

/// What a request to the API port needs; `None` for what stays open: the probes, and the UI's
/// page and static assets (they hold no data, and a browser cannot add a bearer header when it
/// loads a page; every data request the UI then makes carries the token).
pub fn api_role(method: &Method, path: &str) -> Option<Role> {
    let read_only = matches!(*method, Method::GET | Method::HEAD);
    if read_only
        && (path == "/healthz" || path == "/readyz" || path == "/" || path.starts_with("/ui/"))
    {
        return None;
    }
    if INGEST_PATHS.contains(&path) {
        return Some(Role::Ingest);
    }
    // Anything that could change state (`POST /-/reload` and whatever comes later) is admin's.
    if read_only || *method == Method::OPTIONS {
        Some(Role::Read)
    } else {
        Some(Role::Admin)
    }
}

/// The 401 / 403 answer: `{"error": {"type", "message"}}`, with `WWW-Authenticate` on 401.
pub fn denied_response(denied: &Denied, what: &str) -> Response {
    let (status, kind) = if denied.is_forbidden() {
        (StatusCode::FORBIDDEN, "forbidden")
    } else {
        (StatusCode::UNAUTHORIZED, "unauthorized")
    };
    let body = json!({ "error": { "type": kind, "message": denied.message(what) } });
    let mut resp = (status, axum::Json(body)).into_response();
    if status == StatusCode::UNAUTHORIZED {
        resp.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    resp
}

fn authorization(req: &Request) -> Option<&[u8]> {
    req.headers()
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes)
}

async fn api_guard(State(auth): State<AuthHandle>, mut req: Request, next: Next) -> Response {
    let Some(needed) = api_role(req.method(), req.uri().path()) else {
        return next.run(req).await;
    };
    let (mut resp, caller) = match auth.authorize(authorization(&req), needed, Listener::Api) {
        Ok(caller) => {
            req.extensions_mut().insert(caller.clone());
            (next.run(req).await, caller)
        }
        Err((d, caller)) => (
            denied_response(&d, &format!("{} {}", req.method(), req.uri().path())),
            caller,
        ),
    };
    resp.extensions_mut().insert(caller);
    resp
}

async fn otlp_guard(State(auth): State<AuthHandle>, req: Request, next: Next) -> Response {
    match auth.check(authorization(&req), Role::Ingest, Listener::Otlp) {
        Ok(()) => next.run(req).await,
        Err(d) => denied_response(
            &d,
            &format!("OTLP export ({} {})", req.method(), req.uri().path()),
        ),
    }
}

/// The API port's router with every route guarded by its role (unchanged without tokens).
pub fn protect_api(router: axum::Router, auth: &AuthHandle) -> axum::Router {
    if !auth.enabled() {
        return router;
    }
    router.layer(axum::middleware::from_fn_with_state(
        auth.clone(),
        api_guard,
    ))
}

/// The OTLP/HTTP router with every route needing `ingest` (unchanged without tokens).
pub fn protect_otlp(router: axum::Router, auth: &AuthHandle) -> axum::Router {
    if !auth.enabled() {
        return router;
    }
    router.layer(axum::middleware::from_fn_with_state(
        auth.clone(),
        otlp_guard,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_need_their_roles() {
        let get = Method::GET;
        for open in [
            "/healthz",
            "/readyz",
            "/",
            "/ui/app.js",
            "/ui/vendor/uPlot.min.css",
        ] {
            assert_eq!(api_role(&get, open), None, "{open}");
            assert_eq!(api_role(&Method::HEAD, open), None, "{open}");
        }
        for read in [
            "/metrics",
            "/api/v1/fleet",
            "/api/v1/alerts/x/snapshot",
            "/nope",
            "/ui",
        ] {
            assert_eq!(api_role(&get, read), Some(Role::Read), "{read}");
        }
        assert_eq!(
            api_role(&Method::POST, "/api/v1/embeddings"),
            Some(Role::Ingest)
        );
        assert_eq!(api_role(&Method::POST, "/ui/app.js"), Some(Role::Admin));
        assert_eq!(
            api_role(&Method::DELETE, "/api/v1/alerts/x"),
            Some(Role::Admin)
        );
        assert_eq!(api_role(&Method::PUT, "/healthz"), Some(Role::Admin));
        // A configuration reload (`crate::reload`) is an admin's.
        assert_eq!(api_role(&Method::POST, "/-/reload"), Some(Role::Admin));
    }

    #[tokio::test]
    async fn denied_answers_are_json_with_www_authenticate_on_401() {
        let r = denied_response(&Denied::Missing { needed: Role::Read }, "GET /metrics");
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(r.headers().get(header::WWW_AUTHENTICATE).unwrap(), "Bearer");
        let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["type"], "unauthorized");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("GET /metrics needs a `read` token"),
            "{v}"
        );

        let r = denied_response(
            &Denied::Forbidden {
                needed: Role::Ingest,
                has: Role::Read,
            },
            "x",
        );
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert!(r.headers().get(header::WWW_AUTHENTICATE).is_none());
    }
}
