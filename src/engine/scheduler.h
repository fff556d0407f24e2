#pragma once
// The scheduler: tensor-free continuous batching. It knows sequences only as token counts and
// block ids (a state slot + a page table, from two BlockManagers), and turns them into step plans:
//
//  * a token budget per step (chunked prefill): running sequences first, in arrival order, each
//    taking what it still needs (1 for a decode, the rest of its prompt capped by the budget);
//    then waiting sequences in arrival order while the budget, max_num_seqs and the cache allow;
//  * admission by free cache: a waiting sequence is admitted only if a slot and the pages for its
//    first chunk are free (strict FCFS: nobody overtakes a sequence that does not fit);
//  * preemption by recompute: when a running sequence needs a page and none is free, the latest
//    arrived running sequence gives back everything and rejoins the front of the queue; it later
//    prefills its prompt and generated tokens again (bitwise the same state: the model is
//    chunk-invariant, and the sampler's noise is addressed by position);
//  * abort frees everything at once;
//  * asynchronous scheduling: schedule() advances the counts as it plans, and a sampled chunk adds a
//    placeholder token, so step N+1 can be planned before step N's tokens are known. Sequences
//    with a step in flight are never preempted.
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "util/block_manager.h"

namespace deepinfer {

struct SchedulerConfig {
  int max_num_seqs = 32;             // running at once (≤ the slot pool)
  int64_t max_batched_tokens = 512;  // tokens per step
  int64_t tokens_per_page = 256;     // V4CacheLayout::tokens_per_page
};

// kFinishing: finished or aborted while a planned step still computes it; its cache is freed (and the
// sequence forgotten) when the last such step is done.
enum class SeqStatus { kWaiting, kRunning, kFinishing };

struct SchedSeq {
  uint64_t id = 0;
  uint64_t arrival = 0;
  int64_t num_tokens = 0;    // prompt + generated (+ placeholders of sampled steps in flight)
  int64_t num_computed = 0;  // tokens whose state is (or is being) written to the cache
  int32_t slot = -1;
  std::vector<int32_t> pages;
  SeqStatus status = SeqStatus::kWaiting;
  int in_flight = 0;         // planned steps whose results are not back
  int num_preemptions = 0;
};

struct ScheduledChunk {
  uint64_t seq = 0;
  int64_t start = 0;    // first position of the chunk
  int64_t len = 0;
  bool sample = false;  // the chunk reaches the last known token: sample the next one
};

struct StepPlan {
  std::vector<ScheduledChunk> chunks;
  std::vector<uint64_t> preempted;  // sequences that lost their cache in this plan
  int64_t num_tokens = 0;
  bool empty() const { return chunks.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& cfg, BlockManager& slots, BlockManager& pages);

  void add(uint64_t id, int64_t num_prompt_tokens);  // joins the waiting queue
  void abort(uint64_t id);  // frees its slot and pages and forgets it (once no planned step computes it)
  StepPlan schedule();
  // The engine calls this when a plan's results are in: for every chunk still known, the step is no
  // longer in flight; `sampled` chunks' placeholder stays as the real token.
  void on_step_done(const StepPlan& plan);
  // A sequence produced its last token (or failed): frees everything.
  void finish(uint64_t id) { abort(id); }

  const SchedSeq* find(uint64_t id) const;
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  bool idle() const { return seqs_.empty(); }
  // Accounting across both pools: every held block belongs to exactly one known sequence, and each
  // pool's free + used = total. Empty string when all holds.
  std::string check_invariants() const;

 private:
  int64_t pages_for(int64_t tokens) const {
    return (tokens + cfg_.tokens_per_page - 1) / cfg_.tokens_per_page;
  }
  bool grow(SchedSeq& s, int64_t tokens);  // pages for `tokens` positions
  void release(SchedSeq& s);
  void preempt(SchedSeq& s, StepPlan& plan);

  SchedulerConfig cfg_;
  BlockManager& slots_;
  BlockManager& pages_;
  std::map<uint64_t, SchedSeq> seqs_;
  std::deque<uint64_t> waiting_;   // arrival order (preempted ones at the front)
  std::vector<uint64_t> running_;  // arrival order
  uint64_t next_arrival_ = 0;
};

}  // namespace deepinfer
