// Tests of the Anthropic Messages vocabulary: realistic streams (thinking, text, tool input,
// max_tokens, error), cut at any byte, and non-streaming bodies.

use super::super::StreamFormat;
use super::super::tests::{run_as, run_cut};
use proptest::prelude::*;

/// An extended-thinking stream as Anthropic sends it: thinking deltas and a signature, a ping,
/// the answer, usage split across `message_start` (input) and `message_delta` (output).
const STREAM: &str = concat!(
    "event: message_start\n",
    "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-sonnet-4-5\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":25,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":100,\"output_tokens\":1}}}\n\n",
    "event: content_block_start\n",
    "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}\n\n",
    "event: ping\n",
    "data: {\"type\": \"ping\"}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"The user says hi.\"}}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\" Reply briefly.\"}}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"EqQBCgIYAhIM1gbcDa9GJwZA2b3h\"}}\n\n",
    "event: content_block_stop\n",
    "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    "event: content_block_start\n",
    "data: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"! \\u2728\"}}\n\n",
    "event: content_block_stop\n",
    "data: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
    "event: message_delta\n",
    "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":42}}\n\n",
    "event: message_stop\n",
    "data: {\"type\":\"message_stop\"}\n\n",
);

fn run(text: &str) -> super::super::SseObserver {
    run_as(StreamFormat::Anthropic, text.as_bytes())
}

#[test]
fn thinking_then_text_stream() {
    let o = run(STREAM);
    assert!(o.malformed.is_none(), "{:?}", o.malformed);
    assert!(o.seen.done && !o.seen.error_event);
    assert_eq!(o.events, 13);
    assert_eq!(
        o.content_events, 4,
        "two thinking and two text deltas; not the signature"
    );
    assert_eq!(
        o.seen.prompt_tokens,
        Some(125),
        "input plus cached prompt tokens"
    );
    assert_eq!(o.seen.completion_tokens, Some(42));
    assert_eq!(
        o.seen.reasoning_tokens, None,
        "Anthropic does not report it"
    );
    assert_eq!(o.seen.finish_reason.as_deref(), Some("stop"));
    assert_eq!(o.seen.model.as_deref(), Some("claude-sonnet-4-5"));
}

#[test]
fn first_content_is_the_first_thinking_delta() {
    let mut o = super::super::SseObserver::new(StreamFormat::Anthropic);
    let head = STREAM.find("event: content_block_delta").unwrap();
    assert_eq!(o.feed(&STREAM.as_bytes()[..head]).content_events, 0);
    assert_eq!(o.seen.model.as_deref(), Some("claude-sonnet-4-5"));
    let next = STREAM[head..].find("\n\n").unwrap() + head + 2;
    assert_eq!(o.feed(&STREAM.as_bytes()[head..next]).content_events, 1);
}

#[test]
fn stop_reasons_map_to_chat_finish_reasons() {
    for (stop, want) in [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        ("pause_turn", "pause_turn"),
    ] {
        let text = format!(
            "event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"{stop}\",\"stop_sequence\":null}},\"usage\":{{\"output_tokens\":16}}}}\n\n"
        );
        assert_eq!(
            run(&text).seen.finish_reason.as_deref(),
            Some(want),
            "{stop}"
        );
    }
}

#[test]
fn tool_input_counts_but_empty_partial_json_does_not() {
    let o = run(concat!(
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get_weather\",\"input\":{}}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\"}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"location\\\": \\\"Paris\\\"}\"}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"future_delta\",\"payload\":1}}\n\n",
        "event: message_delta\n",
        "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":20}}\n\n",
    ));
    assert_eq!(
        o.content_events, 2,
        "the non-empty tool input and the unknown delta type"
    );
    assert_eq!(o.seen.finish_reason.as_deref(), Some("tool_calls"));
    assert!(!o.seen.done, "no message_stop");
}

#[test]
fn error_event_mid_stream() {
    let o = run(concat!(
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"}}\n\n",
        "event: error\n",
        "data: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
    ));
    assert!(o.seen.error_event);
    assert_eq!(o.malformed.as_deref(), Some("event 2 is an error event"));
    assert!(
        run("data: {\"type\":\"error\",\"error\":{}}\n\n")
            .seen
            .error_event,
        "typed error without event line"
    );
}

#[test]
fn message_delta_input_tokens_update_the_prompt() {
    let o = run(concat!(
        "data: {\"type\":\"message_start\",\"message\":{\"model\":\"m\",\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n",
        "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"input_tokens\":12,\"output_tokens\":16}}\n\n",
        "data: {\"type\":\"message_stop\"}\n\n",
    ));
    assert_eq!(
        (o.seen.prompt_tokens, o.seen.completion_tokens),
        (Some(12), Some(16))
    );
    assert_eq!(o.seen.finish_reason.as_deref(), Some("length"));
    assert!(o.seen.done);
}

#[test]
fn non_streaming_bodies() {
    let body = br#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-haiku-4-5","content":[{"type":"text","text":"Hi"}],"stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":9,"cache_read_input_tokens":3,"output_tokens":16}}"#;
    let o = StreamFormat::Anthropic.json_body(body).unwrap();
    assert_eq!((o.prompt_tokens, o.completion_tokens), (Some(12), Some(16)));
    assert_eq!(
        (o.finish_reason.as_deref(), o.model.as_deref()),
        (Some("length"), Some("claude-haiku-4-5"))
    );
    let error = br#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: Field required"}}"#;
    let o = StreamFormat::Anthropic.json_body(error).unwrap();
    assert_eq!((o.completion_tokens, o.finish_reason), (None, None));
}

proptest! {
    #[test]
    fn chunk_boundaries_do_not_matter(cuts in proptest::collection::vec(0usize..STREAM.len(), 0..40)) {
        let whole = run(STREAM);
        let o = run_cut(StreamFormat::Anthropic, STREAM.as_bytes(), cuts);
        prop_assert_eq!(o.events, whole.events);
        prop_assert_eq!(o.content_events, 4);
        prop_assert_eq!(&o.seen, &whole.seen);
        prop_assert!(o.malformed.is_none());
    }
}

#[test]
fn cache_reads_are_the_cached_input_tokens() {
    assert_eq!(run(STREAM).seen.cached_input_tokens, Some(100));
    let body = br#"{"model":"claude-haiku-4-5","stop_reason":"end_turn","usage":{"input_tokens":9,"cache_creation_input_tokens":5,"cache_read_input_tokens":3,"output_tokens":16}}"#;
    let o = StreamFormat::Anthropic.json_body(body).unwrap();
    assert_eq!(
        (o.prompt_tokens, o.cached_input_tokens),
        (Some(17), Some(3))
    );
}
