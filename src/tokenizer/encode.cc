// Encoding pipeline (HF order): split on non-normalized added tokens -> normalize the gaps ->
// split on normalized added tokens -> pre-tokenize (Split / ByteLevel) -> byte-level BPE.
// Decoding: concatenated token bytes, invalid UTF-8 replaced by U+FFFD.
#include <unicode/normalizer2.h>
#include <unicode/uniset.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <cctype>
#include <mutex>
#include <thread>

#include "tokenizer/impl.h"
#include "util/error.h"

namespace deepinfer::tokenizer {

namespace {

bool all_ascii(std::string_view s) {
  size_t i = 0, n = s.size();
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    if (w & 0x8080808080808080ull) return false;
  }
  for (; i < n; ++i)
    if (uint8_t(s[i]) >= 0x80) return false;
  return true;
}

// HF tokenizers normalizes with the `unicode-normalization-alignments` crate, whose tables are
// Unicode 9.0: characters assigned later are neither decomposed, composed nor reordered. ICU's
// FilteredNormalizer2 over [:Age=9.0:] (all characters assigned in 9.0 or earlier) reproduces
// that exactly (normalization data of assigned characters is stable across versions).
struct Unicode9Normalizers {
  icu::UnicodeSet age9;
  std::unique_ptr<icu::FilteredNormalizer2> nf[4];
  Unicode9Normalizers() {
    UErrorCode st = U_ZERO_ERROR;
    age9.applyPattern(icu::UnicodeString("[:Age=9.0:]", -1, US_INV), st);
    if (U_FAILURE(st)) return;
    age9.freeze();
    const icu::Normalizer2* base[4] = {icu::Normalizer2::getNFCInstance(st),
                                       icu::Normalizer2::getNFDInstance(st),
                                       icu::Normalizer2::getNFKCInstance(st),
                                       icu::Normalizer2::getNFKDInstance(st)};
    if (U_FAILURE(st)) return;
    for (int i = 0; i < 4; ++i) nf[i] = std::make_unique<icu::FilteredNormalizer2>(*base[i], age9);
  }
};

std::string icu_normalize(std::string_view s, NormalizerStep::Kind k) {
  if (all_ascii(s)) return std::string(s);  // ASCII is invariant under NFC/NFD/NFKC/NFKD
  static const Unicode9Normalizers kNorm;  // immutable after thread-safe construction
  UErrorCode st = U_ZERO_ERROR;
  int idx = k == NormalizerStep::kNFC ? 0 : k == NormalizerStep::kNFD ? 1 : k == NormalizerStep::kNFKC ? 2 : 3;
  const icu::Normalizer2* n = kNorm.nf[idx].get();
  if (!n) throw Error("tokenizer: ICU normalizer unavailable");
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), int32_t(s.size())));
  icu::UnicodeString r = n->normalize(u, st);
  if (U_FAILURE(st)) throw Error("tokenizer: ICU normalization failed");
  std::string out;
  r.toUTF8String(out);
  return out;
}

// Rust char::is_whitespace (Unicode White_Space) for the code point starting at s[i].
size_t whitespace_len_at(std::string_view s, size_t i) {
  uint8_t c = uint8_t(s[i]);
  if (c == ' ' || (c >= 0x09 && c <= 0x0D)) return 1;
  if (c < 0x80) return 0;
  auto b = [&](size_t k) { return i + k < s.size() ? uint8_t(s[i + k]) : 0; };
  if (c == 0xC2 && (b(1) == 0x85 || b(1) == 0xA0)) return 2;
  if (c == 0xE1 && b(1) == 0x9A && b(2) == 0x80) return 3;  // U+1680
  if (c == 0xE2 && b(1) == 0x80 && ((b(2) >= 0x80 && b(2) <= 0x8A) || b(2) == 0xA8 ||
                                    b(2) == 0xA9 || b(2) == 0xAF))
    return 3;  // U+2000..200A, 2028, 2029, 202F
  if (c == 0xE2 && b(1) == 0x81 && b(2) == 0x9F) return 3;  // U+205F
  if (c == 0xE3 && b(1) == 0x80 && b(2) == 0x80) return 3;  // U+3000
  return 0;
}
// Whitespace code point ending at s[i-1]: its length, or 0.
size_t whitespace_len_before(std::string_view s, size_t i) {
  for (size_t len = 1; len <= 3 && len <= i; ++len) {
    size_t st = i - len;
    if ((uint8_t(s[st]) & 0xC0) == 0x80) continue;  // continuation byte: go further back
    size_t w = whitespace_len_at(s, st);
    return w == len ? w : 0;
  }
  return 0;
}
bool is_word_byte(uint8_t c) { return c >= 0x80 || c == '_' || std::isalnum(c); }

size_t utf8_len(uint8_t c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

// Splits `text` on the added tokens of `trie` (leftmost-longest, as HF's Aho-Corasick) and
// calls gap(string_view) / token(id) in order.
struct AllowAll {
  bool operator()(const char*, const char*) const { return true; }
};

template <class Gap, class Tok, class Allow = AllowAll>
void split_added(const Tokenizer::Impl& m, const TokenTrie& trie, std::string_view text,
                 ParseSpecial mode, Gap&& gap, Tok&& token, Allow allow = Allow()) {
  if (trie.empty() || mode == ParseSpecial::kNone) {
    if (!text.empty()) gap(text);
    return;
  }
  const char* s = text.data();
  size_t n = text.size(), emitted = 0, i = 0;
  while (i < n) {
    if (!trie.can_start(uint8_t(s[i]))) {
      ++i;
      continue;
    }
    int32_t ti = -1;
    size_t len = trie.longest(s, n, i, ti);
    if (len == 0) {
      ++i;
      continue;
    }
    const AddedTokenInfo& a = m.added[size_t(ti)];
    size_t start = i, stop = i + len;
    if (a.special && mode == ParseSpecial::kNonSpecialOnly) {
      i = stop;  // HF skips the match; the search resumes after it
      continue;
    }
    if (!allow(s + start, s + stop)) {  // overlaps untrusted text: not a token
      ++i;
      continue;
    }
    if (a.single_word) {
      bool left_ok = start == 0 || !is_word_byte(uint8_t(s[start - 1]));
      bool right_ok = stop == n || !is_word_byte(uint8_t(s[stop]));
      if (!left_ok || !right_ok) {
        i = stop;
        continue;
      }
    }
    if (a.lstrip) {
      while (start > emitted) {
        size_t w = whitespace_len_before(text, start);
        if (!w || start - w < emitted) break;
        start -= w;
      }
    }
    if (a.rstrip) {
      while (stop < n) {
        size_t w = whitespace_len_at(text, stop);
        if (!w) break;
        stop += w;
      }
    }
    if (start > emitted) gap(text.substr(emitted, start - emitted));
    token(a.id);
    emitted = stop;
    i = std::max(i + len, stop);
  }
  if (emitted < n) gap(text.substr(emitted));
}

}  // namespace

std::string Tokenizer::Impl::normalize(std::string_view s) const {
  std::string cur(s);
  for (const NormalizerStep& st : normalizers) {
    switch (st.kind) {
      case NormalizerStep::kNFC:
      case NormalizerStep::kNFD:
      case NormalizerStep::kNFKC:
      case NormalizerStep::kNFKD:
        cur = icu_normalize(cur, st.kind);
        break;
      case NormalizerStep::kPrepend:
        if (!cur.empty()) cur = st.a + cur;
        break;
      case NormalizerStep::kReplace: {
        std::string out;
        size_t pos = 0;
        for (size_t f; (f = cur.find(st.a, pos)) != std::string::npos; pos = f + st.a.size())
          out.append(cur, pos, f - pos).append(st.b);
        out.append(cur, pos);
        cur = std::move(out);
        break;
      }
      case NormalizerStep::kReplaceRegex: {
        Regex::Scratch sc;
        std::string out;
        size_t pos = 0, b, e;
        while (pos <= cur.size() && st.re->find(cur, pos, b, e, sc)) {
          out.append(cur, pos, b - pos).append(st.b);
          if (e == b) {
            if (b >= cur.size()) {
              pos = cur.size();
              break;
            }
            size_t l = utf8_len(uint8_t(cur[b]));
            out.append(cur, b, l);
            e = b + l;
          }
          pos = e;
        }
        if (pos < cur.size()) out.append(cur, pos);
        cur = std::move(out);
        break;
      }
    }
  }
  return cur;
}

void Tokenizer::Impl::encode(std::string_view text, ParseSpecial mode, Ctx& ctx,
                             std::vector<int32_t>& out) const {
  auto tok = [&](int32_t id) { out.push_back(id); };
  split_added(
      *this, raw_trie, text, mode,
      [&](std::string_view gap) {
        if (has_normalizer()) {
          std::string norm = normalize(gap);
          encode_normalized_gap(norm, mode, ctx, out);
        } else {
          encode_normalized_gap(gap, mode, ctx, out);
        }
      },
      tok);
}

void Tokenizer::Impl::encode_normalized_gap(std::string_view text, ParseSpecial mode, Ctx& ctx,
                                            std::vector<int32_t>& out) const {
  split_added(
      *this, norm_trie, text, mode,
      [&](std::string_view gap) { pretokenize(0, gap, ctx, out); },
      [&](int32_t id) { out.push_back(id); });
}

void Tokenizer::Impl::pretokenize(size_t level, std::string_view piece, Ctx& ctx,
                                  std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (level == pretokenizers.size()) {
    bpe(piece, ctx, out);
    return;
  }
  const PreTokenizerStep& p = pretokenizers[level];
  std::string prefixed;
  if (p.kind == PreTokenizerStep::kByteLevel) {
    if (p.add_prefix_space && piece[0] != ' ') {
      prefixed.reserve(piece.size() + 1);
      prefixed += ' ';
      prefixed += piece;
      piece = prefixed;
    }
    if (!p.re) {
      pretokenize(level + 1, piece, ctx, out);
      return;
    }
  }
  size_t pos = 0, mb, me;
  if (p.behavior == SplitBehavior::kIsolated && !p.invert) {
    size_t last = 0;
    while (pos < piece.size() && p.re->find(piece, pos, mb, me, ctx.rx)) {
      if (me == mb) {  // empty match: no piece; step one character
        pos = mb + utf8_len(uint8_t(piece[mb]));
        continue;
      }
      if (mb > last) pretokenize(level + 1, piece.substr(last, mb - last), ctx, out);
      pretokenize(level + 1, piece.substr(mb, me - mb), ctx, out);
      last = pos = me;
    }
    if (last < piece.size()) pretokenize(level + 1, piece.substr(last), ctx, out);
    return;
  }
  // General behaviours: collect (begin, end, is_match) then apply HF's rules.
  struct Sp {
    size_t b, e;
    bool m;
  };
  std::vector<Sp> sp;
  size_t last = 0;
  while (pos < piece.size() && p.re->find(piece, pos, mb, me, ctx.rx)) {
    if (me == mb) {
      pos = mb + utf8_len(uint8_t(piece[mb]));
      continue;
    }
    if (mb > last) sp.push_back({last, mb, false});
    sp.push_back({mb, me, true});
    last = pos = me;
  }
  if (last < piece.size()) sp.push_back({last, piece.size(), false});
  if (p.invert)
    for (Sp& s : sp) s.m = !s.m;
  std::vector<Sp> res;
  bool prev = false;
  switch (p.behavior) {
    case SplitBehavior::kIsolated:
      res = sp;
      break;
    case SplitBehavior::kRemoved:
      for (Sp& s : sp)
        if (!s.m) res.push_back(s);
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (Sp& s : sp) {
        if (s.m && !prev && !res.empty())
          res.back().e = s.e;
        else
          res.push_back(s);
        prev = s.m;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (size_t k = sp.size(); k-- > 0;) {
        Sp& s = sp[k];
        if (s.m && !prev && !res.empty())
          res.back().b = s.b;
        else
          res.push_back(s);
        prev = s.m;
      }
      std::reverse(res.begin(), res.end());
      break;
    case SplitBehavior::kContiguous:
      for (size_t k = 0; k < sp.size(); ++k) {
        Sp& s = sp[k];
        if (k > 0 && s.m == prev)
          res.back().e = s.e;
        else
          res.push_back(s);
        prev = s.m;
      }
      break;
  }
  for (const Sp& s : res)
    if (s.e > s.b) pretokenize(level + 1, piece.substr(s.b, s.e - s.b), ctx, out);
}

// Byte-level BPE of one pre-token. Repeatedly merges the adjacent pair of lowest rank (the
// leftmost one on ties), which is exactly what HF's heap-based merge loop computes.
void Tokenizer::Impl::bpe(std::string_view piece, Ctx& ctx, std::vector<int32_t>& out) const {
  size_t n = piece.size();
  if (ctx.use_cache && n >= 2 && n <= 48) {
    auto it = ctx.cache.find(piece);
    if (it != ctx.cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
    size_t before = out.size();
    ctx.use_cache = false;
    bpe(piece, ctx, out);
    ctx.use_cache = true;
    if (ctx.cache.size() >= 65536) ctx.cache.clear();
    ctx.cache.emplace(std::string(piece), std::vector<int32_t>(out.begin() + before, out.end()));
    return;
  }
  if (ignore_merges) {
    auto it = bytes_to_id.find(std::string(piece));
    if (it != bytes_to_id.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (n > 64) {
    bpe_long(piece, ctx, out);
    return;
  }
  auto& sym = ctx.sym;
  auto& rank = ctx.rank;
  auto& nid = ctx.nid;
  sym.clear();
  for (size_t i = 0; i < n; ++i) {
    int32_t id = byte_id[uint8_t(piece[i])];
    if (id < 0) id = unk_id;  // no symbol for this byte: unk, or dropped (HF without unk)
    if (id >= 0) sym.push_back(id);
  }
  size_t k = sym.size();
  if (k <= 1) {
    out.insert(out.end(), sym.begin(), sym.end());
    return;
  }
  rank.resize(k);
  nid.resize(k);
  for (size_t i = 0; i + 1 < k; ++i) rank[i] = merges.find(sym[i], sym[i + 1], nid[i]);
  rank[k - 1] = INT32_MAX;
  while (k > 1) {
    size_t best = 0;
    int32_t br = rank[0];
    for (size_t i = 1; i + 1 < k; ++i)
      if (rank[i] < br) {
        br = rank[i];
        best = i;
      }
    if (br == INT32_MAX) break;
    sym[best] = nid[best];
    // remove symbol best+1
    std::memmove(&sym[best + 1], &sym[best + 2], (k - best - 2) * sizeof(int32_t));
    std::memmove(&rank[best + 1], &rank[best + 2], (k - best - 2) * sizeof(int32_t));
    std::memmove(&nid[best + 1], &nid[best + 2], (k - best - 2) * sizeof(int32_t));
    --k;
    rank[k - 1] = INT32_MAX;
    if (best + 1 < k) rank[best] = merges.find(sym[best], sym[best + 1], nid[best]);
    else rank[best] = INT32_MAX;
    if (best > 0) rank[best - 1] = merges.find(sym[best - 1], sym[best], nid[best - 1]);
  }
  out.insert(out.end(), sym.begin(), sym.begin() + k);
}

void Tokenizer::Impl::bpe_long(std::string_view piece, Ctx& ctx, std::vector<int32_t>& out) const {
  auto& s = ctx.hsym;
  auto& heap = ctx.heap;  // (rank, pos), min-heap via std::greater
  s.clear();
  heap.clear();
  for (size_t i = 0; i < piece.size(); ++i) {
    int32_t id = byte_id[uint8_t(piece[i])];
    if (id < 0) id = unk_id;
    if (id < 0) continue;
    int32_t idx = int32_t(s.size());
    s.push_back({id, idx - 1, -1});
    if (idx > 0) s[idx - 1].next = idx;
  }
  auto cmp = std::greater<std::pair<int32_t, int32_t>>();
  auto push = [&](int32_t pos) {
    int32_t nx = s[pos].next;
    if (nx < 0) return;
    int32_t id = 0;
    int32_t r = merges.find(s[pos].id, s[nx].id, id);
    if (r == INT32_MAX) return;
    heap.emplace_back(r, pos);
    std::push_heap(heap.begin(), heap.end(), cmp);
  };
  for (int32_t i = 0; i + 1 < int32_t(s.size()); ++i) push(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), cmp);
    auto [r, pos] = heap.back();
    heap.pop_back();
    if (s[pos].id < 0) continue;
    int32_t nx = s[pos].next;
    if (nx < 0) continue;
    int32_t id = 0;
    if (merges.find(s[pos].id, s[nx].id, id) != r) continue;  // stale entry
    s[pos].id = id;
    s[nx].id = -1;
    s[pos].next = s[nx].next;
    if (s[pos].next >= 0) s[s[pos].next].prev = pos;
    if (s[pos].prev >= 0) push(s[pos].prev);
    push(pos);
  }
  for (int32_t i = s.empty() ? -1 : 0; i >= 0; i = s[i].next) out.push_back(s[i].id);
}

// ---------------------------------------------------------------------------------------------
// Public API
std::vector<int32_t> Tokenizer::encode_pieces(std::span<const TextPiece> pieces) const {
  const Impl& m = *impl_;
  std::vector<int32_t> out;
  Impl::Ctx ctx;
  if (m.has_normalizer()) {  // offsets move under normalization: encode piece by piece
    for (const TextPiece& p : pieces)
      encode_into(p.text, p.trusted ? ParseSpecial::kAll : ParseSpecial::kNone, out);
    return out;
  }
  std::string text;
  std::vector<uint32_t> untrusted{0};  // prefix counts of untrusted bytes
  for (const TextPiece& p : pieces) {
    std::string v = utf8::to_valid(p.text);
    text += v;
    for (size_t i = 0; i < v.size(); ++i) untrusted.push_back(untrusted.back() + (p.trusted ? 0 : 1));
  }
  const char* base = text.data();
  auto allow = [&](const char* b, const char* e) {
    return untrusted[size_t(e - base)] == untrusted[size_t(b - base)];
  };
  auto tok = [&](int32_t id) { out.push_back(id); };
  split_added(
      m, m.raw_trie, text, ParseSpecial::kAll,
      [&](std::string_view gap) {
        split_added(
            m, m.norm_trie, gap, ParseSpecial::kAll,
            [&](std::string_view g2) { m.pretokenize(0, g2, ctx, out); }, tok, allow);
      },
      tok, allow);
  return out;
}

void Tokenizer::encode_into(std::string_view text, ParseSpecial mode,
                            std::vector<int32_t>& out) const {
  Impl::Ctx ctx;
  if (utf8::is_valid(text)) {
    impl_->encode(text, mode, ctx, out);
  } else {
    std::string fixed = utf8::to_valid(text);
    impl_->encode(fixed, mode, ctx, out);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens,
                                       ParseSpecial mode) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special_tokens) out = impl_->prefix_ids;
  encode_into(text, mode, out);
  if (add_special_tokens) out.insert(out.end(), impl_->suffix_ids.begin(), impl_->suffix_ids.end());
  return out;
}

std::vector<std::vector<int32_t>> Tokenizer::encode_batch(const std::vector<std::string>& texts,
                                                          bool add_special_tokens,
                                                          ParseSpecial mode,
                                                          unsigned threads) const {
  std::vector<std::vector<int32_t>> res(texts.size());
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = unsigned(std::min<size_t>(threads, std::max<size_t>(1, texts.size())));
  std::atomic<size_t> next{0};
  auto work = [&]() {
    Impl::Ctx ctx;  // one context (with its pre-token memo) per worker thread
    ctx.use_cache = true;
    std::string fixed;
    for (;;) {
      size_t i = next.fetch_add(1);
      if (i >= texts.size()) break;
      std::vector<int32_t>& out = res[i];
      if (add_special_tokens) out = impl_->prefix_ids;
      std::string_view t = texts[i];
      if (!utf8::is_valid(t)) {
        fixed = utf8::to_valid(t);
        t = fixed;
      }
      impl_->encode(t, mode, ctx, out);
      if (add_special_tokens) out.insert(out.end(), impl_->suffix_ids.begin(), impl_->suffix_ids.end());
    }
  };
  if (threads <= 1) {
    work();
    return res;
  }
  std::vector<std::thread> pool;
  std::exception_ptr err;
  std::mutex err_mu;
  for (unsigned t = 0; t < threads; ++t)
    pool.emplace_back([&]() {
      try {
        work();
      } catch (...) {
        std::lock_guard<std::mutex> lk(err_mu);
        if (!err) err = std::current_exception();
        next = texts.size();
      }
    });
  for (auto& th : pool) th.join();
  if (err) std::rethrow_exception(err);
  return res;
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  const Impl& m = *impl_;
  if (id < 0 || size_t(id) >= m.kind.size() || !m.kind[id]) return {};
  return std::string_view(m.dec_blob).substr(m.dec_off[id], m.dec_off[id + 1] - m.dec_off[id]);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::string bytes;
  bytes.reserve(ids.size() * 4);
  for (int32_t id : ids) {
    if (id < 0 || size_t(id) >= m.kind.size() || !m.kind[id]) continue;
    if (skip_special_tokens && m.kind[id] == 3) continue;
    bytes.append(m.dec_blob, m.dec_off[id], m.dec_off[id + 1] - m.dec_off[id]);
  }
  if (utf8::is_valid(bytes)) return bytes;
  return utf8::to_valid(bytes);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  std::string t(token);
  if (auto it = impl_->added_str_to_id.find(t); it != impl_->added_str_to_id.end()) return it->second;
  if (auto it = impl_->model_str_to_id.find(t); it != impl_->model_str_to_id.end()) return it->second;
  return std::nullopt;
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  const Impl& m = *impl_;
  if (id < 0 || size_t(id) >= m.kind.size() || !m.kind[id]) return std::nullopt;
  return m.str_blob.substr(m.str_off[id], m.str_off[id + 1] - m.str_off[id]);
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && size_t(id) < impl_->kind.size() && impl_->kind[id] == 3;
}
bool Tokenizer::is_added(int32_t id) const {
  return id >= 0 && size_t(id) < impl_->kind.size() && impl_->kind[id] >= 2;
}
const std::vector<AddedTokenInfo>& Tokenizer::added_tokens() const { return impl_->added; }
int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::eos_id() const { return impl_->eos; }
int32_t Tokenizer::pad_id() const { return impl_->pad; }
size_t Tokenizer::vocab_size() const { return impl_->kind.size(); }
const TokenizerConfig& Tokenizer::config() const { return impl_->config; }

// ---------------------------------------------------------------------------------------------
StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special_tokens)
    : tok_(tok), skip_special_(skip_special_tokens) {}

std::string StreamDecoder::push(int32_t id) {
  if (skip_special_ && tok_.is_special(id)) return {};
  std::string_view b = tok_.token_bytes(id);
  if (b.empty()) return {};
  pending_.append(b);
  std::string out;
  size_t used = utf8::append_lossy_prefix(pending_, false, out);
  pending_.erase(0, used);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out;
  utf8::append_lossy_prefix(pending_, true, out);
  pending_.clear();
  return out;
}

void StreamDecoder::reset() { pending_.clear(); }

}  // namespace deepinfer::tokenizer
