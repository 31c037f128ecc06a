"""Drive tokenwatch's proxy with the real OpenAI Python client over the Responses API (streamed
and not) and a streamed chat completion of a reasoning model, and with the real Anthropic Python
client over the Messages API (streamed; it authenticates with `x-api-key`), as a user would.

Usage: streaming_apis_client.py BASE_URL MODEL MAX_TOKENS
Prints one JSON object keyed by the x-request-id each request was sent with: what the client
saw (event counts, usage, status), for the test to compare with tokenwatch's records.
"""
import json
import sys
import time

from anthropic import Anthropic
from openai import OpenAI

base_url, model, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = OpenAI(base_url=base_url, api_key="sk-test-key", max_retries=0, timeout=60)
out = {}

# Responses API, streamed: reasoning deltas first, then output text, then response.incomplete.
start = time.monotonic()
first_delta_s = None
kinds = {}
text_deltas = 0  # deltas with text (the simulator, like vLLM, sends some empty ones)
final = None
stream = client.responses.create(
    model=model,
    instructions="You are terse.",
    input=[{"role": "user", "content": [{"type": "input_text", "text": "what is paged attention?"}]}],
    max_output_tokens=max_tokens,
    stream=True,
    extra_headers={"x-request-id": "resp-stream"},
)
for ev in stream:
    kinds[ev.type] = kinds.get(ev.type, 0) + 1
    if ev.type.endswith(".delta") and getattr(ev, "delta", None):
        text_deltas += 1
        if first_delta_s is None:
            first_delta_s = time.monotonic() - start
    if ev.type in ("response.completed", "response.incomplete", "response.failed"):
        final = ev.response
u = final.usage
out["resp-stream"] = {
    "kinds": kinds,
    "text_deltas": text_deltas,
    "first_delta_s": first_delta_s,
    "status": final.status,
    "incomplete_reason": final.incomplete_details.reason if final.incomplete_details else None,
    "model": final.model,
    "input_tokens": u.input_tokens,
    "output_tokens": u.output_tokens,
    "reasoning_tokens": u.output_tokens_details.reasoning_tokens,
}

# Responses API, not streamed.
r = client.responses.create(
    model=model, input="hello there", max_output_tokens=max_tokens, extra_headers={"x-request-id": "resp-json"}
)
out["resp-json"] = {
    "status": r.status,
    "incomplete_reason": r.incomplete_details.reason if r.incomplete_details else None,
    "input_tokens": r.usage.input_tokens,
    "output_tokens": r.usage.output_tokens,
    "reasoning_tokens": r.usage.output_tokens_details.reasoning_tokens,
}

# Chat completions, streamed, from the reasoning model: `delta.reasoning` chunks come first.
stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "hi"}],
    stream=True,
    stream_options={"include_usage": True},
    max_tokens=max_tokens,
    extra_headers={"x-request-id": "chat-think"},
)
reasoning_chunks, content_chunks, usage, finish = 0, 0, None, None
for ch in stream:
    if ch.choices:
        d = ch.choices[0].delta
        extra = d.model_extra or {}
        if extra.get("reasoning") or extra.get("reasoning_content"):
            reasoning_chunks += 1
        if d.content:
            content_chunks += 1
        finish = ch.choices[0].finish_reason or finish
    if ch.usage is not None:
        usage = ch.usage
out["chat-think"] = {
    "reasoning_chunks": reasoning_chunks,
    "content_chunks": content_chunks,
    "finish_reason": finish,
    "prompt_tokens": usage.prompt_tokens,
    "completion_tokens": usage.completion_tokens,
    "reasoning_tokens": usage.completion_tokens_details.reasoning_tokens if usage.completion_tokens_details else None,
}
# Anthropic Messages through the Anthropic SDK, streamed, with the same API key as the OpenAI
# client above (sent as `x-api-key`, not `Authorization`).
anthropic = Anthropic(
    base_url=base_url.removesuffix("/v1"), api_key="sk-test-key", max_retries=0, timeout=60
)
text_deltas = 0
with anthropic.messages.stream(
    model=model,
    max_tokens=max_tokens,
    messages=[{"role": "user", "content": "what is paged attention?"}],
    extra_headers={"x-request-id": "sdk-msg"},
) as stream:
    for event in stream:
        # Deltas with text, thinking or answer (the simulator, like vLLM, sends some empty ones).
        if event.type == "content_block_delta" and (
            getattr(event.delta, "text", None) or getattr(event.delta, "thinking", None)
        ):
            text_deltas += 1
    final = stream.get_final_message()
out["sdk-msg"] = {
    "deltas": text_deltas,
    "stop_reason": final.stop_reason,
    "input_tokens": final.usage.input_tokens,
    "output_tokens": final.usage.output_tokens,
}
print(json.dumps(out))
