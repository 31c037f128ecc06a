// Tests of the SSE framing and the chat vocabulary (real vLLM streams, reasoning deltas under
// both field names), and helpers the other formats' tests share: runs cut at any byte.

use super::*;
use proptest::prelude::*;

const CHAT: &str = include_str!("../../../../../../fixtures/vllm-cpu-sse-chat.txt");
const COMPLETION: &str = include_str!("../../../../../../fixtures/vllm-cpu-sse.txt");

/// A vLLM (2026) reasoning-model chat stream: three reasoning deltas under `delta.reasoning`,
/// then the answer, then usage with the reasoning count.
pub(super) const CHAT_REASONING: &str = concat!(
    "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1796202257,\"model\":\"qwen3-8b\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1796202257,\"model\":\"qwen3-8b\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"The user\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1796202257,\"model\":\"qwen3-8b\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\" greets\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1796202257,\"model\":\"qwen3-8b\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\" me.\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1796202257,\"model\":\"qwen3-8b\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1796202257,\"model\":\"qwen3-8b\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"!\"},\"logprobs\":null,\"finish_reason\":\"stop\",\"stop_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1796202257,\"model\":\"qwen3-8b\",\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"total_tokens\":16,\"completion_tokens\":5,\"completion_tokens_details\":{\"reasoning_tokens\":3}}}\n\n",
    "data: [DONE]\n\n",
);

pub(super) fn run_as(format: StreamFormat, bytes: &[u8]) -> SseObserver {
    let mut o = SseObserver::new(format);
    o.feed(bytes);
    o.finish();
    o
}

/// The stream fed in pieces cut at `cuts` (any byte offsets, in any order).
pub(super) fn run_cut(format: StreamFormat, bytes: &[u8], mut cuts: Vec<usize>) -> SseObserver {
    cuts.sort_unstable();
    let mut o = SseObserver::new(format);
    let mut prev = 0;
    for c in cuts {
        let c = c.min(bytes.len());
        o.feed(&bytes[prev..c]);
        prev = c;
    }
    o.feed(&bytes[prev..]);
    o.finish();
    o
}

fn run(bytes: &[u8]) -> SseObserver {
    run_as(StreamFormat::OpenAi, bytes)
}

#[test]
fn real_vllm_chat_stream() {
    let o = run(CHAT.as_bytes());
    assert!(o.seen.done);
    assert!(o.malformed.is_none(), "{:?}", o.malformed);
    assert_eq!(o.seen.prompt_tokens, Some(16));
    assert_eq!(o.seen.completion_tokens, Some(20));
    assert_eq!(o.seen.reasoning_tokens, None);
    assert_eq!(o.seen.finish_reason.as_deref(), Some("length"));
    assert_eq!(o.seen.model.as_deref(), Some("tinyllama"));
    // The role-only first chunk and the empty-content chunks do not count as content.
    let non_empty = CHAT
        .lines()
        .filter(|l| l.contains("\"content\":\"") && !l.contains("\"content\":\"\""))
        .count() as u32;
    assert_eq!(o.content_events, non_empty);
    assert!(o.content_events < o.events - 2);
}

#[test]
fn real_vllm_completion_stream() {
    let o = run(COMPLETION.as_bytes());
    assert!(o.seen.done);
    assert_eq!(o.seen.completion_tokens, Some(20));
    let non_empty = COMPLETION
        .lines()
        .filter(|l| l.contains("\"text\":\"") && !l.contains("\"text\":\"\""))
        .count();
    assert_eq!(o.content_events as usize, non_empty);
}

#[test]
fn first_role_only_chunk_is_not_content() {
    let mut o = SseObserver::new(StreamFormat::OpenAi);
    let r =
        o.feed(b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n");
    assert_eq!(r.content_events, 0);
    let r = o.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n");
    assert_eq!(r.content_events, 1);
}

#[test]
fn reasoning_deltas_are_content_under_either_field_name() {
    let o = run(CHAT_REASONING.as_bytes());
    assert!(o.malformed.is_none(), "{:?}", o.malformed);
    assert!(o.seen.done);
    assert_eq!(o.content_events, 5, "3 reasoning + 2 answer deltas");
    assert_eq!(
        (
            o.seen.prompt_tokens,
            o.seen.completion_tokens,
            o.seen.reasoning_tokens
        ),
        (Some(11), Some(5), Some(3))
    );
    assert_eq!(o.seen.finish_reason.as_deref(), Some("stop"));

    // The first reasoning delta is the first content, whichever name the server uses.
    for field in ["reasoning", "reasoning_content"] {
        let mut o = SseObserver::new(StreamFormat::OpenAi);
        let role = o.feed(
            b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
        );
        assert_eq!(role.content_events, 0);
        let think = format!(
            "data: {{\"choices\":[{{\"delta\":{{\"{field}\":\"Hmm\",\"content\":null}}}}]}}\n\n"
        );
        assert_eq!(o.feed(think.as_bytes()).content_events, 1, "{field}");
        let empty = format!("data: {{\"choices\":[{{\"delta\":{{\"{field}\":\"\"}}}}]}}\n\n");
        assert_eq!(o.feed(empty.as_bytes()).content_events, 0, "empty {field}");
        assert!(o.malformed.is_none(), "{:?}", o.malformed);
    }
}

#[test]
fn chat_error_event_is_noted() {
    let o =
        run(b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"error\":{\"message\":\"boom\"}}\n\n");
    assert!(o.seen.error_event);
    assert_eq!(o.malformed.as_deref(), Some("event 2 is an error event"));
    assert!(!o.seen.done);
}

#[test]
fn malformed_event_is_noted_not_fatal() {
    let o = run(b"data: {not json\n\ndata: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n");
    assert!(o.malformed.is_some());
    assert_eq!(o.content_events, 1);
    assert!(o.seen.done);
}

#[test]
fn crlf_and_multiline_data() {
    let o = run(b": keep-alive\r\ndata: {\"choices\":\r\ndata: [{\"text\":\"a\"}]}\r\n\r\ndata: [DONE]\r\n\r\n");
    assert!(o.malformed.is_none(), "{:?}", o.malformed);
    assert_eq!(o.content_events, 1);
    assert!(o.seen.done);
}

#[test]
fn non_streaming_body() {
    let body = br#"{"model":"m","choices":[{"message":{"content":"x"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":7}}"#;
    let o = StreamFormat::OpenAi.json_body(body).unwrap();
    assert_eq!(
        (
            o.prompt_tokens,
            o.completion_tokens,
            o.finish_reason.as_deref(),
            o.model.as_deref()
        ),
        (Some(5), Some(7), Some("stop"), Some("m"))
    );
    assert_eq!(o.reasoning_tokens, None);
    let body = br#"{"model":"o4","choices":[{"message":{"content":"x","reasoning":"y"},"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":64,"completion_tokens_details":{"reasoning_tokens":60,"audio_tokens":0}}}"#;
    let o = StreamFormat::OpenAi.json_body(body).unwrap();
    assert_eq!(
        (o.completion_tokens, o.reasoning_tokens),
        (Some(64), Some(60))
    );
    assert_eq!(StreamFormat::OpenAi.json_body(b"[1,2]"), None);
}

#[test]
fn endpoints_choose_their_format() {
    use StreamFormat::*;
    for (path, want) in [
        ("/v1/chat/completions", Some(OpenAi)),
        ("/v1/completions", Some(OpenAi)),
        ("/v1/embeddings", Some(OpenAi)),
        ("/v1/responses", Some(Responses)),
        ("/v1/messages", Some(Anthropic)),
        ("/v1/messages/count_tokens", None),
        ("/v1/responses/resp_1", None),
        ("/v1/models", None),
    ] {
        assert_eq!(StreamFormat::for_endpoint(path), want, "{path}");
    }
}

#[test]
fn event_names_are_reset_per_event_and_bounded() {
    // An `event:` line without data dispatches nothing and does not leak into the next event.
    let long = "x".repeat(10 * MAX_EVENT_NAME);
    let text = format!(
        "event: error\n\nevent: {long}\ndata: {{\"choices\":[{{\"text\":\"a\"}}]}}\n\ndata: [DONE]\n\n"
    );
    let o = run(text.as_bytes());
    assert_eq!((o.events, o.content_events), (2, 1));
    assert!(o.malformed.is_none(), "{:?}", o.malformed);
}

proptest! {
    // However the stream is cut into chunks, the observer sees the same events.
    #[test]
    fn chunk_boundaries_do_not_matter(cuts in proptest::collection::vec(0usize..CHAT.len(), 0..40)) {
        let whole = run(CHAT.as_bytes());
        let o = run_cut(StreamFormat::OpenAi, CHAT.as_bytes(), cuts);
        prop_assert_eq!(o.events, whole.events);
        prop_assert_eq!(o.content_events, whole.content_events);
        prop_assert_eq!(o.seen.completion_tokens, whole.seen.completion_tokens);
        prop_assert!(o.seen.done);
    }

    #[test]
    fn reasoning_stream_cut_anywhere(cuts in proptest::collection::vec(0usize..CHAT_REASONING.len(), 0..40)) {
        let whole = run(CHAT_REASONING.as_bytes());
        let o = run_cut(StreamFormat::OpenAi, CHAT_REASONING.as_bytes(), cuts);
        prop_assert_eq!(o.events, whole.events);
        prop_assert_eq!(o.content_events, 5);
        prop_assert_eq!(&o.seen, &whole.seen);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        for f in [StreamFormat::OpenAi, StreamFormat::Responses, StreamFormat::Anthropic] {
            let _ = run_as(f, &bytes);
            let _ = f.json_body(&bytes);
        }
    }
}

#[test]
fn cached_prompt_tokens_streamed_and_unary() {
    let stream = concat!(
        "data: {\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":2006,\"completion_tokens\":300,\"prompt_tokens_details\":{\"cached_tokens\":1920,\"audio_tokens\":0}}}\n\n",
        "data: [DONE]\n\n",
    );
    let o = run(stream.as_bytes());
    assert_eq!(
        (o.seen.prompt_tokens, o.seen.cached_input_tokens),
        (Some(2006), Some(1920))
    );
    let body = br#"{"model":"m","choices":[{"finish_reason":"stop"}],"usage":{"prompt_tokens":50,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":32}}}"#;
    let o = StreamFormat::OpenAi.json_body(body).unwrap();
    assert_eq!(o.cached_input_tokens, Some(32));
    let o = run(CHAT_REASONING.as_bytes());
    assert_eq!(o.seen.cached_input_tokens, None, "not reported: unknown");
}
