#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include <cstdio>

#include "util/error.h"

namespace deepinfer::tokenizer {

namespace {
#include "tokenizer/unicode_delta.inc"

// Oniguruma's \s (as in HF tokenizers): the Unicode White_Space property. PCRE2's \s with UCP
// also matches U+180E (through \h), which Unicode removed from White_Space in 6.3.
constexpr const char* kWhiteSpace =
    "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

std::string delta_ranges(const std::string& cat) {
  for (const DeltaCategory& c : kDeltaCategories) {
    if (cat != c.name) continue;
    std::string out;
    char buf[48];
    for (size_t i = 0; i < c.count; ++i) {
      if (c.ranges[i].lo == c.ranges[i].hi)
        std::snprintf(buf, sizeof buf, "\\x{%X}", c.ranges[i].lo);
      else
        std::snprintf(buf, sizeof buf, "\\x{%X}-\\x{%X}", c.ranges[i].lo, c.ranges[i].hi);
      out += buf;
    }
    return out;
  }
  return "";
}

}  // namespace

// Rewrites an HF (Oniguruma-syntax) pattern so that PCRE2 10.42 (Unicode 14 tables) matches what
// Oniguruma with Unicode 16 tables matches: \s/\S become the White_Space set, and every
// \p{X} gains the code points assigned to X after Unicode 14. \P{X} and \S inside a bracket
// class are kept as they are (PCRE2's meaning).
std::string translate_pattern(const std::string& p) {
  std::string out;
  out.reserve(p.size() * 2);
  bool in_class = false;
  size_t class_start = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[i + 1];
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
        ++i;
        continue;
      }
      if (e == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpace) + "]";
        ++i;
        continue;
      }
      if (e == 'p' || e == 'P') {
        size_t j = i + 2;
        std::string name;
        size_t end;
        if (j < p.size() && p[j] == '{') {
          end = p.find('}', j);
          if (end == std::string::npos) {
            out += c;
            continue;
          }
          name = p.substr(j + 1, end - j - 1);
        } else if (j < p.size()) {
          name = p.substr(j, 1);
          end = j;
        } else {
          out += c;
          continue;
        }
        std::string orig = p.substr(i, end + 1 - i);
        std::string delta = (name.empty() || name[0] == '^') ? "" : delta_ranges(name);
        if (delta.empty() || (e == 'P' && in_class)) {
          out += orig;
        } else if (in_class) {
          out += orig + delta;
        } else if (e == 'p') {
          out += "[" + orig + delta + "]";
        } else {
          out += "[^\\p{" + name + "}" + delta + "]";
        }
        i = end;
        continue;
      }
      out += c;
      out += e;
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      class_start = i + 1;
      if (class_start < p.size() && p[class_start] == '^') {
        out += '^';
        ++i;
        ++class_start;
      }
      if (class_start < p.size() && p[class_start] == ']') {  // literal ']' first in class
        out += ']';
        ++i;
      }
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX [:name:]
      size_t e = p.find(":]", i + 2);
      if (e != std::string::npos) {
        out += p.substr(i, e + 2 - i);
        i = e + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

Regex::Regex(const std::string& pattern, bool literal) : pattern_(pattern) {
  const std::string compiled = literal ? pattern : translate_pattern(pattern);
  int err = 0;
  PCRE2_SIZE off = 0;
  uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK;
  if (literal) opts |= PCRE2_LITERAL;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled.data()), compiled.size(), opts, &err,
                        &off, nullptr);
  if (!code_) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof buf);
    throw Error("tokenizer: regex pattern rejected at offset " + std::to_string(off) + ": " +
                reinterpret_cast<const char*>(buf) + " (pattern: " + pattern + ")");
  }
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() {
  if (code_) pcre2_code_free(code_);
}

Regex::Scratch::Scratch() { md_ = pcre2_match_data_create(1, nullptr); }
Regex::Scratch::~Scratch() {
  if (md_) pcre2_match_data_free(md_);
  if (mctx_) pcre2_match_context_free(mctx_);
  if (stack_) pcre2_jit_stack_free(stack_);
}

bool Regex::find(std::string_view subject, size_t start, size_t& mbegin, size_t& mend,
                 Scratch& sc) const {
  auto subj = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc;
  if (jit_) {
    rc = pcre2_jit_match(code_, subj, subject.size(), start, 0, sc.md_, sc.mctx_);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !sc.stack_) {
      // Default 32 KiB machine-stack area was not enough: retry with a large JIT stack.
      sc.stack_ = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
      sc.mctx_ = pcre2_match_context_create(nullptr);
      pcre2_jit_stack_assign(sc.mctx_, nullptr, sc.stack_);
      rc = pcre2_jit_match(code_, subj, subject.size(), start, 0, sc.md_, sc.mctx_);
    }
  } else {
    rc = pcre2_match(code_, subj, subject.size(), start, PCRE2_NO_UTF_CHECK, sc.md_, nullptr);
  }
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(rc, buf, sizeof buf);
    throw Error(std::string("tokenizer: regex match failed: ") +
                reinterpret_cast<const char*>(buf));
  }
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(sc.md_);
  mbegin = ov[0];
  mend = ov[1];
  return true;
}

}  // namespace deepinfer::tokenizer
