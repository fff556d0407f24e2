#!/bin/sh
# Real-world schemas for bench_grammar: the SchemaStore-derived schemas vendored in the
# check-jsonschema wheel on PyPI (each keeps its own licence in the wheel). Usage: $0 OUTDIR
set -e
out=${1:-/tmp/realschemas}
tmp=$(mktemp -d)
python3 -m pip download --no-deps -q -d "$tmp" check-jsonschema==0.39.0
mkdir -p "$out"
unzip -o -q -j "$tmp"/check_jsonschema-*.whl 'check_jsonschema/builtin_schemas/vendor/*.json' -d "$out"
echo "schemas in $out"
