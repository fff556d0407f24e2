// GBNF front-end (llama.cpp dialect): `name ::= alternatives`, "literals", [classes] over code
// points, '.', groups, * + ? {m} {m,} {m,n}, # comments; the start rule is `root`.
#include <algorithm>
#include <map>
#include <string>

#include "grammar/ir.h"
#include "util/error.h"

namespace deepinfer::grammar {

namespace {

class GbnfParser {
 public:
  GbnfParser(Ir& ir, std::string_view s) : ir_(ir), s_(s) {}

  int parse() {
    skip(true);
    while (pos_ < s_.size()) {
      std::string name = ident();
      if (name.empty()) fail("expected a rule name");
      skip(true);
      if (s_.substr(pos_, 3) != "::=") fail("expected '::=' after rule name '" + name + "'");
      pos_ += 3;
      int r = rule(name);
      if (ir_.rule_body(r) >= 0) fail("rule '" + name + "' defined twice");
      ir_.set_rule(r, alternatives(0));
      skip(true);
    }
    auto it = rules_.find("root");
    if (it == rules_.end() || ir_.rule_body(it->second) < 0) throw Error("gbnf: no 'root' rule");
    return it->second;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    size_t line = 1;
    for (size_t i = 0; i < pos_ && i < s_.size(); ++i) line += s_[i] == '\n';
    throw Error("gbnf: " + why + " (line " + std::to_string(line) + ")");
  }
  int rule(const std::string& name) {
    auto it = rules_.find(name);
    if (it != rules_.end()) return it->second;
    int r = ir_.new_rule(name);
    rules_[name] = r;
    return r;
  }
  static bool is_name(char c) { return isalnum((unsigned char)c) || c == '_' || c == '-'; }
  std::string ident() {
    size_t start = pos_;
    while (pos_ < s_.size() && is_name(s_[pos_])) ++pos_;
    return std::string(s_.substr(start, pos_ - start));
  }
  void skip(bool newlines) {
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c == '#') { while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_; }
      else if (c == ' ' || c == '\t' || c == '\r' || c == '\n') ++pos_;
      else break;
    }
  }
  // Is the text at pos_ the start of the next rule (`name ::=`)?
  bool at_rule_start() {
    size_t save = pos_;
    std::string n = ident();
    skip(true);
    bool yes = !n.empty() && s_.substr(pos_, 3) == "::=";
    pos_ = save;
    return yes;
  }

  uint32_t hex(int n) {
    uint32_t v = 0;
    for (int i = 0; i < n; ++i) {
      if (pos_ >= s_.size() || !isxdigit((unsigned char)s_[pos_])) fail("bad hex escape");
      char c = s_[pos_++];
      v = v * 16 + (isdigit((unsigned char)c) ? c - '0' : (tolower(c) - 'a' + 10));
    }
    return v;
  }
  uint32_t chr() {
    if (pos_ >= s_.size()) fail("unexpected end of grammar");
    unsigned char c = s_[pos_];
    if (c == '\\') {
      ++pos_;
      if (pos_ >= s_.size()) fail("trailing backslash");
      char e = s_[pos_++];
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '0': return 0;
        case 'x': return hex(2);
        case 'u': return hex(4);
        case 'U': { uint32_t v = hex(8); if (v > 0x10FFFF) fail("code point out of range"); return v; }
        case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': return (unsigned char)e;
        default: fail(std::string("unknown escape \\") + e);
      }
    }
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || pos_ + n > s_.size()) fail("invalid UTF-8");
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 31) : n == 3 ? (c & 15) : (c & 7);
    for (int i = 1; i < n; ++i) {
      unsigned char d = s_[pos_ + i];
      if ((d >> 6) != 2) fail("invalid UTF-8");
      cp = (cp << 6) | (d & 63);
    }
    pos_ += n;
    return cp;
  }

  int alternatives(int depth) {
    if (depth > ir_.limits().max_nesting) fail("nesting too deep");
    std::vector<int> alts;
    while (true) {
      alts.push_back(sequence(depth));
      skip(true);
      if (pos_ < s_.size() && s_[pos_] == '|') { ++pos_; continue; }
      break;
    }
    return ir_.alt(std::move(alts));
  }

  int sequence(int depth) {
    std::vector<int> items;
    while (true) {
      skip(true);
      if (pos_ >= s_.size()) break;
      char c = s_[pos_];
      if (c == '|' || c == ')') break;
      int atom;
      if (c == '"') {
        ++pos_;
        std::vector<int> lits;
        while (pos_ < s_.size() && s_[pos_] != '"') {
          uint32_t cp = chr();
          lits.push_back(ir_.codepoints({{cp, cp}}));
        }
        if (pos_ >= s_.size()) fail("unterminated string");
        ++pos_;
        atom = lits.empty() ? ir_.empty() : ir_.seq(std::move(lits));
      } else if (c == '[') {
        ++pos_;
        bool neg = pos_ < s_.size() && s_[pos_] == '^';
        if (neg) ++pos_;
        std::vector<std::pair<uint32_t, uint32_t>> r;
        while (pos_ < s_.size() && s_[pos_] != ']') {
          uint32_t lo = chr(), hi = lo;
          if (pos_ + 1 < s_.size() && s_[pos_] == '-' && s_[pos_ + 1] != ']') {
            ++pos_;
            hi = chr();
            if (hi < lo) fail("range out of order");
          }
          r.push_back({lo, hi});
        }
        if (pos_ >= s_.size()) fail("unterminated character class");
        ++pos_;
        if (neg) {
          std::sort(r.begin(), r.end());
          std::vector<std::pair<uint32_t, uint32_t>> c2;
          uint32_t next = 0;
          for (auto [lo, hi] : r) {
            if (lo > next) c2.push_back({next, lo - 1});
            next = std::max(next, hi + 1);
          }
          if (next <= 0x10FFFF) c2.push_back({next, 0x10FFFF});
          r = std::move(c2);
        }
        atom = ir_.codepoints(r);
      } else if (c == '.') {
        ++pos_;
        atom = ir_.codepoints({{0, 0x10FFFF}});
      } else if (c == '(') {
        ++pos_;
        atom = alternatives(depth + 1);
        skip(true);
        if (pos_ >= s_.size() || s_[pos_] != ')') fail("missing ')'");
        ++pos_;
      } else if (is_name(c)) {
        if (at_rule_start()) break;
        atom = ir_.ref(rule(ident()));
      } else if (c == '<') {
        fail("token terminals (<...>) are not supported");
      } else {
        fail(std::string("unexpected character '") + c + "'");
      }
      // Postfix operators bind to the atom just parsed (no whitespace needed).
      while (pos_ < s_.size()) {
        char q = s_[pos_];
        if (q == '*') { ++pos_; atom = ir_.star(atom); }
        else if (q == '+') { ++pos_; atom = ir_.plus(atom); }
        else if (q == '?') { ++pos_; atom = ir_.opt(atom); }
        else if (q == '{') {
          ++pos_;
          skip(false);
          long long mn = number(), mx = mn;
          skip(false);
          if (pos_ < s_.size() && s_[pos_] == ',') {
            ++pos_;
            skip(false);
            mx = (pos_ < s_.size() && isdigit((unsigned char)s_[pos_])) ? number() : -1;
            skip(false);
          }
          if (pos_ >= s_.size() || s_[pos_] != '}') fail("bad {m,n}");
          ++pos_;
          if (mx >= 0 && mx < mn) fail("{m,n} with n < m");
          atom = ir_.repeat(atom, (int)mn, (int)mx);
        } else break;
      }
      items.push_back(atom);
    }
    return items.empty() ? ir_.empty() : ir_.seq(std::move(items));
  }

  long long number() {
    size_t start = pos_;
    long long v = 0;
    while (pos_ < s_.size() && isdigit((unsigned char)s_[pos_])) {
      v = v * 10 + (s_[pos_++] - '0');
      if (v > ir_.limits().max_repeat) fail("repetition count above limit");
    }
    if (pos_ == start) fail("expected a number");
    return v;
  }

  Ir& ir_;
  std::string_view s_;
  size_t pos_ = 0;
  std::map<std::string, int> rules_;
};

}  // namespace

int compile_gbnf(Ir& ir, std::string_view text) {
  GbnfParser p(ir, text);
  return p.parse();
}

}  // namespace deepinfer::grammar
