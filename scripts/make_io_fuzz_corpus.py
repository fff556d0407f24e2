#!/usr/bin/env python3
# Writes the seed corpus for fuzz/fuzz_io_safetensors.cc: small valid safetensors files.
# Usage: python3 scripts/make_io_fuzz_corpus.py fuzz/corpus/io_safetensors
import json, struct, sys, os
out = sys.argv[1]
def img(header, data):
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data
cases = {
  "f32_pair": img({"__metadata__": {"format": "pt"}, "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                   "b": {"dtype": "BF16", "shape": [1, 2], "data_offsets": [8, 12]}}, b"\0\0\x80\x3f\0\0\0\x40\x80\x3f\0\x40"),
  "fp8_scale": img({"w.weight": {"dtype": "F8_E4M3", "shape": [2, 3], "data_offsets": [0, 6]},
                    "w.scale": {"dtype": "F8_E8M0", "shape": [1, 1], "data_offsets": [6, 7]}}, b"\x38\x40\xb8\x38\x38\x38\x80"),
  "fp4_i8": img({"e.weight": {"dtype": "I8", "shape": [1, 2], "data_offsets": [0, 2]},
                 "e.scale": {"dtype": "F8_E8M0", "shape": [1, 1], "data_offsets": [2, 3]},
                 "ids": {"dtype": "I64", "shape": [1], "data_offsets": [3, 11]}}, b"\x21\xf7\x7f" + b"\x05" + b"\0" * 7),
  "empty_and_scalar": img({"z": {"dtype": "U16", "shape": [0, 3], "data_offsets": [0, 0]},
                           "s": {"dtype": "F64", "shape": [], "data_offsets": [0, 8]}}, b"\0" * 8),
  "all_dtypes": None,
  "no_tensors": img({}, b""),
}
sizes = {"BOOL":1,"U8":1,"I8":1,"I16":2,"U16":2,"I32":4,"U32":4,"I64":8,"U64":8,"F16":2,"BF16":2,"F32":4,"F64":8,"F8_E4M3":1,"F8_E5M2":1,"F8_E8M0":1}
hdr, off = {}, 0
for k, s in sizes.items():
    hdr["t_" + k] = {"dtype": k, "shape": [2], "data_offsets": [off, off + 2 * s]}; off += 2 * s
cases["all_dtypes"] = img(hdr, b"\x01" * off)
os.makedirs(out, exist_ok=True)
for n, b in cases.items():
    open(os.path.join(out, n + ".safetensors"), "wb").write(b)
