# OTLP/gRPC with bearer tokens: for each case (a label and a token, or none) exports one GenAI span
# with the OpenTelemetry SDK's exporter (model `<model>-<label>`) and makes one raw call with grpcio
# to read the status code; prints {label: {"sdk": SUCCESS|FAILURE, "code": ..., "details": ...}}.
import argparse
import json
import logging
import sys

import grpc
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind
from recording import Recording




def sdk_export(endpoint, token, model):
    headers = {"authorization": f"Bearer {token}"} if token else None
    recording = Recording(OTLPSpanExporter(endpoint=endpoint, insecure=True, timeout=5, headers=headers))
    tp = TracerProvider(resource=Resource.create({"service.name": "auth-test"}))
    tp.add_span_processor(SimpleSpanProcessor(recording))
    with tp.get_tracer("tokenwatch-auth-test").start_as_current_span(f"chat {model}", kind=SpanKind.CLIENT) as s:
        s.set_attribute("gen_ai.operation.name", "chat")
        s.set_attribute("gen_ai.provider.name", "vllm")
        s.set_attribute("gen_ai.request.model", model)
        s.set_attribute("gen_ai.usage.input_tokens", 10)
        s.set_attribute("gen_ai.usage.output_tokens", 5)
    tp.shutdown()
    return recording.results[0] if recording.results else "NONE"


def raw_call(endpoint, token):
    metadata = [("authorization", f"Bearer {token}")] if token else None
    with grpc.insecure_channel(endpoint) as ch:
        stub = trace_service_pb2_grpc.TraceServiceStub(ch)
        try:
            stub.Export(trace_service_pb2.ExportTraceServiceRequest(), timeout=10, metadata=metadata)
            return {"code": "OK", "details": ""}
        except grpc.RpcError as e:
            return {"code": e.code().name, "details": e.details()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True, help="host:port")
    ap.add_argument("--model", required=True)
    ap.add_argument("--case", action="append", default=[], help="LABEL=TOKEN (empty TOKEN: no header)")
    args = ap.parse_args()
    # The exporter logs each refused export; the test reads only stdout.
    logging.basicConfig(level=logging.ERROR)
    out = {}
    for case in args.case:
        label, _, token = case.partition("=")
        out[label] = {"sdk": sdk_export(args.endpoint, token, f"{args.model}-{label}"), **raw_call(args.endpoint, token)}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
