// JSON Schema (draft 2020-12) front-end. Every assertion keyword is either enforced exactly,
// enforced on a documented sound subset (fewer spellings accepted, never an invalid instance),
// or rejected with an error naming the keyword. Annotations and unknown keywords are ignored,
// as the specification requires.
//
// Sound-subset choices (they can only reject valid text, never accept invalid text):
//  * properties are emitted in schema order, then additional properties;
//  * additional property names never contain backslash escapes (so they cannot spell a named key);
//  * strings under pattern/format use only the escapes JSON requires;
//  * numbers with bounds use no exponent; integers are written without a fraction or with ".0".
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "grammar/ir.h"
#include "util/error.h"
#include "util/json.h"

namespace deepinfer::grammar {

using json = nlohmann::ordered_json;

namespace {


std::vector<uint32_t> decode_utf8(const std::string& s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    unsigned char c = s[i];
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 31) : n == 3 ? (c & 15) : (c & 7);
    for (int k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (s[i + k] & 63);
    out.push_back(cp);
    i += n;
  }
  return out;
}

const std::set<std::string> kAnnotations = {
    "$schema", "$id", "$comment", "$defs", "definitions", "title", "description", "default",
    "examples", "deprecated", "readOnly", "writeOnly", "contentMediaType", "contentEncoding",
    "contentSchema", "$vocabulary", "$anchor", "$dynamicAnchor"};
const std::set<std::string> kSupported = {
    "type", "enum", "const", "properties", "required", "additionalProperties", "items",
    "prefixItems", "minItems", "maxItems", "minLength", "maxLength", "pattern", "format",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "anyOf", "oneOf", "allOf",
    "$ref", "uniqueItems", "x-patterns"};
const std::set<std::string> kUnsupported = {
    "not", "if", "then", "else", "dependentRequired", "dependentSchemas", "contains",
    "minContains", "maxContains", "patternProperties", "propertyNames", "unevaluatedProperties",
    "unevaluatedItems", "minProperties", "maxProperties", "multipleOf", "$dynamicRef",
    "$recursiveRef", "dependencies", "additionalItems"};

const std::vector<std::string> kAllTypes = {"null", "boolean", "object", "array", "number", "string", "integer"};

class SchemaCompiler {
 public:
  SchemaCompiler(Ir& ir, const JsonOptions& opt, json doc) : ir_(ir), opt_(opt), doc_(std::move(doc)) {
    ws_ = json_ws(ir_, opt_);
    scan_ids(doc_, 0, true);
  }

  int root() { return ref_rule("#"); }

 private:
  [[noreturn]] static void unsupported(const std::string& what) {
    throw Error("json schema: unsupported: " + what);
  }

  void scan_ids(const json& s, int depth, bool top) {
    if (depth > 4 * ir_.limits().max_nesting) throw Error("json schema: nesting too deep");
    if (s.is_object()) {
      if (!top && s.contains("$id")) nested_id_ = true;
      for (auto& [k, v] : s.items()) scan_ids(v, depth + 1, false);
    } else if (s.is_array()) {
      for (auto& v : s) scan_ids(v, depth + 1, false);
    }
  }

  const json& resolve(const std::string& ref) {
    if (ref.empty() || ref[0] != '#') unsupported("$ref '" + ref + "' (only local '#...' references)");
    if (nested_id_) unsupported("$ref in a schema with nested $id (base URI changes)");
    if (ref.size() > 1 && ref[1] != '/') unsupported("$ref to anchor '" + ref + "'");
    const json* cur = &doc_;
    size_t i = 1;
    while (i < ref.size()) {
      size_t j = ref.find('/', i + 1);
      if (j == std::string::npos) j = ref.size();
      std::string tok = ref.substr(i + 1, j - i - 1), t;
      for (size_t k = 0; k < tok.size(); ++k) {
        if (tok[k] == '~' && k + 1 < tok.size()) { t += tok[k + 1] == '1' ? '/' : '~'; ++k; }
        else if (tok[k] == '%' && k + 2 < tok.size() && isxdigit((unsigned char)tok[k + 1]) && isxdigit((unsigned char)tok[k + 2])) {
          t += static_cast<char>(std::stoi(tok.substr(k + 1, 2), nullptr, 16));
          k += 2;
        } else t += tok[k];
      }
      if (cur->is_object() && cur->contains(t)) cur = &(*cur)[t];
      else if (cur->is_array() && !t.empty() && std::all_of(t.begin(), t.end(), ::isdigit) && std::stoul(t) < cur->size())
        cur = &(*cur)[std::stoul(t)];
      else throw Error("json schema: $ref '" + ref + "' does not resolve");
      i = j;
    }
    return *cur;
  }

  int ref_rule(const std::string& ref) {
    auto it = refs_.find(ref);
    if (it != refs_.end()) return ir_.ref(it->second);
    const json& target = ref == "#" ? doc_ : resolve(ref);
    int r = ir_.new_rule(ref);
    refs_[ref] = r;
    // Chains of references recurse natively; bound them like nesting.
    if (++active_refs_ > ir_.limits().max_nesting) throw Error("json schema: $ref chain too deep");
    ir_.set_rule(r, gen(target, active_refs_));
    --active_refs_;
    return ir_.ref(r);
  }

  // ------------------------------------------------------------ generic JSON pieces
  int sep(char c) { return ir_.seq({ws_, ir_.byte(c), ws_}); }
  int str_char() {
    if (str_char_ < 0) str_char_ = json_string_char(ir_);
    return str_char_;
  }
  int any_string() { return ir_.seq({ir_.byte('"'), ir_.star(str_char()), ir_.byte('"')}); }
  int any_value() {
    if (value_rule_ < 0) value_rule_ = json_value_rule(ir_, opt_);
    return ir_.ref(value_rule_);
  }

  // Integers in [lo, hi] written without leading zeros; bounds are decimal magnitudes.
  int digits(char a, char b) { return ir_.bytes({{(uint8_t)a, (uint8_t)b}}); }
  int uint_same_len(const std::string& a, const std::string& b) {
    if (a.size() == 1) return digits(a[0], b[0]);
    std::string ra = a.substr(1), rb = b.substr(1);
    if (a[0] == b[0]) return ir_.seq({ir_.byte(a[0]), uint_same_len(ra, rb)});
    std::vector<int> alts;
    alts.push_back(ir_.seq({ir_.byte(a[0]), uint_same_len(ra, std::string(ra.size(), '9'))}));
    if (b[0] - a[0] > 1)
      alts.push_back(ir_.seq({digits(a[0] + 1, b[0] - 1), ir_.repeat(digits('0', '9'), ra.size(), ra.size())}));
    alts.push_back(ir_.seq({ir_.byte(b[0]), uint_same_len(std::string(rb.size(), '0'), rb)}));
    return ir_.alt(std::move(alts));
  }
  // hi < 0: unbounded above.
  int uint_range(long long lo, long long hi) {
    if (hi >= 0 && lo > hi) return ir_.nothing();
    std::string a = std::to_string(lo);
    std::vector<int> alts;
    size_t maxlen = hi >= 0 ? std::to_string(hi).size() : 0;
    for (size_t len = a.size(); hi < 0 ? len <= a.size() : len <= maxlen; ++len) {
      std::string from = len == a.size() ? a : "1" + std::string(len - 1, '0');
      std::string to = (hi >= 0 && len == maxlen) ? std::to_string(hi) : std::string(len, '9');
      alts.push_back(uint_same_len(from, to));
    }
    if (hi < 0)  // every longer number
      alts.push_back(ir_.seq({digits('1', '9'), ir_.repeat(digits('0', '9'), a.size(), -1)}));
    return ir_.alt(std::move(alts));
  }

  static long long to_bound(const json& v, const char* kw, bool up) {
    double d = v.get<double>();
    if (!std::isfinite(d) || std::fabs(d) > 1e17) unsupported(std::string(kw) + " with magnitude above 1e17");
    return static_cast<long long>(up ? std::ceil(d) : std::floor(d));
  }

  int integer(const json& s) {
    bool has_lo = false, has_hi = false;
    long long lo = 0, hi = 0;
    auto low = [&](long long v) { if (!has_lo || v > lo) lo = v; has_lo = true; };
    auto high = [&](long long v) { if (!has_hi || v < hi) hi = v; has_hi = true; };
    if (s.contains("minimum")) low(to_bound(s["minimum"], "minimum", true));
    if (s.contains("exclusiveMinimum")) low(to_bound(s["exclusiveMinimum"], "exclusiveMinimum", false) + 1);
    if (s.contains("maximum")) high(to_bound(s["maximum"], "maximum", false));
    if (s.contains("exclusiveMaximum")) high(to_bound(s["exclusiveMaximum"], "exclusiveMaximum", true) - 1);
    if (has_lo && has_hi && lo > hi) return ir_.nothing();
    std::vector<int> alts;
    // Non-negative part [max(lo,0), hi].
    if (!has_hi || hi >= 0) alts.push_back(uint_range(has_lo ? std::max(lo, 0LL) : 0, has_hi ? hi : -1));
    // Negative part: magnitudes [max(1,-hi), -lo].
    if (!has_lo || lo < 0) {
      long long mlo = has_hi ? std::max(1LL, -hi) : 1, mhi = has_lo ? -lo : -1;
      alts.push_back(ir_.seq({ir_.byte('-'), uint_range(mlo, mhi)}));
    }
    // 1.0 is an integer in JSON Schema (and to Python's jsonschema); only one zero, though: models
    // readily run away on "17.000000..." when any number of zeros is allowed.
    return ir_.seq({ir_.alt(std::move(alts)), ir_.opt(ir_.literal(".0"))});
  }

  int frac_any() { return ir_.opt(ir_.seq({ir_.byte('.'), ir_.plus(digits('0', '9'))})); }
  int frac_zero() { return ir_.opt(ir_.seq({ir_.byte('.'), ir_.plus(ir_.byte('0'))})); }
  int frac_nonzero() {
    return ir_.seq({ir_.byte('.'), ir_.star(digits('0', '9')), digits('1', '9'), ir_.star(digits('0', '9'))});
  }
  // Magnitudes m = I.F (no sign) with m >= L, m > L, m <= H or m < H (integer bounds).
  int mag(int op, long long b) {
    switch (op) {
      case 0:  // >=
        if (b <= 0) return ir_.seq({uint_range(0, -1), frac_any()});
        return ir_.seq({uint_range(b, -1), frac_any()});
      case 1:  // >
        if (b < 0) return ir_.seq({uint_range(0, -1), frac_any()});
        return ir_.alt({ir_.seq({ir_.literal(std::to_string(b)), frac_nonzero()}),
                        ir_.seq({uint_range(b + 1, -1), frac_any()})});
      case 2:  // <=
        if (b < 0) return ir_.nothing();
        if (b == 0) return ir_.seq({ir_.byte('0'), frac_zero()});
        return ir_.alt({ir_.seq({uint_range(0, b - 1), frac_any()}), ir_.seq({ir_.literal(std::to_string(b)), frac_zero()})});
      default:  // <
        if (b <= 0) return ir_.nothing();
        return ir_.seq({uint_range(0, b - 1), frac_any()});
    }
  }
  // Signed numbers satisfying one bound. op: 0 >=, 1 >, 2 <=, 3 <.
  int signed_bound(int op, long long b) {
    int nonneg = mag(op, b);
    // Negative x = -m (m > 0): x >= b <=> m <= -b; x > b <=> m < -b; x <= b <=> m >= -b; x < b <=> m > -b.
    static const int flip[] = {2, 3, 0, 1};
    int neg;
    if ((op == 0 || op == 1) && b >= 0) neg = ir_.nothing();
    else if (op == 2 && b >= 0) neg = mag(1, 0);
    else if (op == 3 && b > 0) neg = mag(1, 0);
    else neg = ir_.and_(mag(flip[op], -b), mag(1, 0));
    return ir_.alt({nonneg, ir_.seq({ir_.byte('-'), neg})});
  }

  int number(const json& s) {
    std::vector<std::pair<int, long long>> bounds;
    static const char* kws[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    for (int op = 0; op < 4; ++op) {
      if (!s.contains(kws[op])) continue;
      const json& v = s[kws[op]];
      if (!v.is_number()) throw Error(std::string("json schema: ") + kws[op] + " must be a number");
      double d = v.get<double>();
      if (d != std::floor(d)) unsupported(std::string(kws[op]) + " with a non-integer value on type number");
      bounds.push_back({op, to_bound(v, kws[op], false)});
    }
    if (bounds.empty()) return json_number(ir_);
    int lang = signed_bound(bounds[0].first, bounds[0].second);
    for (size_t i = 1; i < bounds.size(); ++i) lang = ir_.and_(lang, signed_bound(bounds[i].first, bounds[i].second));
    return lang;
  }

  int format_body(const std::string& f) {
    static const char* kDate =
        R"((\d{4}-((0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|(0[469]|11)-(0[1-9]|[12]\d|30)|02-(0[1-9]|1\d|2[0-8]))|)"
        R"((\d\d(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)-02-29))";
    static const char* kTime = R"(([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d))";
    static const char* kHost = R"([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*)";
    static const std::map<std::string, std::string> kFormats = {
        // Calendar-exact, including leap years; leap seconds are left out (sound subset).
        {"date", kDate},
        {"time", kTime},
        {"date-time", std::string(kDate) + "[Tt]" + kTime},
        {"uuid", R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"},
        {"ipv4", R"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3})"},
        {"hostname", kHost},
        {"email", std::string(R"([A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@)") + kHost},
    };
    auto it = kFormats.find(f);
    if (it == kFormats.end()) unsupported("format '" + f + "'");
    return parse_regex(ir_, it->second, true, false);
  }

  int string(const json& s) {
    std::vector<int> parts;  // languages of the string body, intersected
    std::vector<std::string> patterns;
    if (s.contains("pattern")) patterns.push_back(s["pattern"].get<std::string>());
    if (s.contains("x-patterns"))
      for (auto& p : s["x-patterns"]) patterns.push_back(p.get<std::string>());
    for (auto& p : patterns) parts.push_back(parse_regex(ir_, p, true, true));
    if (s.contains("format")) parts.push_back(format_body(s["format"].get<std::string>()));
    long long mn = s.contains("minLength") ? s["minLength"].get<long long>() : 0;
    long long mx = s.contains("maxLength") ? s["maxLength"].get<long long>() : -1;
    if (mn < 0 || mx < -1) throw Error("json schema: negative length");
    if (mx >= 0 && mn > mx) return ir_.nothing();
    if (mn > 0 || mx >= 0 || parts.empty()) {
      if (mn > ir_.limits().max_repeat || mx > ir_.limits().max_repeat)
        throw Error("json schema: minLength/maxLength above limit " + std::to_string(ir_.limits().max_repeat));
      parts.push_back(ir_.repeat(str_char(), mn, mx));
    }
    int body = parts[0];
    for (size_t i = 1; i < parts.size(); ++i) body = ir_.and_(body, parts[i]);
    return ir_.seq({ir_.byte('"'), body, ir_.byte('"')});
  }

  int array(const json& s, int depth) {
    if (s.contains("uniqueItems") && s["uniqueItems"].is_boolean() && s["uniqueItems"].get<bool>())
      unsupported("uniqueItems: true");
    std::vector<int> prefix;
    if (s.contains("prefixItems"))
      for (auto& p : s["prefixItems"]) prefix.push_back(gen(p, depth + 1));
    const json items = s.contains("items") ? s["items"] : json(true);
    long long mn = s.contains("minItems") ? s["minItems"].get<long long>() : 0;
    long long mx = s.contains("maxItems") ? s["maxItems"].get<long long>() : -1;
    long long k = prefix.size();
    if (items.is_boolean() && !items.get<bool>()) mx = mx < 0 ? k : std::min(mx, k);
    if (mx >= 0 && mn > mx) return ir_.nothing();
    if (mn > ir_.limits().max_repeat || mx > ir_.limits().max_repeat)
      throw Error("json schema: minItems/maxItems above limit " + std::to_string(ir_.limits().max_repeat));
    int rest = (mx >= 0 && mx <= k) ? -1 : gen(items, depth + 1);
    // Built from the back: tail(i) is what may follow once i elements are written.
    std::function<int(long long)> tail = [&](long long i) -> int {
      if (mx >= 0 && i >= mx) return ir_.empty();
      if (i < k) {
        int piece = i == 0 ? ir_.seq({prefix[i], tail(i + 1)}) : ir_.seq({sep(','), prefix[i], tail(i + 1)});
        return i >= mn ? ir_.opt(piece) : piece;
      }
      long long rmin = std::max(0LL, mn - i), rmax = mx < 0 ? -1 : mx - i;
      if (i == 0) {
        int piece = ir_.seq({rest, ir_.repeat(ir_.seq({sep(','), rest}), std::max(0LL, rmin - 1), rmax < 0 ? -1 : rmax - 1)});
        return rmin == 0 ? ir_.opt(piece) : piece;
      }
      return ir_.repeat(ir_.seq({sep(','), rest}), rmin, rmax);
    };
    if (mx == 0) return ir_.seq({ir_.byte('['), ws_, ir_.byte(']')});
    bool empty_ok = mn == 0;
    mn = std::max(mn, 1LL);  // build the non-empty form; the empty array is its own branch
    int nonempty = ir_.seq({tail(0), ws_, ir_.byte(']')});
    return ir_.seq({ir_.byte('['), ws_, empty_ok ? ir_.alt({ir_.byte(']'), nonempty}) : nonempty});
  }

  // A key string that is none of `names` and uses no escapes (so it cannot spell one of them).
  int other_key(const std::vector<std::string>& names) {
    struct TNode {
      std::map<uint32_t, int> kids;
      bool terminal = false;
    };
    std::vector<TNode> t(1);
    for (auto& n : names) {
      int cur = 0;
      for (uint32_t cp : decode_utf8(n)) {
        auto it = t[cur].kids.find(cp);
        if (it == t[cur].kids.end()) {
          t.push_back({});
          it = t[cur].kids.emplace(cp, (int)t.size() - 1).first;
        }
        cur = it->second;
      }
      t[cur].terminal = true;
    }
    std::vector<std::pair<uint32_t, uint32_t>> plain = {{0x20, '"' - 1}, {'"' + 1, '\\' - 1}, {'\\' + 1, 0x10FFFF}};
    int free_tail = ir_.star(ir_.codepoints(plain));
    std::function<int(int)> body = [&](int v) -> int {
      std::vector<int> alts;
      if (!t[v].terminal) alts.push_back(ir_.empty());
      std::vector<std::pair<uint32_t, uint32_t>> others;
      uint32_t next = 0;
      for (auto& [cp, _] : t[v].kids) {
        if (cp > next) others.push_back({next, cp - 1});
        next = cp + 1;
      }
      others.push_back({next, 0x10FFFF});
      std::vector<std::pair<uint32_t, uint32_t>> allowed;
      for (auto [lo, hi] : others)
        for (auto [plo, phi] : plain) {
          uint32_t a = std::max(lo, plo), b = std::min(hi, phi);
          if (a <= b) allowed.push_back({a, b});
        }
      if (!allowed.empty()) alts.push_back(ir_.seq({ir_.codepoints(allowed), free_tail}));
      for (auto& [cp, kid] : t[v].kids)
        if (cp >= 0x20 && cp != '"' && cp != '\\') alts.push_back(ir_.seq({ir_.codepoints({{cp, cp}}), body(kid)}));
      return ir_.alt(std::move(alts));
    };
    return ir_.seq({ir_.byte('"'), body(0), ir_.byte('"')});
  }

  int object(const json& s, int depth) {
    struct Member {
      std::string name;
      json schema;
      bool required;
    };
    std::set<std::string> required;
    if (s.contains("required"))
      for (auto& r : s["required"]) required.insert(r.get<std::string>());
    const json addl = s.contains("additionalProperties") ? s["additionalProperties"] : json(true);
    std::vector<Member> members;
    std::set<std::string> named;
    if (s.contains("properties"))
      for (auto& [k, v] : s["properties"].items()) {
        members.push_back({k, v, required.count(k) > 0});
        named.insert(k);
      }
    if (s.contains("required"))
      for (auto& r : s["required"]) {
        std::string k = r.get<std::string>();
        if (!named.count(k)) { members.push_back({k, addl, true}); named.insert(k); }
      }
    std::vector<std::string> names;
    std::vector<std::pair<int, bool>> nodes;  // member node, optional
    for (auto& m : members) {
      names.push_back(m.name);
      if (m.schema.is_boolean() && !m.schema.get<bool>()) {
        if (m.required) return ir_.nothing();
        continue;  // can never appear
      }
      int v = gen(m.schema, depth + 1);
      nodes.push_back({ir_.seq({ir_.literal(python_json_string(m.name)), sep(':'), v}), !m.required});
    }
    Node g;
    int n = nodes.size();
    // States 0..n: nothing written yet; n+1..2n+1: something written (next member needs a comma).
    g.g_states = 2 * n + 2;
    g.g_start = 0;
    for (int i = 0; i < n; ++i) {
      auto [node, optional] = nodes[i];
      g.g_edges.push_back({i, n + 1 + i + 1, node});
      g.g_edges.push_back({n + 1 + i, n + 1 + i + 1, ir_.seq({sep(','), node})});
      if (optional) {
        g.g_edges.push_back({i, i + 1, -1});
        g.g_edges.push_back({n + 1 + i, n + 1 + i + 1, -1});
      }
    }
    if (!(addl.is_boolean() && !addl.get<bool>())) {
      int extra = ir_.seq({other_key(names), sep(':'), gen(addl, depth + 1)});
      g.g_edges.push_back({n, 2 * n + 1, extra});
      g.g_edges.push_back({2 * n + 1, 2 * n + 1, ir_.seq({sep(','), extra})});
    }
    g.g_finals = {2 * n + 1};  // something written; the empty object is its own branch
    bool empty_ok = true;
    for (auto& nd : nodes) empty_ok = empty_ok && nd.second;
    int nonempty = ir_.seq({ir_.graph(std::move(g)), ws_, ir_.byte('}')});
    return ir_.seq({ir_.byte('{'), ws_, empty_ok ? ir_.alt({ir_.byte('}'), nonempty}) : nonempty});
  }

  // Literal JSON value (enum/const) with flexible whitespace.
  int literal_value(const json& v, int depth) {
    if (depth > ir_.limits().max_nesting) throw Error("json schema: enum value nesting too deep");
    switch (v.type()) {
      case json::value_t::null: return ir_.literal("null");
      case json::value_t::boolean: return ir_.literal(v.get<bool>() ? "true" : "false");
      case json::value_t::string: return ir_.literal(python_json_string(v.get<std::string>()));
      case json::value_t::number_integer:
      case json::value_t::number_unsigned:
        return ir_.seq({ir_.literal(v.dump()), frac_zero()});
      case json::value_t::number_float: {
        double d = v.get<double>();
        if (d == std::floor(d) && std::fabs(d) < 1e15) {
          // 1.0 and 1 are the same JSON Schema value.
          return ir_.seq({ir_.literal(std::to_string(static_cast<long long>(d))), frac_zero()});
        }
        return ir_.literal(v.dump());
      }
      case json::value_t::array: {
        if (v.empty()) return ir_.seq({ir_.byte('['), ws_, ir_.byte(']')});
        std::vector<int> k = {ir_.byte('['), ws_};
        for (size_t i = 0; i < v.size(); ++i) {
          if (i) k.push_back(sep(','));
          k.push_back(literal_value(v[i], depth + 1));
        }
        k.push_back(ws_);
        k.push_back(ir_.byte(']'));
        return ir_.seq(std::move(k));
      }
      case json::value_t::object: {
        if (v.empty()) return ir_.seq({ir_.byte('{'), ws_, ir_.byte('}')});
        std::vector<int> k = {ir_.byte('{'), ws_};
        bool first = true;
        for (auto& [key, val] : v.items()) {
          if (!first) k.push_back(sep(','));
          first = false;
          k.push_back(ir_.literal(python_json_string(key)));
          k.push_back(sep(':'));
          k.push_back(literal_value(val, depth + 1));
        }
        k.push_back(ws_);
        k.push_back(ir_.byte('}'));
        return ir_.seq(std::move(k));
      }
      default: throw Error("json schema: unsupported literal value");
    }
  }

  static std::string type_of(const json& v) {
    switch (v.type()) {
      case json::value_t::null: return "null";
      case json::value_t::boolean: return "boolean";
      case json::value_t::string: return "string";
      case json::value_t::array: return "array";
      case json::value_t::object: return "object";
      case json::value_t::number_integer:
      case json::value_t::number_unsigned: return "integer";
      default: {
        double d = v.get<double>();
        return d == std::floor(d) ? "integer" : "number";
      }
    }
  }

  static std::set<std::string> types_of(const json& s) {
    std::set<std::string> t;
    if (!s.contains("type")) return {kAllTypes.begin(), kAllTypes.end()};
    if (s["type"].is_string()) t.insert(s["type"].get<std::string>());
    else for (auto& x : s["type"]) t.insert(x.get<std::string>());
    if (t.count("number")) t.insert("integer");
    return t;
  }

  // ------------------------------------------------------------ schema combination
  json merge(const json& a, const json& b, int depth) {
    if (depth > ir_.limits().max_nesting) throw Error("json schema: allOf/$ref combination too deep");
    if (a.is_boolean()) return a.get<bool>() ? b : a;
    if (b.is_boolean()) return b.get<bool>() ? a : b;
    if (!a.is_object() || !b.is_object()) throw Error("json schema: schema must be an object or boolean");
    // Inline references first so their keywords take part in the merge.
    if (a.contains("$ref") && b.contains("$ref") && a["$ref"] != b["$ref"]) {
      json a2 = a;
      a2.erase("$ref");
      return merge(merge(a2, resolve(a["$ref"].get<std::string>()), depth + 1), b, depth + 1);
    }
    json r = a;
    for (auto& [k, vb] : b.items()) {
      if (!r.contains(k)) {
        r[k] = vb;
        continue;
      }
      json& va = r[k];
      if (va == vb) continue;
      if (kAnnotations.count(k)) continue;
      if (k == "type") {
        std::set<std::string> ta = types_of(a), tb = types_of(b);
        json t = json::array();
        for (auto& x : kAllTypes)
          if (ta.count(x) && tb.count(x)) t.push_back(x);
        if (t.size() == 2 && t[0] == "number" && t[1] == "integer") t = json::array({"integer"});
        va = t;
      } else if (k == "required") {
        for (auto& x : vb)
          if (std::find(va.begin(), va.end(), x) == va.end()) va.push_back(x);
      } else if (k == "minLength" || k == "minItems" || k == "minimum" || k == "exclusiveMinimum") {
        if (vb.get<double>() > va.get<double>()) va = vb;
      } else if (k == "maxLength" || k == "maxItems" || k == "maximum" || k == "exclusiveMaximum") {
        if (vb.get<double>() < va.get<double>()) va = vb;
      } else if (k == "enum") {
        json e = json::array();
        for (auto& x : va)
          if (std::find(vb.begin(), vb.end(), x) != vb.end()) e.push_back(x);
        va = e;
      } else if (k == "const") {
        r["enum"] = json::array();  // two different constants: nothing matches
        r.erase("const");
      } else if (k == "pattern") {
        if (!r.contains("x-patterns")) r["x-patterns"] = json::array();
        r["x-patterns"].push_back(vb);
      } else if (k == "x-patterns") {
        for (auto& x : vb) va.push_back(x);
      } else if (k == "allOf") {
        for (auto& x : vb) va.push_back(x);
      } else if (k == "anyOf") {
        json cross = json::array();
        if (va.size() * vb.size() > 256) unsupported("anyOf x anyOf combination larger than 256");
        for (auto& x : va)
          for (auto& y : vb) cross.push_back(json{{"allOf", json::array({x, y})}});
        va = cross;
      } else if (k == "properties" || k == "additionalProperties" || k == "items" || k == "prefixItems") {
        // Handled below with the interplay between them.
      } else if (k == "uniqueItems") {
        va = va.get<bool>() || vb.get<bool>();
      } else {
        unsupported("combining different '" + k + "' values (allOf/$ref siblings)");
      }
    }
    if (a.contains("prefixItems") || b.contains("prefixItems") || a.contains("items") || b.contains("items")) {
      // Position i is constrained by each side's prefixItems[i], or by its items past the prefix.
      auto at = [](const json& s, size_t i) -> json {
        if (s.contains("prefixItems") && i < s["prefixItems"].size()) return s["prefixItems"][i];
        return s.contains("items") ? s["items"] : json(true);
      };
      size_t ka = a.contains("prefixItems") ? a["prefixItems"].size() : 0;
      size_t kb = b.contains("prefixItems") ? b["prefixItems"].size() : 0;
      json prefix = json::array();
      for (size_t i = 0; i < std::max(ka, kb); ++i) prefix.push_back(merge(at(a, i), at(b, i), depth + 1));
      r.erase("prefixItems");
      if (!prefix.empty()) r["prefixItems"] = prefix;
      json items = merge(at(a, std::max(ka, kb)), at(b, std::max(ka, kb)), depth + 1);
      if (items == json(true)) r.erase("items");
      else r["items"] = items;
    }
    if (a.contains("properties") || b.contains("properties") || a.contains("additionalProperties") ||
        b.contains("additionalProperties")) {
      json pa = a.contains("properties") ? a["properties"] : json::object();
      json pb = b.contains("properties") ? b["properties"] : json::object();
      json aa = a.contains("additionalProperties") ? a["additionalProperties"] : json(true);
      json ab = b.contains("additionalProperties") ? b["additionalProperties"] : json(true);
      json props = json::object();
      for (auto& [k, v] : pa.items()) props[k] = pb.contains(k) ? merge(v, pb[k], depth + 1) : merge(v, ab, depth + 1);
      for (auto& [k, v] : pb.items())
        if (!pa.contains(k)) props[k] = merge(v, aa, depth + 1);
      if (!props.empty()) r["properties"] = props;
      json addl = merge(aa, ab, depth + 1);
      if (addl == json(true)) r.erase("additionalProperties");
      else r["additionalProperties"] = addl;
    }
    return r;
  }

  // Provably disjoint oneOf branches make oneOf the same as anyOf.
  bool disjoint(const json& x, const json& y) {
    if (x.is_boolean() || y.is_boolean()) return (x == json(false)) || (y == json(false));
    auto lits = [](const json& s, json& out) {
      if (s.contains("const")) { out = json::array({s["const"]}); return true; }
      if (s.contains("enum")) { out = s["enum"]; return true; }
      return false;
    };
    auto eff_types = [&](const json& s) {
      json l;
      if (lits(s, l)) {
        std::set<std::string> t;
        for (auto& v : l) { t.insert(type_of(v)); if (type_of(v) == "integer") t.insert("number"); }
        return t;
      }
      auto t = types_of(s);
      return t;
    };
    auto tx = eff_types(x), ty = eff_types(y);
    bool overlap = false;
    for (auto& t : tx) overlap |= ty.count(t) > 0;
    if (!overlap) return true;
    json lx, ly;
    if (lits(x, lx) && lits(y, ly)) {
      for (auto& v : lx)
        for (auto& w : ly)
          if (v == w) return false;
      return true;
    }
    // Discriminator: a property required on both sides whose literal values do not overlap.
    if (x.contains("properties") && y.contains("properties") && x.contains("required") && y.contains("required") &&
        !tx.count("null") && tx.size() == 1 && ty.size() == 1) {
      for (auto& [k, px] : x["properties"].items()) {
        if (!y["properties"].contains(k)) continue;
        const std::string& key = k;  // clang cannot capture a structured binding
        auto req = [&](const json& s) { return std::find(s["required"].begin(), s["required"].end(), key) != s["required"].end(); };
        if (!req(x) || !req(y)) continue;
        const json& py = y["properties"][k];
        if (px.is_object() && py.is_object() && lits(px, lx) && lits(py, ly)) {
          bool any = false;
          for (auto& v : lx)
            for (auto& w : ly) any |= v == w;
          if (!any) return true;
        }
      }
    }
    return false;
  }

  bool has_assertions(const json& s, const char* except) {
    for (auto& [k, v] : s.items())
      if (!kAnnotations.count(k) && k != except && (kSupported.count(k) || kUnsupported.count(k))) return true;
    return false;
  }

  int gen(const json& s, int depth) {
    if (depth > ir_.limits().max_nesting) throw Error("json schema: nesting too deep");
    if (ir_.size() > ir_.limits().max_ir_nodes / 2) throw Error("json schema: too large");
    if (s.is_boolean()) return s.get<bool>() ? any_value() : ir_.nothing();
    if (!s.is_object()) throw Error("json schema: a schema must be an object or a boolean");
    for (auto& [k, v] : s.items())
      if (kUnsupported.count(k)) {
        // Keywords that are no-ops in these forms are accepted.
        if (k == "if" && !s.contains("then") && !s.contains("else")) continue;
        if ((k == "then" || k == "else") && !s.contains("if")) continue;
        unsupported("keyword '" + k + "'");
      }
    if (s.contains("$ref")) {
      std::string ref = s["$ref"].get<std::string>();
      if (!has_assertions(s, "$ref")) return ref_rule(ref);
      json rest = s;
      rest.erase("$ref");
      return gen(merge(rest, resolve(ref), depth + 1), depth + 1);
    }
    if (s.contains("allOf")) {
      json r = s;
      r.erase("allOf");
      for (auto& x : s["allOf"]) r = merge(r, x, depth + 1);
      return gen(r, depth + 1);
    }
    if (s.contains("anyOf") || s.contains("oneOf")) {
      const char* key = s.contains("anyOf") ? "anyOf" : "oneOf";
      json base = s;
      base.erase(key);
      std::vector<json> branches;
      for (auto& x : s[key]) branches.push_back(merge(base, x, depth + 1));
      if (std::string(key) == "oneOf") {
        if (s.contains("anyOf")) unsupported("anyOf together with oneOf");
        for (size_t i = 0; i < branches.size(); ++i)
          for (size_t j = i + 1; j < branches.size(); ++j)
            if (!disjoint(branches[i], branches[j]))
              unsupported("oneOf whose branches may overlap (branches " + std::to_string(i) + " and " + std::to_string(j) + ")");
      }
      std::vector<int> alts;
      for (auto& b : branches) alts.push_back(gen(b, depth + 1));
      return ir_.alt(std::move(alts));
    }
    std::set<std::string> types = types_of(s);
    if (s.contains("const") || s.contains("enum")) {
      json values = s.contains("const") ? json::array({s["const"]}) : s["enum"];
      if (values.is_array() && values.size() > ir_.limits().max_enum_values)
        throw Error("json schema: enum has " + std::to_string(values.size()) + " values, above the limit of " +
                    std::to_string(ir_.limits().max_enum_values));
      if (s.contains("const") && s.contains("enum")) {
        json keep = json::array();
        for (auto& v : s["enum"])
          if (v == s["const"]) keep.push_back(v);
        values = keep;
      }
      for (auto& [k, v] : s.items())
        if (k != "const" && k != "enum" && k != "type" && !kAnnotations.count(k) && kSupported.count(k))
          unsupported("enum/const combined with '" + k + "'");
      std::vector<int> alts;
      for (auto& v : values)
        if (types.count(type_of(v))) alts.push_back(literal_value(v, 0));
      return ir_.alt(std::move(alts));
    }
    std::vector<int> alts;
    for (auto& t : types) {
      if (t == "null") alts.push_back(ir_.literal("null"));
      else if (t == "boolean") alts.push_back(ir_.alt({ir_.literal("true"), ir_.literal("false")}));
      else if (t == "string") alts.push_back(string(s));
      else if (t == "integer") { if (!types.count("number")) alts.push_back(integer(s)); }
      else if (t == "number") alts.push_back(number(s));
      else if (t == "array") alts.push_back(array(s, depth));
      else if (t == "object") alts.push_back(object(s, depth));
      else throw Error("json schema: unknown type '" + t + "'");
    }
    return ir_.alt(std::move(alts));
  }

  Ir& ir_;
  JsonOptions opt_;
  json doc_;
  int ws_ = -1;
  int str_char_ = -1;
  int value_rule_ = -1;
  bool nested_id_ = false;
  int active_refs_ = 0;
  std::map<std::string, int> refs_;
};

// Rejects inputs nested deeper than the limit before the JSON parser sees them.
void check_depth(std::string_view text, int limit) {
  int depth = 0;
  bool in_str = false, esc = false;
  for (char c : text) {
    if (in_str) {
      if (esc) esc = false;
      else if (c == '\\') esc = true;
      else if (c == '"') in_str = false;
      continue;
    }
    if (c == '"') in_str = true;
    else if (c == '[' || c == '{') {
      if (++depth > limit) throw Error("json schema: nesting deeper than " + std::to_string(limit));
    } else if (c == ']' || c == '}') --depth;
  }
}

}  // namespace

int json_string_char(Ir& ir) {
  auto hex = [&] { return ir.bytes({{'0', '9'}, {'A', 'F'}, {'a', 'f'}}); };
  // \u escapes of surrogates are left out so one escape is always one character.
  int u = ir.seq({ir.literal("\\u"),
                  ir.alt({ir.seq({ir.bytes({{'0', '9'}, {'A', 'C'}, {'a', 'c'}, {'E', 'F'}, {'e', 'f'}}), hex(), hex(), hex()}),
                          ir.seq({ir.bytes({{'D', 'D'}, {'d', 'd'}}), ir.bytes({{'0', '7'}}), hex(), hex()})})});
  int simple = ir.seq({ir.byte('\\'), ir.bytes({{'"', '"'}, {'\\', '\\'}, {'/', '/'}, {'b', 'b'}, {'f', 'f'}, {'n', 'n'}, {'r', 'r'}, {'t', 't'}})});
  int raw = ir.codepoints({{0x20, '"' - 1}, {'"' + 1, '\\' - 1}, {'\\' + 1, 0x10FFFF}});
  return ir.alt({raw, simple, u});
}

int json_number(Ir& ir) {
  int d = ir.bytes({{'0', '9'}});
  return ir.seq({ir.opt(ir.byte('-')), ir.alt({ir.byte('0'), ir.seq({ir.bytes({{'1', '9'}}), ir.star(d)})}),
                 ir.opt(ir.seq({ir.byte('.'), ir.plus(d)})),
                 ir.opt(ir.seq({ir.bytes({{'e', 'e'}, {'E', 'E'}}), ir.opt(ir.bytes({{'+', '+'}, {'-', '-'}})), ir.plus(d)}))});
}

int json_ws(Ir& ir, const JsonOptions& opt) {
  int c = ir.bytes({{' ', ' '}, {'\t', '\t'}, {'\n', '\n'}, {'\r', '\r'}});
  return opt.max_whitespace < 0 ? ir.star(c) : ir.repeat(c, 0, opt.max_whitespace);
}

int json_value_rule(Ir& ir, const JsonOptions& opt) {
  int ws = json_ws(ir, opt);
  int value = ir.new_rule("json_value");
  int v = ir.ref(value);
  auto sep = [&](char c) { return ir.seq({ws, ir.byte(c), ws}); };
  int str = ir.seq({ir.byte('"'), ir.star(json_string_char(ir)), ir.byte('"')});
  int member = ir.seq({str, sep(':'), v});
  // "{" ws ( "}" | members ws "}" ): never two whitespace runs back to back (that would double
  // the bound and the DFA states).
  int object = ir.seq({ir.byte('{'), ws, ir.alt({ir.byte('}'), ir.seq({member, ir.star(ir.seq({sep(','), member})), ws, ir.byte('}')})})});
  int array = ir.seq({ir.byte('['), ws, ir.alt({ir.byte(']'), ir.seq({v, ir.star(ir.seq({sep(','), v})), ws, ir.byte(']')})})});
  ir.set_rule(value, ir.alt({object, array, str, json_number(ir), ir.literal("true"), ir.literal("false"), ir.literal("null")}));
  return value;
}

int compile_json_schema(Ir& ir, std::string_view text, const JsonOptions& opt) {
  check_depth(text, ir.limits().max_nesting);
  json doc = parse_json_fast(text);  // throws Error "json schema: invalid JSON: ..."
  try {
    SchemaCompiler c(ir, opt, std::move(doc));
    int r = c.root();
    int root = ir.new_rule("root");
    ir.set_rule(root, r);
    return root;
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("json schema: malformed schema: ") + e.what());
  }
}

}  // namespace deepinfer::grammar
