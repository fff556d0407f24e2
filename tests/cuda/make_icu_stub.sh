#!/usr/bin/env bash
# Writes OUTDIR/libicuuc.so.<N>: a stand-in for ICU's common library exporting every ICU symbol that
# BINARY imports (functions abort, data is zeroed). ICU is used only by the tokenizer's Unicode
# normalizers, which the embedded nano model does not have; GPU machines with another ICU version
# (Ubuntu 24.04: 74, the dev machine: 72) can then run binaries that link the tokenizer.
# Usage: tests/cuda/make_icu_stub.sh BINARY OUTDIR
set -eu
BIN=$1
OUTDIR=$2
ver=$(readelf -d "$BIN" | grep -o 'libicuuc\.so\.[0-9]*' | head -1 | sed 's/.*\.//')
[ -n "$ver" ] || { echo "no ICU symbols in $BIN"; exit 0; }
src=$(mktemp --suffix=.c)
{
  echo '#include <stdio.h>'
  echo '#include <stdlib.h>'
  echo 'static void icu_stub_abort(const char* s) { fprintf(stderr, "ICU stub: %s called\n", s); abort(); }'
  i=0
  for s in $(nm -u "$BIN" | awk '{print $2}' | grep -E "icu_${ver}|_${ver}\$" | sed 's/@.*//' | sort -u); do
    case "$s" in
      _ZTV* | _ZTI* | _ZTS*) echo "__attribute__((aligned(16))) char d$i[512] __asm__(\"$s\");" ;;
      *) echo "void f$i(void) __asm__(\"$s\"); void f$i(void) { icu_stub_abort(\"$s\"); }" ;;
    esac
    i=$((i + 1))
  done
} > "$src"
mkdir -p "$OUTDIR"
cc -shared -fPIC -O1 -Wl,-soname,libicuuc.so.$ver -o "$OUTDIR/libicuuc.so.$ver" "$src"
rm -f "$src"
echo "wrote $OUTDIR/libicuuc.so.$ver"
