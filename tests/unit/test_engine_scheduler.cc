// The scheduler against a simulated model: the "model" computes a sequence's next token as a hash
// of all its tokens, but only from state it was actually fed (chunks must arrive in order, each
// exactly once since the last preemption). Checks: outputs equal an unconstrained run under a
// tiny cache (preemption by recompute), budget and max_num_seqs are respected, abort frees
// everything, the cache accounting holds after every step, async planning gives the same outputs.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <random>

#include "engine/scheduler.h"

using namespace deepinfer;

namespace {

struct SimSeq {
  std::vector<int32_t> tokens;  // prompt + generated
  int64_t prompt = 0, max_new = 0;
  uint64_t state_hash = 0;      // "cache": hash of tokens fed so far
  int64_t fed = 0;              // tokens fed since the last (re)admission
  bool done = false;
};

uint64_t mix(uint64_t h, int32_t t) { return (h ^ (uint64_t)(t + 1)) * 0x9E3779B97F4A7C15ull + 7; }

struct RunResult {
  std::map<uint64_t, std::vector<int32_t>> outputs;
  int preemptions = 0;
  int steps = 0;
};

RunResult run(int num_seqs, int32_t slots, int32_t pages, SchedulerConfig cfg, bool async, uint32_t seed,
              std::optional<uint64_t> abort_id = std::nullopt) {
  std::mt19937 g(seed);
  BlockManager slot_pool(slots), page_pool(pages);
  Scheduler sch(cfg, slot_pool, page_pool);
  std::map<uint64_t, SimSeq> seqs;
  for (int i = 0; i < num_seqs; ++i) {
    SimSeq s;
    s.prompt = 1 + g() % 40;
    s.max_new = 1 + g() % 30;
    for (int64_t k = 0; k < s.prompt; ++k) s.tokens.push_back((int32_t)(g() % 1000));
    seqs[i] = s;
    sch.add(i, s.prompt);
  }
  RunResult r;
  std::optional<StepPlan> inflight;
  auto execute = [&](const StepPlan& plan) {
    for (uint64_t p : plan.preempted) {
      seqs[p].state_hash = 0;
      seqs[p].fed = 0;
    }
    for (const auto& c : plan.chunks) {
      SimSeq& s = seqs[c.seq];
      if (s.done) continue;  // finished while this plan was in flight
      EXPECT_EQ(c.start, s.fed) << "chunk out of order for seq " << c.seq;
      for (int64_t k = c.start; k < c.start + c.len; ++k) {
        ASSERT_LT(k, (int64_t)s.tokens.size()) << "input token not known yet";
        s.state_hash = mix(s.state_hash, s.tokens[k]);
      }
      s.fed += c.len;
      const SchedSeq* q = sch.find(c.seq);
      ASSERT_NE(q, nullptr);
      EXPECT_GE((int64_t)q->pages.size() * cfg.tokens_per_page, c.start + c.len) << "pages do not cover chunk";
      if (!c.sample) continue;
      s.tokens.push_back((int32_t)(s.state_hash % 1000));
      if ((int64_t)s.tokens.size() - s.prompt >= s.max_new) {
        s.done = true;
        sch.finish(c.seq);
      }
    }
    sch.on_step_done(plan);
  };
  while (!sch.idle() || inflight) {
    StepPlan plan = sch.schedule();
    ++r.steps;
    EXPECT_LE(plan.num_tokens, cfg.max_batched_tokens);
    EXPECT_LE((int)sch.num_running(), cfg.max_num_seqs);
    r.preemptions += (int)plan.preempted.size();
    if (abort_id && r.steps == 3) {
      sch.abort(*abort_id);
      seqs[*abort_id].done = true;
    }
    if (async) {  // plan N+1 before N's results are in
      if (inflight) execute(*inflight);
      inflight = plan;
      if (sch.idle() && inflight) {
        execute(*inflight);
        inflight.reset();
      }
    } else {
      execute(plan);
    }
    EXPECT_EQ(sch.check_invariants(), "") << "after step " << r.steps;
    if (r.steps > 100000) {
      ADD_FAILURE() << "no progress";
      break;
    }
  }
  EXPECT_EQ(slot_pool.num_used(), 0);
  EXPECT_EQ(page_pool.num_used(), 0);
  for (auto& [id, s] : seqs)
    r.outputs[id] = std::vector<int32_t>(s.tokens.begin() + std::min<int64_t>(s.prompt, s.tokens.size()), s.tokens.end());
  return r;
}

}  // namespace

TEST(Scheduler, PreemptionByRecomputeGivesTheUnconstrainedOutputs) {
  SchedulerConfig big{16, 64, 8};
  RunResult ref = run(24, 16, 1000, big, false, 1);
  EXPECT_EQ(ref.preemptions, 0);
  SchedulerConfig tight{8, 32, 8};
  RunResult small = run(24, 8, 14, tight, false, 1);  // 14 pages of 8 tokens: must preempt
  EXPECT_GT(small.preemptions, 0);
  EXPECT_EQ(ref.outputs, small.outputs);
}

TEST(Scheduler, AsyncPlanningGivesTheSameOutputs) {
  SchedulerConfig cfg{6, 24, 4};
  RunResult sync = run(20, 6, 40, cfg, false, 2);
  RunResult async = run(20, 6, 40, cfg, true, 2);
  EXPECT_EQ(sync.outputs, async.outputs);
  RunResult async_tight = run(20, 6, 16, cfg, true, 2);
  EXPECT_EQ(sync.outputs, async_tight.outputs);
}

TEST(Scheduler, AbortFreesEverythingAtOnce) {
  SchedulerConfig cfg{4, 16, 4};
  RunResult r = run(6, 4, 50, cfg, false, 3, 2);  // pools checked empty at the end
  SUCCEED();
}

TEST(Scheduler, StrictFcfsAdmissionAndBudget) {
  BlockManager slots(2), pages(100);
  Scheduler sch({2, 10, 4}, slots, pages);
  sch.add(1, 7);
  sch.add(2, 7);
  sch.add(3, 3);
  StepPlan p = sch.schedule();
  ASSERT_EQ(p.chunks.size(), 2u);  // seq 1 whole prompt, seq 2 the rest of the budget
  EXPECT_EQ(p.chunks[0].len, 7);
  EXPECT_TRUE(p.chunks[0].sample);
  EXPECT_EQ(p.chunks[1].len, 3);
  EXPECT_FALSE(p.chunks[1].sample);
  EXPECT_EQ(sch.num_waiting(), 1u) << "max_num_seqs = 2";
  sch.on_step_done(p);
  StepPlan q = sch.schedule();  // seq 1 decodes (1 token), seq 2 finishes its prompt (4)
  ASSERT_EQ(q.chunks.size(), 2u);
  EXPECT_EQ(q.chunks[0].len, 1);
  EXPECT_EQ(q.chunks[1].start, 3);
  EXPECT_EQ(q.chunks[1].len, 4);
  EXPECT_EQ(sch.check_invariants(), "");
  sch.abort(1);
  sch.abort(2);
  sch.abort(3);
  // 1 and 2 are in plan q, which may still be writing their cache: kept until q is done; 3 goes at once.
  EXPECT_EQ(sch.check_invariants(), "");
  EXPECT_EQ(slots.num_used(), 2);
  EXPECT_EQ(sch.num_running() + sch.num_waiting(), 0u);
  EXPECT_TRUE(sch.schedule().empty()) << "finished sequences are not planned again";
  sch.on_step_done(q);
  EXPECT_EQ(slots.num_used() + pages.num_used(), 0);
  EXPECT_TRUE(sch.idle());
  EXPECT_EQ(sch.check_invariants(), "");
}
