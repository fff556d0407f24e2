// StopMatcher (stop strings over the streamed text) and the stop-token / length helpers.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "engine/stop_matcher.h"
#include "util/error.h"

namespace deepinfer {
namespace {

struct Streamed {
  std::string text;     // everything emitted, flush included
  bool stopped = false;
  int stop_index = -1;
  size_t max_held = 0;  // largest hold-back seen
};

Streamed stream(StopMatcher& m, const std::vector<std::string>& deltas) {
  Streamed s;
  for (const std::string& d : deltas) {
    StopMatcher::Result r = m.push(d);
    s.text += r.text;
    s.max_held = std::max(s.max_held, m.held_back_bytes());
    if (r.stopped) {
      s.stopped = true;
      s.stop_index = r.stop_index;
      return s;
    }
  }
  s.text += m.flush();
  return s;
}

// Reference by brute force over the whole text: the first end position where some stop string
// ends, the longest one on a tie.
Streamed reference(const std::string& text, const std::vector<std::string>& stops, bool include) {
  Streamed s;
  for (size_t end = 1; end <= text.size(); ++end) {
    int best = -1;
    for (size_t j = 0; j < stops.size(); ++j) {
      const std::string& st = stops[j];
      if (st.size() <= end && text.compare(end - st.size(), st.size(), st) == 0 &&
          (best < 0 || st.size() > stops[best].size()))
        best = (int)j;
    }
    if (best >= 0) {
      s.stopped = true;
      s.stop_index = best;
      s.text = text.substr(0, include ? end : end - stops[best].size());
      return s;
    }
  }
  s.text = text;
  return s;
}

TEST(StopMatcher, StopSplitOverThreeDeltas) {
  StopMatcher m({"\n\nUser"}, false);
  auto r1 = m.push("Hello\n");
  EXPECT_EQ(r1.text, "Hello");  // "\n" could start the stop: held
  EXPECT_FALSE(r1.stopped);
  auto r2 = m.push("\nUs");
  EXPECT_EQ(r2.text, "");
  EXPECT_EQ(m.held_back_bytes(), 4u);
  auto r3 = m.push("er: hi");
  EXPECT_TRUE(r3.stopped);
  EXPECT_EQ(r3.stop_index, 0);
  EXPECT_EQ(r3.text, "");
  EXPECT_TRUE(m.stopped());
  EXPECT_THROW(m.push("more"), Error);
}

TEST(StopMatcher, FalseStartIsReleased) {
  StopMatcher m({"\n\nUser"}, false);
  EXPECT_EQ(m.push("a\n\nUs").text, "a");
  EXPECT_EQ(m.push("ed").text, "\n\nUsed");  // no longer a prefix: all of it goes out
  EXPECT_EQ(m.push("\n").text, "");
  EXPECT_EQ(m.flush(), "\n");  // end of stream for another reason: nothing is lost
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, IncludeStopString) {
  StopMatcher m({"\n\nUser"}, true);
  std::string out;
  for (const char* d : {"Hello\n", "\nUs", "er: hi"}) {
    auto r = m.push(d);
    out += r.text;
    EXPECT_EQ(m.held_back_bytes(), 0u);  // emitted either way, so nothing is held back
    if (r.stopped) break;
  }
  EXPECT_EQ(out, "Hello\n\nUser");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcher, PrefixStopsFirstCompletionWins) {
  // "User" completes before "User:", whatever the list order and the delta split.
  for (bool swap : {false, true}) {
    std::vector<std::string> stops = {"User:", "User"};
    if (swap) std::swap(stops[0], stops[1]);
    const int user = swap ? 0 : 1;
    for (const auto& deltas : std::vector<std::vector<std::string>>{{"Hi User: x"}, {"Hi U", "ser", ": x"}}) {
      StopMatcher m(stops, false);
      Streamed s = stream(m, deltas);
      EXPECT_TRUE(s.stopped);
      EXPECT_EQ(s.stop_index, user);
      EXPECT_EQ(s.text, "Hi ");
      StopMatcher inc(stops, true);
      EXPECT_EQ(stream(inc, deltas).text, "Hi User");
    }
  }
  // Same end byte: the longer (earlier starting) one.
  StopMatcher m({"ab", "xab"}, false);
  Streamed s = stream(m, {"zx", "ab"});
  EXPECT_EQ(s.stop_index, 1);
  EXPECT_EQ(s.text, "z");
  // Self-overlapping stop: "aab" inside "aaab" needs the KMP fallback.
  StopMatcher o({"aab"}, false);
  Streamed t = stream(o, {"a", "a", "a", "b", "c"});
  EXPECT_TRUE(t.stopped);
  EXPECT_EQ(t.text, "a");
}

TEST(StopMatcher, RandomStreamsMatchBruteForceAndNeverLoseText) {
  std::mt19937 rng(7);
  const std::string alphabet = "ab\nU";
  const std::vector<std::vector<std::string>> stop_sets = {
      {"\n\nU"}, {"ab", "aba"}, {"aab", "ba\n"}, {"abab", "bab", "b\nb"}, {"UUU", "a"}, {}};
  int stopped = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const auto& stops = stop_sets[iter % stop_sets.size()];
    const bool include = (iter / stop_sets.size()) % 2;
    std::string text;
    const int len = 1 + (int)(rng() % 40);
    for (int i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
    std::vector<std::string> deltas;
    for (size_t i = 0; i < text.size();) {
      const size_t n = 1 + rng() % 5;
      deltas.push_back(text.substr(i, n));
      i += n;
    }
    StopMatcher m(stops, include);
    Streamed got = stream(m, deltas);
    Streamed want = reference(text, stops, include);
    ASSERT_EQ(got.stopped, want.stopped) << text;
    ASSERT_EQ(got.stop_index, want.stop_index) << text;
    ASSERT_EQ(got.text, want.text) << text;
    size_t max_len = 0;
    for (const auto& s : stops) max_len = std::max(max_len, s.size());
    ASSERT_LE(got.max_held, max_len == 0 ? 0 : max_len - 1);
    stopped += got.stopped;
  }
  EXPECT_GT(stopped, 500);  // the random streams do exercise matches
}

TEST(StopMatcher, EmittedTextIsPrefixOfFinalText) {
  // Hold-back correctness step by step: what is out is never taken back.
  const std::string text = "one\n\nUsher\n\nUser: two";
  StopMatcher m({"\n\nUser:", "\n\nUser"}, false);
  std::string out;
  for (char c : text) {
    auto r = m.push(std::string(1, c));
    out += r.text;
    EXPECT_EQ(text.compare(0, out.size(), out), 0);
    if (r.stopped) break;
  }
  EXPECT_EQ(out, "one\n\nUsher");
}

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = (unsigned char)s[i];
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t j = 1; j < n; ++j)
      if (((unsigned char)s[i + j] >> 6) != 2) return false;
    i += n;
  }
  return true;
}

TEST(StopMatcher, Utf8DeltasStayWholeCharacters) {
  // "é" = C3 A9 and "è" = C3 A8 share a lead byte: a partial byte match must not split "è".
  StopMatcher m({"aé", "日本"}, false);
  std::vector<std::string> deltas = {"x", "a", "è", "日", "日", "本", "語"};
  std::string out;
  bool stopped = false;
  for (const auto& d : deltas) {
    auto r = m.push(d);
    EXPECT_TRUE(valid_utf8(r.text)) << "chunk after delta " << d;
    out += r.text;
    if (r.stopped) {
      stopped = true;
      EXPECT_EQ(r.stop_index, 1);
      break;
    }
  }
  EXPECT_TRUE(stopped);
  EXPECT_EQ(out, "xaè日");
  StopMatcher e({"é"}, true);
  Streamed s = stream(e, {"ca", "f", "é", " au lait"});
  EXPECT_EQ(s.text, "café");
}

TEST(StopMatcher, NoStopBeforeMinTokens) {
  StopMatcher m({"END"}, false);
  auto r1 = m.push("xEND", /*can_stop=*/false);  // before min_tokens: ordinary text
  EXPECT_FALSE(r1.stopped);
  EXPECT_EQ(r1.text, "xEND");
  EXPECT_EQ(m.push("E", false).text, "");  // still held: it may start a later match
  auto r2 = m.push("ND!", true);
  EXPECT_TRUE(r2.stopped);
  EXPECT_EQ(r2.text, "");
}

TEST(StopMatcher, NoStopsPassesEverythingThrough) {
  StopMatcher m;
  EXPECT_EQ(m.push("abc").text, "abc");
  EXPECT_EQ(m.flush(), "");
  EXPECT_THROW(m.push("x"), Error);  // finished
  EXPECT_THROW(StopMatcher({"a", ""}, false), Error);
  SamplingParams p;
  p.stop = {"zz"};
  p.include_stop_str_in_output = true;
  StopMatcher fromp(p);
  auto r = fromp.push("azzb");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "azz");
}

TEST(StopTokens, EosStopIdsLengthAndMinTokens) {
  const int32_t eos[] = {2, 3};
  SamplingParams p;
  p.stop_token_ids = {7};
  auto c = check_stop_token(3, 1, 100, p, eos);
  EXPECT_EQ(c.reason, FinishReason::kStop);
  EXPECT_EQ(c.stop_token, 3);
  EXPECT_FALSE(c.emit_token_text);
  c = check_stop_token(7, 1, 100, p, eos);
  EXPECT_EQ(c.reason, FinishReason::kStop);
  EXPECT_EQ(c.stop_token, 7);
  EXPECT_EQ(check_stop_token(5, 1, 100, p, eos).reason, FinishReason::kNone);
  EXPECT_EQ(check_stop_token(5, 100, 100, p, eos).reason, FinishReason::kLength);
  // A stop token that is also the last allowed token is a stop.
  EXPECT_EQ(check_stop_token(7, 100, 100, p, eos).reason, FinishReason::kStop);
  p.include_stop_str_in_output = true;
  EXPECT_TRUE(check_stop_token(7, 1, 100, p, eos).emit_token_text);
  // ignore_eos: EOS is plain text, stop tokens still stop.
  p.ignore_eos = true;
  EXPECT_EQ(check_stop_token(2, 1, 100, p, eos).reason, FinishReason::kNone);
  EXPECT_EQ(check_stop_token(7, 1, 100, p, eos).reason, FinishReason::kStop);
  // min_tokens: nothing stops before it, except the length cap.
  SamplingParams q;
  q.min_tokens = 5;
  EXPECT_EQ(check_stop_token(2, 4, 100, q, eos).reason, FinishReason::kNone);
  EXPECT_EQ(check_stop_token(2, 5, 100, q, eos).reason, FinishReason::kStop);
  EXPECT_EQ(check_stop_token(9, 4, 4, q, eos).reason, FinishReason::kLength);
}

}  // namespace
}  // namespace deepinfer
