"""Helpers for the live-server tests: start `deepinfer serve` on a free loopback port, read its
/metrics, wait until the engine is idle, stop it with SIGTERM."""
import json
import os
import re
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request


class ServerProcess:
    def __init__(self, *args, api_key=None, startup_timeout=120):
        exe = os.environ.get("DEEPINFER_BIN")
        assert exe, "DEEPINFER_BIN must name the built deepinfer command"
        self.api_key = api_key
        cmd = [exe, "serve", "--host", "127.0.0.1", "--port", "0", "--threads", "2", *args]
        if api_key:
            cmd += ["--api-key", api_key]
        self.log = tempfile.NamedTemporaryFile(prefix="deepinfer-serve-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + startup_timeout
        self.port = None
        while time.time() < deadline and self.port is None:
            if self.proc.poll() is not None:
                raise RuntimeError("deepinfer serve exited early:\n" + self.stderr())
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", self.stderr())
            if m:
                self.port = int(m.group(1))
            else:
                time.sleep(0.05)
        if self.port is None:
            self.proc.kill()
            raise RuntimeError("deepinfer serve did not start:\n" + self.stderr())
        self.url = f"http://127.0.0.1:{self.port}"
        self.base_url = self.url + "/v1"

    def stderr(self):
        with open(self.log.name, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def headers(self):
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = "Bearer " + self.api_key
        return h

    def request(self, method, path, body=None, headers=None, timeout=60):
        """(status, parsed JSON or text) without raising on HTTP errors."""
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers=headers if headers is not None else self.headers())
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, raw, ctype = r.status, r.read(), r.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            status, raw, ctype = e.code, e.read(), e.headers.get("Content-Type", "")
        text = raw.decode("utf-8", "replace")
        if "json" in ctype:
            return status, json.loads(text)
        return status, text

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def metrics(self):
        status, text = self.request("GET", "/metrics")
        assert status == 200, text
        return parse_metrics(text)

    def wait_idle(self, timeout=60):
        """Waits until nothing is admitted, running or queued and the cache is empty; returns the
        last metrics (the caller asserts on them)."""
        deadline = time.time() + timeout
        m = self.metrics()
        while time.time() < deadline:
            if is_idle(m):
                return m
            time.sleep(0.05)
            m = self.metrics()
        return m

    def alive(self):
        return self.proc.poll() is None

    def stop(self, timeout=60):
        """SIGTERM, wait; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("deepinfer serve did not exit after SIGTERM:\n" + self.stderr())
        rc = self.proc.returncode
        try:
            os.unlink(self.log.name)
        except OSError:
            pass
        return rc


def parse_metrics(text):
    """Prometheus text -> {"name{labels}": float} (and "name" for unlabelled samples)."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        out[key] = float(value)
    return out


def is_idle(m):
    return (m["deepinfer_server_sequences"] == 0 and m["deepinfer_num_requests_running"] == 0
            and m["deepinfer_num_requests_waiting"] == 0 and m["deepinfer_cache_pages_used"] == 0
            and m["deepinfer_cache_slots_used"] == 0)


def sse_events(body):
    """Splits an SSE body (str) into its data payloads; asserts the framing on the way."""
    assert body.endswith("\n\n"), body[-200:]
    events = []
    for block in body.split("\n\n")[:-1]:
        lines = [ln for ln in block.split("\n") if not ln.startswith(":")]
        if not lines:
            continue  # a comment-only block (keep-alive)
        assert len(lines) == 1 and lines[0].startswith("data: "), block
        events.append(lines[0][len("data: "):])
    return events
