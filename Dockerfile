# syntax=docker/dockerfile:1
# tokenwatch's container image: the web UI's npm dependencies, the release binary built with
# cargo, and a slim non-root runtime with a HEALTHCHECK on /healthz. Build from the repo root:
#   docker build -t tokenwatch .
# Checked by hadolint (crates/tokenwatch/tests/deploy_artifacts.rs); the image itself is built
# only where a registry is reachable (the base images are pulled).

# 1. The UI's runtime npm dependency (uPlot), embedded in the binary by crates/tokenwatch/build.rs.
FROM node:22-bookworm-slim AS ui
WORKDIR /src/ui
COPY ui/package.json ui/package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund

# 2. The release binary. build.rs finds uPlot's files in ui/node_modules and skips npm.
FROM rust:1.95-bookworm AS builder
WORKDIR /src
COPY . .
COPY --from=ui /src/ui/node_modules ./ui/node_modules
RUN cargo build --release --locked -p tokenwatch \
    && install -D -m 0755 target/release/tokenwatch /out/tokenwatch

# 3. Runtime: the binary, the CA roots (HTTPS upstreams), a non-root user owning the data dir.
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
