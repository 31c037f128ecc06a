# Raw OTLP/gRPC calls with grpcio and the opentelemetry-proto stubs: a batch with one invalid
# span (partial success), a gzip-compressed export, and undecodable bytes; prints one JSON line.
import argparse
import json
import sys

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def request(model):
    req = trace_service_pb2.ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    attr = rs.resource.attributes.add()
    attr.key, attr.value.string_value = "service.name", "raw-grpc"
    spans = rs.scope_spans.add().spans
    for i, trace_len in enumerate([16, 15]):
        s = spans.add()
        s.trace_id = bytes([0xAB] * trace_len)
        s.span_id = bytes([i + 1] * 8)
        s.name = f"chat {model}"
        s.start_time_unix_nano = 1_700_000_000_000_000_000
        s.end_time_unix_nano = 1_700_000_001_000_000_000
        a = s.attributes.add()
        a.key, a.value.string_value = "gen_ai.request.model", model
    return req


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    args = ap.parse_args()
    out = {}
    with grpc.insecure_channel(args.endpoint) as ch:
        stub = trace_service_pb2_grpc.TraceServiceStub(ch)
        resp = stub.Export(request("raw-grpc-model"), timeout=10)
        out["rejected_spans"] = resp.partial_success.rejected_spans
        out["error_message"] = resp.partial_success.error_message
        resp = stub.Export(request("raw-grpc-gzip"), timeout=10, compression=grpc.Compression.Gzip)
        out["gzip_rejected_spans"] = resp.partial_success.rejected_spans
        raw = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        try:
            raw(b"\x0a\x80\x01\x0a", timeout=10)
            out["garbage"] = "accepted"
        except grpc.RpcError as e:
            out["garbage"] = {"code": e.code().name, "details": e.details()}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
