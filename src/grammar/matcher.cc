// Vocabulary trie, per-state token sets, the pushdown matcher and the grammar cache.
//
// Mask = union over the live stack tops of the token set of each top DFA state. That set is
// exact for tokens that stay inside the top rule; tokens that would return from or call into
// another rule mid-token are kept as trie subtrees ("uncertain") and re-walked against the real
// stack. Most grammars have one rule (everything non-recursive is inlined), so they never need it.
#include <algorithm>
#include <cstring>

#include "grammar/ir.h"
#include "util/error.h"

namespace deepinfer::grammar {

struct MaskEntry {
  std::vector<uint32_t> bits;   // dense form (mask_words) or empty
  std::vector<int32_t> tokens;  // sparse form
  std::vector<std::pair<uint32_t, int32_t>> uncertain;  // (trie node, DFA state at that node)
};

// ---------------------------------------------------------------- Vocabulary
std::shared_ptr<const Vocabulary> Vocabulary::create(std::vector<std::string> token_bytes,
                                                     std::vector<bool> special, int32_t eos_id,
                                                     int32_t logits_width) {
  if (logits_width < (int64_t)token_bytes.size())
    throw Error("grammar: logits width " + std::to_string(logits_width) + " is below vocabulary size " +
                std::to_string(token_bytes.size()));
  special.resize(token_bytes.size(), false);
  if (eos_id >= (int64_t)token_bytes.size()) throw Error("grammar: eos id out of range");
  auto v = std::make_shared<Vocabulary>();
  v->width_ = logits_width;
  v->eos_ = eos_id;
  if (eos_id >= 0) special[eos_id] = true;
  std::vector<int32_t> order;
  for (size_t i = 0; i < token_bytes.size(); ++i)
    if (!special[i] && !token_bytes[i].empty() && token_bytes[i].size() < 65535) order.push_back(i);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return token_bytes[a] < token_bytes[b]; });
  v->dup_next_.assign(token_bytes.size(), -1);
  v->byte_ = {0};
  v->depth_ = {0};
  v->end_ = {0};
  v->tok_ = {-1};
  std::vector<uint32_t> path = {0};
  std::vector<int32_t> last_dup;  // per node: last token id in its duplicate chain
  last_dup.push_back(-1);
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& s = token_bytes[id];
    if (prev && s == *prev) {
      uint32_t node = path.back();
      v->dup_next_[last_dup[node]] = id;
      last_dup[node] = id;
      continue;
    }
    size_t lcp = 0;
    if (prev)
      while (lcp < s.size() && lcp < prev->size() && s[lcp] == (*prev)[lcp]) ++lcp;
    while (path.size() > lcp + 1) {
      v->end_[path.back()] = v->byte_.size();
      path.pop_back();
    }
    for (size_t d = lcp; d < s.size(); ++d) {
      path.push_back(v->byte_.size());
      v->byte_.push_back(static_cast<uint8_t>(s[d]));
      v->depth_.push_back(static_cast<uint16_t>(d + 1));
      v->end_.push_back(0);
      v->tok_.push_back(-1);
      last_dup.push_back(-1);
    }
    v->tok_[path.back()] = id;
    last_dup[path.back()] = id;
    prev = &s;
  }
  for (uint32_t p : path) v->end_[p] = v->byte_.size();
  // Plain-token slice (see grammar.h).
  v->plain_bits_.assign(v->mask_words(), 0);
  v->impure_below_.assign(v->byte_.size(), 0);
  {
    std::vector<int> u(1, 0);
    std::vector<uint32_t> anc(1, 0);
    for (size_t i = 1; i < v->byte_.size(); ++i) {
      uint16_t d = v->depth_[i];
      u.resize(d + 1);
      anc.resize(d + 1);
      anc[d] = i;
      u[d] = u[d - 1] < 0 ? -1 : plain_step(u[d - 1], v->byte_[i]);
      if (v->tok_[i] < 0) continue;
      if (u[d] >= 0) {
        for (int32_t t = v->tok_[i]; t >= 0; t = v->dup_next_[t]) v->plain_bits_[t >> 5] |= 1u << (t & 31);
      } else {
        for (int k = d; k >= 1 && !v->impure_below_[anc[k]]; --k) v->impure_below_[anc[k]] = 1;
      }
    }
  }
  v->bytes_ = std::move(token_bytes);
  v->special_ = std::move(special);
  return v;
}

int Vocabulary::plain_step(int u, uint8_t b) {
  switch (u) {
    case 0:
      if (b >= 0x20 && b < 0x80) return (b == '"' || b == '\\') ? -1 : 0;
      if (b >= 0xC2 && b <= 0xDF) return 1;
      if (b == 0xE0) return 2;
      if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return 3;
      if (b == 0xED) return 4;
      if (b == 0xF0) return 5;
      if (b >= 0xF1 && b <= 0xF3) return 6;
      if (b == 0xF4) return 7;
      return -1;
    case 1: return b >= 0x80 && b <= 0xBF ? 0 : -1;
    case 2: return b >= 0xA0 && b <= 0xBF ? 1 : -1;
    case 3: return b >= 0x80 && b <= 0xBF ? 1 : -1;
    case 4: return b >= 0x80 && b <= 0x9F ? 1 : -1;
    case 5: return b >= 0x90 && b <= 0xBF ? 3 : -1;
    case 6: return b >= 0x80 && b <= 0xBF ? 3 : -1;
    case 7: return b >= 0x80 && b <= 0x8F ? 3 : -1;
  }
  return -1;
}

namespace {
// Does every plain byte path from q stay alive? (Then all plain tokens are accepted from q.)
bool absorbs_plain(const Machine& M, int q) {
  std::vector<std::pair<int, int>> seen = {{0, q}}, todo = {{0, q}};
  while (!todo.empty()) {
    auto [u, d] = todo.back();
    todo.pop_back();
    for (int b = 0; b < 256; ++b) {
      int u2 = Vocabulary::plain_step(u, static_cast<uint8_t>(b));
      if (u2 < 0) continue;
      int d2 = M.step(d, static_cast<uint8_t>(b));
      if (d2 < 0) return false;
      std::pair<int, int> pr{u2, d2};
      if (std::find(seen.begin(), seen.end(), pr) != seen.end()) continue;
      if (seen.size() >= 64) return false;  // not a simple string body; walk normally
      seen.push_back(pr);
      todo.push_back(pr);
    }
  }
  return true;
}
}  // namespace

// ---------------------------------------------------------------- Grammar
Grammar::Grammar(std::unique_ptr<Machine> m, std::shared_ptr<const Vocabulary> v)
    : machine_(std::move(m)), vocab_(std::move(v)) {
  cache_.reset(new std::atomic<const MaskEntry*>[machine_->num_states()]);
  for (size_t i = 0; i < machine_->num_states(); ++i) cache_[i].store(nullptr);
}

Grammar::~Grammar() {
  for (size_t i = 0; i < machine_->num_states(); ++i) delete cache_[i].load();
}

size_t Grammar::num_states() const { return machine_->num_states(); }

const MaskEntry& Grammar::entry(int q) const {
  if (const MaskEntry* e = cache_[q].load(std::memory_order_acquire)) return *e;
  const Vocabulary& V = *vocab_;
  const Machine& M = *machine_;
  auto* e = new MaskEntry;
  size_t n = V.byte_.size();
  std::vector<int32_t> st(1, q);
  bool plain = absorbs_plain(M, q);
  for (size_t i = 1; i < n;) {
    if (plain && !V.impure_below_[i]) { i = V.end_[i]; continue; }  // all plain: taken from the slice
    uint16_t d = V.depth_[i];
    int s = M.step(st[d - 1], V.byte_[i]);
    if (s < 0) { i = V.end_[i]; continue; }
    if (st.size() <= d) st.resize(d + 1);
    st[d] = s;
    for (int32_t t = V.tok_[i]; t >= 0; t = V.dup_next_[t]) e->tokens.push_back(t);
    if (V.end_[i] > i + 1 && ((M.final_[s] && M.pop_matters[s]) || !M.calls[s].empty()))
      e->uncertain.push_back({static_cast<uint32_t>(i), s});
    ++i;
  }
  // Dense bitsets only when they are smaller than the id list.
  if (plain) e->bits = V.plain_bits_;
  if (plain || e->tokens.size() > V.mask_words()) {
    if (!plain) e->bits.assign(V.mask_words(), 0);
    for (int32_t t : e->tokens) e->bits[t >> 5] |= 1u << (t & 31);
    e->tokens.clear();
    e->tokens.shrink_to_fit();
  }
  const MaskEntry* expected = nullptr;
  if (!cache_[q].compare_exchange_strong(expected, e, std::memory_order_acq_rel)) {
    delete e;
    return *expected;
  }
  return *e;
}

// ---------------------------------------------------------------- Matcher
namespace {
constexpr int32_t kEnd = -1;  // the empty stack: the whole grammar has been matched
}

Matcher::Matcher(std::shared_ptr<const Grammar> g) : g_(std::move(g)) {
  std::vector<int32_t> cfg;
  if (g_->machine().start >= 0) {
    cfg.push_back(intern(g_->machine().start, kEnd));
    closure(cfg);
  }
  history_.push_back(std::move(cfg));
  frames_mark_.push_back(frames_.size());
}

int Matcher::intern(int32_t state, int32_t parent) {
  uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(state)) << 32) | static_cast<uint32_t>(parent);
  auto [it, fresh] = frame_ids_.try_emplace(key, static_cast<int32_t>(frames_.size()));
  if (fresh) frames_.push_back({state, parent});
  return it->second;
}

void Matcher::closure(std::vector<int32_t>& set) {
  const Machine& M = g_->machine();
  size_t limit = 4096;
  std::vector<int32_t> stack;
  stack.swap(set);
  set.clear();
  // Small sets dominate; a linear membership test beats hashing there.
  auto has = [&](int32_t x) { return std::find(set.begin(), set.end(), x) != set.end(); };
  std::vector<int32_t> todo;
  for (int32_t x : stack)
    if (!has(x)) { set.push_back(x); todo.push_back(x); }
  while (!todo.empty()) {
    int32_t id = todo.back();
    todo.pop_back();
    if (id == kEnd) continue;
    Frame f = frames_[id];
    auto add = [&](int32_t x) {
      if (has(x)) return;
      if (set.size() >= limit) throw Error("grammar: too ambiguous (more than 4096 live parse stacks)");
      set.push_back(x);
      todo.push_back(x);
    };
    if (M.final_[f.state]) add(f.parent);
    for (const Machine::Call& c : M.calls[f.state]) {
      int32_t caller = intern(c.ret, f.parent);
      add(intern(c.callee_start, caller));
    }
  }
  std::sort(set.begin(), set.end());
}

bool Matcher::step(const std::vector<int32_t>& in, uint8_t b, std::vector<int32_t>& out) {
  const Machine& M = g_->machine();
  out.clear();
  for (int32_t id : in) {
    if (id == kEnd) continue;
    int t = M.step(frames_[id].state, b);
    if (t >= 0) out.push_back(intern(t, frames_[id].parent));
  }
  if (out.empty()) return false;
  closure(out);
  return true;
}

void Matcher::walk(uint32_t node, const std::vector<int32_t>& cfg, uint32_t* words, int depth) {
  const Vocabulary& V = g_->vocab();
  if (scratch_.size() <= (size_t)depth) scratch_.resize(depth + 1);
  for (uint32_t c = node + 1; c < V.end_[node]; c = V.end_[c]) {
    std::vector<int32_t>& next = scratch_[depth];
    if (!step(cfg, V.byte_[c], next)) continue;
    for (int32_t t = V.tok_[c]; t >= 0; t = V.dup_next_[t]) words[t >> 5] |= 1u << (t & 31);
    if (V.end_[c] > c + 1) {
      std::vector<int32_t> copy = next;  // scratch_[depth] is reused by the next sibling
      walk(c, copy, words, depth + 1);
    }
  }
}

void Matcher::fill_mask(uint32_t* words) {
  const Vocabulary& V = g_->vocab();
  std::memset(words, 0, V.mask_words() * sizeof(uint32_t));
  if (terminated_) return;
  const std::vector<int32_t>& cfg = history_.back();
  size_t mark = frames_.size();
  bool end = false;
  for (int32_t id : cfg) {
    if (id == kEnd) { end = true; continue; }
    Frame f = frames_[id];
    const MaskEntry& e = g_->entry(f.state);
    if (!e.bits.empty())
      for (size_t w = 0; w < e.bits.size(); ++w) words[w] |= e.bits[w];
    for (int32_t t : e.tokens) words[t >> 5] |= 1u << (t & 31);
    for (auto [node, s] : e.uncertain) {
      int32_t base = intern(s, f.parent);
      std::vector<int32_t> sub = {base};
      closure(sub);
      // The base stack itself only continues inside its rule, which the cached set covers.
      sub.erase(std::remove(sub.begin(), sub.end(), base), sub.end());
      if (!sub.empty()) walk(node, sub, words, 0);
    }
  }
  if (end && V.eos_id() >= 0) words[V.eos_id() >> 5] |= 1u << (V.eos_id() & 31);
  // Frames made while walking are garbage; drop them so memory tracks accepted text only.
  for (size_t i = mark; i < frames_.size(); ++i)
    frame_ids_.erase((static_cast<uint64_t>(static_cast<uint32_t>(frames_[i].state)) << 32) |
                     static_cast<uint32_t>(frames_[i].parent));
  frames_.resize(mark);
}

bool Matcher::accept_bytes(std::string_view bytes) {
  if (terminated_) return false;
  std::vector<int32_t> cur = history_.back(), next;
  for (unsigned char b : bytes) {
    if (!step(cur, b, next)) {
      size_t mark = frames_mark_.back();
      for (size_t i = mark; i < frames_.size(); ++i)
        frame_ids_.erase((static_cast<uint64_t>(static_cast<uint32_t>(frames_[i].state)) << 32) |
                         static_cast<uint32_t>(frames_[i].parent));
      frames_.resize(mark);
      return false;
    }
    cur.swap(next);
  }
  history_.push_back(std::move(cur));
  frames_mark_.push_back(frames_.size());
  return true;
}

bool Matcher::accept_token(int32_t id) {
  const Vocabulary& V = g_->vocab();
  if (terminated_ || id < 0 || id >= (int64_t)V.size()) return false;
  if (id == V.eos_id()) {
    if (!can_end()) return false;
    history_.push_back(history_.back());
    frames_mark_.push_back(frames_.size());
    terminated_ = true;
    return true;
  }
  if (V.is_special(id) || V.token(id).empty()) return false;
  return accept_bytes(V.token(id));
}

bool Matcher::can_end() const {
  const auto& cfg = history_.back();
  return !terminated_ && !cfg.empty() && cfg.front() == kEnd;
}

void Matcher::rollback(size_t n) {
  if (n > num_tokens()) throw Error("grammar: rollback past the start of the output");
  if (n == 0) return;
  terminated_ = false;
  history_.resize(history_.size() - n);
  frames_mark_.resize(frames_mark_.size() - n);
  size_t mark = frames_mark_.back();
  for (size_t i = mark; i < frames_.size(); ++i)
    frame_ids_.erase((static_cast<uint64_t>(static_cast<uint32_t>(frames_[i].state)) << 32) |
                     static_cast<uint32_t>(frames_[i].parent));
  frames_.resize(mark);
}

// ---------------------------------------------------------------- compile + cache
std::shared_ptr<const Grammar> compile(const Spec& spec, std::shared_ptr<const Vocabulary> vocab,
                                       const Limits& limits, const JsonOptions& json) {
  if (!vocab) throw Error("grammar: no vocabulary");
  if (spec.text.size() > limits.max_spec_bytes) throw Error("grammar: spec larger than the limit");
  Ir ir(limits);
  int root = -1;
  switch (spec.kind) {
    case SpecKind::Regex: {
      root = ir.new_rule("root");
      ir.set_rule(root, parse_regex(ir, spec.text, false, false));
      break;
    }
    case SpecKind::JsonSchema: root = compile_json_schema(ir, spec.text, json); break;
    case SpecKind::JsonObject: root = compile_json_schema(ir, "{\"type\":\"object\"}", json); break;
    case SpecKind::Gbnf: root = compile_gbnf(ir, spec.text); break;
  }
  auto m = std::make_unique<Machine>(build_machine(ir, root));
  return std::make_shared<Grammar>(std::move(m), std::move(vocab));
}

GrammarCache::GrammarCache(std::shared_ptr<const Vocabulary> vocab, size_t capacity, Limits limits,
                           JsonOptions json)
    : vocab_(std::move(vocab)), capacity_(std::max<size_t>(1, capacity)), limits_(limits), json_(json) {}

std::shared_ptr<const Grammar> GrammarCache::get(const Spec& spec) {
  std::string key = std::to_string(static_cast<int>(spec.kind)) + ":" + spec.text;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  auto g = compile(spec, vocab_, limits_, json_);  // outside the lock: compiles run in parallel
  std::lock_guard<std::mutex> lk(mu_);
  auto it = index_.find(key);
  if (it != index_.end()) return it->second->second;
  lru_.emplace_front(key, g);
  index_[key] = lru_.begin();
  if (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return g;
}

size_t GrammarCache::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return lru_.size();
}

}  // namespace deepinfer::grammar
