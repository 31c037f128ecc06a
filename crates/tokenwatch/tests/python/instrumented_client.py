"""The real OpenAI Python client, instrumented by one of the common GenAI instrumentations as an
app would be, calls an OpenAI-compatible server; the instrumentation's spans go to tokenwatch's
OTLP/HTTP receiver.

Usage: instrumented_client.py INSTRUMENTATION BASE_URL OTLP_HTTP_BASE MODEL CALLS
  INSTRUMENTATION: openinference | openai-v2 | traceloop | openlit
  OTLP_HTTP_BASE: http://host:port (spans go to /v1/traces)
Prints one JSON object: the instrumentation's package version and, per call in order, whether it
streamed, when it started (unix ms), the time to its first content chunk and to its end as the
client measured them and the tokens it was told.

openai-v2 also exports its metrics (gen_ai.client.operation.duration, gen_ai.client.token.usage)
to OTLP_HTTP_BASE/v1/metrics, once, at the end: per call, its spans say nothing of streams.
"""
import json
import sys
import time
from importlib import metadata

kind, base_url, otlp, model, calls = sys.argv[1:6]
calls = int(calls)
traces = otlp.rstrip("/") + "/v1/traces"
meters = None


def sdk_provider():
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    tp = TracerProvider(resource=Resource.create({"service.name": f"app-{kind}"}))
    tp.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=traces)))
    trace.set_tracer_provider(tp)
    return tp


if kind == "openinference":
    from openinference.instrumentation.openai import OpenAIInstrumentor

    provider = sdk_provider()
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    package = "openinference-instrumentation-openai"
elif kind == "openai-v2":
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    provider = sdk_provider()
    # One export, at the end (force_flush): cumulative histograms of every call.
    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=otlp.rstrip("/") + "/v1/metrics"),
        export_interval_millis=3_600_000,
    )
    meters = MeterProvider(metric_readers=[reader], resource=provider.resource)
    OpenAIInstrumentor().instrument(tracer_provider=provider, meter_provider=meters)
    package = "opentelemetry-instrumentation-openai-v2"
elif kind == "traceloop":
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from traceloop.sdk import Traceloop

    Traceloop.init(
        app_name=f"app-{kind}",
        exporter=OTLPSpanExporter(endpoint=traces),
        disable_batch=True,
        telemetry_enabled=False,
    )
    provider = None
    package = "traceloop-sdk"
elif kind == "openlit":
    import openlit

    # OpenLIT's default batching: with disable_batch=True the span of the HTTP request under
    # each call is exported on the call's own thread when the headers come back, before OpenLIT
    # starts its first-token clock, so the client waits for that export too (2-3 ms to a local
    # collector) and no span shows it.
    openlit.init(
        otlp_endpoint=otlp.rstrip("/"),
        application_name=f"app-{kind}",
        disable_metrics=True,
    )
    provider = None
    package = "openlit"
else:
    sys.exit(f"unknown instrumentation {kind!r}")

from openai import OpenAI  # noqa: E402  (after instrumenting, as apps do)

client = OpenAI(base_url=base_url, api_key="sk-test-key", max_retries=0, timeout=60)
out = []
for i in range(calls):
    stream = i % 2 == 1
    started = time.time()
    t0 = time.perf_counter()
    ttft, completion, prompt = None, None, None
    messages = [{"role": "user", "content": f"call {i}: explain continuous batching"}]
    if stream:
        chunks = client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
        for ch in chunks:
            if ttft is None and ch.choices and ch.choices[0].delta.content:
                ttft = time.perf_counter() - t0
            if ch.usage is not None:
                completion, prompt = ch.usage.completion_tokens, ch.usage.prompt_tokens
    else:
        r = client.chat.completions.create(model=model, messages=messages, max_tokens=12)
        completion, prompt = r.usage.completion_tokens, r.usage.prompt_tokens
    e2e = time.perf_counter() - t0
    out.append(
        {
            "stream": stream,
            "started_ms": started * 1000.0,
            "ttft_s": ttft,
            "e2e_s": e2e,
            "completion_tokens": completion,
            "prompt_tokens": prompt,
        }
    )
    time.sleep(0.3)

if meters is not None:
    meters.force_flush()
if provider is not None:
    provider.force_flush()
else:
    from opentelemetry import trace

    tp = trace.get_tracer_provider()
    if hasattr(tp, "force_flush"):
        tp.force_flush()
print(json.dumps({"package": package, "version": metadata.version(package), "calls": out}))
