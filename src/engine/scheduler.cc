#include "engine/scheduler.h"

#include <algorithm>
#include <set>
#include <stdexcept>

namespace deepinfer {

Scheduler::Scheduler(const SchedulerConfig& cfg, BlockManager& slots, BlockManager& pages)
    : cfg_(cfg), slots_(slots), pages_(pages) {
  if (cfg_.max_num_seqs < 1 || cfg_.max_batched_tokens < 1 || cfg_.tokens_per_page < 1)
    throw std::invalid_argument("scheduler limits must be positive");
}

void Scheduler::add(uint64_t id, int64_t num_prompt_tokens) {
  if (seqs_.count(id)) throw std::logic_error("sequence id added twice");
  SchedSeq s;
  s.id = id;
  s.arrival = next_arrival_++;
  s.num_tokens = num_prompt_tokens;
  seqs_[id] = std::move(s);
  waiting_.push_back(id);
}

void Scheduler::release(SchedSeq& s) {
  if (s.slot >= 0) slots_.release({s.slot});
  pages_.release(s.pages);
  s.slot = -1;
  s.pages.clear();
}

void Scheduler::abort(uint64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end() || it->second.status == SeqStatus::kFinishing) return;
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), id), waiting_.end());
  running_.erase(std::remove(running_.begin(), running_.end(), id), running_.end());
  if (it->second.in_flight > 0) {  // a planned step still writes its cache: freed when that step is done
    it->second.status = SeqStatus::kFinishing;
    return;
  }
  release(it->second);
  seqs_.erase(it);
}

bool Scheduler::grow(SchedSeq& s, int64_t tokens) {
  const int64_t need = pages_for(tokens) - (int64_t)s.pages.size();
  return need <= 0 || pages_.allocate((int32_t)need, &s.pages);
}

void Scheduler::preempt(SchedSeq& s, StepPlan& plan) {
  release(s);
  s.status = SeqStatus::kWaiting;
  s.num_computed = 0;
  ++s.num_preemptions;
  running_.erase(std::remove(running_.begin(), running_.end(), s.id), running_.end());
  // Back to the waiting queue in arrival order among the other preempted / waiting sequences.
  auto pos = std::find_if(waiting_.begin(), waiting_.end(),
                          [&](uint64_t w) { return seqs_.at(w).arrival > s.arrival; });
  waiting_.insert(pos, s.id);
  plan.preempted.push_back(s.id);
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  int64_t budget = cfg_.max_batched_tokens;
  std::set<uint64_t> planned;

  // 1. Running sequences, oldest first.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    SchedSeq& s = seqs_.at(running_[i]);
    const int64_t want = std::min(s.num_tokens - s.num_computed, budget);
    if (want <= 0) {  // waiting for a token of a step in flight
      ++i;
      continue;
    }
    bool ok = grow(s, s.num_computed + want);
    while (!ok) {  // free pages by preempting the newest sequence that has no step in flight
      SchedSeq* victim = nullptr;
      for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
        SchedSeq& v = seqs_.at(*it);
        if (v.in_flight == 0 && !planned.count(v.id)) {
          victim = &v;
          break;
        }
      }
      if (!victim) break;
      const bool self = victim == &s;
      preempt(*victim, plan);
      if (self) break;
      ok = grow(s, s.num_computed + want);
    }
    if (!ok) {
      // s was preempted (it is no longer at running_[i]) or nothing can be freed this step.
      if (i < running_.size() && running_[i] == s.id) ++i;
      continue;
    }
    ScheduledChunk c{s.id, s.num_computed, want, s.num_computed + want == s.num_tokens};
    s.num_computed += want;
    if (c.sample) ++s.num_tokens;  // placeholder for the token this step samples
    ++s.in_flight;
    planned.insert(s.id);
    plan.chunks.push_back(c);
    budget -= want;
    ++i;
  }

  // 2. Waiting sequences, strictly in order, while they fit.
  while (!waiting_.empty() && budget > 0 && (int)running_.size() < cfg_.max_num_seqs) {
    SchedSeq& s = seqs_.at(waiting_.front());
    const int64_t want = std::min(s.num_tokens - s.num_computed, budget);
    if (slots_.num_free() < 1 || pages_.num_free() < pages_for(s.num_computed + want)) break;
    std::vector<int32_t> slot;
    slots_.allocate(1, &slot);
    s.slot = slot[0];
    grow(s, s.num_computed + want);
    s.status = SeqStatus::kRunning;
    waiting_.pop_front();
    // running_ stays in arrival order (a re-admitted preempted sequence goes back to its place).
    auto pos = std::find_if(running_.begin(), running_.end(),
                            [&](uint64_t r) { return seqs_.at(r).arrival > s.arrival; });
    running_.insert(pos, s.id);
    ScheduledChunk c{s.id, s.num_computed, want, s.num_computed + want == s.num_tokens};
    s.num_computed += want;
    if (c.sample) ++s.num_tokens;
    ++s.in_flight;
    plan.chunks.push_back(c);
    budget -= want;
  }
  plan.num_tokens = cfg_.max_batched_tokens - budget;
  return plan;
}

void Scheduler::on_step_done(const StepPlan& plan) {
  for (const auto& c : plan.chunks) {
    auto it = seqs_.find(c.seq);
    if (it != seqs_.end() && it->second.in_flight > 0) --it->second.in_flight;
    if (it != seqs_.end() && it->second.status == SeqStatus::kFinishing && it->second.in_flight == 0) {
      release(it->second);
      seqs_.erase(it);
    }
  }
}

const SchedSeq* Scheduler::find(uint64_t id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : &it->second;
}

std::string Scheduler::check_invariants() const {
  if (auto e = slots_.check_invariants(); !e.empty()) return "slots: " + e;
  if (auto e = pages_.check_invariants(); !e.empty()) return "pages: " + e;
  int64_t slots = 0, pages = 0, finishing = 0;
  for (const auto& [id, s] : seqs_) {
    if (s.status == SeqStatus::kFinishing && s.in_flight == 0) return "finished sequence with no step in flight kept";
    finishing += s.status == SeqStatus::kFinishing;
    if (s.status == SeqStatus::kWaiting && (s.slot >= 0 || !s.pages.empty()))
      return "waiting sequence " + std::to_string(id) + " holds cache";
    if (s.status == SeqStatus::kRunning && s.slot < 0) return "running sequence without a slot";
    if (s.num_computed > s.num_tokens) return "computed past the known tokens";
    if ((int64_t)s.pages.size() < pages_for(s.num_computed)) return "computed tokens without pages";
    slots += s.slot >= 0;
    pages += (int64_t)s.pages.size();
  }
  if (slots != slots_.num_used()) return "slot pool used count differs from sequences' slots";
  if (pages != pages_.num_used()) return "page pool used count differs from sequences' pages";
  if (waiting_.size() + running_.size() + (size_t)finishing != seqs_.size()) return "a sequence is in no queue or in both";
  return "";
}

}  // namespace deepinfer
