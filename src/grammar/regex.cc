// Regex front-end: an ECMAScript/Python-compatible subset over Unicode code points, lowered to
// UTF-8 bytes. Features whose meaning is not regular (backreferences, lookaround, \b) are errors.
// Where JavaScript and Python disagree (\s, \d, \w, '.') the common subset is used, so anything
// the matcher allows also matches under Python's `re` (the judge in the tests).
#include <algorithm>
#include <string>

#include "grammar/ir.h"
#include "util/error.h"

namespace deepinfer::grammar {

namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

Ranges complement(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  uint32_t next = 0;
  for (auto [lo, hi] : r) {
    if (lo > next) out.push_back({next, lo - 1});
    if (hi + 1 > next) next = hi + 1;
  }
  if (next <= 0x10FFFF) out.push_back({next, 0x10FFFF});
  return out;
}

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}};
// Complements stay inside ASCII: Python's \D, \W, \S exclude Unicode digits/letters/spaces.
Ranges ascii_complement(const Ranges& r) {
  Ranges out;
  for (auto p : complement(r))
    if (p.first <= 0x7F) out.push_back({p.first, std::min<uint32_t>(p.second, 0x7F)});
  return out;
}

class Parser {
 public:
  Parser(Ir& ir, std::string_view s, bool json) : ir_(ir), s_(s), json_(json) {}

  int parse(bool search) {
    std::vector<int> alts;
    do {
      bool anchored_start = false, anchored_end = false;
      if (peek('^')) { ++pos_; anchored_start = true; }
      std::vector<int> items = seq(0, &anchored_end);
      if (search) {
        if (!anchored_start) items.insert(items.begin(), any_star());
        if (!anchored_end) items.push_back(any_star());
      }
      alts.push_back(ir_.seq(items.empty() ? std::vector<int>{ir_.empty()} : items));
    } while (eat('|'));
    if (pos_ != s_.size()) fail("unbalanced ')'");
    return ir_.alt(std::move(alts));
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw Error("regex: " + why + " at offset " + std::to_string(pos_));
  }
  bool peek(char c) const { return pos_ < s_.size() && s_[pos_] == c; }
  bool eat(char c) {
    if (!peek(c)) return false;
    ++pos_;
    return true;
  }
  int any_star() { return ir_.star(ir_.codepoints({{0, 0x10FFFF}}, json_)); }
  int cls(const Ranges& r) { return ir_.codepoints(r, json_); }

  uint32_t utf8_char() {
    unsigned char c = s_[pos_];
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || pos_ + n > s_.size()) fail("invalid UTF-8 in pattern");
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 31) : n == 3 ? (c & 15) : (c & 7);
    for (int i = 1; i < n; ++i) {
      unsigned char d = s_[pos_ + i];
      if ((d >> 6) != 2) fail("invalid UTF-8 in pattern");
      cp = (cp << 6) | (d & 63);
    }
    pos_ += n;
    return cp;
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

  // An escape after '\'. Returns true with a class in `out`, for both single chars and \d etc.
  void escape(Ranges& out, bool in_class) {
    if (pos_ >= s_.size()) fail("trailing backslash");
    char c = s_[pos_++];
    switch (c) {
      case 'd': out = kDigit; return;
      case 'D': out = ascii_complement(kDigit); return;
      case 'w': out = kWord; return;
      case 'W': out = ascii_complement(kWord); return;
      case 's': out = kSpace; return;
      case 'S': out = ascii_complement(kSpace); return;
      case 'n': out = {{'\n', '\n'}}; return;
      case 'r': out = {{'\r', '\r'}}; return;
      case 't': out = {{'\t', '\t'}}; return;
      case 'f': out = {{'\f', '\f'}}; return;
      case 'v': out = {{'\v', '\v'}}; return;
      case '0': out = {{0, 0}}; return;
      case 'x': { uint32_t v = hex(2); out = {{v, v}}; return; }
      case 'u': {
        uint32_t v;
        if (eat('{')) {
          v = 0;
          int n = 0;
          while (pos_ < s_.size() && s_[pos_] != '}') { v = v * 16 + hex(1); if (++n > 6) fail("bad \\u{}"); }
          if (!eat('}') || n == 0 || v > 0x10FFFF) fail("bad \\u{}");
        } else {
          v = hex(4);
          if (v >= 0xD800 && v <= 0xDBFF && pos_ + 6 <= s_.size() && s_[pos_] == '\\' && s_[pos_ + 1] == 'u') {
            pos_ += 2;
            uint32_t lo = hex(4);
            if (lo < 0xDC00 || lo > 0xDFFF) fail("unpaired surrogate");
            v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
          }
        }
        out = {{v, v}};
        return;
      }
      case 'c': {
        if (pos_ >= s_.size() || !isalpha((unsigned char)s_[pos_])) fail("bad \\c");
        uint32_t v = s_[pos_++] % 32;
        out = {{v, v}};
        return;
      }
      case 'b':
        if (in_class) { out = {{8, 8}}; return; }
        fail("word boundary \\b is not supported");
      case 'B': fail("\\B is not supported");
      case 'p': case 'P': fail("Unicode property escapes are not supported");
      case 'k': fail("named backreferences are not supported");
      default:
        if (c >= '1' && c <= '9') fail("backreferences are not supported");
        if (isalnum((unsigned char)c)) fail(std::string("unknown escape \\") + c);
        --pos_;
        { uint32_t v = utf8_char(); out = {{v, v}}; }
        return;
    }
  }

  int char_class() {
    bool neg = eat('^');
    Ranges r;
    bool first = true;
    while (true) {
      if (pos_ >= s_.size()) fail("unterminated character class");
      if (peek(']') && !(first && false)) { ++pos_; break; }
      first = false;
      Ranges item;
      if (eat('\\')) escape(item, true);
      else if (peek('[') && pos_ + 1 < s_.size() && s_[pos_ + 1] == ':') fail("POSIX classes are not supported");
      else { uint32_t v = utf8_char(); item = {{v, v}}; }
      if (item.size() == 1 && item[0].first == item[0].second && peek('-') && pos_ + 1 < s_.size() &&
          s_[pos_ + 1] != ']') {
        ++pos_;
        Ranges hi;
        if (eat('\\')) escape(hi, true);
        else { uint32_t v = utf8_char(); hi = {{v, v}}; }
        if (hi.size() != 1 || hi[0].first != hi[0].second) fail("bad range in class");
        if (hi[0].first < item[0].first) fail("range out of order in class");
        item = {{item[0].first, hi[0].first}};
      }
      r.insert(r.end(), item.begin(), item.end());
    }
    if (neg) {
      // Python and JS negated classes include newlines and all of Unicode.
      r = complement(r);
    }
    return cls(r);
  }

  bool parse_int(int& v) {
    size_t start = pos_;
    long long x = 0;
    while (pos_ < s_.size() && isdigit((unsigned char)s_[pos_])) {
      x = x * 10 + (s_[pos_++] - '0');
      if (x > 1000000000) fail("repetition count too large");
    }
    v = static_cast<int>(x);
    return pos_ > start;
  }

  // Tries to read {m}, {m,}, {m,n}; leaves pos_ unchanged when it is a literal brace.
  bool brace(int& mn, int& mx) {
    size_t save = pos_;
    ++pos_;
    // Python reads {,n} as {0,n}, JavaScript as literal text: refuse rather than guess.
    if (peek(',')) fail("'{,n}' means different things in Python and JavaScript");
    if (!parse_int(mn)) { pos_ = save; return false; }
    mx = mn;
    if (eat(',')) {
      if (!parse_int(mx)) mx = -1;
    }
    if (!eat('}')) { pos_ = save; return false; }
    if (mx >= 0 && mx < mn) fail("repetition {m,n} with n < m");
    return true;
  }

  std::vector<int> seq(int depth, bool* anchored_end) {
    if (depth > ir_.limits().max_nesting) fail("nesting too deep");
    std::vector<int> items;
    while (pos_ < s_.size() && !peek('|') && !peek(')')) {
      if (peek('$')) {
        ++pos_;
        bool at_end = pos_ == s_.size() || peek('|') || (peek(')') && depth > 0 && false);
        if (depth != 0 || !at_end || !anchored_end) fail("'$' is only supported at the end of the pattern");
        *anchored_end = true;
        break;
      }
      if (peek('^')) fail("'^' is only supported at the start of the pattern");
      int atom;
      char c = s_[pos_];
      if (c == '(') {
        ++pos_;
        if (eat('?')) {
          if (eat(':')) {
          } else if (peek('<') && pos_ + 1 < s_.size() && s_[pos_ + 1] != '=' && s_[pos_ + 1] != '!') {
            while (pos_ < s_.size() && s_[pos_] != '>') ++pos_;
            if (!eat('>')) fail("bad group name");
          } else if (peek('P') && pos_ + 1 < s_.size() && s_[pos_ + 1] == '<') {
            while (pos_ < s_.size() && s_[pos_] != '>') ++pos_;
            if (!eat('>')) fail("bad group name");
          } else {
            fail("lookaround and inline flags are not supported");
          }
        }
        std::vector<int> alts;
        do {
          std::vector<int> k = seq(depth + 1, nullptr);
          alts.push_back(k.empty() ? ir_.empty() : ir_.seq(k));
        } while (eat('|'));
        if (!eat(')')) fail("missing ')'");
        atom = ir_.alt(std::move(alts));
      } else if (c == '[') {
        ++pos_;
        atom = char_class();
      } else if (c == '.') {
        ++pos_;
        atom = cls(complement({{'\n', '\n'}, {'\r', '\r'}}));
      } else if (c == '\\') {
        ++pos_;
        Ranges r;
        escape(r, false);
        atom = cls(r);
      } else if (c == '*' || c == '+' || c == '?') {
        fail("quantifier without an operand");
      } else if (c == '{') {
        int a, b;
        if (brace(a, b)) fail("quantifier without an operand");
        ++pos_;
        atom = cls({{'{', '{'}});
      } else {
        uint32_t v = utf8_char();
        atom = cls({{v, v}});
      }
      // Quantifiers (lazy '?' suffix does not change the language).
      while (pos_ < s_.size()) {
        int mn, mx;
        char q = s_[pos_];
        if (q == '*') { ++pos_; mn = 0; mx = -1; }
        else if (q == '+') { ++pos_; mn = 1; mx = -1; }
        else if (q == '?') { ++pos_; mn = 0; mx = 1; }
        else if (q == '{' && brace(mn, mx)) {}
        else break;
        if (mn > ir_.limits().max_repeat || mx > ir_.limits().max_repeat) fail("repetition count above limit");
        atom = ir_.repeat(atom, mn, mx);
        if (eat('?')) {}
        else if (peek('+')) fail("possessive quantifiers are not supported");
        else if (peek('*') || peek('{')) {
          // e.g. a** : Python rejects "multiple repeat"; be equally strict.
          int a, b;
          if (peek('*') || brace(a, b)) fail("multiple repeat");
        }
      }
      items.push_back(atom);
    }
    return items;
  }

  Ir& ir_;
  std::string_view s_;
  bool json_;
  size_t pos_ = 0;
};

}  // namespace

int parse_regex(Ir& ir, std::string_view pattern, bool json_string, bool search) {
  Parser p(ir, pattern, json_string);
  return p.parse(search);
}

}  // namespace deepinfer::grammar
