#!/usr/bin/env bash
# Collector-only tokenwatch against a REAL vLLM (issue 38, "Done when"): starts vLLM (CPU build,
# tiny model, `--max-num-seqs 2` so requests queue) with the shared rig, a collector-only
# `tokenwatch run --scrape …/metrics` (no proxy, no OTLP) on free ports with a temporary data
# directory, drives concurrent streaming clients straight at vLLM, then checks numerically that
# the fleet row has every figure the proxy would give, that /api/v1/latency answers from the
# runtime (TTFT, ITL, E2E, queue, prefill and decode) with vLLM's own count and each percentile
# inside the bucket vLLM's cumulative counts put it in, that an SLO counts (and burns) from the
# runtime, and that `top --once` shows the same figures. Prints a table of checks; exits non-zero
# on any failure; stops everything it started.
#
# Not part of scripts/test.sh (vLLM takes minutes to start); the test command replays recorded
# real vLLM expositions instead (crates/tokenwatch/tests/e2e/runtime_latency.rs).
#
# Usage: scripts/vllm-check.sh [--release]
# Env:   VLLM_CPU_SH     the rig (default ../shared/tools/vllm-cpu/vllm-cpu.sh from the repository
#                        root; in a git worktree, also from the main checkout's parent)
#        TOKENWATCH_BIN  a built tokenwatch binary (default: cargo build -p tokenwatch)
#        VLLM_RIG_PORT   vLLM's port (default 8000; it must be free: another server is not measured)
#        CLIENTS (8), DURATION_S (40), MAX_TOKENS (32)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

profile=debug
build_flags=()
for arg in "$@"; do
  case "$arg" in
    --release) profile=release; build_flags=(--release) ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "error: unknown argument $arg (only --release)" >&2; exit 2 ;;
  esac
done

# The shared vLLM rig: ../shared next to the repository (or next to the main checkout of a worktree).
RIG=${VLLM_CPU_SH:-}
if [ -z "$RIG" ]; then
  common=$(git rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)
  for cand in "$ROOT/../shared/tools/vllm-cpu/vllm-cpu.sh" \
              ${common:+"$(dirname "$common")/../shared/tools/vllm-cpu/vllm-cpu.sh"}; do
    if [ -x "$cand" ]; then RIG=$cand; break; fi
  done
fi
[ -n "$RIG" ] && [ -x "$RIG" ] || { echo "error: the vLLM rig ../shared/tools/vllm-cpu/vllm-cpu.sh was not found (set VLLM_CPU_SH)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "error: python3 is needed for the clients and the checks" >&2; exit 1; }
command -v curl >/dev/null || { echo "error: curl is needed" >&2; exit 1; }

PORT=${VLLM_RIG_PORT:-8000}
export VLLM_RIG_PORT=$PORT
if curl -s -m 2 -o /dev/null "http://127.0.0.1:$PORT/health"; then
  echo "error: something already answers on 127.0.0.1:$PORT — stop it (or set VLLM_RIG_PORT): this check measures the vLLM it starts" >&2
  exit 1
fi

if [ -n "${TOKENWATCH_BIN:-}" ]; then
  TW=$TOKENWATCH_BIN
else
  echo "==> building tokenwatch ($profile)"
  cargo build -q -p tokenwatch "${build_flags[@]}"
  TW="${CARGO_TARGET_DIR:-$ROOT/target}/$profile/tokenwatch"
fi
[ -x "$TW" ] || { echo "error: no tokenwatch binary at $TW" >&2; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/vllm-check.XXXXXX")
# The rig's pid file lives in our own run directory: `stop` stops the server this script started.
export VLLM_RIG_RUN="$WORK/vllm-rig"
export HF_HUB_OFFLINE=1
export VLLM_RIG_EXTRA=${VLLM_RIG_EXTRA:---max-num-seqs 2}
tw_pid=""
vllm_started=0
status=1
cleanup() {
  if [ -n "$tw_pid" ] && kill -0 "$tw_pid" 2>/dev/null; then
    kill "$tw_pid" 2>/dev/null || true
    wait "$tw_pid" 2>/dev/null || true
  fi
  if [ "$vllm_started" = 1 ]; then
    "$RIG" stop >/dev/null 2>&1 || true
  fi
  if [ "$status" = 0 ]; then
    rm -rf "$WORK"
  else
    echo "logs kept in $WORK (tokenwatch.log, vllm-rig/)" >&2
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

echo "==> starting vLLM with $RIG (port $PORT, $VLLM_RIG_EXTRA)"
t0=$SECONDS
vllm_started=1
"$RIG" up >"$WORK/vllm-up.log" 2>&1 || { tail -30 "$WORK/vllm-up.log" >&2; echo "error: vLLM did not start" >&2; exit 1; }
echo "    vLLM healthy after $((SECONDS - t0)) s"

API_PORT=$(free_port); PROXY_PORT=$(free_port)
cat >"$WORK/tokenwatch.yaml" <<EOF
scrape:
  interval: 1s
  timeout: 1s
alerting:
  overrides:
    slo_burn: {params: {min_requests: 10}}
slos:
  - name: ttft_100ms
    objective: ttft_p95
    threshold_ms: 100
    target: 0.95
    window: 10m
    burn_windows: {fast_long: 30s, fast_short: 10s, slow_long: 60s, slow_short: 15s}
EOF
echo "==> starting collector-only tokenwatch on 127.0.0.1:$API_PORT (scraping vLLM every 1 s)"
"$TW" run -c "$WORK/tokenwatch.yaml" --listen "127.0.0.1:$API_PORT" --proxy-listen "127.0.0.1:$PROXY_PORT" \
  --no-otlp --data-dir "$WORK/data" --scrape "http://127.0.0.1:$PORT/metrics" >"$WORK/tokenwatch.log" 2>&1 &
tw_pid=$!

python3 "$ROOT/scripts/vllm_check.py" \
  --vllm "http://127.0.0.1:$PORT" --api "http://127.0.0.1:$API_PORT" --tokenwatch "$TW" \
  --model "${VLLM_RIG_SERVED_NAME:-tinyllama}" --clients "${CLIENTS:-8}" \
  --duration "${DURATION_S:-40}" --max-tokens "${MAX_TOKENS:-32}" && status=0 || status=$?
exit "$status"
