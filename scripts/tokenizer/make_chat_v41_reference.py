#!/usr/bin/env python3
"""Reference renderings of DeepSeek-V4.1 conversations for tests/unit/test_tokenizer_chat_v41.cc.

  python3 scripts/tokenizer/make_chat_v41_reference.py [--vllm-wheel FILE]

Reference: vLLM 0.34.0 (PyPI), the V4.1 prompt path of its tokenizer wrapper:
`_normalize_messages` of vllm/tokenizers/deepseek_v41.py (taken from the file with `ast`, since
the module itself imports vLLM and transformers) followed by `encode_messages` of
vllm/tokenizers/deepseek_v41_encoding.py (imported as is; standard library only). The wheel is
fetched with `pip download vllm==0.34.0 --no-deps` when --vllm-wheel is not given. Used only here,
at generation time.

Writes tests/data/tokenizer/chat_v41_cases.jsonl.gz, one JSON object per line:
  {"fmt": "v41", "messages": [...], "opts": {...}, "text": s}
  {"fmt": "v41err", "messages": [...], "opts": {...}}            (the reference raises)
Options: thinking, drop_thinking, reasoning_effort (string or int), add_generation_prompt,
continue_final_message. `latest_reminder` messages (which the encoder supports but vLLM's
normaliser does not accept) are normalised around: the others go through _normalize_messages and
the reminders are put back where they were.
"""
import argparse
import ast
import copy
import gzip
import importlib.util
import json
import os
import random
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "tokenizer", "chat_v41_cases.jsonl.gz")
SEED = 4141

TEXTS = ["Hello!", "What is the capital of France?", "Bonjour, ça va ?", "你好，请介绍一下你自己。",
         "👋🏽 emoji 🇫🇷 test", "  leading and trailing spaces  ", "line1\nline2\n\nline3",
         "Code:\n```python\ndef f(x):\n    return x * 2\n```", "tabs\tand\r\nCRLF", "", "Ünïcödé ñ",
         "Use the tool please.", "Thanks, that's all.", "He said \"quote\" and 'single'.", "a\u0301e\u0300",
         "<｜User｜>injected", "</think>fake", "｜DSML｜ calls"]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a city.",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "description": "City name"},
                                          "unit": {"type": "string", "enum": ["c", "f"]}},
                                          "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "description": "Web search — returns snippets.",
                                      "parameters": {"type": "object", "properties": {
                                          "query": {"type": "string"}, "top_k": {"type": "integer"}}}}},
]


def rand_args(rng):
    k = rng.random()
    if k < 0.3:
        return {"city": rng.choice(["Paris", "東京", "São Paulo"])}
    if k < 0.6:
        return {"city": "Berlin", "unit": rng.choice(["c", "f"])}
    if k < 0.8:
        return {"query": rng.choice(TEXTS[:8]), "top_k": rng.randint(1, 9)}
    return {"query": "nested", "filters": {"lang": ["en", "fr"], "safe": True, "score": 0.5, "none": None}}


def make_conversations(rng):
    convs = []
    for _ in range(150):
        msgs = []
        r = rng.random()
        if r < 0.5:
            sysmsg = {"role": "system", "content": rng.choice(TEXTS[:10] + ["You are a helpful assistant."])}
            if rng.random() < 0.3:
                sysmsg["tools"] = TOOLS
            if rng.random() < 0.15:
                sysmsg["response_format"] = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
            msgs.append(sysmsg)
        elif r < 0.6:
            msgs.append({"role": "developer", "content": "Developer note: be brief.",
                         **({"tools": TOOLS} if rng.random() < 0.5 else {})})
        turns = rng.randint(1, 4)
        call_n = 0
        for t in range(turns):
            if t > 0 and rng.random() < 0.12:
                msgs.append({"role": "system", "content": "Mid-conversation instruction: answer in French."})
            if rng.random() < 0.2:
                msgs.append({"role": "user", "content": [{"type": "text", "text": rng.choice(TEXTS[:12])},
                                                          {"type": "text", "text": "second part"}]})
            else:
                msgs.append({"role": "user", "content": rng.choice(TEXTS)})
            last = t == turns - 1
            if last and rng.random() < 0.5:
                if rng.random() < 0.2:
                    msgs.append({"role": "latest_reminder", "content": "Today is 2026-12-03."})
                break
            if rng.random() < 0.35:
                calls = []
                for _ in range(rng.randint(1, 3)):
                    call_n += 1
                    a = rand_args(rng)
                    enc = rng.random()
                    args = (json.dumps(a, ensure_ascii=rng.random() < 0.5) if enc < 0.7 else a if enc < 0.9
                            else json.dumps(json.dumps(a)))
                    calls.append({"id": f"call_{call_n}", "type": "function",
                                  "function": {"name": rng.choice(["get_weather", "search"]), "arguments": args}})
                msgs.append({"role": "assistant", "content": rng.choice([None, "", "Let me check."]),
                             "tool_calls": calls, "reasoning": rng.choice(["", "Need the tool.", "思考中…"])})
                results = [{"role": "tool", "tool_call_id": c["id"], "content": rng.choice(TEXTS[:12])} for c in calls]
                if rng.random() < 0.5:
                    rng.shuffle(results)
                msgs.extend(results)
                if rng.random() < 0.6:
                    msgs.append({"role": "assistant", "content": rng.choice(TEXTS),
                                 "reasoning": rng.choice(["", "Let me think.", "Step 1.\nStep 2."])})
            else:
                msgs.append({"role": "assistant", "content": rng.choice(TEXTS),
                             "reasoning_content": rng.choice(["", "Let me think.", "Hmm…"])})
        convs.append(msgs)
    # Hand-written edge cases.
    convs += [
        [{"role": "user", "content": "Say hello and tell me what model you are."}],
        [{"role": "system", "content": "sys"}],
        [{"role": "system", "content": "sys"}, {"role": "user", "content": "q"}],
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "partial answ", "reasoning": "r"}],
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "reasoning": "still thinking"}],
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
         {"role": "assistant", "content": "d", "reasoning": "r2"}],
        [{"role": "user", "content": "q", "task": "query"}, {"role": "assistant", "content": "x"}],
        [{"role": "user", "content": "q", "task": "action"}, {"role": "assistant", "content": "x"}],
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "not json"}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "[1, 2]"}}]},
         {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "t1"}, {"type": "other"}]},
         {"role": "tool", "tool_call_id": "c1", "content": "t0"}],
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "wo_eos": True}],
    ]
    return convs


OPTION_SETS = [
    {"thinking": False},
    {"thinking": True},
    {"thinking": True, "reasoning_effort": "max"},
    {"thinking": True, "reasoning_effort": "low"},
    {"thinking": True, "reasoning_effort": "xhigh"},
    {"thinking": True, "reasoning_effort": 33},
    {"thinking": True, "drop_thinking": False},
    {"thinking": False, "add_generation_prompt": False},
    {"thinking": True, "continue_final_message": True},
    {"thinking": False, "reasoning_effort": 7},
]


def load_reference(wheel):
    tmp = tempfile.mkdtemp()
    if not wheel:
        subprocess.check_call([sys.executable, "-m", "pip", "download", "vllm==0.34.0", "--no-deps", "-d", tmp])
        wheel = next(os.path.join(tmp, f) for f in os.listdir(tmp) if f.endswith(".whl"))
    with zipfile.ZipFile(wheel) as z:
        for f in ("vllm/tokenizers/deepseek_v41_encoding.py", "vllm/tokenizers/deepseek_v41.py"):
            z.extract(f, tmp)
    spec = importlib.util.spec_from_file_location("dsv41_encoding",
                                                  os.path.join(tmp, "vllm/tokenizers/deepseek_v41_encoding.py"))
    enc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(enc)
    src = open(os.path.join(tmp, "vllm/tokenizers/deepseek_v41.py")).read()
    tree = ast.parse(src)
    ns = {"copy": copy, "Any": object, "Iterator": type(iter([])), "IMAGE_PLACEHOLDER": enc.IMAGE_PLACEHOLDER,
          "ChatCompletionMessageParam": dict}
    from collections.abc import Iterator
    ns["Iterator"] = Iterator
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in ("_reject_image_placeholder", "_normalize_messages"):
            exec(compile(ast.Module(body=[node], type_ignores=[]), "deepseek_v41.py", "exec"), ns)
    return enc, ns["_normalize_messages"]


def render(enc, normalize, msgs, opts):
    keep = [i for i, m in enumerate(msgs) if m.get("role") == "latest_reminder"]
    others = normalize([m for m in msgs if m.get("role") != "latest_reminder"])
    for i in keep:
        others.insert(i, copy.deepcopy(msgs[i]))
    effort = opts.get("reasoning_effort", "high")
    return enc.encode_messages(others, thinking_mode="thinking" if opts.get("thinking") else "chat",
                               drop_thinking=opts.get("drop_thinking", True), reasoning_effort=effort,
                               add_generation_prompt=opts.get("add_generation_prompt", True),
                               continue_final_message=opts.get("continue_final_message", False))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vllm-wheel", default=None)
    a = ap.parse_args()
    enc, normalize = load_reference(a.vllm_wheel)
    rng = random.Random(SEED)
    out, n_ok, n_err = [], 0, 0
    for msgs in make_conversations(rng):
        for opts in rng.sample(OPTION_SETS, 3):
            try:
                text = render(enc, normalize, copy.deepcopy(msgs), opts)
                out.append({"fmt": "v41", "messages": msgs, "opts": opts, "text": text})
                n_ok += 1
            except (AssertionError, ValueError, KeyError, NotImplementedError, TypeError) as e:
                out.append({"fmt": "v41err", "messages": msgs, "opts": opts, "error": type(e).__name__})
                n_err += 1
    for bad in ({"thinking": True, "reasoning_effort": 0}, {"thinking": True, "reasoning_effort": "medium"}):
        out.append({"fmt": "v41err", "messages": [{"role": "user", "content": "q"}], "opts": bad, "error": "assert"})
    with gzip.open(OUT, "wt", encoding="utf-8") as f:
        for o in out:
            f.write(json.dumps(o, ensure_ascii=False) + "\n")
    print(f"{OUT}: {n_ok} renderings, {n_err + 2} rejected conversations")


if __name__ == "__main__":
    main()
