#pragma once
// DeepInfer tokenizer: byte-level BPE loaded from a Hugging Face `tokenizer.json`
// (+ optional `tokenizer_config.json`), bit-exact with HF `tokenizers` for the supported subset.
//
// Supported tokenizer.json features (anything else is rejected with deepinfer::Error):
//   normalizer:    null, Sequence, NFC, NFD, NFKC, NFKD (ICU), Prepend, Replace (String pattern)
//   pre_tokenizer: null, Sequence, Split (Regex/String pattern, all behaviours, invert), ByteLevel
//   model:         BPE (byte-level alphabet), ignore_merges, unk_token; dropout must be null
//   decoder:       ByteLevel (or a Sequence holding it), or null
//   post_processor: ByteLevel (no-op for ids), TemplateProcessing (single), null
//   added_tokens:  special / lstrip / rstrip / normalized flags (single_word: ASCII word rule)
//
// Invalid UTF-8 (documented rule, docs/tokenizer.md): every input string is first made valid by
// replacing each maximal invalid subsequence with U+FFFD, exactly like Rust's
// String::from_utf8_lossy and Python's bytes.decode("utf-8", "replace"). Decoding likewise
// replaces invalid byte sequences in the concatenated token bytes by U+FFFD (HF's rule).
//
// Thread safety: a Tokenizer is immutable after loading; every const method may be called from
// any number of threads at once. Copies share the loaded data. No global state.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer::tokenizer {

// Which added tokens (tokenizer.json "added_tokens") are recognised in the input text.
enum class ParseSpecial {
  kAll,             // every added token (HF default)
  kNonSpecialOnly,  // tokens flagged special are plain text (HF `encode_special_tokens = True`)
  kNone,            // no added token is recognised: all text goes through BPE. Use this for
                    // untrusted text (user message content): it can never yield a control token.
};

struct AddedTokenInfo {
  int32_t id = -1;
  std::string content;
  bool special = false, lstrip = false, rstrip = false, normalized = false, single_word = false;
};

// Values read from tokenizer_config.json (all optional).
struct TokenizerConfig {
  std::string bos_token, eos_token, pad_token;  // token strings ("" if unset)
  bool add_bos_token = false, add_eos_token = false;
  bool has_add_bos_token = false, has_add_eos_token = false;  // key present in the file
  std::string chat_template;                    // Jinja source ("" if none)
  int64_t model_max_length = 0;
};

class Tokenizer {
 public:
  // `path` is a tokenizer.json file (optionally gzip-compressed, e.g. tokenizer.json.gz) or a
  // directory holding tokenizer.json[.gz]. A tokenizer_config.json[.gz] next to it is read too.
  static Tokenizer from_file(const std::string& path);
  // From in-memory JSON texts (config_json may be empty).
  static Tokenizer from_json(std::string_view tokenizer_json, std::string_view config_json = {});

  // Text -> ids. add_special_tokens: post-processing as transformers does it: BOS/EOS per
  // tokenizer_config.json's add_bos_token/add_eos_token when present, otherwise the
  // tokenizer.json TemplateProcessing post-processor (if any). Never adds anything when false.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false,
                              ParseSpecial parse_special = ParseSpecial::kAll) const;
  // Appends to `out` instead of returning (no post-processing).
  void encode_into(std::string_view text, ParseSpecial parse_special,
                   std::vector<int32_t>& out) const;
  // Encodes each text; spreads the work over `threads` threads (0 = all hardware threads).
  std::vector<std::vector<int32_t>> encode_batch(const std::vector<std::string>& texts,
                                                 bool add_special_tokens = false,
                                                 ParseSpecial parse_special = ParseSpecial::kAll,
                                                 unsigned threads = 0) const;

  // Encodes a concatenation of pieces as one text (so BPE/pre-tokenization sees the same
  // boundaries as encoding the joined string), but added tokens are recognised only where they
  // lie entirely inside trusted pieces. Chat templates pass their own markers as trusted and
  // message content as untrusted: user text can never produce a control token.
  struct TextPiece {
    std::string_view text;
    bool trusted = false;
  };
  std::vector<int32_t> encode_pieces(std::span<const TextPiece> pieces) const;

  // Ids -> text, as HF `decode`: ids that name no token are skipped; with skip_special_tokens,
  // added tokens flagged special are dropped. Result is always valid UTF-8.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;
  // Raw bytes a single token contributes to a decode (may be a partial UTF-8 character).
  // Empty for unknown ids.
  std::string_view token_bytes(int32_t id) const;

  // Token string as written in tokenizer.json (byte-level alphabet for BPE entries).
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;  // an added token flagged special
  bool is_added(int32_t id) const;    // any added token
  const std::vector<AddedTokenInfo>& added_tokens() const;

  int32_t bos_id() const;  // -1 when not configured
  int32_t eos_id() const;
  int32_t pad_id() const;
  size_t vocab_size() const;  // 1 + the largest id (model vocab and added tokens)
  const TokenizerConfig& config() const;

  Tokenizer(const Tokenizer&) = default;
  Tokenizer& operator=(const Tokenizer&) = default;
  Tokenizer(Tokenizer&&) noexcept = default;
  Tokenizer& operator=(Tokenizer&&) noexcept = default;
  ~Tokenizer();

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;
};

// Incremental detokenizer: feed ids one at a time, get text deltas. Deltas never split a UTF-8
// character; the concatenation of all deltas plus finish() equals tokenizer.decode(all ids).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special_tokens = false);
  std::string push(int32_t id);  // text that became final with this token (may be empty)
  std::string finish();          // flushes an incomplete trailing character (as U+FFFD)
  void reset();
  size_t pending_bytes() const { return pending_.size(); }

 private:
  Tokenizer tok_;
  bool skip_special_;
  std::string pending_;
};

// UTF-8 helpers (also used by tests and the chat module).
namespace utf8 {
bool is_valid(std::string_view s);
// Makes s valid UTF-8 by the from_utf8_lossy rule (maximal invalid subparts -> U+FFFD).
std::string to_valid(std::string_view s);
// Decodes the longest prefix of s that is final (complete characters, or invalid bytes that no
// later byte can complete); appends it (lossy) to out; returns the number of bytes consumed.
// With final = true everything is consumed.
size_t append_lossy_prefix(std::string_view s, bool final, std::string& out);
}  // namespace utf8

}  // namespace deepinfer::tokenizer
