#!/usr/bin/env python3
"""Load generator for an OpenAI-compatible server (deepinfer serve, vLLM, ...), standard library only.

Sends streaming /v1/completions requests with prompts of exactly --input-len tokens (token ids from
the server's own /tokenize) and exactly --output-len generated tokens (ignore_eos), either as a
Poisson process of --request-rate requests/s or as fast as --max-concurrency allows, and reports the
metrics with vLLM's definitions (benchmarks/benchmark_serving.py):

  TTFT  time from sending the request to receiving the first token
  TPOT  per request: (E2EL - TTFT) / (output tokens - 1)       (requests with > 1 output token)
  ITL   time between consecutive streamed chunks, over all requests
  E2EL  time from sending the request to receiving the last token
  throughput: completed requests / duration, output tokens / duration, (input + output) / duration

  python3 bench/loadgen.py --url http://127.0.0.1:8000 --num-prompts 64 --input-len 128 \
      --output-len 64 --max-concurrency 8
  python3 bench/loadgen.py --request-rate 4 ...   # Poisson arrivals, 4 requests/s on average
"""
import argparse
import http.client
import json
import random
import statistics
import threading
import time
import urllib.parse

FILLER = ("In the beginning God created the heaven and the earth. And the earth was without form, and void; "
          "and darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. ")


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class Client:
    def __init__(self, url, api_key):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port or 80
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = "Bearer " + api_key

    def post_json(self, path, body):
        c = http.client.HTTPConnection(self.host, self.port, timeout=600)
        c.request("POST", path, body=json.dumps(body), headers=self.headers)
        r = c.getresponse()
        data = r.read()
        c.close()
        if r.status != 200:
            raise RuntimeError(f"{path}: HTTP {r.status}: {data[:300]!r}")
        return json.loads(data)

    def get_json(self, path):
        c = http.client.HTTPConnection(self.host, self.port, timeout=60)
        c.request("GET", path, headers=self.headers)
        r = c.getresponse()
        data = r.read()
        c.close()
        if r.status != 200:
            raise RuntimeError(f"{path}: HTTP {r.status}: {data[:300]!r}")
        return json.loads(data)


def make_prompts(client, n, input_len, seed):
    """n prompts of exactly input_len token ids: windows of the tokenized filler at random offsets."""
    text = FILLER * (input_len // 20 + 4)
    ids = client.post_json("/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]
    while len(ids) < 2 * input_len:
        ids = ids + ids
    rng = random.Random(seed)
    return [ids[o:o + input_len] for o in (rng.randrange(len(ids) - input_len) for _ in range(n))]


def run_one(client, model, prompt, output_len, out):
    body = {"model": model, "prompt": prompt, "max_tokens": output_len, "ignore_eos": True, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    rec = {"input_len": len(prompt), "ok": False, "itl": [], "ttft": None, "e2el": None, "output_len": 0}
    t0 = time.perf_counter()
    try:
        c = http.client.HTTPConnection(client.host, client.port, timeout=600)
        c.request("POST", "/v1/completions", body=json.dumps(body), headers=client.headers)
        r = c.getresponse()
        if r.status != 200:
            rec["error"] = f"HTTP {r.status}: {r.read()[:200]!r}"
            c.close()
            out.append(rec)
            return
        last = None
        while True:
            line = r.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                rec["ok"] = True
                break
            chunk = json.loads(payload)
            if chunk.get("usage"):
                rec["output_len"] = chunk["usage"]["completion_tokens"]
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                now = time.perf_counter()
                if last is None:
                    rec["ttft"] = now - t0
                else:
                    rec["itl"].append(now - last)
                last = now
        rec["e2el"] = (last if last is not None else time.perf_counter()) - t0
        c.close()
    except Exception as e:  # noqa: BLE001 - a failed request is reported, not fatal
        rec["error"] = repr(e)
    out.append(rec)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--model", default=None, help="default: the server's first model")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--request-rate", type=float, default=float("inf"),
                    help="requests/s, Poisson arrivals (default inf: all at once, bounded by --max-concurrency)")
    ap.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the results to this file")
    a = ap.parse_args()

    client = Client(a.url, a.api_key)
    model = a.model or client.get_json("/v1/models")["data"][0]["id"]
    prompts = make_prompts(client, a.num_prompts, a.input_len, a.seed)
    rng = random.Random(a.seed)
    sem = threading.Semaphore(a.max_concurrency) if a.max_concurrency else None
    results, threads = [], []

    def worker(p):
        try:
            run_one(client, model, p, a.output_len, results)
        finally:
            if sem:
                sem.release()

    start = time.perf_counter()
    for p in prompts:
        if sem:
            sem.acquire()
        t = threading.Thread(target=worker, args=(p,))
        t.start()
        threads.append(t)
        if a.request_rate != float("inf"):
            time.sleep(rng.expovariate(a.request_rate))
    for t in threads:
        t.join()
    duration = time.perf_counter() - start

    ok = [r for r in results if r["ok"]]
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    tpot = [(r["e2el"] - r["ttft"]) / (r["output_len"] - 1) for r in ok if r["output_len"] > 1 and r["ttft"]]
    itl = [x for r in ok for x in r["itl"]]
    e2el = [r["e2el"] for r in ok]
    out_tokens = sum(r["output_len"] for r in ok)
    in_tokens = sum(r["input_len"] for r in ok)
    summary = {
        "model": model, "num_prompts": a.num_prompts, "input_len": a.input_len, "output_len": a.output_len,
        "request_rate": a.request_rate if a.request_rate != float("inf") else "inf",
        "max_concurrency": a.max_concurrency, "completed": len(ok), "failed": len(results) - len(ok),
        "duration_s": duration, "request_throughput": len(ok) / duration,
        "output_throughput": out_tokens / duration, "total_token_throughput": (in_tokens + out_tokens) / duration,
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
    }
    for name, xs in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        ms = [x * 1000 for x in xs]
        summary[f"mean_{name}_ms"] = statistics.fmean(ms) if ms else float("nan")
        summary[f"median_{name}_ms"] = percentile(ms, 50)
        summary[f"p99_{name}_ms"] = percentile(ms, 99)

    print("=" * 20 + " Serving Benchmark Result " + "=" * 20)
    rows = [("Successful requests", summary["completed"]), ("Failed requests", summary["failed"]),
            ("Benchmark duration (s)", f"{duration:.2f}"), ("Total input tokens", in_tokens),
            ("Total generated tokens", out_tokens),
            ("Request throughput (req/s)", f"{summary['request_throughput']:.2f}"),
            ("Output token throughput (tok/s)", f"{summary['output_throughput']:.2f}"),
            ("Total token throughput (tok/s)", f"{summary['total_token_throughput']:.2f}")]
    for name, title in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st token)"),
                        ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")):
        rows.append((f"-- {title} --", ""))
        for stat in ("mean", "median", "p99"):
            rows.append((f"{stat.capitalize()} {name.upper()} (ms)", f"{summary[f'{stat}_{name}_ms']:.2f}"))
    for k, v in rows:
        print(f"{k:<42}{v}")
    errors = [r["error"] for r in results if not r["ok"] and "error" in r]
    if errors:
        print("first errors:", errors[:3])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0 if not errors else 1


if __name__ == "__main__":
    raise SystemExit(main())
