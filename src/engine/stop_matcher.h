#pragma once
// Stop conditions of one output sequence: stop strings over the detokenized text stream
// (StopMatcher), and stop tokens / EOS / length (check_stop_token). vLLM semantics; see
// docs/sampling.md "Stopping".
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampling_params.h"

namespace deepinfer {

// OpenAI finish_reason: kStop (EOS, a stop token or a stop string), kLength (max_tokens or the
// context limit).
enum class FinishReason { kNone, kStop, kLength };

// Token ids the sampler masks (logit -inf) while fewer than min_tokens tokens have been generated:
// stop_token_ids, plus the EOS ids unless ignore_eos. Sorted, unique; empty when min_tokens == 0.
std::vector<int32_t> min_tokens_masked_ids(const SamplingParams& params, std::span<const int32_t> eos_ids);

struct TokenStop {
  FinishReason reason = FinishReason::kNone;
  // The finishing token was EOS or in stop_token_ids (-1 otherwise, also for length).
  int32_t stop_token = -1;
  // Whether the finishing token's text belongs in the output: vLLM drops the text of an EOS / stop
  // token unless include_stop_str_in_output. Always true when reason is kNone or kLength.
  bool emit_token_text = true;
};

// Call after appending `token` as output token number `num_output` (1-based: it includes `token`).
// `length_limit` is the effective cap: min(max_tokens, context limit - prompt length).
// Order: stop token before length, so a stop token that is also the last allowed one reports kStop.
// Before min_tokens no stop token ends the sequence (the sampler masked them anyway).
TokenStop check_stop_token(int32_t token, int64_t num_output, int64_t length_limit, const SamplingParams& params,
                           std::span<const int32_t> eos_ids);

// Incremental stop-string matcher over the detokenized output. Feed each text delta (whole UTF-8
// characters, as the detokenizer produces them); it returns the text that is safe to emit now and
// holds back the longest suffix that could still grow into a stop string. The concatenation of all
// returned text (push results + flush) is the final output text, independent of how the stream
// was split into deltas.
//
// Matching: byte-wise, one KMP automaton per stop string, so each byte costs O(#stops). The first
// stop string to COMPLETE in the stream wins; if several complete on the same byte, the longest
// (earliest starting) one. The output is truncated before the match, or after it with
// include_stop_str_in_output (nothing is then held back, since the text is emitted either way).
class StopMatcher {
 public:
  StopMatcher() = default;
  StopMatcher(std::vector<std::string> stops, bool include_stop_str_in_output);
  explicit StopMatcher(const SamplingParams& params)
      : StopMatcher(params.stop, params.include_stop_str_in_output) {}

  struct Result {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string completed in this delta; the sequence is finished
    int stop_index = -1;   // which entry of `stops` matched (vLLM reports it as stop_reason)
  };

  // can_stop = false (fewer than min_tokens generated, vLLM) keeps tracking but never stops: a stop
  // string completing in such a delta is ordinary text. After a stop, push() throws deepinfer::Error.
  Result push(std::string_view delta, bool can_stop = true);
  // End of stream for another reason (EOS, length): releases the held-back text.
  std::string flush();

  bool stopped() const { return stopped_; }
  size_t held_back_bytes() const { return held_.size(); }

 private:
  struct Pattern {
    std::string s;
    std::vector<int> fail;  // KMP failure function: longest proper border of s[0..i]
    int state = 0;          // length of the longest suffix of the stream that is a prefix of s
  };
  std::vector<Pattern> patterns_;
  bool include_ = false;
  bool stopped_ = false;  // a stop string matched
  bool done_ = false;     // stopped or flushed: no more input
  std::string held_;  // text received but not yet emitted
};

}  // namespace deepinfer
