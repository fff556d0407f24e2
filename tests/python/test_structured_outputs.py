"""Structured outputs from Python on the embedded nano model: every output that finished with
"stop" validates against its JSON Schema with Python `jsonschema` (draft 2020-12) or fully matches
its regex with Python `re`; vLLM's spellings (structured_outputs=StructuredOutputsParams(...) and
the older guided_decoding=GuidedDecodingParams(...)); bad specs are ValueErrors; the CLI flags.
"""
import json
import os
import re
import subprocess

import jsonschema
import pytest

import deepinfer
from deepinfer import GuidedDecodingParams, SamplingParams, StructuredOutputsParams


@pytest.fixture(scope="module")
def llm():
    return deepinfer.LLM(threads=2)


SCHEMAS = [
    {"type": "object",
     "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 12},
                    "age": {"type": "integer", "minimum": 0, "maximum": 150},
                    "tribe": {"enum": ["Judah", "Levi", "Dan"]}},
     "required": ["name", "age", "tribe"], "additionalProperties": False},
    {"type": "array", "minItems": 1, "maxItems": 3,
     "items": {"type": "object", "additionalProperties": False, "required": ["book", "chapter"],
               "properties": {"book": {"type": "string", "pattern": "^[A-Z][a-z]{1,8}$"},
                              "chapter": {"type": "integer", "minimum": 1}}}},
    {"$defs": {"verse": {"type": "object", "required": ["text"], "additionalProperties": False,
                         "properties": {"text": {"type": "string", "maxLength": 40},
                                        "number": {"type": "number", "exclusiveMinimum": 0}}}},
     "type": "object", "required": ["verses"], "additionalProperties": False,
     "properties": {"verses": {"type": "array", "items": {"$ref": "#/$defs/verse"}, "maxItems": 2},
                    "kind": {"anyOf": [{"const": "psalm"}, {"type": "null"}, {"type": "boolean"}]}}},
    {"type": "object", "properties": {"date": {"type": "string", "format": "date"},
                                      "tags": {"type": "array", "prefixItems": [{"type": "boolean"}],
                                               "items": {"type": "string", "maxLength": 5},
                                               "maxItems": 3}},
     "required": ["date", "tags"], "additionalProperties": False},
]


def finished(outs):
    return [c for o in outs for c in o.outputs if c.finish_reason == "stop"]


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_json_schema_outputs_validate(llm, index):
    schema = SCHEMAS[index]
    # The nano model loves newlines: schema 0 keeps JSON whitespace (bounded runs), the others use
    # vLLM's disable_any_whitespace so that most outputs complete within max_tokens.
    so = StructuredOutputsParams(json=schema, disable_any_whitespace=index > 0)
    sp = SamplingParams(n=3, temperature=1.0, seed=11 + index, max_tokens=300, structured_outputs=so)
    outs = llm.generate(["In the beginning", "And God said"], sp)
    done = finished(outs)
    assert len(done) >= 3, [c.text for o in outs for c in o.outputs]
    for c in done:
        jsonschema.validate(json.loads(c.text), schema, cls=jsonschema.Draft202012Validator,
                            format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


REGEXES = [r"(Amen|Selah)\. [0-9]{1,3}", r"[A-Z][a-z]+( [a-z]+){1,4}[.!?]", r"\d{4}-\d{2}-\d{2}",
           r"(yea|nay)+", r"[^\n]{3,10}"]


@pytest.mark.parametrize("pattern", REGEXES)
def test_regex_outputs_fully_match(llm, pattern):
    sp = SamplingParams(n=2, temperature=1.0, seed=5, max_tokens=60,
                        structured_outputs=StructuredOutputsParams(regex=pattern))
    done = finished(llm.generate(["The LORD is my shepherd"], sp))
    assert done
    for c in done:
        assert re.fullmatch(pattern, c.text), (pattern, c.text)


def test_choice_json_object_grammar_and_the_old_spelling(llm):
    choices = ["Genesis", "Exodus (2)", "a.b*c"]
    out = llm.generate("Book:", SamplingParams(temperature=1.0, seed=3, n=4, max_tokens=20,
                                               structured_outputs=StructuredOutputsParams(choice=choices)))
    for c in out[0].outputs:
        assert c.finish_reason == "stop" and c.text in choices, c.text
    out = llm.generate("Thus saith", SamplingParams(temperature=0.7, seed=4, max_tokens=120,
                                                    guided_decoding=GuidedDecodingParams(json_object=True)))
    c = out[0].outputs[0]
    if c.finish_reason == "stop":
        assert isinstance(json.loads(c.text), dict)
    gbnf = 'root ::= "light" (" and " word)* "."\nword ::= [a-z]+\n'
    out = llm.generate("Let there be", SamplingParams(temperature=1.0, seed=6, n=2, max_tokens=60,
                                                      structured_outputs=StructuredOutputsParams(grammar=gbnf)))
    for c in finished(out):
        assert re.fullmatch(r"light( and [a-z]+)*\.", c.text), c.text


def test_seeded_structured_output_is_reproducible(llm):
    sp = SamplingParams(temperature=1.0, seed=42, max_tokens=100,
                        structured_outputs=StructuredOutputsParams(json=SCHEMAS[0]))
    a = llm.generate("Who", sp)[0].outputs[0]
    b = llm.generate(["Who", "other prompt"], [sp, SamplingParams(seed=1)])[0].outputs[0]
    assert a.token_ids == b.token_ids and a.text == b.text


def test_bad_specs_are_value_errors(llm):
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(json={}, regex="a")
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="not supported"):
        StructuredOutputsParams(json_object=True, whitespace_pattern=" ")
    for bad in [StructuredOutputsParams(json="{oops"), StructuredOutputsParams(regex="(a"),
                StructuredOutputsParams(json={"type": "string", "format": "nonsense"}),
                StructuredOutputsParams(grammar="root ::= undefined_rule\n")]:
        with pytest.raises(ValueError, match="structured output"):
            llm.generate("x", SamplingParams(max_tokens=5, structured_outputs=bad))
    # The engine is still fine afterwards.
    out = llm.generate("x", SamplingParams(max_tokens=5, seed=1,
                                           structured_outputs=StructuredOutputsParams(regex="ok")))
    assert out[0].outputs[0].text == "ok" and out[0].outputs[0].finish_reason == "stop"


def test_cli_flags(tmp_path):
    exe = os.environ.get("DEEPINFER_BIN")
    if exe is None:
        pytest.skip("no deepinfer command beside this package")
    schema = SCHEMAS[0]
    f = tmp_path / "schema.json"
    f.write_text(json.dumps(schema))
    res = subprocess.run([exe, "generate", "--quiet", "--prompt", "In the beginning", "--json-schema", str(f),
                          "--temperature", "1", "--seed", "2", "--max-tokens", "200"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    jsonschema.validate(json.loads(res.stdout), schema)
    res = subprocess.run([exe, "generate", "--quiet", "--prompt", "x", "--regex", "[0-9]{2}-[a-c]"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and re.fullmatch(r"[0-9]{2}-[a-c]", res.stdout.rstrip("\n")), res.stdout
    g = tmp_path / "g.gbnf"
    g.write_text('root ::= "yea" | "nay"\n')
    res = subprocess.run([exe, "generate", "--quiet", "--prompt", "x", "--grammar", str(g)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.rstrip("\n") in ("yea", "nay")
    res = subprocess.run([exe, "generate", "--quiet", "--prompt", "x", "--regex", "("],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 1 and "structured output (regex)" in res.stderr
