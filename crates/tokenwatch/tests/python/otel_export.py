# Exports GenAI spans (and one OpenInference LLM span) and metrics (server histograms with explicit
# buckets, client chunk histograms with exponential buckets) with the real OpenTelemetry Python SDK
# to tokenwatch's OTLP receiver (gRPC or HTTP/protobuf), and prints what it sent as one JSON line.
import argparse
import json
import sys
import time

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode
from recording import Recording

TTFT_BOUNDS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]




def exporters(transport, endpoint):
    if transport == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return (OTLPSpanExporter(endpoint=endpoint, insecure=True, timeout=10),
                OTLPMetricExporter(endpoint=endpoint, insecure=True, timeout=10))
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return (OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces", timeout=10),
            OTLPMetricExporter(endpoint=f"{endpoint}/v1/metrics", timeout=10))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--transport", choices=["grpc", "http"], required=True)
    ap.add_argument("--endpoint", required=True, help="host:port (gRPC) or http://host:port (HTTP)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--spans", type=int, default=5)
    args = ap.parse_args()

    resource = Resource.create({"service.name": "otel-test-app", "service.instance.id": "pod-7", "tenant.id": "acme"})
    span_exp, metric_exp = exporters(args.transport, args.endpoint)
    recording = Recording(span_exp)
    tp = TracerProvider(resource=resource)
    tp.add_span_processor(SimpleSpanProcessor(recording))
    tracer = tp.get_tracer("tokenwatch-test")

    sent = {"trace_id": None, "parent_span_id": None, "span_ids": [], "error_span_id": None}
    with tracer.start_as_current_span("invoke_agent", kind=SpanKind.INTERNAL) as parent:
        ctx = parent.get_span_context()
        sent["trace_id"] = format(ctx.trace_id, "032x")
        sent["parent_span_id"] = format(ctx.span_id, "016x")
        for i in range(args.spans):
            with tracer.start_as_current_span(f"chat {args.model}", kind=SpanKind.CLIENT) as s:
                s.set_attribute("gen_ai.operation.name", "chat")
                s.set_attribute("gen_ai.provider.name", "vllm")
                s.set_attribute("gen_ai.request.model", args.model)
                s.set_attribute("gen_ai.response.model", args.model)
                s.set_attribute("gen_ai.usage.input_tokens", 100 + i)
                s.set_attribute("gen_ai.usage.output_tokens", 20 + i)
                s.set_attribute("gen_ai.response.finish_reasons", ["stop"])
                s.set_attribute("gen_ai.response.time_to_first_chunk", 0.05 * (i + 1))
                s.set_attribute("server.address", "gpu-node-1")
                s.set_attribute("server.port", 8000)
                sent["span_ids"].append(format(s.get_span_context().span_id, "016x"))
                time.sleep(0.01)
        with tracer.start_as_current_span(f"chat {args.model}", kind=SpanKind.CLIENT) as s:
            s.set_attribute("gen_ai.operation.name", "chat")
            s.set_attribute("gen_ai.request.model", args.model)
            s.set_attribute("error.type", "500")
            s.set_status(Status(StatusCode.ERROR, "upstream failed"))
            sent["error_span_id"] = format(s.get_span_context().span_id, "016x")
        # An OpenInference LLM span (as Arize/Phoenix instrumentations write them).
        with tracer.start_as_current_span("ChatCompletion", kind=SpanKind.INTERNAL) as s:
            s.set_attribute("openinference.span.kind", "LLM")
            s.set_attribute("llm.model_name", f"{args.model}-oi")
            s.set_attribute("llm.system", "openai")
            s.set_attribute("llm.token_count.prompt", 7)
            s.set_attribute("llm.token_count.completion", 3)
            s.set_attribute("llm.token_count.total", 10)
            sent["oi_span_id"] = format(s.get_span_context().span_id, "016x")
    tp.shutdown()
    sent["span_results"] = recording.results

    # Two cumulative exports of GenAI server histograms with explicit buckets (SDK advisory).
    reader = PeriodicExportingMetricReader(metric_exp, export_interval_millis=3_600_000)
    mp = MeterProvider(resource=resource, metric_readers=[reader])
    meter = mp.get_meter("tokenwatch-test")
    ttft = meter.create_histogram("gen_ai.server.time_to_first_token", unit="s",
                                  explicit_bucket_boundaries_advisory=TTFT_BOUNDS)
    tpot = meter.create_histogram("gen_ai.server.time_per_output_token", unit="s",
                                  explicit_bucket_boundaries_advisory=[0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2])
    dur = meter.create_histogram("gen_ai.server.request.duration", unit="s",
                                 explicit_bucket_boundaries_advisory=[0.1, 0.5, 1, 2, 5, 10])
    usage = meter.create_histogram("gen_ai.client.token.usage", unit="{token}",
                                   explicit_bucket_boundaries_advisory=[1, 16, 64, 256, 1024, 4096])
    attrs = {"gen_ai.request.model": args.model, "gen_ai.provider.name": "vllm", "gen_ai.operation.name": "chat"}
    flushes = []
    for export in range(2):
        for i in range(50):
            ttft.record(0.03 + 0.002 * i + 0.1 * export, attrs)
            tpot.record(0.02, attrs)
            dur.record(1.5, attrs)
            usage.record(120, {**attrs, "gen_ai.token.type": "input"})
            usage.record(30, {**attrs, "gen_ai.token.type": "output"})
        flushes.append(mp.force_flush(timeout_millis=10_000))
        time.sleep(0.2)
    mp.shutdown()

    # The client's chunk metrics as exponential histograms (a view), two cumulative exports.
    _, client_exp = exporters(args.transport, args.endpoint)
    reader = PeriodicExportingMetricReader(client_exp, export_interval_millis=3_600_000)
    views = [View(instrument_name="gen_ai.client.operation.*", aggregation=ExponentialBucketHistogramAggregation())]
    mp = MeterProvider(resource=resource, metric_readers=[reader], views=views)
    meter = mp.get_meter("tokenwatch-test-client")
    ttfc = meter.create_histogram("gen_ai.client.operation.time_to_first_chunk", unit="s")
    tpoc = meter.create_histogram("gen_ai.client.operation.time_per_output_chunk", unit="s")
    client_attrs = {"gen_ai.request.model": f"{args.model}-client", "gen_ai.provider.name": "openai",
                    "gen_ai.operation.name": "chat"}
    for export in range(2):
        for i in range(50):
            ttfc.record(0.2 + 0.001 * i + 0.1 * export, client_attrs)
            tpoc.record(0.02, client_attrs)
        flushes.append(mp.force_flush(timeout_millis=10_000))
        time.sleep(0.2)
    mp.shutdown()
    sent["metric_flushes"] = flushes
    print(json.dumps(sent))
    ok = all(r == "SUCCESS" for r in recording.results) and all(flushes)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
