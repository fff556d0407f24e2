// UTF-8 validation and lossy decoding with the "maximal subpart" rule (Unicode 15 §3.9, the
// rule of Rust's String::from_utf8_lossy, WHATWG and CPython's "replace" handler).
#include <cstring>

#include "tokenizer/tokenizer.h"

namespace deepinfer::tokenizer::utf8 {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";

// For a lead byte: sequence length (0 = never valid as a lead) and the allowed range of the
// second byte.
struct Lead {
  uint8_t len, lo, hi;
};
inline Lead lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

enum class Step { kValid, kInvalid, kTruncated };
// Examines the sequence starting at s[i]; sets n to the bytes it covers (for kInvalid: the
// maximal subpart to replace by one U+FFFD, at least 1).
inline Step examine(const uint8_t* s, size_t len, size_t i, size_t& n) {
  Lead L = lead_info(s[i]);
  if (L.len == 1) {
    n = 1;
    return Step::kValid;
  }
  if (L.len == 0) {
    n = 1;
    return Step::kInvalid;
  }
  size_t k = 1;
  for (; k < L.len; ++k) {
    if (i + k >= len) {
      n = k;
      return Step::kTruncated;
    }
    uint8_t c = s[i + k];
    bool ok = (k == 1) ? (c >= L.lo && c <= L.hi) : (c >= 0x80 && c <= 0xBF);
    if (!ok) {
      n = k;
      return Step::kInvalid;
    }
  }
  n = L.len;
  return Step::kValid;
}

}  // namespace

bool is_valid(std::string_view sv) {
  const auto* s = reinterpret_cast<const uint8_t*>(sv.data());
  size_t len = sv.size(), i = 0;
  while (i < len) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= len) {
      uint64_t w;
      std::memcpy(&w, s + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= len) break;
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    size_t n;
    if (examine(s, len, i, n) != Step::kValid) return false;
    i += n;
  }
  return true;
}

size_t append_lossy_prefix(std::string_view sv, bool final, std::string& out) {
  const auto* s = reinterpret_cast<const uint8_t*>(sv.data());
  size_t len = sv.size(), i = 0, run = 0;  // [run, i): valid bytes not yet appended
  while (i < len) {
    size_t n;
    Step st = examine(s, len, i, n);
    if (st == Step::kValid) {
      i += n;
      continue;
    }
    out.append(sv.data() + run, i - run);
    if (st == Step::kTruncated && !final) return i;
    out.append(kReplacement);
    i += n;
    run = i;
  }
  out.append(sv.data() + run, i - run);
  return len;
}

std::string to_valid(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  append_lossy_prefix(s, true, out);
  return out;
}

}  // namespace deepinfer::tokenizer::utf8
