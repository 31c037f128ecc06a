// The API whose event vocabulary a streamed response speaks (OpenAI chat/completions, OpenAI
// Responses, Anthropic Messages), chosen from the request's endpoint — shared by the proxy's
// stream observer (which reads each format's events, `sources::proxy::sse`) and text capture.

/// The API whose event vocabulary a response speaks, chosen from the request's endpoint. Each
/// variant's events and JSON bodies are read in its own module of `sources::proxy::sse`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamFormat {
    /// OpenAI chat completions, completions and embeddings: `choices` chunks, then `data: [DONE]`.
    OpenAi,
    /// OpenAI Responses (`/v1/responses`): typed `response.*` events, ending with
    /// `response.completed`, `response.incomplete` or `response.failed` (no `[DONE]`).
    Responses,
    /// Anthropic Messages (`/v1/messages`): `message_start` … `content_block_delta` …
    /// `message_delta`, `message_stop`.
    Anthropic,
}

impl StreamFormat {
    /// The format of an endpoint whose requests become records; None for every other path.
    pub fn for_endpoint(path: &str) -> Option<StreamFormat> {
        match path {
            "/v1/chat/completions" | "/v1/completions" | "/v1/embeddings" => {
                Some(StreamFormat::OpenAi)
            }
            "/v1/responses" => Some(StreamFormat::Responses),
            "/v1/messages" => Some(StreamFormat::Anthropic),
            _ => None,
        }
    }
}
