#include "engine/structured_output.h"

#include <algorithm>

#include "util/error.h"

namespace deepinfer {

namespace {

grammar::SpecKind spec_kind(StructuredKind k) {
  switch (k) {
    case StructuredKind::kRegex: return grammar::SpecKind::Regex;
    case StructuredKind::kJsonSchema: return grammar::SpecKind::JsonSchema;
    case StructuredKind::kGrammar: return grammar::SpecKind::Gbnf;
    case StructuredKind::kJsonObject: return grammar::SpecKind::JsonObject;
    case StructuredKind::kNone: break;
  }
  throw Error("structured output: no kind given");
}

}  // namespace

StructuredCompiler::StructuredCompiler(const tokenizer::Tokenizer* tok, int64_t logits_width,
                                       std::vector<int32_t> eos_ids)
    : tok_(tok), width_(logits_width), eos_ids_(std::move(eos_ids)) {
  std::erase_if(eos_ids_, [&](int32_t id) { return id < 0 || id >= logits_width; });
}

std::shared_ptr<const grammar::Grammar> StructuredCompiler::compile(const StructuredOutput& s) {
  const std::string what = std::string("structured output (") + structured_kind_name(s.kind) + "): ";
  if (!tok_) throw Error(what + "needs a tokenizer");
  grammar::GrammarCache* cache;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!cache_) {
      // Token bytes per id below the logits width; added tokens (control tokens) are never
      // allowed except the primary EOS, which the grammar allows when it is complete.
      const int64_t n = std::min<int64_t>((int64_t)tok_->vocab_size(), width_);
      std::vector<std::string> bytes((size_t)n);
      std::vector<bool> special((size_t)n, false);
      for (int32_t id = 0; id < n; ++id) {
        bytes[id] = std::string(tok_->token_bytes(id));
        special[id] = tok_->is_added(id) || bytes[id].empty();
      }
      int32_t eos = -1;
      if (tok_->eos_id() >= 0 && tok_->eos_id() < n) eos = tok_->eos_id();
      for (int32_t id : eos_ids_)
        if (eos < 0 && id < n) eos = id;
      vocab_ = grammar::Vocabulary::create(std::move(bytes), std::move(special), eos, (int32_t)width_);
      cache_ = std::make_unique<grammar::GrammarCache>(vocab_, 64);
      grammar::JsonOptions compact;
      compact.max_whitespace = 0;
      compact_cache_ = std::make_unique<grammar::GrammarCache>(vocab_, 64, grammar::Limits{}, compact);
    }
    const bool json = s.kind == StructuredKind::kJsonSchema || s.kind == StructuredKind::kJsonObject;
    cache = json && s.disable_any_whitespace ? compact_cache_.get() : cache_.get();
  }
  if (vocab_->eos_id() < 0) throw Error(what + "the model has no end-of-sequence token");
  std::shared_ptr<const grammar::Grammar> g;
  try {
    g = cache->get({spec_kind(s.kind), s.text});
  } catch (const Error& e) {
    throw Error(what + e.what());
  }
  // A grammar whose language is empty would leave no token to sample at the first step.
  grammar::Matcher probe(g);
  std::vector<uint32_t> mask(vocab_->mask_words());
  probe.fill_mask(mask.data());
  if (std::all_of(mask.begin(), mask.end(), [](uint32_t w) { return w == 0; }))
    throw Error(what + "the grammar matches no output (no token can start it)");
  return g;
}

StructuredState::StructuredState(std::shared_ptr<const grammar::Grammar> g, const std::vector<int32_t>* eos_ids)
    : matcher_(std::move(g)), eos_ids_(eos_ids) {
  mask_.resize(matcher_.grammar().vocab().mask_words());
}

const uint32_t* StructuredState::fill_mask() {
  matcher_.fill_mask(mask_.data());
  const int32_t eos = matcher_.grammar().vocab().eos_id();
  if ((mask_[eos >> 5] >> (eos & 31)) & 1u)
    for (int32_t id : *eos_ids_) mask_[id >> 5] |= 1u << (id & 31);
  return mask_.data();
}

bool StructuredState::accept(int32_t token) {
  const int32_t eos = matcher_.grammar().vocab().eos_id();
  if (std::find(eos_ids_->begin(), eos_ids_->end(), token) != eos_ids_->end()) token = eos;
  return matcher_.accept_token(token);
}

}  // namespace deepinfer
