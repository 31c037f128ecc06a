// Feedback and evaluation scores as every input gives them (`POST /api/v1/feedback`,
// `/api/v1/scores`, span attributes): the reserved feedback and verdict names, what a score name
// may be, and one score on its way to the alert engine.

/// Thumbs: 1 up, 0 down.
pub const THUMBS: &str = "thumbs";
/// Guardrail verdict: 1 flagged, 0 passed.
pub const GUARDRAIL: &str = "guardrail";
/// Hallucination verdict: 1 flagged, 0 not.
pub const HALLUCINATION: &str = "hallucination";
/// RAG retrieval recall (0..1).
pub const RETRIEVAL_RECALL: &str = "retrieval_recall";
/// RAG retrieval came back empty: 1, else 0.
pub const RETRIEVAL_EMPTY: &str = "retrieval_empty";
/// The evaluation score A/B regression reads as toxicity.
pub const TOXICITY: &str = "toxicity";
/// The quality score A/B regression and prompt-version decay read unless configured otherwise.
pub const DEFAULT_QUALITY: &str = "factuality";

/// Names that are feedback or verdicts, not evaluation scores (`POST /api/v1/scores` refuses
/// them as a score name).
pub const RESERVED: [&str; 5] = [
    THUMBS,
    GUARDRAIL,
    HALLUCINATION,
    RETRIEVAL_RECALL,
    RETRIEVAL_EMPTY,
];

/// Whether `name` is a score that says how good an answer is (higher is better): any
/// evaluation score but toxicity.
pub fn is_quality(name: &str) -> bool {
    !RESERVED.contains(&name) && name != TOXICITY
}

/// Longest score name.
pub const MAX_NAME: usize = 64;

/// Whether `name` may name an evaluation score: 1 to `MAX_NAME` of `[a-z0-9_.]`, not one of
/// the feedback / verdict names.
pub fn valid_score_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'.')
        && !RESERVED.contains(&name)
}

/// One score on its way to the engine (`POST /api/v1/feedback`, `/api/v1/scores`).
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreInput {
    /// Empty when the score names a trace only.
    pub request_id: String,
    /// Empty when the score names a request id only.
    pub trace_id: String,
    /// The model, when the poster said; used when the request is not known to the engine.
    pub model: String,
    pub at_ms: i64,
    pub name: String,
    pub value: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn score_names_are_checked() {
        assert!(valid_score_name("bleu"));
        assert!(valid_score_name("rag.recall_at_5"));
        assert!(!valid_score_name(""));
        assert!(!valid_score_name("BLEU"));
        assert!(!valid_score_name(&"a".repeat(MAX_NAME + 1)));
        assert!(!valid_score_name(GUARDRAIL));
    }
}
