#!/usr/bin/env bash
# Builds every libFuzzer target (fuzz/fuzz_*.cc) with clang + ASan/UBSan and runs each for N
# seconds (default 60) on its seed corpus fuzz/corpus/<module>_<what>/ and dictionary
# fuzz/<module>_<what>.dict (if present).
#   scripts/run_fuzzers.sh [SECONDS] [BUILD_DIR]
# Exits non-zero if any target crashes, leaks or trips a sanitizer. New inputs found go to a
# scratch corpus under the build dir; crash reproducers are left in BUILD_DIR/fuzz-artifacts/.
set -euo pipefail
secs=${1:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
build=${2:-$root/build-fuzz}
jobs=${JOBS:-2}

CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DDEEPINFER_FUZZ=ON -DDEEPINFER_SANITIZE=ON -DDEEPINFER_TESTS=OFF -DDEEPINFER_CUDA=OFF >/dev/null
targets=()
for src in "$root"/fuzz/fuzz_*.cc; do
  [ -e "$src" ] || continue
  targets+=("$(basename "$src" .cc)")
done
if [ ${#targets[@]} -eq 0 ]; then echo "no fuzz targets"; exit 0; fi
cmake --build "$build" -j"$jobs" --target "${targets[@]}"

status=0
mkdir -p "$build/fuzz-artifacts"
for t in "${targets[@]}"; do
  exe=$(find "$build" -type f -name "$t" -perm -u+x | head -1)
  seeds="$root/fuzz/corpus/${t#fuzz_}"
  work="$build/fuzz-corpus/${t#fuzz_}"
  mkdir -p "$work"
  dirs=("$work")
  [ -d "$seeds" ] && dirs+=("$seeds")
  # Optional libFuzzer dictionary fuzz/<module>_<what>.dict (keywords of a text format).
  dict=()
  [ -f "$root/fuzz/${t#fuzz_}.dict" ] && dict=(-dict="$root/fuzz/${t#fuzz_}.dict")
  echo "== $t for ${secs}s"
  # Only the scratch dir (first) receives new inputs; the checked-in seeds stay untouched.
  if ! ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      "$exe" -max_total_time="$secs" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix="$build/fuzz-artifacts/$t-" "${dict[@]}" "${dirs[@]}"; then
    echo "!! $t failed" >&2
    status=1
  fi
done
exit $status
