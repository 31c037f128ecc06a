// Tests of the Responses vocabulary: realistic streams (reasoning, text, tool call, cut at
// max_output_tokens, failed, error), cut at any byte, and non-streaming bodies.

use super::super::StreamFormat;
use super::super::tests::{run_as, run_cut};
use proptest::prelude::*;

/// A reasoning model's stream as OpenAI sends it: lifecycle events, a reasoning summary, the
/// answer text, and `response.completed` with usage; no `[DONE]`.
const STREAM: &str = concat!(
    "event: response.created\n",
    "data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"created_at\":1796202257,\"status\":\"in_progress\",\"model\":\"o4-mini-2025-04-16\",\"output\":[],\"usage\":null}}\n\n",
    "event: response.in_progress\n",
    "data: {\"type\":\"response.in_progress\",\"sequence_number\":1,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"model\":\"o4-mini-2025-04-16\",\"output\":[],\"usage\":null}}\n\n",
    "event: response.output_item.added\n",
    "data: {\"type\":\"response.output_item.added\",\"sequence_number\":2,\"output_index\":0,\"item\":{\"id\":\"rs_1\",\"type\":\"reasoning\",\"summary\":[]}}\n\n",
    "event: response.reasoning_summary_part.added\n",
    "data: {\"type\":\"response.reasoning_summary_part.added\",\"sequence_number\":3,\"item_id\":\"rs_1\",\"output_index\":0,\"summary_index\":0,\"part\":{\"type\":\"summary_text\",\"text\":\"\"}}\n\n",
    "event: response.reasoning_summary_text.delta\n",
    "data: {\"type\":\"response.reasoning_summary_text.delta\",\"sequence_number\":4,\"item_id\":\"rs_1\",\"output_index\":0,\"summary_index\":0,\"delta\":\"**Greeting**\"}\n\n",
    "event: response.reasoning_summary_text.done\n",
    "data: {\"type\":\"response.reasoning_summary_text.done\",\"sequence_number\":5,\"item_id\":\"rs_1\",\"output_index\":0,\"summary_index\":0,\"text\":\"**Greeting**\"}\n\n",
    "event: response.output_item.added\n",
    "data: {\"type\":\"response.output_item.added\",\"sequence_number\":6,\"output_index\":1,\"item\":{\"id\":\"msg_1\",\"type\":\"message\",\"status\":\"in_progress\",\"role\":\"assistant\",\"content\":[]}}\n\n",
    "event: response.content_part.added\n",
    "data: {\"type\":\"response.content_part.added\",\"sequence_number\":7,\"item_id\":\"msg_1\",\"output_index\":1,\"content_index\":0,\"part\":{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[]}}\n\n",
    "event: response.output_text.delta\n",
    "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":8,\"item_id\":\"msg_1\",\"output_index\":1,\"content_index\":0,\"delta\":\"Hi\",\"logprobs\":[]}\n\n",
    "event: response.output_text.delta\n",
    "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":9,\"item_id\":\"msg_1\",\"output_index\":1,\"content_index\":0,\"delta\":\" there \\\"\\u00e9\\\"\",\"logprobs\":[]}\n\n",
    "event: response.output_text.delta\n",
    "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":10,\"item_id\":\"msg_1\",\"output_index\":1,\"content_index\":0,\"delta\":\"\",\"logprobs\":[]}\n\n",
    "event: response.output_text.done\n",
    "data: {\"type\":\"response.output_text.done\",\"sequence_number\":11,\"item_id\":\"msg_1\",\"output_index\":1,\"content_index\":0,\"text\":\"Hi there\",\"logprobs\":[]}\n\n",
    "event: response.output_item.done\n",
    "data: {\"type\":\"response.output_item.done\",\"sequence_number\":12,\"output_index\":1,\"item\":{\"id\":\"msg_1\",\"type\":\"message\",\"status\":\"completed\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"Hi there\",\"annotations\":[]}]}}\n\n",
    "event: response.completed\n",
    "data: {\"type\":\"response.completed\",\"sequence_number\":13,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"completed\",\"incomplete_details\":null,\"model\":\"o4-mini-2025-04-16\",\"output\":[{\"id\":\"rs_1\",\"type\":\"reasoning\",\"summary\":[{\"type\":\"summary_text\",\"text\":\"**Greeting**\"}]},{\"id\":\"msg_1\",\"type\":\"message\",\"status\":\"completed\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"Hi there\",\"annotations\":[]}]}],\"usage\":{\"input_tokens\":14,\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":73,\"output_tokens_details\":{\"reasoning_tokens\":64},\"total_tokens\":87}}}\n\n",
);

fn run(text: &str) -> super::super::SseObserver {
    run_as(StreamFormat::Responses, text.as_bytes())
}

#[test]
fn reasoning_then_text_stream() {
    let o = run(STREAM);
    assert!(o.malformed.is_none(), "{:?}", o.malformed);
    assert!(o.seen.done && !o.seen.error_event);
    assert_eq!(o.events, 14);
    assert_eq!(
        o.content_events, 3,
        "the summary delta and two non-empty text deltas"
    );
    assert_eq!(
        (
            o.seen.prompt_tokens,
            o.seen.completion_tokens,
            o.seen.reasoning_tokens
        ),
        (Some(14), Some(73), Some(64))
    );
    assert_eq!(o.seen.finish_reason.as_deref(), Some("stop"));
    assert_eq!(o.seen.model.as_deref(), Some("o4-mini-2025-04-16"));
}

#[test]
fn first_content_is_the_first_reasoning_delta() {
    let mut o = super::super::SseObserver::new(StreamFormat::Responses);
    let head = STREAM
        .find("event: response.reasoning_summary_text.delta")
        .unwrap();
    assert_eq!(
        o.feed(&STREAM.as_bytes()[..head]).content_events,
        0,
        "lifecycle events are not content"
    );
    let next = STREAM[head..].find("\n\n").unwrap() + head + 2;
    assert_eq!(o.feed(&STREAM.as_bytes()[head..next]).content_events, 1);
    assert_eq!(
        o.seen.model.as_deref(),
        Some("o4-mini-2025-04-16"),
        "model from response.created"
    );
}

#[test]
fn every_delta_kind_counts() {
    for kind in [
        "response.output_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.refusal.delta",
        "response.function_call_arguments.delta",
        "response.custom_tool_call_input.delta",
    ] {
        let text = format!(
            "event: {kind}\ndata: {{\"type\":\"{kind}\",\"item_id\":\"x\",\"output_index\":0,\"delta\":\"{{\\\"a\"}}\n\n"
        );
        let o = run(&text);
        assert_eq!(o.content_events, 1, "{kind}");
        assert!(o.malformed.is_none(), "{kind}: {:?}", o.malformed);
    }
    // Other events with a `delta` (audio, annotations …) are not timed as tokens.
    let o = run(
        "data: {\"type\":\"response.audio.delta\",\"delta\":\"AAAA\"}\n\ndata: {\"type\":\"response.future.delta\",\"delta\":{\"x\":1}}\n\n",
    );
    assert_eq!(o.content_events, 0);
    assert!(o.malformed.is_none(), "{:?}", o.malformed);
}

#[test]
fn cut_at_max_output_tokens_is_length() {
    let text = concat!(
        "event: response.output_text.delta\n",
        "data: {\"type\":\"response.output_text.delta\",\"delta\":\"a\"}\n\n",
        "event: response.incomplete\n",
        "data: {\"type\":\"response.incomplete\",\"response\":{\"status\":\"incomplete\",\"incomplete_details\":{\"reason\":\"max_output_tokens\"},\"model\":\"m\",\"output\":[],\"usage\":{\"input_tokens\":3,\"output_tokens\":16,\"output_tokens_details\":{\"reasoning_tokens\":15}}}}\n\n",
    );
    let o = run(text);
    assert!(o.seen.done && !o.seen.error_event && o.malformed.is_none());
    assert_eq!(o.seen.finish_reason.as_deref(), Some("length"));
    assert_eq!(
        (o.seen.completion_tokens, o.seen.reasoning_tokens),
        (Some(16), Some(15))
    );
    let filtered = text.replace("max_output_tokens", "content_filter");
    assert_eq!(
        run(&filtered).seen.finish_reason.as_deref(),
        Some("content_filter")
    );
}

#[test]
fn function_call_output_is_tool_calls() {
    let o = run(concat!(
        "event: response.function_call_arguments.delta\n",
        "data: {\"type\":\"response.function_call_arguments.delta\",\"item_id\":\"fc_1\",\"output_index\":0,\"delta\":\"{\\\"city\\\":\"}\n\n",
        "event: response.completed\n",
        "data: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\",\"model\":\"m\",\"output\":[{\"type\":\"function_call\",\"id\":\"fc_1\",\"call_id\":\"c\",\"name\":\"weather\",\"arguments\":\"{}\"}],\"usage\":{\"input_tokens\":9,\"output_tokens\":7}}}\n\n",
    ));
    assert_eq!(o.content_events, 1);
    assert_eq!(o.seen.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(o.seen.reasoning_tokens, None, "not reported, not invented");
}

#[test]
fn failures_are_error_events() {
    let failed = run(concat!(
        "event: response.output_text.delta\n",
        "data: {\"type\":\"response.output_text.delta\",\"delta\":\"a\"}\n\n",
        "event: response.failed\n",
        "data: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"boom\"},\"model\":\"m\",\"output\":[],\"usage\":null}}\n\n",
    ));
    assert!(failed.seen.error_event && failed.seen.done);
    assert_eq!(
        failed.malformed.as_deref(),
        Some("event 2 is an error event")
    );
    assert_eq!(failed.seen.finish_reason.as_deref(), Some("error"));

    let typed = run(
        "event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"boom\",\"param\":null,\"sequence_number\":3}\n\n",
    );
    assert!(typed.seen.error_event && !typed.seen.done);
    // `event: error` alone marks it, whatever the data says.
    let named = run("event: error\ndata: {\"message\":\"boom\"}\n\n");
    assert!(named.seen.error_event);
    // An `event: error` line whose event has no data dispatches nothing and marks nothing.
    let empty =
        run("event: error\n\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"a\"}\n\n");
    assert!(!empty.seen.error_event);
    assert_eq!(empty.content_events, 1);
}

#[test]
fn unknown_events_and_done_sentinel_pass_quietly() {
    let o = run(
        "event: response.web_search_call.searching\ndata: {\"type\":\"response.web_search_call.searching\",\"item_id\":\"ws\",\"output_index\":0}\n\ndata: [DONE]\n\n",
    );
    assert!(o.malformed.is_none(), "{:?}", o.malformed);
    assert_eq!((o.events, o.content_events), (2, 0));
    assert!(
        !o.seen.done,
        "only a terminal response event completes a Responses stream"
    );
    let o = run("data: {\"type\":\"response.output_text.delta\",\"delta\":\n\n");
    assert!(o.malformed.as_deref().unwrap().contains("not valid JSON"));
}

#[test]
fn non_streaming_bodies() {
    let body = br#"{"id":"resp_2","object":"response","status":"completed","model":"gpt-4.1","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"ok"}]}],"usage":{"input_tokens":20,"output_tokens":2,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":22}}"#;
    let o = StreamFormat::Responses.json_body(body).unwrap();
    assert_eq!(
        (o.prompt_tokens, o.completion_tokens, o.reasoning_tokens),
        (Some(20), Some(2), Some(0))
    );
    assert_eq!(
        (o.finish_reason.as_deref(), o.model.as_deref()),
        (Some("stop"), Some("gpt-4.1"))
    );
    let cut = br#"{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"usage":{"input_tokens":1,"output_tokens":8}}"#;
    assert_eq!(
        StreamFormat::Responses
            .json_body(cut)
            .unwrap()
            .finish_reason
            .as_deref(),
        Some("length")
    );
    let error = br#"{"error":{"message":"bad","type":"invalid_request_error"}}"#;
    assert_eq!(
        StreamFormat::Responses
            .json_body(error)
            .unwrap()
            .finish_reason,
        None
    );
}

proptest! {
    #[test]
    fn chunk_boundaries_do_not_matter(cuts in proptest::collection::vec(0usize..STREAM.len(), 0..40)) {
        let whole = run(STREAM);
        let o = run_cut(StreamFormat::Responses, STREAM.as_bytes(), cuts);
        prop_assert_eq!(o.events, whole.events);
        prop_assert_eq!(o.content_events, 3);
        prop_assert_eq!(&o.seen, &whole.seen);
        prop_assert!(o.malformed.is_none());
    }
}

#[test]
fn cached_input_tokens_streamed_and_unary() {
    assert_eq!(run(STREAM).seen.cached_input_tokens, Some(0));
    let body = br#"{"status":"completed","model":"gpt-4.1","output":[],"usage":{"input_tokens":2000,"input_tokens_details":{"cached_tokens":1536},"output_tokens":2}}"#;
    let o = StreamFormat::Responses.json_body(body).unwrap();
    assert_eq!(
        (o.prompt_tokens, o.cached_input_tokens),
        (Some(2000), Some(1536))
    );
}
