#pragma once
// Internal representation of a loaded tokenizer (not part of the public API).
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::tokenizer {

// Open-addressing map (a, b) -> (rank, merged id).
class MergeMap {
 public:
  void reserve(size_t n);
  void insert(int32_t a, int32_t b, int32_t rank, int32_t id);  // overwrites (HF: last wins)
  // Returns the rank, or INT32_MAX when (a, b) has no merge; sets id.
  inline int32_t find(int32_t a, int32_t b, int32_t& id) const {
    uint64_t key = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
    size_t h = hash(key);
    for (;;) {
      const Slot& s = slots_[h];
      if (s.key == key) {
        id = s.id;
        return s.rank;
      }
      if (s.key == kEmpty) return INT32_MAX;
      h = (h + 1) & mask_;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  struct Slot {
    uint64_t key = kEmpty;
    int32_t rank = 0, id = 0;
  };
  size_t hash(uint64_t k) const { return size_t((k * 0x9E3779B97F4A7C15ull) >> shift_); }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t count_ = 0;
};

// Byte trie over added-token contents; finds the longest token starting at a position.
class TokenTrie {
 public:
  void add(const std::string& s, int32_t token_index);
  bool empty() const { return nodes_.size() <= 1; }
  // Longest token starting at text[i]: returns its length (0 if none) and its index.
  size_t longest(const char* text, size_t len, size_t i, int32_t& token_index) const;
  bool can_start(uint8_t b) const { return first_[b]; }

 private:
  struct Node {
    int32_t token = -1;
    std::vector<std::pair<uint8_t, int32_t>> kids;
  };
  std::vector<Node> nodes_{1};
  bool first_[256] = {};
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokenizerStep {
  enum Kind { kSplit, kByteLevel } kind = kSplit;
  std::unique_ptr<Regex> re;  // Split pattern; ByteLevel: the GPT-2 pattern when use_regex
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;
};

struct NormalizerStep {
  enum Kind { kNFC, kNFD, kNFKC, kNFKD, kPrepend, kReplace, kReplaceRegex } kind = kNFC;
  std::string a, b;
  std::unique_ptr<Regex> re;
};

struct Tokenizer::Impl {
  // --- model (BPE) ---
  int32_t byte_id[256];                // id of each byte's byte-level symbol (-1: none)
  MergeMap merges;
  bool ignore_merges = false;
  int32_t unk_id = -1;
  std::unordered_map<std::string, int32_t> bytes_to_id;  // raw bytes -> model id (ignore_merges)

  // --- tokens by id ---
  std::vector<uint8_t> kind;            // 0 none, 1 model, 2 added, 3 added special
  std::vector<uint32_t> dec_off;        // decode bytes of id i: dec_blob[dec_off[i], dec_off[i+1])
  std::string dec_blob;
  std::vector<uint32_t> str_off;        // tokenizer.json string of id i
  std::string str_blob;
  std::unordered_map<std::string, int32_t> model_str_to_id, added_str_to_id;

  // --- added tokens ---
  std::vector<AddedTokenInfo> added;
  TokenTrie raw_trie, norm_trie;  // non-normalized / normalized tokens

  std::vector<NormalizerStep> normalizers;
  std::vector<PreTokenizerStep> pretokenizers;

  std::vector<int32_t> prefix_ids, suffix_ids;  // add_special_tokens
  TokenizerConfig config;
  int32_t bos = -1, eos = -1, pad = -1;

  // Scratch for one thread's encoding work.
  struct Ctx {
    Regex::Scratch rx;
    std::vector<int32_t> sym, rank, nid;
    struct HeapSym {
      int32_t id, prev, next;
    };
    std::vector<HeapSym> hsym;
    std::vector<std::pair<int32_t, int32_t>> heap;
    std::string tmp;
    // Pre-token -> ids memo, owned by one thread's context (encode_batch reuses a context over
    // many texts). Heterogeneous lookup: no string is built for a hit.
    struct SvHash {
      using is_transparent = void;
      size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
    };
    struct SvEq {
      using is_transparent = void;
      bool operator()(std::string_view a, std::string_view b) const { return a == b; }
    };
    std::unordered_map<std::string, std::vector<int32_t>, SvHash, SvEq> cache;
    bool use_cache = false;
  };

  void encode(std::string_view valid_text, ParseSpecial mode, Ctx& ctx,
              std::vector<int32_t>& out) const;
  void encode_normalized_gap(std::string_view text, ParseSpecial mode, Ctx& ctx,
                             std::vector<int32_t>& out) const;
  void pretokenize(size_t level, std::string_view piece, Ctx& ctx,
                   std::vector<int32_t>& out) const;
  void bpe(std::string_view piece, Ctx& ctx, std::vector<int32_t>& out) const;
  void bpe_long(std::string_view piece, Ctx& ctx, std::vector<int32_t>& out) const;
  std::string normalize(std::string_view s) const;
  bool has_normalizer() const { return !normalizers.empty(); }
};

}  // namespace deepinfer::tokenizer
