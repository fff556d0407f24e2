"""`deepinfer serve` on the embedded nano model, driven by the official `openai` client.

Expected values come from independent facts, never from recorded outputs: the tokenizer's own
encode/decode (/tokenize, /detokenize), greedy determinism, the same request without a stop string,
the raw completion of the same prompt ids, the OpenAI chunk-format rules, seeded reproducibility.
"""
import json
import os

import openai
import pytest

from deepinfer_server import ServerProcess, sse_events

MSGS = [{"role": "user", "content": "Who was Moses?"}]


@pytest.fixture(scope="module")
def server():
    s = ServerProcess()
    yield s
    assert s.stop() == 0, s.stderr()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client):
    models = client.models.list().data
    assert len(models) == 1
    return models[0].id


def special_strings():
    src = os.environ["DEEPINFER_SOURCE_DIR"]
    with open(os.path.join(src, "models", "nano-v4", "tokenizer.json"), encoding="utf-8") as f:
        return [t["content"] for t in json.load(f)["added_tokens"] if t["special"]]


def strip_specials(text):
    for s in special_strings():
        text = text.replace(s, "")
    return text


def test_models_and_health(server, client, model):
    assert model == "nano-v4"  # the directory's basename
    assert client.models.retrieve(model).id == model
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    assert server.request("GET", "/health")[0] == 200


def test_chat_greedy_usage_and_prompt_tokens(server, client, model):
    r = client.chat.completions.create(model=model, messages=MSGS, max_tokens=16, temperature=0)
    assert r.object == "chat.completion" and len(r.choices) == 1
    c = r.choices[0]
    assert c.index == 0 and c.message.role == "assistant" and c.finish_reason in ("length", "stop")
    assert c.message.content
    # The prompt is the chat rendering the tokenizer endpoint produces for the same messages.
    status, tok = server.post("/tokenize", {"messages": MSGS})
    assert status == 200
    assert r.usage.prompt_tokens == tok["count"] == len(tok["tokens"])
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    if c.finish_reason == "length":
        assert r.usage.completion_tokens == 16
    # Greedy is deterministic.
    r2 = client.chat.completions.create(model=model, messages=MSGS, max_tokens=16, temperature=0)
    assert r2.choices[0].message.content == c.message.content


def test_completion_text_is_the_tokenizers_decode(server, client, model):
    prompt = "In the beginning God created"
    r = client.completions.create(model=model, prompt=prompt, max_tokens=20, temperature=0, logprobs=0,
                                  extra_body={"ignore_eos": True})
    c = r.choices[0]
    assert c.finish_reason == "length" and r.usage.completion_tokens == 20
    status, tok = server.post("/tokenize", {"prompt": prompt})
    assert r.usage.prompt_tokens == tok["count"]
    # The text is the decode of the generated tokens: the per-token strings join to it.
    assert "".join(c.logprobs.tokens) == c.text
    # Token ids as the prompt give the same continuation as the text they encode.
    r2 = client.completions.create(model=model, prompt=tok["tokens"], max_tokens=20, temperature=0,
                                   extra_body={"ignore_eos": True})
    assert r2.choices[0].text == c.text


def test_tokenize_detokenize_round_trip(server):
    text = "And God said, Let there be light: and there was light."
    status, tok = server.post("/tokenize", {"prompt": text, "add_special_tokens": False, "return_token_strs": True})
    assert status == 200 and tok["count"] == len(tok["tokens"]) == len(tok["token_strs"])
    assert tok["max_model_len"] > 0
    status, de = server.post("/detokenize", {"tokens": tok["tokens"]})
    assert status == 200 and de["prompt"] == text
    assert "".join(tok["token_strs"]) == text


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_stream_equals_non_stream(client, model, kind):
    kw = dict(model=model, max_tokens=24, temperature=0)
    if kind == "chat":
        full = client.chat.completions.create(messages=MSGS, **kw)
        chunks = list(client.chat.completions.create(messages=MSGS, stream=True,
                                                     stream_options={"include_usage": True}, **kw))
        want = full.choices[0].message.content
    else:
        full = client.completions.create(prompt="And Moses said", **kw)
        chunks = list(client.completions.create(prompt="And Moses said", stream=True,
                                                stream_options={"include_usage": True}, **kw))
        want = full.choices[0].text
    assert len({c.id for c in chunks}) == 1
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert len(usage_chunks) == 1 and chunks[-1] is usage_chunks[0] and chunks[-1].choices == []
    assert usage_chunks[0].usage.completion_tokens == full.usage.completion_tokens
    assert usage_chunks[0].usage.prompt_tokens == full.usage.prompt_tokens
    body = chunks[:-1]
    finishes = [c.choices[0].finish_reason for c in body if c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert body[-1].choices[0].finish_reason is not None
    if kind == "chat":
        assert body[0].choices[0].delta.role == "assistant"
        assert all(c.choices[0].delta.role is None for c in body[1:])
        text = "".join(c.choices[0].delta.content or "" for c in body)
    else:
        text = "".join(c.choices[0].text for c in body)
    assert text == want


def test_n_choices(client, model):
    r = client.chat.completions.create(model=model, messages=MSGS, max_tokens=12, n=3, temperature=1.0, seed=7)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert r.usage.completion_tokens >= 3
    # Streaming: indices interleave, one finish per choice, texts equal the non-streamed ones (seeded).
    chunks = list(client.chat.completions.create(model=model, messages=MSGS, max_tokens=12, n=3,
                                                 temperature=1.0, seed=7, stream=True))
    texts, finishes = {}, {}
    for ch in chunks:
        for c in ch.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                assert c.index not in finishes
                finishes[c.index] = c.finish_reason
    assert sorted(finishes) == [0, 1, 2]
    for c in r.choices:
        assert texts[c.index] == c.message.content


def test_seed_reproducibility(client, model):
    kw = dict(model=model, prompt="The LORD is my shepherd", max_tokens=16, temperature=1.0,
              extra_body={"ignore_eos": True})
    a = client.completions.create(seed=1234, **kw).choices[0].text
    b = client.completions.create(seed=1234, **kw).choices[0].text
    assert a == b
    others = {client.completions.create(seed=s, **kw).choices[0].text for s in (1, 2, 3)}
    assert len(others | {a}) > 1  # different seeds sample differently


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_across_tokens(client, model, stream):
    kw = dict(model=model, prompt="In the beginning God created", max_tokens=40, temperature=0,
              extra_body={"ignore_eos": True})
    base = client.completions.create(logprobs=0, **kw).choices[0]
    toks = base.logprobs.tokens
    # A stop string made of the end of one token and the start of the next (never a token itself).
    i = next(k for k in range(3, len(toks) - 1) if len(toks[k].strip()) >= 2 and len(toks[k + 1].strip()) >= 2)
    stop = toks[i][-2:] + toks[i + 1][:2]
    want = base.text[:base.text.index(stop)]
    if stream:
        chunks = list(client.completions.create(stop=[stop], stream=True, **kw))
        got = "".join(c.choices[0].text for c in chunks)
        assert chunks[-1].choices[0].finish_reason == "stop"
        assert all(stop not in c.choices[0].text for c in chunks)
    else:
        c = client.completions.create(stop=[stop], **kw).choices[0]
        got = c.text
        assert c.finish_reason == "stop"
    assert got == want


def test_chat_logprob_shapes(client, model):
    r = client.chat.completions.create(model=model, messages=MSGS, max_tokens=10, temperature=0, logprobs=True,
                                       top_logprobs=5)
    c = r.choices[0]
    entries = c.logprobs.content
    assert len(entries) == r.usage.completion_tokens
    for e in entries:
        assert e.logprob <= 0 and len(e.top_logprobs) == 5
        tops = [t.logprob for t in e.top_logprobs]
        assert tops == sorted(tops, reverse=True) and all(t <= 0 for t in tops)
        assert e.logprob == pytest.approx(tops[0], abs=1e-5)  # greedy picks the most likely token
        assert e.token == e.top_logprobs[0].token
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token
    if c.finish_reason == "length":
        assert "".join(e.token for e in entries) == c.message.content
    # top_logprobs = 0: the chosen token only.
    r0 = client.chat.completions.create(model=model, messages=MSGS, max_tokens=4, temperature=0, logprobs=True,
                                        top_logprobs=0)
    assert all(e.top_logprobs == [] for e in r0.choices[0].logprobs.content)


def test_completion_logprob_shapes(client, model):
    r = client.completions.create(model=model, prompt="And Moses said", max_tokens=8, temperature=0, logprobs=3,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 8
    for tok, l, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert l <= 0 and 1 <= len(top) <= 3
        assert max(top.values()) == pytest.approx(l, abs=1e-5)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:k]) for k in range(8)]


def test_thinking_goes_to_reasoning_content(server, client, model):
    # A moderate bias on "</think>" makes this prompt end its reasoning early (greedy, fixed).
    msgs = [{"role": "user", "content": "Tell me of David"}]
    bias = {"6": 7}
    think = client.chat.completions.create(model=model, messages=msgs, max_tokens=30, temperature=0, logit_bias=bias,
                                           extra_body={"chat_template_kwargs": {"thinking": True}})
    m = think.choices[0].message
    # Independent reference: the raw completion of the same prompt ids with special tokens kept.
    status, tok = server.post("/tokenize", {"messages": msgs, "chat_template_kwargs": {"thinking": True}})
    raw = client.completions.create(model=model, prompt=tok["tokens"], max_tokens=30, temperature=0, logit_bias=bias,
                                    extra_body={"skip_special_tokens": False}).choices[0].text
    assert "</think>" in raw
    reasoning, content = raw.split("</think>", 1)
    assert m.reasoning_content == strip_specials(reasoning)
    assert m.content == strip_specials(content)
    assert "</think>" not in m.content and "<think>" not in m.content
    # Streaming routes the same way.
    chunks = list(client.chat.completions.create(model=model, messages=msgs, max_tokens=30, temperature=0,
                                                 logit_bias=bias, stream=True,
                                                 extra_body={"chat_template_kwargs": {"thinking": True}}))
    r_stream = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks)
    c_stream = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert (r_stream, c_stream) == (m.reasoning_content, m.content)
    # Thinking off: no reasoning, and the prompt differs (it ends with "</think>", not "<think>").
    plain = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0)
    assert plain.choices[0].message.reasoning_content is None
    status, tok_off = server.post("/tokenize", {"messages": msgs})
    assert tok_off["tokens"] != tok["tokens"]


def bad_request(fn, param=None, code=None):
    with pytest.raises(openai.BadRequestError) as ei:
        fn()
    e = ei.value
    assert e.status_code == 400
    err = e.body if isinstance(e.body, dict) and "message" in e.body else e.response.json()["error"]
    assert err["message"] and err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


def test_errors_are_openai_shaped_400s(client, model):
    chat = client.chat.completions.create
    cmpl = client.completions.create
    ok = dict(model=model, messages=MSGS, max_tokens=4)
    bad_request(lambda: chat(**{**ok, "temperature": 3}), "temperature")
    bad_request(lambda: chat(**{**ok, "top_p": 0}), "top_p")
    bad_request(lambda: chat(**{**ok, "n": 0}), "n")
    bad_request(lambda: chat(**{**ok, "n": 100000}), "n")
    bad_request(lambda: chat(**{**ok, "max_tokens": 0}), "max_tokens")
    bad_request(lambda: chat(**{**ok, "max_tokens": 10**9}), "max_tokens")
    bad_request(lambda: chat(**{**ok, "presence_penalty": 2.5}), "presence_penalty")
    bad_request(lambda: chat(**{**ok, "model": "gpt-4"}), "model", "model_not_found")
    bad_request(lambda: chat(**{**ok, "messages": []}), "messages")
    bad_request(lambda: chat(**{**ok, "messages": [123]}), "messages")
    bad_request(lambda: chat(**{**ok, "messages": [{"role": "wizard", "content": "x"}]}), "messages")
    bad_request(lambda: chat(**{**ok, "messages": [{"role": "user", "content": 5}]}), "messages")
    bad_request(lambda: chat(**{**ok, "logit_bias": {"99999999": 1}}), "logit_bias")
    bad_request(lambda: chat(**{**ok, "logit_bias": {"5": 1000}}), "logit_bias")
    bad_request(lambda: chat(**{**ok, "logit_bias": {str(i): 1 for i in range(2000)}}), "logit_bias")
    bad_request(lambda: chat(**{**ok, "top_logprobs": 3}), "top_logprobs")
    bad_request(lambda: chat(**{**ok, "logprobs": True, "top_logprobs": 21}), "top_logprobs")
    bad_request(lambda: chat(**{**ok, "stop": [""]}), "stop")
    bad_request(lambda: chat(**{**ok, "seed": 2**64}), "seed")
    bad_request(lambda: chat(**{**ok, "response_format": {"type": "xml"}}), "response_format")
    bad_request(lambda: chat(**{**ok, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
                "response_format")
    bad_request(lambda: chat(**{**ok, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}}}}), "response_format")
    bad_request(lambda: chat(**{**ok, "response_format": {"type": "json_object"}, "extra_body": {"guided_regex": "a+"}}),
                "guided_regex")
    bad_request(lambda: chat(**{**ok, "stream_options": {"include_usage": True}}), "stream_options")
    bad_request(lambda: chat(**{**ok, "extra_body": {"temperature": "hot"}}), "temperature")
    long_prompt = "and it came to pass " * 2000
    bad_request(lambda: chat(**{**ok, "messages": [{"role": "user", "content": long_prompt}]}), "messages",
                "context_length_exceeded")
    bad_request(lambda: cmpl(model=model, prompt=long_prompt, max_tokens=4), "prompt", "context_length_exceeded")
    bad_request(lambda: cmpl(model=model, prompt=long_prompt, max_tokens=4, stream=True), "prompt",
                "context_length_exceeded")
    bad_request(lambda: cmpl(model=model, prompt=[1, 2, 10**7], max_tokens=4), "prompt")
    bad_request(lambda: cmpl(model=model, prompt=[-1], max_tokens=4), "prompt")
    bad_request(lambda: cmpl(model=model, prompt="", max_tokens=4), "prompt")
    # After all that the server still answers.
    assert chat(**ok).choices[0].finish_reason in ("stop", "length")


def test_raw_http_errors(server):
    for body in (b"{", b"not json", b"", b"[]", b"\xff\xfe", b'{"prompt": "\xff"}', b"[" * 100 + b"]" * 100):
        status, err = server.post("/v1/completions", body)
        assert status == 400, (body, err)
        assert set(err["error"]) >= {"message", "type", "param", "code"}
    status, err = server.request("GET", "/v1/nothing")
    assert status == 404 and err["error"]["type"] == "not_found_error"
    status, err = server.post("/v1/completions", b'{"prompt": "' + b"a" * (9 << 20) + b'"}')
    assert status == 413 and "error" in err
    many = {f"X-H{i}": "v" for i in range(150)}
    status, err = server.request("GET", "/health", headers=many)
    assert status == 431 and "error" in err


def test_metrics_exposition(server, client, model):
    before = server.wait_idle()
    r = client.completions.create(model=model, prompt="Jesus wept", max_tokens=4, n=2, temperature=1)
    m = server.wait_idle()
    assert m["deepinfer_prompt_tokens_total"] - before["deepinfer_prompt_tokens_total"] == r.usage.prompt_tokens
    assert (m["deepinfer_generation_tokens_total"] - before["deepinfer_generation_tokens_total"]
            == r.usage.completion_tokens)
    assert m["deepinfer_time_to_first_token_seconds_count"] >= 1
    assert m["deepinfer_time_per_output_token_seconds_count"] >= 1
    assert m['deepinfer_time_to_first_token_seconds_bucket{le="+Inf"}'] == m["deepinfer_time_to_first_token_seconds_count"]
    assert m["deepinfer_generation_tokens_total"] >= 4
    assert m["deepinfer_cache_pages_total"] > 0 and m["deepinfer_cache_usage_perc"] == 0
    assert m['deepinfer_http_requests_total{status="200"}'] >= 1
    assert m["deepinfer_num_requests_running"] == 0 and m["deepinfer_num_requests_waiting"] == 0


def test_api_key_on_every_route():
    s = ServerProcess(api_key="sk-test-123")
    try:
        good = openai.OpenAI(base_url=s.base_url, api_key="sk-test-123", max_retries=0)
        bad = openai.OpenAI(base_url=s.base_url, api_key="sk-test-124", max_retries=0)
        assert good.completions.create(model="nano-v4", prompt="Amen", max_tokens=2).choices
        with pytest.raises(openai.AuthenticationError) as ei:
            bad.completions.create(model="nano-v4", prompt="Amen", max_tokens=2)
        assert ei.value.status_code == 401
        for method, path in [("GET", "/health"), ("GET", "/metrics"), ("GET", "/v1/models"), ("POST", "/tokenize"),
                             ("POST", "/v1/chat/completions"), ("GET", "/nowhere"), ("GET", "//v1/models/../models")]:
            for headers in ({}, {"Authorization": "Bearer sk-test-12"}, {"Authorization": "Bearer sk-test-1234"},
                            {"Authorization": "sk-test-123"}):
                status, err = s.request(method, path, body=b"{}" if method == "POST" else None, headers=headers)
                assert status == 401 and err["error"]["type"] == "authentication_error", (path, headers)
        assert s.request("GET", "/health", headers={"X-Api-Key": "sk-test-123"})[0] == 200
        assert s.request("GET", "/health", headers={"Authorization": "Bearer sk-test-123"})[0] == 200
    finally:
        assert s.stop() == 0


def test_sse_bytes(server):
    """The stream as raw bytes: event framing, chunk objects, [DONE] last, nothing after it."""
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    body = json.dumps({"model": "nano-v4", "messages": MSGS, "max_tokens": 6, "stream": True,
                       "stream_options": {"include_usage": True}})
    conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200
    assert r.getheader("Content-Type").startswith("text/event-stream")
    assert r.getheader("Transfer-Encoding") == "chunked"
    raw = r.read().decode("utf-8")
    conn.close()
    events = sse_events(raw)
    assert events[-1] == "[DONE]" and raw.endswith("data: [DONE]\n\n")
    chunks = [json.loads(e) for e in events[:-1]]
    for c in chunks:
        assert set(c) >= {"id", "object", "created", "model", "choices", "usage"}
        assert c["object"] == "chat.completion.chunk"
    for c in chunks[:-1]:
        assert c["usage"] is None and len(c["choices"]) == 1
        assert set(c["choices"][0]) >= {"index", "delta", "finish_reason", "logprobs"}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def test_disconnect_aborts_within_a_few_steps(server):
    """A client that leaves mid-stream: its request is aborted after a handful of engine steps
    (counted by the engine, not timed), instead of running its remaining ~3000 tokens."""
    import http.client
    import socket
    from deepinfer_server import is_idle
    server.wait_idle()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    body = {"prompt": "And it came to pass", "max_tokens": 3000, "ignore_eos": True, "stream": True}
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200
    got = 0
    while got < 3:
        if r.readline().startswith(b"data: "):
            got += 1
    before = server.metrics()
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    m = server.wait_idle()
    assert is_idle(m), m
    aborts = 'deepinfer_request_success_total{finished_reason="abort"}'
    assert m[aborts] - before[aborts] == 1
    steps = m["deepinfer_engine_steps_total"] - before["deepinfer_engine_steps_total"]
    print("engine steps from disconnect to idle:", steps)
    assert steps < 100


def test_structured_outputs(client, model):
    """response_format / guided_*: finished outputs are in the constraint's language (checked with
    Python's json, jsonschema and re, not with the engine's grammar code)."""
    import re
    import jsonschema
    schema = {"type": "object", "properties": {"tribe": {"enum": ["Judah", "Levi", "Dan"]},
                                               "count": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["tribe", "count"], "additionalProperties": False}
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Name a tribe as JSON."}], max_tokens=60, temperature=0.7,
        seed=3, n=2, response_format={"type": "json_schema", "json_schema": {"name": "tribe", "schema": schema}},
        # The tiny model would otherwise fill the allowed whitespace (vLLM's option, as an extra field).
        extra_body={"structured_outputs": {"disable_any_whitespace": True}})
    for c in r.choices:
        assert c.finish_reason == "stop", c
        jsonschema.validate(json.loads(c.message.content), schema)
    r = client.completions.create(model=model, prompt="An object: ", max_tokens=80, temperature=0, seed=1,
                                  extra_body={"response_format": {"type": "json_object"}})
    c = r.choices[0]
    if c.finish_reason == "stop":
        assert isinstance(json.loads(c.text), dict)
    else:
        assert c.text.lstrip().startswith("{")
    r = client.completions.create(model=model, prompt="A year: ", max_tokens=10, temperature=1.0, seed=5,
                                  extra_body={"guided_regex": "(19|20)[0-9]{2}"})
    assert r.choices[0].finish_reason == "stop" and re.fullmatch("(19|20)[0-9]{2}", r.choices[0].text)
    choices = ["Moses", "Aaron", "a.b(c)"]
    r = client.chat.completions.create(model=model, messages=MSGS, max_tokens=10, temperature=1.0, seed=9, n=3,
                                       extra_body={"guided_choice": choices})
    assert all(c.message.content in choices for c in r.choices)
    # Streaming gives the same constrained text as the non-streamed request (seeded).
    kw = dict(model=model, prompt="A year: ", max_tokens=10, temperature=1.0, seed=5,
              extra_body={"guided_regex": "(19|20)[0-9]{2}"})
    full = client.completions.create(**kw).choices[0].text
    assert "".join(ch.choices[0].text for ch in client.completions.create(stream=True, **kw)) == full
