// IR builder, UTF-8 range encoding, Thompson NFA per rule, subset construction, liveness and
// left-recursion checks. Everything is bounded by Limits so hostile grammars fail cleanly.
#include <algorithm>
#include <chrono>
#include <map>
#include <unordered_map>

#include "grammar/ir.h"
#include "util/error.h"

namespace deepinfer::grammar {

// ---------------------------------------------------------------- IR builder
int Ir::add(Node n) {
  if (nodes_.size() >= limits_.max_ir_nodes) throw Error("grammar: too large (IR node limit)");
  nodes_.push_back(std::move(n));
  return static_cast<int>(nodes_.size()) - 1;
}
int Ir::empty() { return add(Node{}); }
int Ir::nothing() {
  Node n;
  n.kind = NodeKind::Bytes;
  return add(std::move(n));
}
int Ir::bytes(std::vector<std::pair<uint8_t, uint8_t>> ranges) {
  Node n;
  n.kind = NodeKind::Bytes;
  n.ranges = std::move(ranges);
  return add(std::move(n));
}
int Ir::literal(std::string_view s) {
  if (s.empty()) return empty();
  std::vector<int> k;
  for (unsigned char c : s) k.push_back(byte(c));
  return k.size() == 1 ? k[0] : seq(std::move(k));
}
int Ir::seq(std::vector<int> kids) {
  if (kids.size() == 1) return kids[0];
  Node n;
  n.kind = NodeKind::Seq;
  n.kids = std::move(kids);
  return add(std::move(n));
}
int Ir::alt(std::vector<int> kids) {
  if (kids.size() == 1) return kids[0];
  if (kids.empty()) return nothing();
  Node n;
  n.kind = NodeKind::Alt;
  n.kids = std::move(kids);
  return add(std::move(n));
}
int Ir::repeat(int kid, int min, int max) {
  if (min < 0 || (max >= 0 && max < min)) return nothing();
  if (min > limits_.max_repeat || max > limits_.max_repeat)
    throw Error("grammar: repetition count above limit " + std::to_string(limits_.max_repeat));
  if (min == 1 && max == 1) return kid;
  if (max == 0) return empty();
  Node n;
  n.kind = NodeKind::Repeat;
  n.kids = {kid};
  n.min = min;
  n.max = max;
  return add(std::move(n));
}
int Ir::and_(int a, int b) {
  Node n;
  n.kind = NodeKind::And;
  n.kids = {a, b};
  return add(std::move(n));
}
int Ir::ref(int rule) {
  Node n;
  n.kind = NodeKind::Ref;
  n.rule = rule;
  return add(std::move(n));
}
int Ir::graph(Node g) {
  g.kind = NodeKind::Graph;
  return add(std::move(g));
}
int Ir::new_rule(std::string name) {
  rule_body_.push_back(-1);
  rule_name_.push_back(std::move(name));
  return static_cast<int>(rule_body_.size()) - 1;
}

namespace {

int encode_utf8(uint32_t cp, uint8_t* out) {
  if (cp < 0x80) { out[0] = cp; return 1; }
  if (cp < 0x800) { out[0] = 0xC0 | (cp >> 6); out[1] = 0x80 | (cp & 63); return 2; }
  if (cp < 0x10000) {
    out[0] = 0xE0 | (cp >> 12); out[1] = 0x80 | ((cp >> 6) & 63); out[2] = 0x80 | (cp & 63);
    return 3;
  }
  out[0] = 0xF0 | (cp >> 18); out[1] = 0x80 | ((cp >> 12) & 63);
  out[2] = 0x80 | ((cp >> 6) & 63); out[3] = 0x80 | (cp & 63);
  return 4;
}

// Splits [lo, hi] (same encoded length, no surrogates) until each piece is a product of byte ranges.
void utf8_split(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  static const uint32_t bounds[] = {0x7F, 0x7FF, 0xFFFF};
  for (uint32_t b : bounds)
    if (lo <= b && hi > b) { utf8_split(lo, b, out); utf8_split(b + 1, hi, out); return; }
  uint8_t a[4], z[4];
  int n = encode_utf8(lo, a);
  for (int i = 1; i < n; ++i) {
    uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) { utf8_split(lo, lo | m, out); utf8_split((lo | m) + 1, hi, out); return; }
      if ((hi & m) != m) { utf8_split(lo, (hi & ~m) - 1, out); utf8_split(hi & ~m, hi, out); return; }
    }
  }
  encode_utf8(hi, z);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (int i = 0; i < n; ++i) seq.push_back({a[i], z[i]});
  out.push_back(std::move(seq));
}

const char* kHex = "0123456789abcdef";

}  // namespace

int Ir::codepoints(const std::vector<std::pair<uint32_t, uint32_t>>& in, bool json_string) {
  // Normalise: sort, merge, clip to Unicode scalar values (no surrogates).
  std::vector<std::pair<uint32_t, uint32_t>> r;
  for (auto [lo, hi] : in) {
    hi = std::min<uint32_t>(hi, 0x10FFFF);
    if (lo > hi) continue;
    if (lo < 0xD800 && hi >= 0xD800) {
      if (hi > 0xDFFF) r.push_back({0xE000, hi});
      r.push_back({lo, 0xD7FF});
      continue;
    }
    if (lo >= 0xD800 && lo <= 0xDFFF) lo = 0xE000;
    if (lo <= hi) r.push_back({lo, hi});
  }
  std::sort(r.begin(), r.end());
  std::vector<std::pair<uint32_t, uint32_t>> m;
  for (auto p : r) {
    if (!m.empty() && p.first <= m.back().second + 1) m.back().second = std::max(m.back().second, p.second);
    else m.push_back(p);
  }
  std::vector<int> alts;
  std::vector<std::pair<uint32_t, uint32_t>> plain;
  for (auto [lo, hi] : m) {
    if (!json_string) { plain.push_back({lo, hi}); continue; }
    // Characters JSON must escape get their escape spelling; the rest stay raw.
    for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x5C); ++c) {
      if (c >= 0x20 && c != '"' && c != '\\') continue;
      if (c == '"') { alts.push_back(literal("\\\"")); continue; }
      if (c == '\\') { alts.push_back(literal("\\\\")); continue; }
      std::vector<int> forms;
      const char* short_esc = c == 8 ? "\\b" : c == 12 ? "\\f" : c == 10 ? "\\n" : c == 13 ? "\\r" : c == 9 ? "\\t" : nullptr;
      if (short_esc) forms.push_back(literal(short_esc));
      int lo_digit = kHex[c & 15];
      auto hexd = [&](int d) {
        std::vector<std::pair<uint8_t, uint8_t>> rr = {{(uint8_t)d, (uint8_t)d}};
        if (d >= 'a') rr.push_back({(uint8_t)(d - 32), (uint8_t)(d - 32)});
        return bytes(rr);
      };
      forms.push_back(seq({literal("\\u00"), hexd(kHex[c >> 4]), hexd(lo_digit)}));
      alts.push_back(alt(forms));
    }
    uint32_t a = lo;
    while (a <= hi) {
      // Skip the escaped characters inside [a, hi].
      if (a < 0x20 || a == '"' || a == '\\') { ++a; continue; }
      uint32_t b = hi;
      if (a < '"' && b >= '"') b = '"' - 1;
      else if (a < '\\' && b >= '\\') b = '\\' - 1;
      plain.push_back({a, b});
      a = b + 1;
    }
  }
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
  for (auto [lo, hi] : plain) utf8_split(lo, hi, seqs);
  // Merge single-byte pieces into one Bytes node (a big win for ASCII classes).
  std::vector<std::pair<uint8_t, uint8_t>> ascii;
  for (auto& s : seqs) {
    if (s.size() == 1) { ascii.push_back(s[0]); continue; }
    std::vector<int> k;
    for (auto p : s) k.push_back(bytes({p}));
    alts.push_back(seq(std::move(k)));
  }
  if (!ascii.empty()) alts.push_back(bytes(std::move(ascii)));
  return alt(std::move(alts));
}

// ---------------------------------------------------------------- NFA
namespace {

struct NEdge {
  int to;
  int16_t lo, hi;  // lo < 0: epsilon (or call when call >= 0)
  int call;
};

// Out-edges of one NFA state. Most states have one or two (Thompson construction), so those live
// inline: a vector per state made allocation a fifth of a median schema's compile time.
class EdgeList {
 public:
  void push_back(const NEdge& e) {
    if (more_.empty() && n_ < 2) { inl_[n_++] = e; return; }
    if (more_.empty()) more_.assign(inl_, inl_ + n_);
    more_.push_back(e);
  }
  const NEdge* begin() const { return more_.empty() ? inl_ : more_.data(); }
  const NEdge* end() const { return more_.empty() ? inl_ + n_ : more_.data() + more_.size(); }

 private:
  NEdge inl_[2];
  uint8_t n_ = 0;
  std::vector<NEdge> more_;
};

struct Nfa {
  std::vector<EdgeList> out;
  int start = 0, accept = 0;
  int add() { out.emplace_back(); return static_cast<int>(out.size()) - 1; }
};

struct Dfa {
  int nclass = 0;
  uint8_t classmap[256] = {};
  std::vector<int32_t> trans;  // nstates * nclass
  std::vector<uint8_t> final_;
  std::vector<std::vector<std::pair<int, int>>> calls;  // (kept rule, target)
  size_t size() const { return final_.size(); }
};

using Clock = std::chrono::steady_clock;

struct Builder {
  const Ir& ir;
  const std::vector<int>& kept;  // rule -> kept index or -1
  Clock::time_point deadline;
  size_t* nfa_total;
  size_t* dfa_total;
  int inline_depth = 0;

  void check_time() const {
    if (Clock::now() > deadline) throw Error("grammar: compile time limit exceeded");
  }
  int add(Nfa& n) {
    if (++*nfa_total > ir.limits().max_nfa_states) throw Error("grammar: too large (NFA state limit)");
    return n.add();
  }
  static void eps(Nfa& n, int a, int b) { n.out[a].push_back({b, -1, -1, -1}); }

  int build(Nfa& n, int id, int entry) {
    const Node& nd = ir.node(id);
    switch (nd.kind) {
      case NodeKind::Empty: return entry;
      case NodeKind::Bytes: {
        int s = add(n);
        for (auto [lo, hi] : nd.ranges) n.out[entry].push_back({s, lo, hi, -1});
        return s;
      }
      case NodeKind::Seq: {
        int cur = entry;
        for (int k : nd.kids) cur = build(n, k, cur);
        return cur;
      }
      case NodeKind::Alt: {
        int exit = add(n);
        for (int k : nd.kids) {
          int e = add(n);
          eps(n, entry, e);
          eps(n, build(n, k, e), exit);
        }
        return exit;
      }
      case NodeKind::Repeat: {
        if ((*nfa_total & 1023) == 0) check_time();
        int cur = entry;
        for (int i = 0; i < nd.min; ++i) {
          int e = add(n);
          eps(n, cur, e);
          cur = build(n, nd.kids[0], e);
        }
        if (nd.max < 0) {
          int loop = add(n);
          eps(n, cur, loop);
          int e = add(n);
          eps(n, loop, e);
          eps(n, build(n, nd.kids[0], e), loop);
          return loop;
        }
        int exit = add(n);
        for (int i = nd.min; i < nd.max; ++i) {
          eps(n, cur, exit);
          int e = add(n);
          eps(n, cur, e);
          cur = build(n, nd.kids[0], e);
        }
        eps(n, cur, exit);
        return exit;
      }
      case NodeKind::Ref: {
        if (kept[nd.rule] >= 0) {
          int s = add(n);
          n.out[entry].push_back({s, -1, -1, kept[nd.rule]});
          return s;
        }
        if (++inline_depth > 2000) throw Error("grammar: rule inlining too deep");
        int x = build(n, ir.rule_body(nd.rule), entry);
        --inline_depth;
        return x;
      }
      case NodeKind::And: {
        Dfa a = to_dfa(nd.kids[0]), b = to_dfa(nd.kids[1]);
        return embed_product(n, a, b, entry);
      }
      case NodeKind::Graph: {
        std::vector<int> st(nd.g_states);
        for (auto& s : st) s = add(n);
        eps(n, entry, st[nd.g_start]);
        for (const GraphEdge& e : nd.g_edges) {
          if (e.node < 0) { eps(n, st[e.from], st[e.to]); continue; }
          int x = add(n);
          eps(n, st[e.from], x);
          eps(n, build(n, e.node, x), st[e.to]);
        }
        int exit = add(n);
        for (int f : nd.g_finals) eps(n, st[f], exit);
        return exit;
      }
    }
    return entry;
  }

  Dfa to_dfa(int node) {
    Nfa n;
    n.start = add(n);
    n.accept = build(n, node, n.start);
    for (auto& v : n.out)
      for (auto& e : v)
        if (e.call >= 0) throw Error("grammar: recursive rule inside an intersection (allOf/pattern)");
    return determinize(n);
  }

  // Product of two call-free DFAs, copied into n as byte edges.
  int embed_product(Nfa& n, const Dfa& a, const Dfa& b, int entry) {
    int exit = add(n);
    if (a.size() == 0 || b.size() == 0) return exit;
    std::map<std::pair<int, int>, int> ids;
    std::vector<std::pair<int, int>> work;
    auto get = [&](int x, int y) {
      auto [it, fresh] = ids.try_emplace({x, y}, 0);
      if (fresh) {
        it->second = add(n);
        work.push_back({x, y});
        if (ids.size() > ir.limits().max_dfa_states) throw Error("grammar: too large (intersection)");
      }
      return it->second;
    };
    eps(n, entry, get(0, 0));
    while (!work.empty()) {
      auto [x, y] = work.back();
      work.pop_back();
      int s = ids[{x, y}];
      if (a.final_[x] && b.final_[y]) eps(n, s, exit);
      for (int c = 0; c < 256; ++c) {
        int tx = a.trans[x * a.nclass + a.classmap[c]], ty = b.trans[y * b.nclass + b.classmap[c]];
        if (tx < 0 || ty < 0) continue;
        int t = get(tx, ty);
        // Coalesce runs of bytes going to the same product state.
        int c2 = c;
        while (c2 + 1 < 256 && a.trans[x * a.nclass + a.classmap[c2 + 1]] == tx &&
               b.trans[y * b.nclass + b.classmap[c2 + 1]] == ty)
          ++c2;
        n.out[s].push_back({t, (int16_t)c, (int16_t)c2, -1});
        c = c2;
      }
    }
    return exit;
  }

  Dfa determinize(const Nfa& n) {
    Dfa d;
    // Byte classes: bytes no edge distinguishes share a class.
    bool cut[257] = {};
    for (auto& v : n.out)
      for (auto& e : v)
        if (e.lo >= 0) { cut[e.lo] = true; cut[e.hi + 1] = true; }
    int cls = 0;
    for (int b = 0; b < 256; ++b) {
      if (b > 0 && cut[b]) ++cls;
      d.classmap[b] = static_cast<uint8_t>(cls);
    }
    d.nclass = cls + 1;
    std::vector<uint32_t> stamp(n.out.size(), 0);
    uint32_t gen = 0;
    std::vector<int> stack;  // reused by every closure
    auto close = [&](std::vector<int>& set) {
      ++gen;
      stack.clear();
      for (int s : set)  // a bucket can name a state twice
        if (stamp[s] != gen) { stamp[s] = gen; stack.push_back(s); }
      set.clear();
      while (!stack.empty()) {
        int s = stack.back();
        stack.pop_back();
        set.push_back(s);
        for (auto& e : n.out[s])
          if (e.lo < 0 && e.call < 0 && stamp[e.to] != gen) { stamp[e.to] = gen; stack.push_back(e.to); }
      }
      std::sort(set.begin(), set.end());
    };
    struct VecHash {
      size_t operator()(const std::vector<int>& v) const {
        uint64_t h = 1469598103934665603ull;
        for (int x : v) h = (h ^ static_cast<uint32_t>(x)) * 1099511628211ull;
        return h;
      }
    };
    std::unordered_map<std::vector<int>, int, VecHash> ids;
    std::vector<std::vector<int>> sets;
    auto get = [&](std::vector<int> set) {
      auto [it, fresh] = ids.try_emplace(std::move(set), (int)sets.size());
      if (fresh) {
        if (++*dfa_total > ir.limits().max_dfa_states) throw Error("grammar: too large (DFA state limit)");
        sets.push_back(it->first);
      }
      return it->second;
    };
    std::vector<int> s0 = {n.start};
    close(s0);
    get(std::move(s0));
    std::vector<std::vector<int>> buckets(d.nclass);
    for (size_t i = 0; i < sets.size(); ++i) {
      if ((i & 63) == 0) check_time();
      for (auto& b : buckets) b.clear();
      std::map<int, std::vector<int>> callb;
      bool fin = false;
      for (int s : sets[i]) {
        if (s == n.accept) fin = true;
        for (auto& e : n.out[s]) {
          if (e.call >= 0) callb[e.call].push_back(e.to);
          else if (e.lo >= 0)
            for (int c = d.classmap[e.lo]; c <= d.classmap[e.hi]; ++c) buckets[c].push_back(e.to);
        }
      }
      d.final_.push_back(fin);
      d.trans.resize((i + 1) * d.nclass, -1);
      for (int c = 0; c < d.nclass; ++c) {
        if (buckets[c].empty()) continue;
        std::vector<int> t;
        t.swap(buckets[c]);  // the bucket is cleared before its next use anyway
        close(t);
        int id = get(std::move(t));
        d.trans[i * d.nclass + c] = id;
      }
      d.calls.emplace_back();
      for (auto& [r, v] : callb) {
        std::vector<int> t = v;
        close(t);
        int id = get(std::move(t));
        d.calls[i].push_back({r, id});
      }
    }
    return d;
  }
};

// Merges states with identical transitions, round by round from the leaves up (the UTF-8 tails of
// every character class, for instance), so fewer states need a token set. Only equivalent states
// are ever merged, so it can stop early; it is not a full minimization. State 0 stays the start.
void minimize(Dfa& d) {
  size_t n = d.size();
  if (n <= 1) return;
  std::vector<int> cls(n), next(n);
  for (size_t s = 0; s < n; ++s) cls[s] = static_cast<int>(s);
  size_t count = n;
  std::vector<int> flat;
  std::vector<size_t> off(n + 1);
  std::vector<uint64_t> hash(n);  // signature hash per state
  std::vector<int> order(n);      // states sorted by (hash, id)
  std::vector<int> rep_state;     // class -> its first state
  int rounds = 0;
  for (;;) {
    flat.clear();
    for (size_t s = 0; s < n; ++s) {
      off[s] = flat.size();
      flat.push_back(d.final_[s]);
      for (int c = 0; c < d.nclass; ++c) {
        int t = d.trans[s * d.nclass + c];
        flat.push_back(t < 0 ? -1 : cls[t]);
      }
      if (!d.calls[s].empty()) {
        auto calls = d.calls[s];
        for (auto& [r, t] : calls) t = cls[t];
        std::sort(calls.begin(), calls.end());
        calls.erase(std::unique(calls.begin(), calls.end()), calls.end());
        for (auto [r, t] : calls) { flat.push_back(r); flat.push_back(t); }
      }
    }
    off[n] = flat.size();
    // Group states by signature hash (a sort, not a hash map of vectors: no allocation per
    // group), then split each equal-hash run by exact comparison.
    for (size_t s = 0; s < n; ++s) {
      uint64_t h = 1469598103934665603ull;
      for (size_t i = off[s]; i < off[s + 1]; ++i) h = (h ^ static_cast<uint32_t>(flat[i])) * 1099511628211ull;
      hash[s] = h;
      order[s] = static_cast<int>(s);
    }
    std::sort(order.begin(), order.end(), [&](int a, int b) { return hash[a] != hash[b] ? hash[a] < hash[b] : a < b; });
    rep_state.clear();
    for (size_t i = 0; i < n;) {
      size_t j = i;
      while (j < n && hash[order[j]] == hash[order[i]]) ++j;
      size_t first_class = rep_state.size();
      for (size_t k = i; k < j; ++k) {
        int s = order[k], found = -1;
        for (size_t c = first_class; c < rep_state.size(); ++c) {
          int r = rep_state[c];
          if (off[r + 1] - off[r] == off[s + 1] - off[s] &&
              std::equal(flat.begin() + off[r], flat.begin() + off[r + 1], flat.begin() + off[s])) { found = (int)c; break; }
        }
        if (found < 0) {
          found = static_cast<int>(rep_state.size());
          rep_state.push_back(s);
        }
        next[s] = found;
      }
      i = j;
    }
    bool done = rep_state.size() == count || ++rounds >= 5;
    count = rep_state.size();
    cls.swap(next);
    if (done) break;
  }
  // Renumber so that the start state's class is 0.
  std::vector<int> remap(count, -1), rep(count, -1);
  int k = 0;
  remap[cls[0]] = k++;
  for (size_t s = 0; s < n; ++s)
    if (remap[cls[s]] < 0) remap[cls[s]] = k++;
  for (size_t s = 0; s < n; ++s)
    if (rep[remap[cls[s]]] < 0) rep[remap[cls[s]]] = s;
  Dfa m;
  m.nclass = d.nclass;
  std::copy(d.classmap, d.classmap + 256, m.classmap);
  m.trans.resize(count * d.nclass);
  m.final_.resize(count);
  m.calls.resize(count);
  for (size_t c = 0; c < count; ++c) {
    int s = rep[c];
    m.final_[c] = d.final_[s];
    for (int b = 0; b < d.nclass; ++b) {
      int t = d.trans[s * d.nclass + b];
      m.trans[c * d.nclass + b] = t < 0 ? -1 : remap[cls[t]];
    }
    for (auto [r, t] : d.calls[s]) m.calls[c].push_back({r, remap[cls[t]]});
    std::sort(m.calls[c].begin(), m.calls[c].end());
    m.calls[c].erase(std::unique(m.calls[c].begin(), m.calls[c].end()), m.calls[c].end());
  }
  d = std::move(m);
}

// Rules on a cycle of Ref edges must stay rules (call edges); all others are inlined.
std::vector<int> find_recursive(const Ir& ir) {
  size_t R = ir.num_rules();
  std::vector<std::vector<int>> refs(R);
  for (size_t r = 0; r < R; ++r) {
    std::vector<int> stack = {ir.rule_body(r)};
    std::vector<char> seen(ir.size(), 0);
    while (!stack.empty()) {
      int id = stack.back();
      stack.pop_back();
      if (id < 0 || seen[id]) continue;
      seen[id] = 1;
      const Node& n = ir.node(id);
      if (n.kind == NodeKind::Ref) refs[r].push_back(n.rule);
      for (int k : n.kids) stack.push_back(k);
      for (auto& e : n.g_edges)
        if (e.node >= 0) stack.push_back(e.node);
    }
  }
  // Tarjan SCC, iterative.
  std::vector<int> index(R, -1), low(R, 0), comp(R, -1);
  std::vector<char> on(R, 0);
  std::vector<int> st;
  int idx = 0, ncomp = 0;
  std::vector<int> rec(R, 0);
  for (size_t root = 0; root < R; ++root) {
    if (index[root] >= 0) continue;
    std::vector<std::pair<int, size_t>> cs = {{(int)root, 0}};
    index[root] = low[root] = idx++;
    st.push_back(root);
    on[root] = 1;
    while (!cs.empty()) {
      auto& [v, i] = cs.back();
      if (i < refs[v].size()) {
        int w = refs[v][i++];
        if (index[w] < 0) {
          index[w] = low[w] = idx++;
          st.push_back(w);
          on[w] = 1;
          cs.push_back({w, 0});
        } else if (on[w]) {
          low[v] = std::min(low[v], index[w]);
        }
      } else {
        int vv = v;
        if (low[vv] == index[vv]) {
          std::vector<int> members;
          int w;
          do {
            w = st.back();
            st.pop_back();
            on[w] = 0;
            comp[w] = ncomp;
            members.push_back(w);
          } while (w != vv);
          bool self = false;
          for (int x : refs[vv]) self |= x == vv;
          if (members.size() > 1 || self)
            for (int m : members) rec[m] = 1;
          ++ncomp;
        }
        cs.pop_back();
        if (!cs.empty()) low[cs.back().first] = std::min(low[cs.back().first], low[vv]);
      }
    }
  }
  return rec;
}

}  // namespace

Machine build_machine(const Ir& ir, int start_rule) {
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(ir.limits().compile_seconds));
  for (size_t r = 0; r < ir.num_rules(); ++r)
    if (ir.rule_body(r) < 0) throw Error("grammar: rule '" + ir.rule_name(r) + "' is not defined");
  std::vector<int> rec = find_recursive(ir);
  std::vector<int> kept(ir.num_rules(), -1);
  std::vector<int> kept_rules;
  kept[start_rule] = 0;
  kept_rules.push_back(start_rule);
  for (size_t r = 0; r < ir.num_rules(); ++r)
    if (rec[r] && kept[r] < 0) {
      kept[r] = (int)kept_rules.size();
      kept_rules.push_back(r);
    }
  size_t nfa_total = 0, dfa_total = 0;
  Builder b{ir, kept, deadline, &nfa_total, &dfa_total};
  std::vector<Dfa> dfas;
  for (int r : kept_rules) {
    Nfa n;
    n.start = b.add(n);
    n.accept = b.build(n, ir.rule_body(r), n.start);
    dfas.push_back(b.determinize(n));
  }
  size_t K = dfas.size();
  // Liveness: a state is live if it can reach a final state; a rule is productive if its start is.
  std::vector<std::vector<char>> live(K);
  for (size_t k = 0; k < K; ++k) live[k].assign(dfas[k].size(), 0);
  std::vector<char> prod(K, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t k = 0; k < K; ++k) {
      const Dfa& d = dfas[k];
      for (size_t s = d.size(); s-- > 0;) {
        if (live[k][s]) continue;
        bool l = d.final_[s];
        for (int c = 0; !l && c < d.nclass; ++c) {
          int t = d.trans[s * d.nclass + c];
          l = t >= 0 && live[k][t];
        }
        for (auto [r, t] : d.calls[s]) l = l || (prod[r] && live[k][t]);
        if (l) { live[k][s] = 1; changed = true; }
      }
      if (!prod[k] && live[k][0]) { prod[k] = 1; changed = true; }
    }
  }
  // Drop edges into dead states (so any non-empty configuration is viable), then minimize.
  std::vector<char> start_live(K);
  for (size_t k = 0; k < K; ++k) {
    Dfa& d = dfas[k];
    start_live[k] = live[k][0];
    for (size_t s = 0; s < d.size(); ++s) {
      for (int c = 0; c < d.nclass; ++c) {
        int& t = d.trans[s * d.nclass + c];
        if (t >= 0 && !live[k][t]) t = -1;
      }
      std::vector<std::pair<int, int>> keep;
      for (auto [r, t] : d.calls[s])
        if (prod[r] && live[k][t]) keep.push_back({r, t});
      d.calls[s] = std::move(keep);
    }
    minimize(d);
    live[k].assign(d.size(), 1);
  }
  // Left recursion: a rule reaching a call to itself without consuming a byte would loop forever.
  std::vector<char> nullable(K, 0);
  auto eps_reach = [&](size_t k) {
    std::vector<int> seen(dfas[k].size(), 0), st = {0}, out;
    seen[0] = 1;
    while (!st.empty()) {
      int s = st.back();
      st.pop_back();
      out.push_back(s);
      for (auto [r, t] : dfas[k].calls[s])
        if (nullable[r] && !seen[t]) { seen[t] = 1; st.push_back(t); }
    }
    return out;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t k = 0; k < K; ++k) {
      if (nullable[k]) continue;
      for (int s : eps_reach(k))
        if (dfas[k].final_[s]) { nullable[k] = 1; changed = true; break; }
    }
  }
  {
    std::vector<std::vector<int>> g(K);
    for (size_t k = 0; k < K; ++k)
      for (int s : eps_reach(k))
        for (auto [r, t] : dfas[k].calls[s])
          if (prod[r]) g[k].push_back(r);
    std::vector<int> color(K, 0);
    for (size_t root = 0; root < K; ++root) {
      if (color[root]) continue;
      std::vector<std::pair<int, size_t>> st = {{(int)root, 0}};
      color[root] = 1;
      while (!st.empty()) {
        auto& [v, i] = st.back();
        if (i < g[v].size()) {
          int w = g[v][i++];
          if (color[w] == 1)
            throw Error("grammar: left recursion through rule '" + ir.rule_name(kept_rules[w]) +
                        "' is not supported (rewrite with repetition)");
          if (color[w] == 0) { color[w] = 1; st.push_back({w, 0}); }
        } else {
          color[v] = 2;
          st.pop_back();
        }
      }
    }
  }
  // Assemble, dropping edges into dead states so that any non-empty configuration is viable.
  Machine m;
  std::vector<uint32_t> base(K);
  size_t total = 0;
  for (size_t k = 0; k < K; ++k) { base[k] = total; total += dfas[k].size(); }
  std::vector<char> called(K, 0);
  for (size_t k = 0; k < K; ++k)
    for (auto& v : dfas[k].calls)
      for (auto [r, t] : v) called[r] = 1;
  m.final_.resize(total);
  m.calls.resize(total);
  m.class_base.resize(total);
  m.row_base.resize(total);
  m.pop_matters.resize(total);
  for (size_t k = 0; k < K; ++k) {
    const Dfa& d = dfas[k];
    uint32_t cb = m.classes.size();
    m.classes.insert(m.classes.end(), d.classmap, d.classmap + 256);
    for (size_t s = 0; s < d.size(); ++s) {
      size_t g = base[k] + s;
      m.final_[g] = d.final_[s];
      m.class_base[g] = cb;
      m.row_base[g] = m.trans.size();
      m.pop_matters[g] = called[k];
      for (int c = 0; c < d.nclass; ++c) {
        int t = d.trans[s * d.nclass + c];
        m.trans.push_back(t >= 0 && live[k][t] ? (int32_t)(base[k] + t) : -1);
      }
      for (auto [r, t] : d.calls[s])
        if (prod[r] && live[k][t]) m.calls[g].push_back({(int)base[r], (int)(base[k] + t)});
    }
  }
  m.start = start_live[0] ? 0 : -1;
  return m;
}

}  // namespace deepinfer::grammar
