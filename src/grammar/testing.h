#pragma once
// Helpers shared by the grammar tests and the benchmark: Python-compatible JSON serialization,
// a greedy tokenization through the vocabulary trie, and seeded random generation under a mask.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "grammar/grammar.h"

namespace deepinfer::grammar::testkit {

// json.dumps(v, ensure_ascii=False, separators=(", ", ": ") if spaced else (",", ":")).
std::string dump_python(const nlohmann::ordered_json& v, bool spaced);

// Longest-match tokenization (not canonical BPE, but a valid token sequence for the bytes).
// Empty result if some byte has no token.
std::vector<int32_t> greedy_tokenize(const Vocabulary& v, std::string_view text);

struct Sample {
  std::string text;
  std::vector<int32_t> tokens;
  bool completed = false;  // EOS accepted before max_tokens
};
// Picks uniformly among allowed tokens (EOS with probability eos_bias when allowed).
Sample sample(std::shared_ptr<const Grammar> g, uint64_t seed, size_t max_tokens, double eos_bias = 0.5);

}  // namespace deepinfer::grammar::testkit
