#pragma once
// Structured outputs in the engine: SamplingParams::structured compiled against the tokenizer's
// byte-level vocabulary (src/grammar), and the per-choice matcher that masks each step's logits.
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/sampling_params.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {

// One per engine: the grammar vocabulary (built on first use: it costs a pass over the vocabulary)
// and an LRU cache of compiled grammars. Thread-safe (add_request runs on any thread).
class StructuredCompiler {
 public:
  // tok: the engine's tokenizer (may be null: structured requests then fail); logits_width: the
  // model's vocab_size (the sampler's row width); eos_ids: every id that ends generation.
  StructuredCompiler(const tokenizer::Tokenizer* tok, int64_t logits_width, std::vector<int32_t> eos_ids);
  // Compiles (or finds in the cache) the request's grammar. Throws Error "structured output
  // (<kind>): <why>" for a bad or unsupported spec, or a grammar that accepts nothing.
  std::shared_ptr<const grammar::Grammar> compile(const StructuredOutput& s);
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }

 private:
  const tokenizer::Tokenizer* tok_;
  int64_t width_;
  std::vector<int32_t> eos_ids_;
  std::mutex mu_;
  std::shared_ptr<const grammar::Vocabulary> vocab_;
  std::unique_ptr<grammar::GrammarCache> cache_, compact_cache_;  // compact: disable_any_whitespace
};

// One per output sequence (choice). Lives with the choice, so preemption by recompute (which
// replays the same tokens through the model, never through the sampler) keeps it as it is.
class StructuredState {
 public:
  StructuredState(std::shared_ptr<const grammar::Grammar> g, const std::vector<int32_t>* eos_ids);
  // The allowed-token bitmask for the next token: ceil(width / 32) words. Every EOS id is allowed
  // exactly when the grammar is complete.
  const uint32_t* fill_mask();
  // Advances on a sampled token (any EOS id counts as the end); false if the grammar rejects it.
  bool accept(int32_t token);
  bool terminated() const { return matcher_.is_terminated(); }  // EOS accepted: the output is complete

 private:
  grammar::Matcher matcher_;
  const std::vector<int32_t>* eos_ids_;
  std::vector<uint32_t> mask_;  // [mask_words]
};

}  // namespace deepinfer
