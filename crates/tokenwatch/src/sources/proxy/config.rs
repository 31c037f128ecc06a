// The `proxy:` section: where the proxy listens, its upstreams (and how their base URLs are
// read), weighted routes, the headers it reads, its timeouts and its listener's TLS.

use crate::kernel::duration::HumanDuration;
use crate::kernel::tls::UpstreamTlsConfig;
use serde::Deserialize;
use std::net::SocketAddr;
use std::time::Duration;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyConfig {
    pub listen: SocketAddr,
    /// Upstreams: those whose `models` contain the request's model, else those with
    /// `models: ["*"]` (or no models), are a pool balanced by requests in flight.
    pub upstreams: Vec<UpstreamConfig>,
    /// Weighted splits of a model's requests between versions on named upstreams (canaries).
    pub routes: Vec<crate::kernel::splits::RouteConfig>,
    /// Header carrying the tenant. Without it the tenant is a salted hash of the API key.
    pub tenant_header: String,
    pub ab_group_header: String,
    pub model_version_header: String,
    pub prompt_version_header: String,
    /// Path prefixes under which the LLM endpoints are measured like `/v1/…` (a gateway or
    /// ingress mounting the API at `/openai/v1/chat/completions`, say); requests are forwarded on
    /// their own path. `/openai` by default (Azure OpenAI's v1 API). Azure OpenAI's deployment
    /// paths (`/openai/deployments/{deployment}/chat/completions`) are measured whatever this
    /// holds, the deployment standing for the model when the body names none.
    pub path_prefixes: Vec<String>,
    /// Salt for hashing API keys into tenant ids; generated and kept in the data dir when empty.
    pub tenant_salt: String,
    pub connect_timeout: HumanDuration,
    /// Time allowed for the upstream's response headers.
    pub response_timeout: HumanDuration,
    /// Longest silence allowed between two chunks of a response body.
    pub idle_timeout: HumanDuration,
    pub max_request_body_bytes: usize,
    /// Allow the proxy to listen off loopback (it checks no tokenwatch token: the upstream
    /// authenticates the clients whose `Authorization` header it forwards).
    pub allow_public: bool,
    /// The proxy listener's own TLS certificate, or `enabled: false` [default: the shared `tls`].
    pub tls: Option<crate::listen::tls::ListenerTlsConfig>,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            upstreams: Vec::new(),
            routes: Vec::new(),
            tenant_header: "x-tenant-id".into(),
            ab_group_header: "x-ab-group".into(),
            model_version_header: "x-model-version".into(),
            prompt_version_header: "x-prompt-version".into(),
            path_prefixes: vec!["/openai".into()],
            tenant_salt: String::new(),
            connect_timeout: HumanDuration(Duration::from_secs(5)),
            response_timeout: HumanDuration(Duration::from_secs(300)),
            idle_timeout: HumanDuration(Duration::from_secs(120)),
            max_request_body_bytes: 32 * 1024 * 1024,
            allow_public: false,
            tls: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Base URL, `http://host:port[/base]` or `https://host[:port][/base]`.
    pub url: String,
    /// Models routed here; `["*"]` or empty means any model.
    #[serde(default)]
    pub models: Vec<String>,
    /// Runtime label (`vllm`, `tgi`, `sglang`, `triton`, `sim`, `openai`…).
    #[serde(default = "default_runtime")]
    pub runtime: String,
    /// Instance label; defaults to the URL's `host:port`.
    #[serde(default)]
    pub instance: Option<String>,
    /// TLS settings of an `https://` upstream (not allowed on `http://` ones).
    #[serde(default)]
    pub tls: Option<UpstreamTlsConfig>,
}

fn default_runtime() -> String {
    "openai".into()
}

impl UpstreamConfig {
    pub fn serves_any_model(&self) -> bool {
        self.models.is_empty() || self.models.iter().any(|m| m == "*")
    }
}

/// An upstream's base URL, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamUrl {
    pub https: bool,
    pub authority: http::uri::Authority,
    /// The path prefix, without a trailing `/` (empty for none).
    pub base_path: String,
}

/// Parse `http://host:port[/base]` or `https://host[:port][/base]`; anything else is refused.
pub fn parse_upstream_url(url: &str) -> Result<UpstreamUrl, String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => {
            return Err(format!(
                "{url:?}: expected http://host:port or https://host[:port]"
            ));
        }
    };
    let authority = uri
        .authority()
        .cloned()
        .ok_or_else(|| format!("{url:?}: missing host"))?;
    if authority.host().is_empty() || authority.as_str().contains('@') {
        return Err(format!("{url:?}: expected a host[:port] without user info"));
    }
    if uri.query().is_some() {
        return Err(format!("{url:?}: a base URL takes no query string"));
    }
    let base_path = uri.path().trim_end_matches('/').to_string();
    Ok(UpstreamUrl {
        https,
        authority,
        base_path,
    })
}
