"""Drive tokenwatch's proxy with the real OpenAI Python client as Azure OpenAI users do: the
AzureOpenAI client (a deployment's path, `api-key` header, `api-version` query) and the plain
client against Azure's v1 API under `/openai/v1`, one streamed chat each.

Usage: azure_client.py PROXY_ROOT DEPLOYMENT
Prints one JSON object keyed by the x-request-id each request was sent with: the content
chunks and usage the client saw.
"""
import json
import sys

from openai import AzureOpenAI, OpenAI

root, deployment = sys.argv[1], sys.argv[2]
out = {}


def streamed(client, request_id):
    stream = client.chat.completions.create(
        model=deployment,
        messages=[{"role": "user", "content": "what is paged attention?"}],
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=16,
        extra_headers={"x-request-id": request_id},
    )
    chunks, usage = 0, None
    for ch in stream:
        if ch.choices and ch.choices[0].delta.content:
            chunks += 1
        if ch.usage is not None:
            usage = ch.usage
    out[request_id] = {
        "content_chunks": chunks,
        "completion_tokens": usage.completion_tokens,
        "prompt_tokens": usage.prompt_tokens,
    }


streamed(
    AzureOpenAI(
        azure_endpoint=root, api_key="az-key", api_version="2024-10-21", max_retries=0, timeout=60
    ),
    "azure-deployment",
)
streamed(OpenAI(base_url=f"{root}/openai/v1", api_key="az-key", max_retries=0, timeout=60), "azure-v1")
print(json.dumps(out))
