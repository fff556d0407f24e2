"""`deepinfer serve` under abuse: an HTTP fuzz run of more than 10,000 malformed or hostile requests
(bad JSON, wrong types, giant numbers, invalid UTF-8, broken HTTP framing, huge headers, slowloris),
64 concurrent streams with 30% random disconnects, a full queue, and SIGTERM draining.

The server must never answer 5xx to a bad request, never die, report /health 200 afterwards, and
its cache accounting (/metrics) must be exactly empty once the clients are gone.
"""
import http.client
import json
import random
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from deepinfer_server import ServerProcess, is_idle, sse_events

FUZZ_REQUESTS = 13_000  # of which at least 10,000 must be refused as malformed
MSGS = [{"role": "user", "content": "Who was Moses?"}]


@pytest.fixture(scope="module")
def server():
    # Small caps keep the fuzz cheap: a mutated request that stays valid generates <= 32 tokens.
    s = ServerProcess("--max-tokens-limit", "32", "--max-n", "4", "--timeout", "2", "--http-threads", "160")
    yield s
    assert s.stop() == 0, s.stderr()


# ---------------------------------------------------------------------------------------------
# fuzz cases

HOSTILE_VALUES = [None, True, False, -1, 0, 1, 2**31, 2**63, 2**64, -2**63 - 1, 10**40, 1e308, -1e308, 0.5, -0.0,
                  "", "x" * 5000, "\u0000", "\ud7ff\ue000", [], [1] * 50, [[1, 2], [3]], {}, {"a": [1]},
                  {"type": "json_schema"}, [{"role": "user"}], [{"role": "user", "content": None}],
                  [{"role": "user", "content": [{"type": "image_url"}]}], [{"role": "tool", "content": "x"}],
                  [{"role": "assistant", "content": "x", "tool_calls": [{"id": 1}]}],
                  # structured-output specs: pathological, invalid, empty, self-referencing
                  "(a*)*b", "[", "x{1000000}", "root ::= root", ["a", "b"], [""],
                  {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
                  {"json": {"type": "integer"}}, {"type": "json_schema", "json_schema": {"schema": {"type": "string"}}}]
FIELDS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "n", "temperature", "top_p", "top_k",
          "min_p", "stop", "seed", "logprobs", "top_logprobs", "logit_bias", "stream", "stream_options",
          "presence_penalty", "frequency_penalty", "repetition_penalty", "response_format", "tools", "tool_choice",
          "echo", "best_of", "suffix", "min_tokens", "ignore_eos", "stop_token_ids", "chat_template_kwargs",
          "thinking", "reasoning_effort", "user", "tokens", "add_special_tokens", "unknown_field",
          "guided_json", "guided_regex", "guided_grammar", "guided_choice", "structured_outputs"]
ROUTES = ["/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"]


def base_request(rng, route):
    if route == "/v1/chat/completions":
        return {"model": "nano-v4", "messages": [{"role": "user", "content": "Amen"}], "max_tokens": rng.randint(1, 4)}
    if route == "/v1/completions":
        return {"model": "nano-v4", "prompt": "Amen", "max_tokens": rng.randint(1, 4)}
    if route == "/tokenize":
        return {"prompt": "Amen"}
    return {"tokens": [1, 2, 3]}


def garbage_body(rng):
    valid = json.dumps(base_request(rng, "/v1/completions")).encode()
    k = rng.randrange(12)
    if k == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(200)))
    if k == 1:
        return valid[:rng.randrange(len(valid))]
    if k == 2:
        i = rng.randrange(len(valid))
        return valid[:i] + bytes([rng.choice([0x80, 0xC0, 0xFF, 0xED, 0xF8])]) + valid[i:]
    if k == 3:
        d = rng.randint(50, 20000)
        return b"[" * d + b"]" * d
    if k == 4:
        d = rng.randint(50, 5000)
        return b'{"a":' * d + b"1" + b"}" * d
    if k == 5:
        return b'{"prompt": "Amen", "max_tokens": ' + rng.choice([b"1e999", b"-1e999", b"1" * 400, b"NaN",
                                                                  b"Infinity", b"0x10", b"-", b"1.5e"]) + b"}"
    if k == 6:
        return b'{"prompt": "\\ud800", "max_tokens": 1}'
    if k == 7:
        return b'{"prompt": "a", "prompt": 5, "max_tokens": 1}'
    if k == 8:
        return rng.choice([b"null", b"true", b"1", b'"x"', b"[]", b"[{}]", b"{}", b" ", b"\x00"])
    if k == 9:
        return valid.replace(b"Amen", b"A\x00men")
    if k == 10:
        return b'{"prompt": [' + b",".join(str(rng.randint(-5, 10**6)).encode() for _ in range(rng.randint(1, 50))) + b"]}"
    return json.dumps({"messages": [{"role": "user", "content": "x" * rng.randint(0, 3000)}] * rng.randint(0, 300),
                       "max_tokens": 1}).encode()


def mutated_body(rng, route):
    req = base_request(rng, route)
    for _ in range(rng.randint(1, 3)):
        req[rng.choice(FIELDS)] = rng.choice(HOSTILE_VALUES)
    return json.dumps(req).encode()


def raw_http_case(rng):
    """A raw byte string that breaks HTTP itself."""
    k = rng.randrange(12)
    body = json.dumps(base_request(rng, "/v1/completions")).encode()
    if k == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
    if k == 1:
        return b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * rng.randint(9000, 70000) + b"\r\n\r\n"
    if k == 2:
        return b"GET /health HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(rng.randint(100, 2000))) + b"\r\n"
    if k == 3:
        cl = rng.choice([b"-1", b"99999999999999999999999", b"abc", b"", b"1, 2", b"18446744073709551616"])
        return b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + cl + b"\r\n\r\n" + body
    if k == 4:
        return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
                rng.choice([b"zz\r\n", b"ffffffffffffffffff\r\nab\r\n", b"5\r\nabc\r\n0\r\n\r\n", b"-1\r\n"]))
    if k == 5:
        return b"GET /" + b"a" * rng.randint(9000, 40000) + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    if k == 6:
        return rng.choice([b"FOO /health HTTP/1.1\r\n\r\n", b"GET\r\n\r\n", b"GET /health\r\n\r\n",
                           b"GET /health HTTP/9.9\r\n\r\n", b"\r\n\r\n\r\n", b"GET /%00%ff/../v1/models HTTP/1.1\r\n\r\n",
                           b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, close\r\n\r\n"])
    if k == 7:
        return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n"
                % len(body)) + body
    if k == 8:
        return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (len(body) + 50)) + body
    if k == 9:
        return b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n{}}GARBAGE / HTTP/1.1\r\n\r\n"
    if k == 10:
        return b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\nContent-Length: 4\r\n\r\n\x1f\x8b\x08\x00"
    return b"GET /health HTTP/1.1\r\nHost: \xff\xfe\r\nX-\x00: \x01\r\n\r\n"


def send_raw(port, data):
    """Sends bytes, half-closes, returns the status codes of the responses (empty if none)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server may close early on a huge request; that is fine
        out = b""
        try:
            while len(out) < 1 << 20:
                b = s.recv(65536)
                if not b:
                    break
                out += b
        except OSError:
            pass
    codes = []
    for line in out.split(b"\r\n"):
        if line.startswith(b"HTTP/1.1 ") and len(line) >= 12 and line[9:12].isdigit():
            codes.append(int(line[9:12]))
    return codes


class Worker:
    """One keep-alive connection; reconnects after the server closes it."""

    def __init__(self, port):
        self.port = port
        self.conn = None

    def post(self, path, body, headers=None):
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            try:
                self.conn.request("POST", path, body=body, headers=headers or {"Content-Type": "application/json"})
                r = self.conn.getresponse()
                data = r.read()
                if r.getheader("Connection", "").lower() == "close":
                    self.close()
                return r.status, data, r.getheader("Content-Type", "")
            except (http.client.HTTPException, OSError):
                self.close()
                if attempt == 1:
                    raise
        raise AssertionError("unreachable")

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def test_fuzz_10k_hostile_requests(server):
    failures, statuses = [], {}
    lock = threading.Lock()
    workers = 8
    per = FUZZ_REQUESTS // workers + 1

    def run(w):
        rng = random.Random(1000 + w)
        conn = Worker(server.port)
        local = {}
        for i in range(per):
            kind = rng.random()
            try:
                if kind < 0.15:
                    codes = send_raw(server.port, raw_http_case(rng))
                    for c in codes:
                        local[c] = local.get(c, 0) + 1
                    if not any(200 <= c < 300 for c in codes):
                        local["refused"] = local.get("refused", 0) + 1
                    bad = [c for c in codes if c >= 500]
                    if bad:
                        with lock:
                            failures.append(("raw", i, bad))
                    continue
                route = rng.choice(ROUTES)
                body = garbage_body(rng) if kind < 0.65 else mutated_body(rng, route)
                status, data, ctype = conn.post(route, body)
                local[status] = local.get(status, 0) + 1
                if 400 <= status < 500:
                    local["refused"] = local.get("refused", 0) + 1
                ok_shape = True
                if status >= 400:
                    err = json.loads(data)["error"]
                    ok_shape = isinstance(err["message"], str) and err["type"] and "code" in err and "param" in err
                elif "event-stream" in ctype:
                    ok_shape = data.endswith(b"data: [DONE]\n\n")
                else:
                    json.loads(data)
                if status >= 500 or not ok_shape:
                    with lock:
                        failures.append((route, body[:200], status, data[:300]))
            except Exception as e:  # noqa: BLE001 - any client-side surprise is a finding
                with lock:
                    failures.append(("exception", i, repr(e)[:300]))
        conn.close()
        with lock:
            for k, v in local.items():
                statuses[k] = statuses.get(k, 0) + v

    # Slowloris alongside: partial requests that stall must be timed out, not hold the server.
    slow = []
    for _ in range(16):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro")
        slow.append(s)
    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(run, range(workers)))
    refused = statuses.pop("refused", 0)
    total = sum(statuses.values())
    print("fuzz statuses:", dict(sorted(statuses.items())), "responses:", total, "refused as malformed:", refused)
    assert total >= FUZZ_REQUESTS * 0.8  # raw cases may legitimately get no response (connection closed)
    assert not failures, failures[:10]
    assert refused >= 10_000
    # The stalled requests were cut off by the read timeout (a response or a close, never a hang).
    for s in slow:
        s.settimeout(15)
        try:
            data = s.recv(4096)
            assert data == b"" or data.startswith(b"HTTP/1.1 4"), data[:100]
        except ConnectionResetError:
            pass
        s.close()
    assert server.alive()
    assert server.request("GET", "/health")[0] == 200
    m = server.wait_idle()
    assert is_idle(m), m
    assert "internal error" not in server.stderr()
    status, r = server.post("/v1/completions", {"prompt": "Amen", "max_tokens": 4})
    assert status == 200 and r["usage"]["completion_tokens"] >= 1


def stream_client(port, body, disconnect_after, result):
    """Reads an SSE stream; closes the socket after `disconnect_after` events (None: read to the end)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    result["status"] = r.status
    events, buf = [], b""
    while True:
        line = r.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            events.append(line[6:].strip().decode())
            if disconnect_after is not None and len(events) >= disconnect_after:
                conn.sock.shutdown(socket.SHUT_RDWR)
                conn.close()
                result["disconnected"] = True
                return
            if events[-1] == "[DONE]":
                break
    conn.close()
    result["events"] = events


def test_64_streams_with_30_percent_disconnects(server):
    before = server.metrics()
    rng = random.Random(64)
    n = 64
    plan = [rng.randint(1, 4) if rng.random() < 0.3 else None for _ in range(n)]
    # Enough tokens that a disconnected stream is still running when its client leaves.
    body = {"model": "nano-v4", "prompt": "And it came to pass", "max_tokens": 32, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.8}
    results = [dict() for _ in range(n)]
    threads = [threading.Thread(target=stream_client, args=(server.port, body, plan[i], results[i])) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert all(not t.is_alive() for t in threads)
    assert all(r.get("status") == 200 for r in results), [r.get("status") for r in results]
    disconnects = sum(1 for p in plan if p is not None)
    assert 10 <= disconnects <= 30
    for p, r in zip(plan, results):
        if p is None:
            ev = r["events"]
            assert ev[-1] == "[DONE]"
            chunks = [json.loads(e) for e in ev[:-1]]
            assert chunks[-1]["usage"]["completion_tokens"] == 32
            assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]].count("length") == 1
        else:
            assert r.get("disconnected")
    m = server.wait_idle()
    assert is_idle(m), m  # cache accounting back to exactly empty
    assert m["deepinfer_cache_pages_used"] == 0 and m["deepinfer_cache_slots_used"] == 0
    finished = lambda mm, why: mm.get('deepinfer_request_success_total{finished_reason="%s"}' % why, 0)
    new_len = finished(m, "length") - finished(before, "length")
    new_abort = finished(m, "abort") - finished(before, "abort")
    # Every request ended exactly once; the ones whose client left early were aborted (a client
    # that left after the last token was written may have seen its request finish normally).
    assert new_len + new_abort == n
    assert new_abort >= 1 and new_len >= n - disconnects
    assert server.request("GET", "/health")[0] == 200


def test_full_queue_is_429_then_sigterm_drains_and_exits_0():
    s = ServerProcess("--max-queued", "2", "--max-num-seqs", "1", "--shutdown-timeout", "60")
    try:
        body = {"model": "nano-v4", "prompt": "And it came to pass", "max_tokens": 48, "ignore_eos": True,
                "stream": True}
        results = [dict(), dict()]
        conns = []
        for r in results:
            c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
            c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
            conns.append(c)
        resps = [c.getresponse() for c in conns]
        assert [r.status for r in resps] == [200, 200]
        # Two sequences admitted: a third is refused at once, with Retry-After.
        status, err = s.post("/v1/completions", {"prompt": "Amen", "max_tokens": 2})
        assert status == 429 and err["error"]["type"] == "rate_limit_error", err
        status, err = s.post("/v1/completions", {"prompt": "Amen", "max_tokens": 2, "n": 3, "temperature": 1})
        assert status == 429
        assert s.metrics()["deepinfer_admission_rejections_total"] == 2
        # SIGTERM while both stream: they run to completion, new requests are refused, exit 0.
        first = [r.readline() for r in resps]
        assert all(f.startswith(b"data: ") for f in first)
        s.proc.send_signal(15)
        deadline = time.time() + 30
        refused = False
        while time.time() < deadline and not refused:
            try:
                st, _ = s.post("/v1/completions", {"prompt": "Amen", "max_tokens": 2}, timeout=10)
                refused = st == 503
            except OSError:
                refused = True  # the listener is already closed
            time.sleep(0.05)
        assert refused
        for r in resps:
            events = sse_events("data: x\n" + r.read().decode())[1:]  # its first line was read above
            assert events[-1] == "[DONE]"
            last = json.loads(events[-2])
            assert last["choices"][0]["finish_reason"] == "length"
        for c in conns:
            c.close()
        s.proc.wait(60)
        assert s.proc.returncode == 0, s.stderr()
    finally:
        s.stop()


def test_sigterm_with_zero_drain_aborts_streams():
    s = ServerProcess("--shutdown-timeout", "0")
    try:
        body = {"model": "nano-v4", "prompt": "And it came to pass", "max_tokens": 3000, "ignore_eos": True,
                "stream": True}
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
        c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        assert r.status == 200 and r.readline().startswith(b"data: ")
        s.proc.send_signal(15)
        events = sse_events("data: x\n" + r.read().decode())[1:]
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "abort"
        c.close()
        s.proc.wait(60)
        assert s.proc.returncode == 0, s.stderr()
    finally:
        s.stop()
