#!/usr/bin/env python3
"""Generate seeded samples with the C++ matcher, validate them with Python jsonschema (the judge),
and write tests/data/grammar/generated_samples.json. Exits 1 if any completed sample is invalid.

usage: validate_samples.py BUILD_DIR   (needs: pip install jsonschema)
"""
import json, os, subprocess, sys, tempfile

import jsonschema

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "build-grammar")
schemas = json.load(open(os.path.join(root, "tests/data/grammar/sample_schemas.json")))
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "samples.json")
    env = dict(os.environ, DEEPINFER_GRAMMAR_WRITE_SAMPLES=path)
    subprocess.run([os.path.join(build, "tests/test_grammar_generated")], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    samples = json.load(open(path))
bad = done = 0
for s in samples:
    if not s["completed"]:
        continue
    done += 1
    text = bytes.fromhex(s["hex"]).decode("utf-8")
    schema = schemas[s["schema"]]
    cls = jsonschema.Draft202012Validator
    try:
        cls(schema, format_checker=cls.FORMAT_CHECKER).validate(json.loads(text))
        s["valid"] = True
    except (jsonschema.ValidationError, json.JSONDecodeError) as e:
        s["valid"] = False
        s["error"] = str(e).splitlines()[0]
        bad += 1
        print("INVALID", s["schema"], s["seed"], text, s["error"])
json.dump(samples, open(os.path.join(root, "tests/data/grammar/generated_samples.json"), "w"), indent=1)
print(f"{done} completed samples of {len(samples)}, {bad} invalid")
sys.exit(1 if bad else 0)
