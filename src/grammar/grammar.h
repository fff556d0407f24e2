#pragma once
// Structured outputs: compile a regex, a JSON Schema or a GBNF grammar into a byte-level
// pushdown machine and turn it into a token bitmask over the full logits width at each step.
//
//   auto vocab = Vocabulary::create(token_bytes, special, eos_id, 129280);
//   auto g = compile({SpecKind::JsonSchema, schema_text}, vocab);   // shareable, thread-safe
//   Matcher m(g);                                                   // one per request
//   m.fill_mask(words); ... m.accept_token(id); ... m.can_end();
#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace deepinfer::grammar {

// Token bytes in a flat preorder trie, so one mask is one pruned walk.
class Vocabulary {
 public:
  // token_bytes[i]: raw bytes of token i. special[i]: a control token, never allowed except
  // eos_id, which is allowed exactly when the grammar can end. Ids in [token_bytes.size(),
  // logits_width) are padding and always masked.
  static std::shared_ptr<const Vocabulary> create(std::vector<std::string> token_bytes,
                                                  std::vector<bool> special, int32_t eos_id,
                                                  int32_t logits_width);
  int32_t logits_width() const { return width_; }
  size_t mask_words() const { return (static_cast<size_t>(width_) + 31) / 32; }
  int32_t eos_id() const { return eos_; }
  size_t size() const { return bytes_.size(); }
  const std::string& token(int32_t id) const { return bytes_[id]; }
  bool is_special(int32_t id) const { return special_[id]; }

  // Trie: node 0 is the root; node i has byte byte_[i], depth depth_[i], subtree [i, end_[i]).
  std::vector<uint8_t> byte_;
  std::vector<uint16_t> depth_;
  std::vector<uint32_t> end_;
  std::vector<int32_t> tok_;       // first token ending at the node, or -1
  std::vector<int32_t> dup_next_;  // next token with identical bytes, or -1 (per token id)
  // "Plain" tokens: a prefix of valid UTF-8 text without '"', '\\' or control characters (the
  // body of a JSON string). A state that survives every plain byte path accepts all of them at
  // once, so its trie walk only visits subtrees holding other tokens.
  std::vector<uint32_t> plain_bits_;
  std::vector<uint8_t> impure_below_;  // per node: its subtree holds a non-plain token
  static int plain_step(int u, uint8_t b);  // the plain-text automaton; -1 = not plain

 private:
  std::vector<std::string> bytes_;
  std::vector<bool> special_;
  int32_t eos_ = -1;
  int32_t width_ = 0;
};

// Vocabulary from a HuggingFace byte-level BPE tokenizer.json (GPT-2 byte alias alphabet);
// added tokens are special. eos_id: the id of `eos_token` (default the DeepSeek one).
std::shared_ptr<const Vocabulary> load_vocab_from_tokenizer_json(
    const std::string& path, int32_t logits_width,
    const std::string& eos_token = "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");

// Bounds on what hostile input can cost. Exceeding one is a deepinfer::Error, never a crash.
struct Limits {
  size_t max_spec_bytes = 1 << 20;
  size_t max_ir_nodes = 1 << 20;
  size_t max_nfa_states = 1 << 20;
  size_t max_dfa_states = 200000;
  int max_repeat = 100000;      // {m,n}, maxLength, maxItems...
  int max_nesting = 256;        // parentheses, schema depth
  size_t max_enum_values = 100000;  // values of one enum
  size_t max_stacks = 4096;     // live parse stacks at one point (ambiguous grammars)
  double compile_seconds = 5;   // wall time for one compile
};

struct JsonOptions {
  // Longest whitespace run between JSON tokens; bounded on purpose (runaway whitespace), < 0 = unbounded.
  int max_whitespace = 20;
};

enum class SpecKind { Regex, JsonSchema, Gbnf, JsonObject };
struct Spec {
  SpecKind kind = SpecKind::JsonObject;
  std::string text;  // pattern, schema JSON, GBNF text; ignored for JsonObject
};

struct Machine;
struct MaskEntry;

// Compiled grammar bound to a vocabulary. Immutable apart from an internal lock-free cache of
// per-state token sets, so one Grammar can serve many matchers on many threads.
class Grammar {
 public:
  Grammar(std::unique_ptr<Machine> m, std::shared_ptr<const Vocabulary> v);
  ~Grammar();
  Grammar(const Grammar&) = delete;
  Grammar& operator=(const Grammar&) = delete;
  const Vocabulary& vocab() const { return *vocab_; }
  const Machine& machine() const { return *machine_; }
  const MaskEntry& entry(int state) const;  // token set of a DFA state, computed on first use
  size_t num_states() const;

 private:
  std::unique_ptr<Machine> machine_;
  std::shared_ptr<const Vocabulary> vocab_;
  std::unique_ptr<std::atomic<const MaskEntry*>[]> cache_;
};

std::shared_ptr<const Grammar> compile(const Spec& spec, std::shared_ptr<const Vocabulary> vocab,
                                       const Limits& limits = {}, const JsonOptions& json = {});

// Per-request state. Not thread-safe; cheap to create.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const Grammar> g);
  // Writes vocab().mask_words() words; bit i set = token i allowed.
  void fill_mask(uint32_t* bitmask_words);
  // Advances on a token; false (state unchanged) if the token is not allowed.
  bool accept_token(int32_t id);
  // Advances on raw bytes (tests, forced prefixes); false (state unchanged) if rejected.
  bool accept_bytes(std::string_view bytes);
  bool can_end() const;                           // the output so far is a complete match
  bool is_terminated() const { return terminated_; }  // EOS was accepted
  // Undoes the last n accepted tokens (speculative decoding); n > num_tokens() is an error.
  void rollback(size_t n);
  size_t num_tokens() const { return history_.size() - 1; }
  const Grammar& grammar() const { return *g_; }

 private:
  struct Frame {
    int32_t state, parent;
  };
  int intern(int32_t state, int32_t parent);
  void closure(std::vector<int32_t>& set);
  bool step(const std::vector<int32_t>& in, uint8_t b, std::vector<int32_t>& out);
  void walk(uint32_t node, const std::vector<int32_t>& cfg, uint32_t* words, int depth);

  std::shared_ptr<const Grammar> g_;
  std::vector<Frame> frames_;
  std::unordered_map<uint64_t, int32_t> frame_ids_;
  std::vector<std::vector<int32_t>> history_;  // expanded configuration after each token
  std::vector<size_t> frames_mark_;            // frames_.size() after each token
  std::vector<std::vector<int32_t>> scratch_;
  bool terminated_ = false;
};

// Compiled grammars keyed by spec text (LRU, thread-safe). Compile errors are not cached.
class GrammarCache {
 public:
  GrammarCache(std::shared_ptr<const Vocabulary> vocab, size_t capacity, Limits limits = {},
               JsonOptions json = {});
  std::shared_ptr<const Grammar> get(const Spec& spec);
  size_t size() const;

 private:
  std::shared_ptr<const Vocabulary> vocab_;
  size_t capacity_;
  Limits limits_;
  JsonOptions json_;
  mutable std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<const Grammar>>> lru_;
  std::unordered_map<std::string, decltype(lru_)::iterator> index_;
};

}  // namespace deepinfer::grammar
