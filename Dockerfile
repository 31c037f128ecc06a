# syntax=docker/dockerfile:1
# tokenwatch's container image: the release binary built with cargo (the web UI, uPlot included,
# ships inside the crate: no Node.js), and a slim non-root runtime with a HEALTHCHECK on /healthz.
# Build from the repo root:
#   docker build -t tokenwatch .
# Checked by hadolint (crates/tokenwatch/tests/deploy_artifacts.rs); the image itself is built
# only where a registry is reachable (the base images are pulled).

# 1. The release binary. .git is not in the build context: the commit comes from the build
# argument (docker build --build-arg GIT_COMMIT=$(git rev-parse --short=12 HEAD) .).
FROM rust:1.95-bookworm AS builder
ARG GIT_COMMIT=unknown
WORKDIR /src
COPY . .
RUN TOKENWATCH_GIT_COMMIT="$GIT_COMMIT" cargo build --release --locked -p tokenwatch \
    && install -D -m 0755 target/release/tokenwatch /out/tokenwatch

# 2. Runtime: the binary, the CA roots (HTTPS upstreams), a non-root user owning the data dir.
FROM debian:bookworm-slim
COPY --from=builder /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=builder /out/tokenwatch /usr/local/bin/tokenwatch
RUN groupadd --system --gid 10001 tokenwatch \
    && useradd --system --uid 10001 --gid tokenwatch --home-dir /var/lib/tokenwatch --shell /usr/sbin/nologin tokenwatch \
    && install -d -o tokenwatch -g tokenwatch -m 0750 /var/lib/tokenwatch /etc/tokenwatch
USER 10001:10001
WORKDIR /var/lib/tokenwatch
# API + /metrics + probes, proxy, OTLP/gRPC, OTLP/HTTP.
EXPOSE 9464 8080 4317 4318
# No curl in the slim image: bash's /dev/tcp asks /healthz on the default API port and checks
# the status line (change the port here if the configuration's `listen` differs).
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9464 && printf 'GET /healthz HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3 && read -r _ code _ <&3 && [ \"$code\" = 200 ]"]
ENTRYPOINT ["/usr/local/bin/tokenwatch"]
CMD ["run", "--config", "/etc/tokenwatch/tokenwatch.yaml"]
