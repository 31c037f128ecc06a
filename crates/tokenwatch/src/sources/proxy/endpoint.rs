// Which proxied requests are LLM calls, and as which endpoint: the OpenAI and Anthropic paths
// (`/v1/chat/completions` …), the same paths under a configured prefix (`proxy.path_prefixes`;
// `/openai` by default, Azure OpenAI's v1 API), and Azure OpenAI's deployment paths
// (`/openai/deployments/{deployment}/chat/completions?api-version=…`), whose model is the
// deployment. The request is forwarded on its own path; only what it is measured as changes.

use crate::kernel::stream_format::StreamFormat;

/// The endpoints whose requests become records.
const ENDPOINTS: [&str; 5] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/messages",
];

/// Where Azure OpenAI puts a deployment's operations: `/openai/deployments/{name}/{operation}`.
const AZURE_DEPLOYMENTS: &str = "/openai/deployments/";

/// An LLM call recognised from its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlmEndpoint {
    /// The endpoint it is measured as (one of the `/v1/…` paths).
    pub endpoint: &'static str,
    pub format: StreamFormat,
    /// Azure OpenAI's deployment named in the path: the model when the body names none.
    pub deployment: Option<String>,
}

/// The LLM endpoint `path` calls, directly, under one of `prefixes` (each `/…` without a
/// trailing slash), or as an Azure OpenAI deployment; None for every other path.
pub fn llm_endpoint(path: &str, prefixes: &[String]) -> Option<LlmEndpoint> {
    let plain = |p: &str| {
        let endpoint = ENDPOINTS.into_iter().find(|e| *e == p)?;
        Some(LlmEndpoint {
            endpoint,
            format: StreamFormat::for_endpoint(endpoint)?,
            deployment: None,
        })
    };
    if let Some(e) = plain(path) {
        return Some(e);
    }
    if let Some(rest) = path.strip_prefix(AZURE_DEPLOYMENTS) {
        let (deployment, operation) = rest.split_once('/')?;
        if deployment.is_empty() {
            return None;
        }
        let mut e = plain(&format!("/v1/{operation}"))?;
        e.deployment = Some(deployment.to_string());
        return Some(e);
    }
    prefixes
        .iter()
        .filter_map(|p| path.strip_prefix(p.as_str()))
        .find_map(plain)
}

/// `proxy.path_prefixes` as the proxy matches them: trailing slashes cut, empty ones dropped.
pub fn normalised_prefixes(prefixes: &[String]) -> Vec<String> {
    prefixes
        .iter()
        .map(|p| p.trim_end_matches('/').to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

/// What is wrong with a configured prefix, if anything.
pub fn check_prefix(prefix: &str) -> Result<(), String> {
    if !prefix.starts_with('/') {
        return Err(format!("{prefix:?} must start with '/'"));
    }
    if prefix.contains(['?', '#']) {
        return Err(format!("{prefix:?} is a path, without query or fragment"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefixes() -> Vec<String> {
        normalised_prefixes(&["/openai/".into(), "/llm/api".into()])
    }

    #[test]
    fn plain_prefixed_and_azure_deployment_paths_are_measured_as_their_endpoint() {
        let p = prefixes();
        let at = |path: &str| llm_endpoint(path, &p).map(|e| (e.endpoint, e.deployment));
        assert_eq!(
            at("/v1/chat/completions"),
            Some(("/v1/chat/completions", None))
        );
        assert_eq!(at("/v1/messages"), Some(("/v1/messages", None)));
        assert_eq!(
            at("/openai/v1/chat/completions"),
            Some(("/v1/chat/completions", None))
        );
        assert_eq!(at("/llm/api/v1/responses"), Some(("/v1/responses", None)));
        assert_eq!(
            at("/openai/deployments/gpt-4o-prod/chat/completions"),
            Some(("/v1/chat/completions", Some("gpt-4o-prod".into())))
        );
        assert_eq!(
            at("/openai/deployments/emb/embeddings"),
            Some(("/v1/embeddings", Some("emb".into())))
        );
        for other in [
            "/v1/models",
            "/openai/v1/models",
            "/openai/deployments//chat/completions",
            "/openai/deployments/x",
            "/openai/deployments/x/images/generations",
            "/other/v1/chat/completions",
            "/openaiv1/chat/completions",
            "/v1/chat/completions/extra",
        ] {
            assert_eq!(at(other), None, "{other}");
        }
        // Without prefixes, only the plain paths and Azure deployments.
        assert_eq!(llm_endpoint("/openai/v1/chat/completions", &[]), None);
        assert!(llm_endpoint("/openai/deployments/d/completions", &[]).is_some());
    }

    #[test]
    fn prefixes_are_normalised_and_checked() {
        assert_eq!(
            normalised_prefixes(&["/a/".into(), "/".into(), "".into()]),
            ["/a"]
        );
        assert!(check_prefix("/openai").is_ok());
        assert!(
            check_prefix("openai")
                .unwrap_err()
                .contains("start with '/'")
        );
        assert!(check_prefix("/a?b").is_err());
    }
}
