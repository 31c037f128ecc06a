"""Drive tokenwatch's proxy with the real OpenAI Python client, as a user would.

Usage: openai_client.py BASE_URL MODEL N
Prints one JSON object: per-request results (text length, usage, chunk counts, request id).
"""
import json
import sys

from openai import OpenAI

base_url, model, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = OpenAI(base_url=base_url, api_key="sk-test-key", max_retries=0, timeout=60)
results = []
for i in range(n):
    if i % 4 == 3:
        # Non-streaming chat completion.
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"hello {i}"}], max_tokens=24
        )
        results.append({"stream": False, "usage": r.usage.completion_tokens, "prompt": r.usage.prompt_tokens,
                        "text_len": len(r.choices[0].message.content or "")})
        continue
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "tell me about paged attention " * (1 + i % 3)}],
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=32,
        extra_headers={"x-tenant-id": f"tenant-{i % 2}", "x-ab-group": "a" if i % 2 else "b"},
    )
    text, chunks, usage, prompt = "", 0, None, None
    for ch in stream:
        if ch.choices and ch.choices[0].delta.content:
            text += ch.choices[0].delta.content
            chunks += 1
        if ch.usage is not None:
            usage, prompt = ch.usage.completion_tokens, ch.usage.prompt_tokens
    results.append({"stream": True, "usage": usage, "prompt": prompt, "content_chunks": chunks, "text_len": len(text)})
print(json.dumps({"results": results}))
