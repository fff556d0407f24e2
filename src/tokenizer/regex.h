#pragma once
// Internal: PCRE2 (UTF + UCP, JIT-compiled) wrapper for the pre-tokenizer patterns.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;
struct pcre2_real_jit_stack_8;
struct pcre2_real_match_context_8;

namespace deepinfer::tokenizer {

// Translates an HF (Oniguruma) pattern into the PCRE2 pattern used (see regex.cc).
std::string translate_pattern(const std::string& pattern);

class Regex {
 public:
  // literal = true: the pattern is a plain string (HF's {"String": ...} patterns).
  // Throws deepinfer::Error on a pattern PCRE2 rejects.
  explicit Regex(const std::string& pattern, bool literal = false);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Per-thread scratch for matching (match data and a JIT stack allocated on demand).
  class Scratch {
   public:
    Scratch();
    ~Scratch();
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;

   private:
    friend class Regex;
    pcre2_real_match_data_8* md_ = nullptr;
    pcre2_real_jit_stack_8* stack_ = nullptr;
    pcre2_real_match_context_8* mctx_ = nullptr;
  };

  // Finds the first match in subject (valid UTF-8) at or after byte `start`. The subject is
  // the whole piece: look-around never sees past its ends. Returns false when there is none.
  bool find(std::string_view subject, size_t start, size_t& mbegin, size_t& mend,
            Scratch& scratch) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  pcre2_real_code_8* code_ = nullptr;
  bool jit_ = false;
};

}  // namespace deepinfer::tokenizer
