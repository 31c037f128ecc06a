#!/usr/bin/env python3
"""The clients and checks of scripts/vllm-check.sh (stdlib only).

Reads vLLM's own /metrics before and after the traffic, drives concurrent streaming chat clients
straight at vLLM (no proxy), then checks a collector-only tokenwatch's fleet row, latency API,
SLO and `top --once` against vLLM's own counts. Prints a table; exits 1 on any failed check.
"""

import argparse
import http.client
import json
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

CHECKS = []


def check(name, ok, expected, got):
    CHECKS.append((name, bool(ok), str(expected), str(got)))


def get_json(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def get_text(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def vllm_histogram(text, name, model):
    """vLLM's cumulative buckets {le: count} and count of histogram `name` for `model`, summed
    over its other labels (engine)."""
    buckets, count = {}, 0.0
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if not m:
            continue
        labels = dict(LABEL.findall(m.group(2) or ""))
        if labels.get("model_name") != model:
            continue
        value = float(m.group(3))
        if m.group(1) == name + "_bucket":
            le = float("inf") if labels["le"] == "+Inf" else float(labels["le"])
            buckets[le] = buckets.get(le, 0.0) + value
        elif m.group(1) == name + "_count":
            count += value
    return buckets, count


def vllm_counter(text, name, model, where=None):
    total = 0.0
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if not m or m.group(1) != name:
            continue
        labels = dict(LABEL.findall(m.group(2) or ""))
        if labels.get("model_name") == model and all(labels.get(k) == v for k, v in (where or {}).items()):
            total += float(m.group(3))
    return total


def bucket_of(buckets, q):
    """The bucket (lower, upper) that holds the q-quantile of cumulative `buckets`."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    rank = q * total
    lower = 0.0
    for b in bounds:
        if buckets[b] >= rank:
            return lower, b
        lower = b
    return lower, float("inf")


def stream_clients(base, model, clients, duration, max_tokens):
    """`clients` threads streaming chat completions for `duration` seconds; client-felt TTFTs."""
    url = urllib.parse.urlparse(base)
    deadline = time.monotonic() + duration
    ttfts, errors, done = [], [], [0]
    lock = threading.Lock()

    def worker(w):
        i = 0
        while time.monotonic() < deadline:
            i += 1
            body = json.dumps({
                "model": model, "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
                "messages": [{"role": "user", "content": f"client {w} request {i}: say hello"}],
            })
            start = time.monotonic()
            first = None
            try:
                c = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
                c.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
                r = c.getresponse()
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
                for raw in r:
                    line = raw.decode(errors="replace").strip()
                    if not line.startswith("data:") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
                    if first is None and delta.get("content"):
                        first = time.monotonic() - start
                c.close()
                with lock:
                    done[0] += 1
                    if first is not None:
                        ttfts.append(first)
            except Exception as e:  # a failed request is counted, the client goes on
                with lock:
                    errors.append(str(e))
                time.sleep(0.2)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ttfts, errors, done[0]


def pct(values, q):
    v = sorted(values)
    return v[max(0, int(-(-q * len(v) // 1)) - 1)] if v else None


TOP_UNITS = {"µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def top_seconds(cell):
    m = re.match(r"^([0-9.]+)\s*(µs|us|ms|s)$", cell.strip())
    return float(m.group(1)) * TOP_UNITS[m.group(2)] if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vllm", required=True)
    ap.add_argument("--api", required=True)
    ap.add_argument("--tokenwatch", required=True)
    ap.add_argument("--model", default="tinyllama")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--duration", type=float, default=40)
    ap.add_argument("--max-tokens", type=int, default=32)
    a = ap.parse_args()
    api, model = a.api, a.model

    # tokenwatch up, and its first scrape (the baseline its deltas start from) taken.
    deadline = time.monotonic() + 60
    while True:
        try:
            if re.search(r"^tokenwatch_scrape_up\{[^}]*\} 1(\.0)?$", get_text(f"{api}/metrics", timeout=2), re.M):
                break
        except Exception:
            pass
        if time.monotonic() > deadline:
            print("tokenwatch never scraped vLLM", file=sys.stderr)
            return 1
        time.sleep(0.5)
    time.sleep(1.5)
    before = get_text(f"{a.vllm}/metrics")

    print(f"==> {a.clients} streaming clients for {a.duration:.0f} s, {a.max_tokens} tokens each")
    t0 = time.time()
    ttfts, errors, done = stream_clients(a.vllm, model, a.clients, a.duration, a.max_tokens)
    print(f"    {done} requests answered, {len(errors)} failed, client TTFT p50 "
          f"{pct(ttfts, 0.5)} s p99 {pct(ttfts, 0.99)} s")
    time.sleep(4)  # two scrapes or more after the last request
    after = get_text(f"{a.vllm}/metrics")
    fleet = get_json(f"{api}/api/v1/fleet?window=5m")
    row = next((m for m in fleet.get("models", []) if m.get("model_id") == model), None)

    # 1. The fleet row: every figure the proxy would give, from the runtime.
    check("fleet row for the model", row is not None, model, row and row.get("model_id"))
    row = row or {}
    check("fleet figure_source", row.get("figure_source") == "runtime", "runtime", row.get("figure_source"))
    for col in ["ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "requests_per_s",
                "output_tokens_per_s", "error_ratio", "kv_cache_usage", "queue_p50_s",
                "prefill_p50_s", "prefill_p99_s", "decode_p50_s", "decode_p99_s"]:
        v = row.get(col)
        check(f"fleet {col}", isinstance(v, (int, float)), "a value", v)

    # 2. /api/v1/latency answers from the runtime: vLLM's count, each percentile in vLLM's bucket
    # (prefill and decode only the runtime measures: answered from it, and refused of the records).
    figures = {}
    for metric, name in [("ttft", "vllm:time_to_first_token_seconds"),
                         ("itl", "vllm:inter_token_latency_seconds"),
                         ("e2e", "vllm:e2e_request_latency_seconds"),
                         ("queue", "vllm:request_queue_time_seconds"),
                         ("prefill", "vllm:request_prefill_time_seconds"),
                         ("decode", "vllm:request_decode_time_seconds")]:
        b0, c0 = vllm_histogram(before, name, model)
        b1, c1 = vllm_histogram(after, name, model)
        delta = {le: b1[le] - b0.get(le, 0.0) for le in b1}
        lat = get_json(f"{api}/api/v1/latency?model={model}&metric={metric}&window=5m")
        src = lat.get("source")
        check(f"latency {metric} source", src == "runtime" and "source_chosen" in lat,
              "runtime (chosen by itself)", src)
        want = round(c1 - c0)
        check(f"latency {metric} count = vLLM {name}_count increase", lat.get("count") == want,
              want, lat.get("count"))
        figures[metric] = lat
        for q, qname in [(0.5, "p50"), (0.9, "p90"), (0.95, "p95"), (0.99, "p99")]:
            if not delta or max(delta.values()) <= 0:
                check(f"latency {metric} {qname} in vLLM's bucket", False, "observations", "none")
                continue
            lower, upper = bucket_of(delta, q)
            v = lat.get(qname)
            bb = (lat.get("bucket_bounds") or {}).get(qname) or {}
            got_upper = bb.get("upper")
            same_bucket = bb.get("lower") == lower and (got_upper if got_upper is not None else float("inf")) == upper
            inside = isinstance(v, (int, float)) and lower <= v <= (upper if upper != float("inf") else lower)
            check(f"latency {metric} {qname} in vLLM's bucket", same_bucket and inside,
                  f"({lower}, {upper}]", f"{v} in ({bb.get('lower')}, {got_upper}]")
    for metric in ("prefill", "decode"):
        try:
            urllib.request.urlopen(f"{api}/api/v1/latency?model={model}&metric={metric}&source=memory", timeout=10)
            status = 200
        except urllib.error.HTTPError as e:
            status = e.code
        check(f"latency {metric} of the records refused", status == 400, 400, status)

    # 3. An SLO counted (and burning) from the runtime alone.
    slo, deadline = {}, time.monotonic() + 30
    while True:
        s = get_json(f"{api}/api/v1/slos?slo=ttft_100ms&model={model}").get("slos") or [{}]
        slo = s[0]
        if slo.get("alert_state") == "firing" or time.monotonic() > deadline:
            break
        time.sleep(1)
    requests = round(vllm_counter(after, "vllm:request_success_total", model)
                     - vllm_counter(before, "vllm:request_success_total", model))
    check("SLO ttft_100ms counted_from", slo.get("counted_from") == "runtime", "runtime", slo.get("counted_from"))
    check("SLO total = vLLM TTFT observations", slo.get("total") == figures["ttft"].get("count"),
          figures["ttft"].get("count"), slo.get("total"))
    fast = next((w for w in slo.get("burn") or [] if w.get("pair") == "fast"), {})
    check("SLO burns (fast burn rate > 1, alert firing)",
          (fast.get("burn_rate") or 0) > 1 and slo.get("alert_state") == "firing",
          "> 1, firing", f"{fast.get('burn_rate')}, {slo.get('alert_state')}")

    # 4. `top --once` shows the same model figures as the fleet.
    top = subprocess.run([a.tokenwatch, "top", "--once", "--window", "5m", "--size", "200x30",
                          "--url", api], capture_output=True, text=True, timeout=30)
    fleet2 = get_json(f"{api}/api/v1/fleet?window=5m")
    row2 = next((m for m in fleet2.get("models", []) if m.get("model_id") == model), {})
    line = next((l for l in top.stdout.splitlines() if re.match(rf"^│{re.escape(model)}\b", l)), None)
    check("top --once row", top.returncode == 0 and line is not None, model, line and line.strip("│ ")[:60])
    if line:
        cells = [c for c in re.split(r"\s{2,}", line.strip("│ ")) if c]
        for i, col in enumerate(["ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s"], start=1):
            got = top_seconds(cells[i]) if i < len(cells) else None
            want = row2.get(col)
            ok = got is not None and want is not None and abs(got - want) <= 0.01 * want + 1e-4
            check(f"top {col} = fleet", ok, want, cells[i] if i < len(cells) else None)
        for i, name in [(5, "REQ/S"), (6, "TOK/S"), (7, "ERR"), (8, "KV")]:
            cell = cells[i] if i < len(cells) else "–"
            check(f"top {name} has a value", cell != "–", "a value", cell)

    print()
    width = max(len(c[0]) for c in CHECKS)
    print(f"{'check'.ljust(width)}  result  expected  |  got")
    for name, ok, exp, got in CHECKS:
        print(f"{name.ljust(width)}  {'PASS' if ok else 'FAIL'}    {exp}  |  {got}")
    failed = [c for c in CHECKS if not c[1]]
    ttft, itl = figures.get("ttft", {}), figures.get("itl", {})
    summary = {
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t0)),
        "clients": a.clients, "duration_s": a.duration, "requests": done, "client_errors": len(errors),
        "vllm_requests": requests,
        "client_ttft_p50_s": pct(ttfts, 0.5), "client_ttft_p99_s": pct(ttfts, 0.99),
        "runtime_ttft": {k: ttft.get(k) for k in ("count", "p50", "p99")},
        "runtime_ttft_buckets": {k: (ttft.get("bucket_bounds") or {}).get(k) for k in ("p50", "p99")},
        "runtime_itl": {k: itl.get(k) for k in ("count", "p50", "p99")},
        **{f"runtime_{m}": {k: figures.get(m, {}).get(k) for k in ("count", "p50", "p99")}
           for m in ("queue", "prefill", "decode")},
        "fleet": {k: row.get(k) for k in ("requests_per_s", "output_tokens_per_s", "error_ratio", "kv_cache_usage")},
        "slo": {"counted_from": slo.get("counted_from"), "total": slo.get("total"), "bad": slo.get("bad"),
                "fast_burn": fast.get("burn_rate"), "alert_state": slo.get("alert_state")},
        "checks": len(CHECKS), "failed": len(failed),
    }
    print("\nsummary: " + json.dumps(summary))
    print(f"\n{len(CHECKS) - len(failed)} of {len(CHECKS)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
