"""The span exporter wrapper the OTLP test scripts share: it remembers every export result, so a
script can report whether the real SDK exporter succeeded (refused tokens, TLS, retries)."""

from opentelemetry.sdk.trace.export import SpanExporter


class Recording(SpanExporter):
    """Delegates to the OTLP exporter and remembers every export result."""

    def __init__(self, inner):
        self.inner = inner
        self.results = []

    def export(self, spans):
        r = self.inner.export(spans)
        self.results.append(r.name)
        return r

    def shutdown(self):
        self.inner.shutdown()

    def force_flush(self, timeout_millis=30000):
        return True
