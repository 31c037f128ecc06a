// Web UI on the API port: `/` serves the page and `/ui/{path}` its scripts, styles and the
// uPlot library, all embedded in the binary at build time (crates/tokenwatch/build.rs).

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

mod assets {
    include!(concat!(env!("OUT_DIR"), "/ui_assets.rs"));
}

/// Our own files are revalidated on every load (ETag), so an upgraded binary shows its new UI;
/// the vendored library changes only with the files under ui/vendor and may be kept for a day.
const REVALIDATE: &str = "no-cache";
const VENDOR_CACHE: &str = "public, max-age=86400";

/// Routes `/` and `/ui/{*path}`; no fallback (the API router owns it).
pub fn router() -> Router {
    Router::new()
        .route("/", get(index))
        .route("/ui/{*path}", get(asset))
}

fn find(path: &str) -> Option<(&'static str, &'static [u8])> {
    assets::ASSETS
        .iter()
        .find(|(p, _, _)| *p == path)
        .map(|(_, etag, bytes)| (*etag, *bytes))
}

fn content_type(path: &str) -> &'static str {
    match path.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("json") => "application/json",
        // A bundled library's licence (`vendor/uPlot.LICENSE`).
        Some("LICENSE") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

fn serve(path: &str, headers: &HeaderMap) -> Response {
    let Some((etag, bytes)) = find(path) else {
        return (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("no UI asset /ui/{path}\n"),
        )
            .into_response();
    };
    let cache = if path.starts_with("vendor/") {
        VENDOR_CACHE
    } else {
        REVALIDATE
    };
    let common = [
        (header::CACHE_CONTROL, HeaderValue::from_static(cache)),
        (header::ETAG, HeaderValue::from_static(etag)),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
    ];
    let matches = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    if matches {
        return (StatusCode::NOT_MODIFIED, common).into_response();
    }
    let ctype = (
        header::CONTENT_TYPE,
        HeaderValue::from_static(content_type(path)),
    );
    (common, [ctype], bytes).into_response()
}

async fn index(headers: HeaderMap) -> Response {
    serve("index.html", &headers)
}

async fn asset(Path(path): Path<String>, headers: HeaderMap) -> Response {
    serve(&path, &headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header_of(r: &Response, name: header::HeaderName) -> &str {
        r.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    #[test]
    fn every_page_module_and_the_library_are_embedded() {
        for p in [
            "index.html",
            "app.js",
            "style.css",
            "charts.js",
            "pages/fleet.js",
            "pages/model.js",
            "pages/alerts.js",
            "pages/alert.js",
            "pages/requests.js",
            "pages/request.js",
            "pages/gpus.js",
            "pages/spend.js",
            "vendor/uPlot.iife.min.js",
            "vendor/uPlot.min.css",
            "vendor/uPlot.LICENSE",
        ] {
            assert!(
                find(p).is_some_and(|(_, b)| !b.is_empty()),
                "{p} is not embedded"
            );
        }
        let html = std::str::from_utf8(find("index.html").map(|(_, b)| b).unwrap_or_default())
            .unwrap_or("");
        for referenced in [
            "/ui/app.js",
            "/ui/style.css",
            "/ui/vendor/uPlot.iife.min.js",
            "/ui/vendor/uPlot.min.css",
        ] {
            assert!(
                html.contains(referenced),
                "index.html does not load {referenced}"
            );
        }
    }

    #[test]
    fn assets_have_content_types_cache_headers_and_etags() {
        let r = serve("app.js", &HeaderMap::new());
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(
            header_of(&r, header::CONTENT_TYPE),
            "text/javascript; charset=utf-8"
        );
        assert_eq!(header_of(&r, header::CACHE_CONTROL), "no-cache");
        let etag = header_of(&r, header::ETAG).to_string();
        assert!(etag.starts_with('"') && etag.len() == 18, "{etag}");

        let r = serve("vendor/uPlot.min.css", &HeaderMap::new());
        assert_eq!(
            header_of(&r, header::CONTENT_TYPE),
            "text/css; charset=utf-8"
        );
        assert_eq!(
            header_of(&r, header::CACHE_CONTROL),
            "public, max-age=86400"
        );
        assert_eq!(
            header_of(
                &serve("index.html", &HeaderMap::new()),
                header::CONTENT_TYPE
            ),
            "text/html; charset=utf-8"
        );

        let mut h = HeaderMap::new();
        h.insert(
            header::IF_NONE_MATCH,
            HeaderValue::from_str(&etag).unwrap_or(HeaderValue::from_static("x")),
        );
        assert_eq!(serve("app.js", &h).status(), StatusCode::NOT_MODIFIED);
        h.insert(header::IF_NONE_MATCH, HeaderValue::from_static("\"other\""));
        assert_eq!(serve("app.js", &h).status(), StatusCode::OK);
    }

    #[test]
    fn unknown_paths_are_404() {
        for p in ["nope.js", "", "../Cargo.toml", "pages/", "vendor/uPlot.js"] {
            assert_eq!(
                serve(p, &HeaderMap::new()).status(),
                StatusCode::NOT_FOUND,
                "{p}"
            );
        }
    }
}
