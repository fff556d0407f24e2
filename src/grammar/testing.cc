#include "grammar/testing.h"

#include "util/json.h"

#include <cmath>
#include <random>

namespace deepinfer::grammar::testkit {

namespace {

void dump(const nlohmann::ordered_json& v, bool spaced, std::string& out) {
  using T = nlohmann::ordered_json::value_t;
  switch (v.type()) {
    case T::string: append_python_json_string(v.get<std::string>(), out); break;
    case T::array: {
      out += '[';
      bool first = true;
      for (auto& x : v) {
        if (!first) out += spaced ? ", " : ",";
        first = false;
        dump(x, spaced, out);
      }
      out += ']';
      break;
    }
    case T::object: {
      out += '{';
      bool first = true;
      for (auto& [k, x] : v.items()) {
        if (!first) out += spaced ? ", " : ",";
        first = false;
        append_python_json_string(k, out);
        out += spaced ? ": " : ":";
        dump(x, spaced, out);
      }
      out += '}';
      break;
    }
    case T::number_float: {
      double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 1e16) {
        out += std::to_string(static_cast<long long>(d)) + ".0";  // Python prints 1.0
      } else {
        out += v.dump();
      }
      break;
    }
    default: out += v.dump();
  }
}
}  // namespace

std::string dump_python(const nlohmann::ordered_json& v, bool spaced) {
  std::string out;
  dump(v, spaced, out);
  return out;
}

std::vector<int32_t> greedy_tokenize(const Vocabulary& v, std::string_view text) {
  std::vector<int32_t> out;
  size_t pos = 0;
  while (pos < text.size()) {
    uint32_t node = 0;
    int32_t best = -1;
    size_t best_len = 0, d = 0;
    while (pos + d < text.size()) {
      uint32_t c = node + 1, found = 0;
      for (; c < v.end_[node]; c = v.end_[c])
        if (v.byte_[c] == static_cast<uint8_t>(text[pos + d])) { found = c; break; }
      if (!found) break;
      node = found;
      ++d;
      if (v.tok_[node] >= 0) { best = v.tok_[node]; best_len = d; }
    }
    if (best < 0) return {};
    out.push_back(best);
    pos += best_len;
  }
  return out;
}

Sample sample(std::shared_ptr<const Grammar> g, uint64_t seed, size_t max_tokens, double eos_bias) {
  Matcher m(g);
  const Vocabulary& V = g->vocab();
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> mask(V.mask_words());
  std::vector<int32_t> allowed;
  Sample s;
  for (size_t step = 0; step < max_tokens; ++step) {
    m.fill_mask(mask.data());
    allowed.clear();
    bool eos = false;
    for (size_t w = 0; w < mask.size(); ++w)
      for (uint32_t bits = mask[w]; bits; bits &= bits - 1) {
        int32_t id = static_cast<int32_t>(w * 32 + __builtin_ctz(bits));
        if (id == V.eos_id()) eos = true;
        else allowed.push_back(id);
      }
    int32_t pick;
    if (eos && (allowed.empty() || std::uniform_real_distribution<double>(0, 1)(rng) < eos_bias)) pick = V.eos_id();
    else if (allowed.empty()) break;
    else pick = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
    if (!m.accept_token(pick)) break;  // cannot happen if the mask is right; callers check
    if (pick == V.eos_id()) { s.completed = true; break; }
    s.tokens.push_back(pick);
    s.text += V.token(pick);
  }
  return s;
}

}  // namespace deepinfer::grammar::testkit
