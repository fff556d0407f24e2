#include "engine/stop_matcher.h"

#include <algorithm>

#include "util/error.h"

namespace deepinfer {

std::vector<int32_t> min_tokens_masked_ids(const SamplingParams& params, std::span<const int32_t> eos_ids) {
  std::vector<int32_t> ids;
  if (params.min_tokens <= 0) return ids;
  ids.assign(params.stop_token_ids.begin(), params.stop_token_ids.end());
  if (!params.ignore_eos) ids.insert(ids.end(), eos_ids.begin(), eos_ids.end());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

TokenStop check_stop_token(int32_t token, int64_t num_output, int64_t length_limit, const SamplingParams& params,
                           std::span<const int32_t> eos_ids) {
  TokenStop r;
  if (num_output >= params.min_tokens) {
    const bool eos = !params.ignore_eos && std::find(eos_ids.begin(), eos_ids.end(), token) != eos_ids.end();
    const bool stop_id =
        std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), token) != params.stop_token_ids.end();
    if (eos || stop_id) {
      r.reason = FinishReason::kStop;
      r.stop_token = token;
      r.emit_token_text = params.include_stop_str_in_output;
      return r;
    }
  }
  // The length cap holds even before min_tokens: the context cannot grow past its limit.
  if (num_output >= length_limit) r.reason = FinishReason::kLength;
  return r;
}

StopMatcher::StopMatcher(std::vector<std::string> stops, bool include_stop_str_in_output)
    : include_(include_stop_str_in_output) {
  patterns_.reserve(stops.size());
  for (auto& s : stops) {
    if (s.empty()) throw Error("stop strings must not be empty");
    Pattern p;
    p.s = std::move(s);
    p.fail.assign(p.s.size(), 0);
    for (size_t i = 1, k = 0; i < p.s.size(); ++i) {
      while (k > 0 && p.s[i] != p.s[k]) k = p.fail[k - 1];
      if (p.s[i] == p.s[k]) ++k;
      p.fail[i] = (int)k;
    }
    patterns_.push_back(std::move(p));
  }
}

StopMatcher::Result StopMatcher::push(std::string_view delta, bool can_stop) {
  if (done_) throw Error("StopMatcher: text pushed after the sequence finished");
  Result r;
  for (size_t i = 0; i < delta.size(); ++i) {
    const char c = delta[i];
    int best = -1;
    for (size_t j = 0; j < patterns_.size(); ++j) {
      Pattern& p = patterns_[j];
      int q = p.state;
      while (q > 0 && p.s[q] != c) q = p.fail[q - 1];
      if (p.s[q] == c) ++q;
      if (q == (int)p.s.size()) {
        // Earliest completion wins; on the same byte the longer string started earlier.
        if (can_stop && (best < 0 || p.s.size() > patterns_[best].s.size())) best = (int)j;
        q = p.fail[q - 1];  // keep scanning (a match ignored before min_tokens is plain text)
      }
      p.state = q;
    }
    if (best >= 0) {
      const size_t match_end = held_.size() + i + 1;  // in held_ + delta coordinates
      const size_t match_len = patterns_[best].s.size();
      // match_end >= match_len: a match always starts inside the held-back text (or, with
      // include_stop_str_in_output, wherever it starts, everything up to its end is emitted).
      const size_t emit_end = include_ ? match_end : match_end - match_len;
      std::string buf = held_;
      buf.append(delta.substr(0, i + 1));
      r.text = buf.substr(0, std::min(emit_end, buf.size()));
      r.stopped = true;
      r.stop_index = best;
      held_.clear();
      stopped_ = done_ = true;
      return r;
    }
  }
  size_t hold = 0;
  if (!include_)
    for (const Pattern& p : patterns_) hold = std::max(hold, (size_t)p.state);
  std::string buf = std::move(held_);
  buf.append(delta);
  hold = std::min(hold, buf.size());
  r.text = buf.substr(0, buf.size() - hold);
  held_ = buf.substr(buf.size() - hold);
  return r;
}

std::string StopMatcher::flush() {
  done_ = true;
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace deepinfer
