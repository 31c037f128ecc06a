"""One streamed chat completion through tokenwatch's proxy with the real OpenAI Python client,
sent inside the caller's trace (a W3C `traceparent` header), as an instrumented app would.

Usage: traced_client.py BASE_URL MODEL TRACEPARENT
Prints one JSON object: the request id the proxy answered with, usage and the text's length.
"""
import json
import sys

from openai import OpenAI

base_url, model, traceparent = sys.argv[1], sys.argv[2], sys.argv[3]
client = OpenAI(base_url=base_url, api_key="sk-test-key", max_retries=0, timeout=60)
raw = client.chat.completions.with_raw_response.create(
    model=model,
    messages=[{"role": "user", "content": "explain continuous batching"}],
    stream=True,
    stream_options={"include_usage": True},
    max_tokens=16,
    extra_headers={"traceparent": traceparent},
)
request_id = raw.headers.get("x-request-id")
text, usage, prompt = "", None, None
for ch in raw.parse():
    if ch.choices and ch.choices[0].delta.content:
        text += ch.choices[0].delta.content
    if ch.usage is not None:
        usage, prompt = ch.usage.completion_tokens, ch.usage.prompt_tokens
print(json.dumps({"request_id": request_id, "usage": usage, "prompt": prompt, "text_len": len(text)}))
