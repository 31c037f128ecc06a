"""Real clients against tokenwatch's TLS listeners, trusting only the test's CA file.

Usage:
  tls_clients.py openai BASE_URL CA_FILE MODEL
      one streamed chat completion through the proxy with the OpenAI client;
      prints {"text": ..., "content_chunks": n, "usage": n}
  tls_clients.py otlp grpc|http ENDPOINT CA_FILE MODEL SPANS
      GenAI spans with the OpenTelemetry SDK's OTLP exporter (gRPC: https://host:port,
      HTTP: https://host:port); prints {"span_ids": [...], "results": [...]}
Exits non-zero when a client fails, with the error on stderr.
"""
import json
import ssl
import sys
from recording import Recording


def openai_stream(base_url, ca_file, model):
    import httpx2
    from openai import OpenAI

    http_client = httpx2.Client(verify=ssl.create_default_context(cafile=ca_file))
    client = OpenAI(base_url=base_url, api_key="sk-tls-test", max_retries=0, timeout=30, http_client=http_client)
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "tell me about TLS"}],
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=16,
    )
    text, chunks, usage = "", 0, None
    for ch in stream:
        if ch.choices and ch.choices[0].delta.content:
            text += ch.choices[0].delta.content
            chunks += 1
        if ch.usage is not None:
            usage = ch.usage.completion_tokens
    print(json.dumps({"text": text, "content_chunks": chunks, "usage": usage}))
    return 0




def otlp_spans(transport, endpoint, ca_file, model, n):
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import SpanKind

    if transport == "grpc":
        import grpc
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        with open(ca_file, "rb") as f:
            credentials = grpc.ssl_channel_credentials(root_certificates=f.read())
        inner = OTLPSpanExporter(endpoint=endpoint, credentials=credentials, timeout=10)
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        inner = OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces", certificate_file=ca_file, timeout=10)

    recording = Recording(inner)
    tp = TracerProvider(resource=Resource.create({"service.name": "tls-test-app"}))
    tp.add_span_processor(SimpleSpanProcessor(recording))
    tracer = tp.get_tracer("tokenwatch-tls-test")
    span_ids = []
    for i in range(n):
        with tracer.start_as_current_span(f"chat {model}", kind=SpanKind.CLIENT) as s:
            s.set_attribute("gen_ai.operation.name", "chat")
            s.set_attribute("gen_ai.provider.name", "vllm")
            s.set_attribute("gen_ai.request.model", model)
            s.set_attribute("gen_ai.usage.input_tokens", 10 + i)
            s.set_attribute("gen_ai.usage.output_tokens", 5 + i)
            span_ids.append(format(s.get_span_context().span_id, "016x"))
    tp.shutdown()
    print(json.dumps({"span_ids": span_ids, "results": recording.results}))
    return 0 if recording.results and all(r == "SUCCESS" for r in recording.results) else 1


def main(argv):
    if len(argv) == 5 and argv[1] == "openai":
        return openai_stream(argv[2], argv[3], argv[4])
    if len(argv) == 7 and argv[1] == "otlp" and argv[2] in ("grpc", "http"):
        return otlp_spans(argv[2], argv[3], argv[4], argv[5], int(argv[6]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
