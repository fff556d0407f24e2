// DeepSeek-V4 on the CPU backend against transformers (float64, CPU), on the committed fixtures
// made by scripts/make_v4_fixtures.py. Full forward, token-by-token decode and chunked prefill must
// each stay within a median per-position relative L2 error of 1e-5; several sequences in one batch
// must give bitwise the logits each gives alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "io/safetensors.h"
#include "model/model.h"
#include "ops/cpu/cpu_backend.h"
#include "util/error.h"
#include "reference_fixtures.h"

using namespace deepinfer;
namespace fs = std::filesystem;
using testref::RefSeq, testref::ErrStats, testref::compare, testref::read_refs;

namespace {

std::vector<std::string> fixture_dirs() {
  return testref::fixture_dirs(fs::path(DEEPINFER_SOURCE_DIR) / "tests/fixtures/v4", "DEEPINFER_V4_FIXTURES");
}

// Runs one sequence: `first` tokens in one step, then steps of `step` tokens (first = T: one step).
std::vector<float> run_schedule(DeepseekV4Model& m, const std::vector<int32_t>& ids, int64_t first, int64_t step) {
  V4Cache cache(m.config(), 1, (int32_t)V4CacheLayout::make(m.config()).pages_for((int64_t)ids.size()));
  V4SeqState st;
  EXPECT_TRUE(cache.open(&st) && cache.reserve(&st, (int64_t)ids.size()));
  std::vector<float> out;
  int64_t done = 0, T = (int64_t)ids.size();
  while (done < T) {
    int64_t n = done == 0 ? std::min(first, T) : std::min(step, T - done);
    V4SeqChunk c{&st, std::span<const int32_t>(ids.data() + done, n), true};
    auto l = m.forward(std::span<const V4SeqChunk>(&c, 1), cache);
    out.insert(out.end(), l.begin(), l.end());
    done += n;
  }
  return out;
}

}  // namespace

TEST(V4Reference, FixturesExist) { ASSERT_GE(fixture_dirs().size(), 1u) << "no fixtures under tests/fixtures/v4"; }

TEST(V4Reference, FullDecodeAndChunkedMatchTransformers) {
  for (const auto& dir : fixture_dirs()) {
    SCOPED_TRACE(dir);
    CpuBackend be(2);
    LoadedModel m = load_model(dir + "/model", be);
    EXPECT_TRUE(m.unused.empty()) << "unused tensor, e.g. " << (m.unused.empty() ? "" : m.unused[0]);
    const int64_t V = m.v4->config().vocab_size;
    auto refs = read_refs(dir);
    ASSERT_FALSE(refs.empty());
    for (size_t k = 0; k < refs.size(); ++k) {
      const auto& r = refs[k];
      const int64_t T = (int64_t)r.ids.size();
      ASSERT_EQ((int64_t)r.logits.size(), T * V);
      struct Mode {
        const char* name;
        int64_t first, step;
      };
      std::vector<float> full;
      for (Mode mode : {Mode{"full", T, T}, Mode{"decode", 13, 1}, Mode{"chunked", 5, 7}, Mode{"chunked", 1, 4}}) {
        SCOPED_TRACE(std::string(mode.name) + " seq " + std::to_string(k));
        auto out = run_schedule(*m.v4, r.ids, mode.first, mode.step);
        // Chunk invariance: the schedule never changes a bit (so preemption by recompute and prefix
        // reuse reproduce an uninterrupted run exactly).
        if (full.empty()) full = out;
        else EXPECT_EQ(0, std::memcmp(full.data(), out.data(), out.size() * sizeof(float))) << "not bitwise equal to full";
        ErrStats e = compare(out, r.logits, V);
        EXPECT_LE(e.median, 1e-5) << "max " << e.max;
        EXPECT_LE(e.max, 1e-3);
        EXPECT_GE(e.argmax_agree, 0.99);
      }
    }
  }
}

TEST(V4Reference, BatchedSequencesAreBitwiseEqualToAlone) {
  const auto dirs = fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  const std::string dir = dirs.front();
  CpuBackend be(2);
  LoadedModel m = load_model(dir + "/model", be);
  const int64_t V = m.v4->config().vocab_size;
  auto refs = read_refs(dir);
  // Sequences of different lengths with different schedules, so a step mixes prefill chunks and
  // single-token decodes; two sequences share a prompt prefix.
  std::vector<std::vector<int32_t>> seqs;
  for (auto& r : refs) seqs.push_back(r.ids);
  seqs.push_back(std::vector<int32_t>(refs[0].ids.begin(), refs[0].ids.begin() + 29));
  struct Sched {
    int64_t first, step;
  };
  std::vector<Sched> sched{{9, 4}, {1, 1}, {30, 11}, {17, 3}};
  sched.resize(seqs.size(), {5, 2});

  std::vector<std::vector<float>> alone;
  for (size_t i = 0; i < seqs.size(); ++i) alone.push_back(run_schedule(*m.v4, seqs[i], sched[i].first, sched[i].step));

  V4Cache cache(m.v4->config(), (int32_t)seqs.size(), 64);
  std::vector<V4SeqState> states(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i)
    ASSERT_TRUE(cache.open(&states[i]) && cache.reserve(&states[i], (int64_t)seqs[i].size()));
  std::vector<int64_t> done(seqs.size(), 0);
  std::vector<std::vector<float>> batched(seqs.size());
  for (;;) {
    std::vector<V4SeqChunk> batch;
    std::vector<size_t> who;
    for (size_t i = 0; i < seqs.size(); ++i) {
      int64_t T = (int64_t)seqs[i].size();
      if (done[i] >= T) continue;
      int64_t n = done[i] == 0 ? std::min(sched[i].first, T) : std::min(sched[i].step, T - done[i]);
      batch.push_back({&states[i], std::span<const int32_t>(seqs[i].data() + done[i], n), true});
      who.push_back(i);
      done[i] += n;
    }
    if (batch.empty()) break;
    auto l = m.v4->forward(batch, cache);
    ASSERT_EQ(cache.page_manager().check_invariants(), "");
    size_t off = 0;
    for (size_t b = 0; b < batch.size(); ++b) {
      size_t n = batch[b].tokens.size() * V;
      batched[who[b]].insert(batched[who[b]].end(), l.begin() + off, l.begin() + off + n);
      off += n;
    }
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    ASSERT_EQ(alone[i].size(), batched[i].size());
    EXPECT_EQ(0, std::memcmp(alone[i].data(), batched[i].data(), alone[i].size() * sizeof(float)))
        << "sequence " << i << " differs between batched and alone";
  }
}

// Decode steps padded to a bucket of batch sizes (the CUDA graphs' layout, forced here on the CPU): five
// sequences decoding token by token, finishing at different lengths, so steps of 5, 4, ... 1 sequences run
// as 8, 4, 4, 2, 1 rows. Stand-in rows read slot 0 and page 0 (sequence 0's) and must write nothing: every
// sequence's logits must be bitwise those of the unpadded run.
TEST(V4Reference, PaddedDecodeStepsAreBitwiseEqual) {
  const auto dirs = fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  CpuBackend be(2);
  LoadedModel m = load_model(dirs.front() + "/model", be);
  const int64_t V = m.v4->config().vocab_size;
  auto refs = read_refs(dirs.front());
  std::vector<std::vector<int32_t>> seqs;
  for (size_t i = 0; i < 5; ++i) {
    const auto& ids = refs[i % refs.size()].ids;
    seqs.push_back(std::vector<int32_t>(ids.begin(), ids.begin() + std::min<size_t>(ids.size(), 24 + 9 * i)));
  }
  auto run = [&](int pad) {
    m.v4->set_decode_padding(pad);
    V4Cache cache(m.v4->config(), (int32_t)seqs.size(), 64);
    std::vector<V4SeqState> states(seqs.size());
    for (size_t i = 0; i < seqs.size(); ++i)
      EXPECT_TRUE(cache.open(&states[i]) && cache.reserve(&states[i], (int64_t)seqs[i].size()));
    std::vector<std::vector<float>> out(seqs.size());
    for (int64_t t = 0;; ++t) {
      std::vector<V4SeqChunk> batch;
      std::vector<size_t> who;
      for (size_t i = 0; i < seqs.size(); ++i)
        if (t < (int64_t)seqs[i].size()) batch.push_back({&states[i], {seqs[i].data() + t, 1}, true}), who.push_back(i);
      if (batch.empty()) break;
      auto l = m.v4->forward(batch, cache);
      EXPECT_EQ(l.size(), batch.size() * V);
      for (size_t b = 0; b < batch.size(); ++b) out[who[b]].insert(out[who[b]].end(), l.begin() + b * V, l.begin() + (b + 1) * V);
    }
    m.v4->set_decode_padding(-1);
    return out;
  };
  const auto plain = run(0), padded = run(1);
  for (size_t i = 0; i < seqs.size(); ++i) {
    ASSERT_EQ(plain[i].size(), padded[i].size());
    EXPECT_EQ(0, std::memcmp(plain[i].data(), padded[i].data(), plain[i].size() * sizeof(float)))
        << "sequence " << i << " differs when its decode steps are padded";
  }
}

// A decode step ordered for side chains (Backend::chains_side_by_side: the compressors and the indexer forked off
// before wq_b, the router before the shared expert) gives bitwise the logits of the one-chain order: no op of a
// side chain reads what the main chain writes before the join (run here one after another, side chain first).
TEST(V4Reference, SideChainOrderIsBitwiseTheOneChainOrder) {
  const auto dirs = fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  auto refs = read_refs(dirs.front());
  std::vector<std::vector<int32_t>> seqs;
  for (size_t i = 0; i < 4; ++i) {
    const auto& ids = refs[i % refs.size()].ids;
    seqs.push_back(std::vector<int32_t>(ids.begin(), ids.begin() + std::min<size_t>(ids.size(), 30 + 11 * i)));
  }
  auto run = [&](bool side) {
    CpuBackend be(2);
    be.set_side_chain_order(side);
    LoadedModel m = load_model(dirs.front() + "/model", be);
    const int64_t V = m.v4->config().vocab_size;
    V4Cache cache(m.v4->config(), (int32_t)seqs.size(), 64);
    std::vector<V4SeqState> states(seqs.size());
    for (size_t i = 0; i < seqs.size(); ++i)
      EXPECT_TRUE(cache.open(&states[i]) && cache.reserve(&states[i], (int64_t)seqs[i].size()));
    std::vector<float> out;
    for (int64_t t = 0;; ++t) {  // one token a sequence a step: decode steps throughout
      std::vector<V4SeqChunk> batch;
      for (size_t i = 0; i < seqs.size(); ++i)
        if (t < (int64_t)seqs[i].size()) batch.push_back({&states[i], {seqs[i].data() + t, 1}, true});
      if (batch.empty()) break;
      auto l = m.v4->forward(batch, cache);
      EXPECT_EQ(l.size(), batch.size() * V);
      out.insert(out.end(), l.begin(), l.end());
    }
    return out;
  };
  const auto one = run(false), side = run(true);
  ASSERT_EQ(one.size(), side.size());
  EXPECT_EQ(0, std::memcmp(one.data(), side.data(), one.size() * sizeof(float)));
}

// Decode steps fed from the previous step's picks (DeepseekV4Model::launch's feed: the tokens taken on the
// backend, as the engine does when it launches step N+1 before reading step N) against the same steps given
// their tokens on the host: bitwise the same logits and picks. Three sequences after a prefill, sampled (two
// seeded specs) and greedy; sequence 1's token is given in odd steps (feed −1) to mix the two in one step.
TEST(V4Reference, FedDecodeStepsEqualStepsGivenTheirTokens) {
  const auto dirs = fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  CpuBackend be(2);
  LoadedModel m = load_model(dirs.front() + "/model", be);
  DeepseekV4Model& model = *m.v4;
  const int64_t V = model.config().vocab_size;
  auto refs = read_refs(dirs.front());
  const size_t S = 3;
  const int steps = 7;
  const SampleSpec spec[S] = {{0.8f, 0.9f, 0.0f, 0, 11, 0}, {0.0f, 1.0f, 0.0f, 0, 0, 0}, {1.1f, 1.0f, 0.0f, 20, 12, 0}};
  model.set_device_argmax(true);
  struct Run {
    std::vector<float> logits;
    std::vector<int32_t> tokens;
  };
  auto run = [&](bool fed) {
    Run r;
    V4Cache cache(model.config(), (int32_t)S, 64);
    std::vector<V4SeqState> st(S);
    std::vector<std::vector<int32_t>> prompt(S);
    std::vector<V4SeqChunk> pre;
    for (size_t i = 0; i < S; ++i) {
      const auto& ids = refs[i % refs.size()].ids;
      prompt[i].assign(ids.begin(), ids.begin() + std::min<size_t>(ids.size(), 10 + 3 * i));
      EXPECT_TRUE(cache.open(&st[i]) && cache.reserve(&st[i], (int64_t)prompt[i].size() + steps + 1));
      pre.push_back({&st[i], prompt[i], false, spec[i]});
      pre.back().sample.position = (uint64_t)prompt[i].size();
    }
    model.forward_launch(pre, cache);
    EXPECT_FALSE(model.can_feed());  // a prefill step's picks are not kept for a feed
    std::vector<int32_t> tok(model.argmax().begin(), model.argmax().end());
    for (int t = 0; t < steps; ++t) {
      std::vector<V4SeqChunk> batch;
      for (size_t i = 0; i < S; ++i) {
        batch.push_back({&st[i], std::span<const int32_t>(&tok[i], 1), false, spec[i]});
        batch.back().sample.position = (uint64_t)st[i].pos + 1;
      }
      if (!fed) {
        const auto l = model.forward_view(batch, cache);
        r.logits.insert(r.logits.end(), l.begin(), l.end());
        tok.assign(model.argmax().begin(), model.argmax().end());
      } else {
        model.prepare(batch, cache);
        std::vector<int32_t> feed(S, -1), ids(S, -1);  // −1: a fed row's id is ignored
        for (size_t i = 0; i < S; ++i) {
          if (t > 0 && !(i == 1 && t % 2)) feed[i] = (int32_t)i;
          else ids[i] = tok[i];
        }
        if (t > 0) EXPECT_TRUE(model.can_feed());
        model.launch(ids, t > 0 ? std::span<const int32_t>(feed) : std::span<const int32_t>{});
        if (t > 0) {  // the step before reads as argmax(1) after this launch
          const auto prev = model.argmax(1);
          EXPECT_EQ(std::vector<int32_t>(prev.begin(), prev.end()), tok);
        }
        const auto l = model.logits();
        r.logits.insert(r.logits.end(), l.begin(), l.end());
        tok.assign(model.argmax().begin(), model.argmax().end());
      }
      r.tokens.insert(r.tokens.end(), tok.begin(), tok.end());
    }
    return r;
  };
  const Run given = run(false), fed = run(true);
  ASSERT_EQ(given.logits.size(), (size_t)(steps * S * V));
  ASSERT_EQ(fed.logits.size(), given.logits.size());
  EXPECT_EQ(0, std::memcmp(given.logits.data(), fed.logits.data(), given.logits.size() * sizeof(float)));
  EXPECT_EQ(given.tokens, fed.tokens);
  for (int32_t t : fed.tokens) EXPECT_TRUE(t >= 0 && t < V);
  model.set_device_argmax(false);
}

// Logit edits applied on the backend before the picks (bias, penalties, masks) change the logits in place;
// the host reads them back raw (logits_row / logits restore the edited ids), as a row sampled on the host after
// all needs: the same bits as a step without edits. The picks are the host sampler's on the edited logits.
TEST(V4Reference, EditedRowsReadBackRaw) {
  const auto dirs = fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  CpuBackend be(2);
  LoadedModel m = load_model(dirs.front() + "/model", be);
  DeepseekV4Model& model = *m.v4;
  const int64_t V = model.config().vocab_size;
  auto refs = read_refs(dirs.front());
  model.set_device_argmax(true);
  std::vector<LogitEdit> list;
  for (int32_t id = 0; id < (int32_t)V; id += 7) list.push_back({id, 1.5f, id % 3, (uint32_t)(id % 8)});
  const RowEdits erow{1.2f, 0.3f, 0.1f, 0, (int32_t)list.size(), 0};
  const SampleSpec spec{0.9f, 0.95f, 0.0f, 0, 77, 0};
  auto run = [&](bool edited, std::vector<float>& raw_row, std::vector<float>& all, int32_t& pick) {
    V4Cache cache(model.config(), 2, 16);
    std::vector<V4SeqState> st(2);
    std::vector<V4SeqChunk> batch;
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_TRUE(cache.open(&st[i]) && cache.reserve(&st[i], 12));
      batch.push_back({&st[i], std::span<const int32_t>(refs[0].ids.data() + i, 10), false, spec});
      if (edited && i == 1) batch.back().edited = true, batch.back().edit_row = erow, batch.back().edits = list;
    }
    model.forward_launch(batch, cache);
    pick = model.argmax()[1];
    raw_row.resize((size_t)V);
    model.logits_row(1, raw_row.data());
    const auto l = model.logits();
    all.assign(l.begin(), l.end());
  };
  std::vector<float> r0, a0, r1, a1;
  int32_t p0 = 0, p1 = 0;
  run(false, r0, a0, p0);
  run(true, r1, a1, p1);
  EXPECT_EQ(0, std::memcmp(r0.data(), r1.data(), V * sizeof(float)));
  ASSERT_EQ(a0.size(), a1.size());
  EXPECT_EQ(0, std::memcmp(a0.data(), a1.data(), a0.size() * sizeof(float)));
  std::vector<float> edited = r0;  // the pick is sample_row's on the edited row
  apply_edits(edited.data(), V, erow, list.data());
  SampleSpec s = spec;
  EXPECT_EQ(p1, sample_row(edited.data(), V, s));
  model.set_device_argmax(false);
}

// A fed decode step whose row has logit edits with a pending token (RowEdits::pend: its input token is the step
// before's pick, which the backend adds to the edits): logits() reads back the raw logits (the pending token's
// saved value restored by its id), bitwise those of the same step without edits, and the pick is the host
// sampler's on the raw row edited with that token appended. An edit list whose rows overlap is refused.
TEST(V4Reference, FedRowsWithPendingEditsReadBackRaw) {
  const auto dirs = fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  CpuBackend be(2);
  LoadedModel m = load_model(dirs.front() + "/model", be);
  DeepseekV4Model& model = *m.v4;
  const int64_t V = model.config().vocab_size;
  auto refs = read_refs(dirs.front());
  model.set_device_argmax(true);
  StepEdits se;
  for (int32_t id = 5; id < (int32_t)V; id += 13) se.list.push_back({id, 0.5f, id % 3, (uint32_t)(id % 8)});
  se.rows.resize(2);
  se.rows[0] = RowEdits{1.3f, 0.4f, 0.2f, 0, (int32_t)se.list.size(), 1};
  se.list.resize(se.list.size() + 2, LogitEdit{-1, 0.0f, 0, 0u});  // the pending token's two places
  const SampleSpec spec{0.9f, 0.95f, 0.0f, 0, 91, 0};
  struct Out {
    std::vector<float> logits;
    int32_t pick = -1, pending = -1;
  };
  auto run = [&](bool edited, bool overlap) {
    Out o;
    V4Cache cache(model.config(), 2, 16);
    std::vector<V4SeqState> st(2);
    std::vector<V4SeqChunk> pre;
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_TRUE(cache.open(&st[i]) && cache.reserve(&st[i], 14));
      pre.push_back({&st[i], std::span<const int32_t>(refs[0].ids.data() + i, 10), false, spec});
      pre.back().sample.position = 10;
    }
    model.forward_launch(pre, cache);
    std::vector<int32_t> tok(model.argmax().begin(), model.argmax().end());
    for (int t = 0; t < 2; ++t) {  // a step given its tokens, then one fed from its picks
      std::vector<V4SeqChunk> batch;
      for (size_t i = 0; i < 2; ++i) {
        batch.push_back({&st[i], std::span<const int32_t>(&tok[i], 1), false, spec});
        batch.back().sample.position = (uint64_t)st[i].pos + 1;
        if (t == 1 && edited && i == 0) batch.back().edited = true;
      }
      model.prepare(batch, cache);
      if (t == 0) {
        model.launch(tok);
        tok.assign(model.argmax().begin(), model.argmax().end());
        continue;
      }
      const std::vector<int32_t> feed{0, 1}, ids{-1, -1};
      if (overlap) {  // row 1's span over row 0's pending places: refused (the step is abandoned)
        StepEdits bad = se;
        bad.rows[1] = RowEdits{1.1f, 0.0f, 0.0f, se.rows[0].count, 1, 0};
        EXPECT_THROW(model.launch(ids, feed, &bad), Error);
        return o;
      }
      model.launch(ids, feed, edited ? &se : nullptr);
      o.pending = model.argmax(1)[0];
      o.pick = model.argmax()[0];
      const auto l = model.logits();
      o.logits.assign(l.begin(), l.begin() + V);
    }
    return o;
  };
  run(true, true);
  const Out plain = run(false, false), ed = run(true, false);
  ASSERT_EQ(plain.logits.size(), (size_t)V);
  EXPECT_EQ(plain.pending, ed.pending);
  EXPECT_NE((ed.pending - 5) % 13, 0) << "the pending token should have no entry in the list (its own two places)";
  EXPECT_EQ(0, std::memcmp(plain.logits.data(), ed.logits.data(), V * sizeof(float))) << "raw read-back";
  std::vector<float> row = plain.logits;
  RowEdits r0 = se.rows[0];
  const int32_t tokens[1] = {ed.pending};
  apply_edits(row.data(), V, r0, se.list.data(), nullptr, tokens);
  SampleSpec s = spec;
  s.position = 12;
  EXPECT_EQ(ed.pick, sample_row(row.data(), V, s));
  model.set_device_argmax(false);
}

TEST(V4Reference, ForwardRejectsBadInput) {
  const auto dirs = fixture_dirs();
  ASSERT_FALSE(dirs.empty());
  CpuBackend be(1);
  LoadedModel m = load_model(dirs.front() + "/model", be);
  V4Cache cache(m.v4->config(), 1, 1);
  V4SeqState st;
  ASSERT_TRUE(cache.open(&st) && cache.reserve(&st, 4));
  std::vector<int32_t> bad{0, m.v4->config().vocab_size};
  V4SeqChunk c{&st, bad, true};
  EXPECT_THROW(m.v4->forward(std::span<const V4SeqChunk>(&c, 1), cache), Error);
  std::vector<int32_t> ok{1, 2};
  V4SeqChunk twice[2] = {{&st, ok, true}, {&st, ok, true}};
  EXPECT_THROW(m.v4->forward(std::span<const V4SeqChunk>(twice, 2), cache), Error);
  std::vector<int32_t> too_long(cache.layout().tokens_per_page + 1, 1);
  V4SeqChunk c2{&st, too_long, true};
  EXPECT_THROW(m.v4->forward(std::span<const V4SeqChunk>(&c2, 1), cache), Error) << "pages do not cover it";
  V4SeqState no_slot;
  V4SeqChunk c3{&no_slot, ok, true};
  EXPECT_THROW(m.v4->forward(std::span<const V4SeqChunk>(&c3, 1), cache), Error);
  EXPECT_EQ(st.pos, 0) << "a rejected step must not advance the state";
}
