// Routing of proxied requests to upstreams by model: the first upstream listing the model,
// else the first catch-all upstream. Each route carries its runtime and instance labels.

use crate::config::{UpstreamConfig, parse_upstream_url};

#[derive(Debug, Clone)]
pub struct Route {
    authority: http::uri::Authority,
    base_path: String,
    models: Vec<String>,
    any_model: bool,
    pub runtime: String,
    pub instance: String,
}

impl Route {
    pub fn new(u: &UpstreamConfig) -> Result<Route, String> {
        let (authority, base_path) = parse_upstream_url(&u.url)?;
        Ok(Route {
            instance: u.instance.clone().unwrap_or_else(|| authority.to_string()),
            authority,
            base_path,
            models: u.models.clone(),
            any_model: u.serves_any_model(),
            runtime: u.runtime.clone(),
        })
    }

    /// The upstream URI for a client request URI (path and query kept).
    pub fn uri_for(&self, client: &http::Uri) -> Result<http::Uri, String> {
        let pq = client.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        format!("http://{}{}{}", self.authority, self.base_path, pq)
            .parse()
            .map_err(|e| format!("cannot build the upstream URL for {pq:?}: {e}"))
    }
}

#[derive(Debug, Clone, Default)]
pub struct Router {
    routes: Vec<Route>,
}

impl Router {
    pub fn new(upstreams: &[UpstreamConfig]) -> Result<Router, String> {
        let routes = upstreams.iter().map(Route::new).collect::<Result<Vec<_>, _>>()?;
        Ok(Router { routes })
    }

    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    pub fn route(&self, model: Option<&str>) -> Option<&Route> {
        model
            .and_then(|m| self.routes.iter().find(|r| r.models.iter().any(|x| x == m)))
            .or_else(|| self.routes.iter().find(|r| r.any_model))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(url: &str, models: &[&str]) -> UpstreamConfig {
        UpstreamConfig {
            url: url.into(),
            models: models.iter().map(|s| s.to_string()).collect(),
            runtime: "vllm".into(),
            instance: None,
        }
    }

    #[test]
    fn routes_by_model_then_default() {
        let r = Router::new(&[up("http://127.0.0.1:1", &["a"]), up("http://127.0.0.1:2/base/", &["*"])]).unwrap();
        assert_eq!(r.route(Some("a")).unwrap().instance, "127.0.0.1:1");
        assert_eq!(r.route(Some("b")).unwrap().instance, "127.0.0.1:2");
        assert_eq!(r.route(None).unwrap().instance, "127.0.0.1:2");
        let uri = r.route(None).unwrap().uri_for(&"/v1/models?x=1".parse().unwrap()).unwrap();
        assert_eq!(uri.to_string(), "http://127.0.0.1:2/base/v1/models?x=1");
        let only = Router::new(&[up("http://127.0.0.1:1", &["a"])]).unwrap();
        assert!(only.route(Some("z")).is_none());
    }
}
