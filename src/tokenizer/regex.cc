#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "util/error.h"

namespace deepinfer::tokenizer {

Regex::Regex(const std::string& pattern, bool literal) : pattern_(pattern) {
  int err = 0;
  PCRE2_SIZE off = 0;
  uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK;
  if (literal) opts |= PCRE2_LITERAL;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), opts, &err,
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
