#include "deepinfer/engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "engine/scheduler.h"
#include "engine/stop_matcher.h"
#include "engine/structured_output.h"
#include "model/model.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/select/backend_select.h"
#include "util/error.h"

namespace deepinfer {

const char* finish_name(Finish f) {
  switch (f) {
    case Finish::kStop: return "stop";
    case Finish::kLength: return "length";
    case Finish::kAbort: return "abort";
    case Finish::kError: return "error";
    case Finish::kNone: return "";
  }
  return "";
}

std::string default_model_dir() {
#ifdef DEEPINFER_DEFAULT_MODEL_DIR
  return DEEPINFER_DEFAULT_MODEL_DIR;
#else
  return "models/nano-v4";
#endif
}

namespace {

// One output sequence (choice) of a request; the scheduler knows it by `seq_id`.
struct Choice {
  uint64_t seq_id = 0;
  int index = 0;
  std::vector<int32_t> tokens;  // prompt + generated
  SequenceSamplingState sampling;
  std::optional<tokenizer::StreamDecoder> detok;
  StopMatcher stops;
  std::optional<StructuredState> structured;  // the grammar matcher, when params.structured is set
  bool finished = false;
  Choice(std::vector<int32_t> prompt, uint64_t seed, int idx, std::vector<int32_t> masked, const SamplingParams& p)
      : index(idx), tokens(prompt), sampling(prompt, seed, (uint32_t)idx, std::move(masked)), stops(p) {}
};

struct Req {
  uint64_t id = 0;
  SamplingParams params;
  OutputSink sink;
  int64_t prompt_len = 0;
  int64_t length_limit = 0;  // max new tokens: min(max_tokens, context left)
  std::vector<Choice> choices;
  int unfinished = 0;
};

}  // namespace

constexpr int64_t kV41TokensPerPage = 256;

struct Engine::Impl {
  EngineConfig cfg;
  std::string dir;
  CpuBackend backend;                // sampling's thread pool; the model's backend when cpu
  std::unique_ptr<Backend> device;   // the model's backend when not cpu (outlives model and cache)
  LoadedModel model;
  std::optional<tokenizer::Tokenizer> tok;
  std::optional<V4Cache> cache;
  std::vector<float> logits_v41;  // the step's logits (V4.1; V4's stay in the backend's view)
  std::vector<float> host_logits;  // [rows, vocab] the few rows of a V4 step sampled on the host (finish_plan)
  // DeepSeek-V4.1: each sequence's state is its own object (V41SeqState); the scheduler admits
  // against block managers sized from the budget with V4.1's per-token and per-sequence bytes.
  std::optional<BlockManager> v41_slots, v41_pages;
  std::map<uint64_t, V41SeqState> v41_states;
  int64_t v41_page_bytes = 0, v41_slot_bytes = 0;
  std::optional<Scheduler> sched;
  std::vector<int32_t> eos_ids;
  std::optional<StructuredCompiler> structured;  // grammar vocabulary + compiled-grammar cache
  int64_t max_len = 0;
  int64_t vocab = 0;

  // Owned by the loop thread.
  std::map<uint64_t, Req> reqs;
  std::map<uint64_t, std::pair<uint64_t, int>> seq_owner;  // seq id -> (request id, choice)
  uint64_t next_seq = 1;

  // Shared with submitting threads.
  mutable std::mutex mu;
  std::vector<Req> pending;
  std::vector<uint64_t> pending_aborts;
  uint64_t next_req = 1;
  std::atomic<int64_t> live{0};  // requests submitted and not finished
  EngineStats stats_snapshot;
  bool draining = false;

  std::thread loop;
  std::atomic<bool> stop_loop{false};
  std::condition_variable cv;

  explicit Impl(const EngineConfig& c) : cfg(c), backend(c.threads) {}
  Backend& model_backend() { return device ? *device : backend; }

  void emit_finish(Req& r, Choice& ch, Finish f, const std::string& why = {}) {
    if (ch.finished) return;
    RequestOutput o;
    o.request_id = r.id;
    o.index = ch.index;
    o.finished = true;
    o.finish = f;
    if (f == Finish::kError) o.error = why;
    else o.stop_reason = why;
    if (ch.detok && f != Finish::kStop) o.text = ch.stops.flush();
    o.num_prompt_tokens = r.prompt_len;
    o.num_output_tokens = (int64_t)ch.tokens.size() - r.prompt_len;
    ch.finished = true;
    --r.unfinished;
    sched->finish(ch.seq_id);
    seq_owner.erase(ch.seq_id);
    if (r.sink) r.sink(o);
  }

  void retire_finished_requests() {
    if (model.v41) drop_finished_v41();
    for (auto it = reqs.begin(); it != reqs.end();) {
      if (it->second.unfinished == 0) {
        it = reqs.erase(it);
        --live;
      } else {
        ++it;
      }
    }
  }

  void admit_pending() {
    std::vector<Req> incoming;
    std::vector<uint64_t> aborts;
    {
      std::lock_guard<std::mutex> lk(mu);
      incoming.swap(pending);
      aborts.swap(pending_aborts);
    }
    for (auto& r : incoming) {
      const uint64_t id = r.id;
      reqs.emplace(id, std::move(r));
      Req& q = reqs.at(id);
      for (auto& ch : q.choices) {
        ch.seq_id = next_seq++;
        seq_owner[ch.seq_id] = {id, ch.index};
        sched->add(ch.seq_id, q.prompt_len);
      }
    }
    for (uint64_t id : aborts) {
      auto it = reqs.find(id);
      if (it == reqs.end()) continue;
      for (auto& ch : it->second.choices) emit_finish(it->second, ch, Finish::kAbort);
    }
  }

  // Appends a sampled token to a choice, emits its output, finishes it when a stop rule says so.
  void on_token(Req& r, Choice& ch, const SampleResult& s) {
    ch.tokens.push_back(s.token);
    ch.sampling.on_token(s.token);
    const int64_t num_out = (int64_t)ch.tokens.size() - r.prompt_len;
    RequestOutput o;
    o.request_id = r.id;
    o.index = ch.index;
    o.token_ids = {s.token};
    if (r.params.logprobs) o.logprobs.push_back({s.token, s.logprob, s.top_logprobs});
    o.num_prompt_tokens = r.prompt_len;
    o.num_output_tokens = num_out;
    TokenStop ts = check_stop_token(s.token, num_out, r.length_limit, r.params, eos_ids);
    Finish f = Finish::kNone;
    std::string why;
    if (ch.structured) {
      // The sampler only picks allowed tokens, so a rejection is an engine bug: fail the choice.
      bool accepted = false;
      try {
        accepted = ch.structured->accept(s.token);
      } catch (const std::exception& ex) {  // a limit of the matcher (live parse stacks)
        why = std::string("structured output: ") + ex.what();
      }
      if (!accepted) {
        f = Finish::kError;
        if (why.empty()) why = "structured output: sampled a token the grammar rejects";
      } else if (ch.structured->terminated()) {  // EOS accepted: the output is complete (even with ignore_eos)
        ts = TokenStop{FinishReason::kStop, s.token, r.params.include_stop_str_in_output};
      }
    }
    if (ch.detok) {
      const bool can_stop = num_out >= r.params.min_tokens;
      if (ts.emit_token_text) {
        auto res = ch.stops.push(ch.detok->push(s.token), can_stop);
        o.text = std::move(res.text);
        if (res.stopped) {
          f = Finish::kStop;
          why = r.params.stop[res.stop_index];
        }
      }
    }
    if (f == Finish::kError) {
      o.finished = true;
      o.finish = f;
      o.error = why;
      ch.finished = true;
      --r.unfinished;
      sched->finish(ch.seq_id);
      seq_owner.erase(ch.seq_id);
      if (r.sink) r.sink(o);
      return;
    }
    if (f == Finish::kNone && ts.reason != FinishReason::kNone) {
      f = ts.reason == FinishReason::kStop ? Finish::kStop : Finish::kLength;
      if (ts.stop_token >= 0) why = std::to_string(ts.stop_token);
      if (ch.detok) o.text += ch.stops.flush();
    }
    if (f != Finish::kNone) {
      o.finished = true;
      o.finish = f;
      o.stop_reason = why;
      ch.finished = true;
      --r.unfinished;
      sched->finish(ch.seq_id);
      seq_owner.erase(ch.seq_id);
    }
    if (r.sink) r.sink(o);
  }

  // V4.1 step: a chunk starting at 0 (new, or recomputed after preemption) gets a fresh state.
  std::vector<float> forward_v41(const StepPlan& plan, const std::vector<V4SeqChunk>& chunks) {
    for (uint64_t id : plan.preempted) v41_states.erase(id);
    std::vector<V41SeqChunk> c41;
    for (size_t i = 0; i < plan.chunks.size(); ++i) {
      const ScheduledChunk& c = plan.chunks[i];
      V41SeqState& st = v41_states[c.seq];
      if (c.start == 0) st = model.v41->new_state();
      if (st.pos != c.start)
        throw Error("internal: sequence state at position " + std::to_string(st.pos) + ", chunk starts at " +
                    std::to_string(c.start));
      c41.push_back({&st, chunks[i].tokens, false});
    }
    return model.v41->forward(c41);
  }
  void drop_finished_v41() {
    for (auto it = v41_states.begin(); it != v41_states.end();)
      it = seq_owner.count(it->first) ? std::next(it) : v41_states.erase(it);
  }

  // ---- steps ----
  // Pipelined decode (EngineConfig::async_scheduling; V4 on a backend that runs decode steps from
  // graphs): a decode step is launched without waiting for it (`flight`). The next step() plans step
  // N+1 (the scheduler plans ahead with placeholder tokens) and records it (DeepseekV4Model::prepare)
  // while step N runs, then reads and samples step N's logits and launches N+1 with the sampled ids. When
  // every sampled row of N takes the backend's pick (feed_plan; N+1's rows with logit processors take N's pick
  // as a pending token of their edits), N+1 is launched first, its tokens taken from N's picks on the device, and N is read while N+1 runs: the device
  // then never waits for the host between the two. A
  // sequence that finishes while a planned step still holds it keeps its cache until that step is done
  // (Scheduler: kFinishing); its row of that step is computed and dropped. Steps with prefill chunks run
  // as before, one after the other. Without graphs (the CPU backend) prepare only keeps the step and
  // launch runs it whole: the same loop and results, no overlap.
  std::optional<StepPlan> flight;  // launched, its logits not read yet

  // The model's view of a plan's chunks. A chunk's tokens are the choice's (its last one not sampled
  // yet when `placeholders`); a sequence that finished meanwhile (no owner) gets token 0, row dropped.
  struct StepView {
    std::vector<V4SeqState> states;
    std::vector<V4SeqChunk> chunks;
    std::vector<Choice*> who;  // null: finished, not sampled
    StepEdits edits;           // the chunks' logit edits (rows[i] for chunk i), when the tokens are known
  };
  const int32_t zero_token = 0;
  StepView view_of(const StepPlan& plan, bool placeholders) {
    StepView v;
    v.states.resize(plan.chunks.size());
    for (size_t i = 0; i < plan.chunks.size(); ++i) {
      const ScheduledChunk& c = plan.chunks[i];
      const SchedSeq* s = sched->find(c.seq);
      v.states[i].pos = c.start;
      v.states[i].slot = s->slot;
      v.states[i].pages = s->pages;
      auto own = seq_owner.find(c.seq);
      Choice* ch = own == seq_owner.end() ? nullptr : &reqs.at(own->second.first).choices[own->second.second];
      const bool known = ch && !placeholders && c.start + c.len <= (int64_t)ch->tokens.size();
      v.chunks.push_back({&v.states[i],
                          known ? std::span<const int32_t>(ch->tokens.data() + c.start, c.len)
                                : std::span<const int32_t>(&zero_token, 1),
                          false});
      // The backend's pick for the token at c.start + c.len (finish_plan decides whether it is taken), after its
      // logit edits. A row that can never take it (logprobs, a grammar) asks only for the cheap greedy pick.
      const SamplingParams* p = ch && c.sample ? &reqs.at(own->second.first).params : nullptr;
      if (p && cfg.device_sampling && !model.v41 && device_samplable_params(*p, *ch)) {
        v.chunks.back().sample = SampleSpec{effective_temperature(p->temperature), p->top_p, p->min_p, p->top_k,
                                            ch->sampling.rng_key(), (uint64_t)(c.start + c.len),
                                            p->logprobs ? *p->logprobs : -1};
        v.chunks.back().edited = may_edit(*p, *ch, c);
        v.chunks.back().masked = ch->structured.has_value();
      }
      v.who.push_back(ch);
    }
    if (!placeholders) {
      v.edits = step_edits(plan);
      for (size_t i = 0; i < v.chunks.size(); ++i) {
        const RowEdits& r = v.edits.rows[i];
        v.chunks[i].edit_row = r;
        v.chunks[i].edits = std::span<const LogitEdit>(v.edits.list.data() + r.first, (size_t)r.count);
        if (r.mask >= 0)
          v.chunks[i].mask = std::span<const uint32_t>(v.edits.masks.data() + r.mask * mask_words(vocab), (size_t)mask_words(vocab));
      }
    }
    return v;
  }
  // Whether chunk c's sampled row has logit edits (its step records the edits op): bias, penalties, or the
  // min_tokens mask still on for that row — counting the tokens before it that are not known yet (a step in
  // flight), so that the answer at prepare is the answer at launch.
  static bool may_edit(const SamplingParams& p, const Choice& ch, const ScheduledChunk& c) {
    return has_logit_processors(p, ch.sampling,
                                std::max<int64_t>(0, c.start + c.len - (int64_t)ch.sampling.next_position()));
  }
  // The logit edits of a plan's sampled rows that take the backend's pick, as of the tokens known now (rows[i]
  // for chunk i), and the grammar masks of its structured rows (never fed: the mask needs every token before).
  // A row whose edits or mask do not fit the step's capacity gets none and is sampled on the host (edit_overflow,
  // read by device_samplable), and so is a structured row whose mask fails (the host reports it) or whose
  // min_tokens mask is on (the host's rule when the two leave no token is not the backend's).
  // feed (a fed step's map, feed_plan): a fed row's last token is the previous step's pick, pending in its edits.
  StepEdits step_edits(const StepPlan& plan, const std::vector<int32_t>* feed = nullptr) {
    StepEdits se;
    se.rows.resize(plan.chunks.size());
    const int64_t W = mask_words(vocab);
    auto samplable = [&](size_t i) -> std::pair<const Req*, Choice*> {
      const ScheduledChunk& c = plan.chunks[i];
      auto own = seq_owner.find(c.seq);
      if (!c.sample || own == seq_owner.end()) return {nullptr, nullptr};
      Req& r = reqs.at(own->second.first);
      Choice& ch = r.choices[own->second.second];
      if (!cfg.device_sampling || model.v41 || !device_samplable_params(r.params, ch)) return {nullptr, nullptr};
      return {&r, &ch};
    };
    // The grammar masks first, filled side by side (each matcher is its own; a failure stays in its row).
    std::vector<size_t> masked;  // chunks whose row takes a mask: se.masks slot k is masked[k]'s
    for (size_t i = 0; i < plan.chunks.size(); ++i) {
      auto [r, ch] = samplable(i);
      if (!r || !ch->structured) continue;
      const ScheduledChunk& c = plan.chunks[i];
      if ((feed && (*feed)[i] >= 0) || min_tokens_on(r->params, *ch, c) ||
          (int64_t)masked.size() >= DeepseekV4Model::kMaskRows) {
        edit_overflow.insert({c.seq, c.start});
        continue;
      }
      se.rows[i].mask = (int32_t)masked.size();
      masked.push_back(i);
    }
    se.masks.resize(masked.size() * (size_t)W);
    std::vector<char> failed(masked.size(), 0);
    if (!masked.empty())
      backend.pool().parallel_for((int64_t)masked.size(), [&](int64_t b, int64_t e) {
        for (int64_t k = b; k < e; ++k) {
          try {
            const uint32_t* allowed = samplable(masked[(size_t)k]).second->structured->fill_mask();
            std::copy(allowed, allowed + W, se.masks.begin() + k * W);
          } catch (const std::exception&) {
            failed[(size_t)k] = 1;  // the host samples the row and reports the error
          }
        }
      });
    for (size_t k = 0; k < masked.size(); ++k)
      if (failed[k]) {
        se.rows[masked[k]].mask = -1;  // (its slot stays in the list, unused)
        edit_overflow.insert({plan.chunks[masked[k]].seq, plan.chunks[masked[k]].start});
      }
    for (size_t i = 0; i < plan.chunks.size(); ++i) {
      auto [r, ch] = samplable(i);
      const ScheduledChunk& c = plan.chunks[i];
      if (!r || (ch->structured && se.rows[i].mask < 0) || !may_edit(r->params, *ch, c)) continue;
      const size_t before = se.list.size();
      const bool pending = feed && (*feed)[i] >= 0;
      const int32_t mask = se.rows[i].mask;
      RowEdits row = logit_edits(r->params, ch->sampling, (int)vocab, se.list, pending);
      row.mask = mask;
      if ((int64_t)se.list.size() > DeepseekV4Model::kEditCap) {
        se.list.resize(before);
        row = RowEdits{};  // (a mask's slot stays in the list, unused)
        edit_overflow.insert({c.seq, c.start});
      }
      se.rows[i] = row;
    }
    return se;
  }
  // Whether chunk c's row has the min_tokens mask on (as may_edit counts it).
  static bool min_tokens_on(const SamplingParams& p, const Choice& ch, const ScheduledChunk& c) {
    const int64_t pending = std::max<int64_t>(0, c.start + c.len - (int64_t)ch.sampling.next_position());
    return (int64_t)ch.sampling.num_output() + pending < p.min_tokens && !ch.sampling.min_tokens_masked().empty();
  }
  // Every chunk one token: the shape DeepseekV4Model::prepare takes.
  static bool decode_shaped(const StepPlan& plan) {
    for (const auto& c : plan.chunks)
      if (c.len != 1) return false;
    return !plan.empty();
  }
  // Records (or keeps) and launches a decode plan; false (nothing done) when it is not one or async
  // scheduling is off, or when preparing it failed (run_plan then runs it and reports the error).
  bool try_launch(const StepPlan& plan) {
    if (!cfg.async_scheduling || model.v41 || !decode_shaped(plan)) return false;
    StepView v = view_of(plan, true);
    try {
      model.v4->prepare(v.chunks, *cache);
    } catch (const std::exception&) {
      return false;  // run_plan runs it and reports the error
    }
    if (launch_prepared(plan)) flight = plan;
    return true;
  }
  // A decode plan's token ids where the host knows them (0 elsewhere: finished sequences, fed rows).
  std::vector<int32_t> known_ids(const StepPlan& plan) {
    std::vector<int32_t> ids(plan.chunks.size(), 0);
    for (size_t i = 0; i < plan.chunks.size(); ++i) {
      auto own = seq_owner.find(plan.chunks[i].seq);
      if (own == seq_owner.end()) continue;
      const Choice& ch = reqs.at(own->second.first).choices[own->second.second];
      if (plan.chunks[i].start < (int64_t)ch.tokens.size()) ids[i] = ch.tokens[plan.chunks[i].start];
    }
    return ids;
  }
  // Launches the prepared plan with its token ids; a step that fails to launch fails its requests.
  bool launch_prepared(const StepPlan& plan) {
    try {
      const StepEdits edits = step_edits(plan);
      model.v4->launch(known_ids(plan), {}, &edits);
    } catch (const std::exception& e) {
      fail_plan(plan, view_of(plan, true).who, e.what());
      return false;
    }
    return true;
  }

  bool step() {
    admit_pending();
    if (flight) return step_pipelined();
    StepPlan plan = sched->schedule();
    if (plan.empty()) {
      retire_finished_requests();
      update_stats();
      return !sched->idle();
    }
    count([&] { stats_snapshot.preemptions += (int64_t)plan.preempted.size(); });
    if (try_launch(plan)) return true;  // its results are read by the next step()
    run_plan(plan);
    return true;
  }

  // A plan run now, from its forward pass to its tokens.
  void run_plan(const StepPlan& plan) {
    StepView v = view_of(plan, false);
    try {
      if (model.v41) logits_v41 = forward_v41(plan, v.chunks);
      else model.v4->forward_launch(v.chunks, *cache);
    } catch (const std::exception& e) {
      fail_plan(plan, v.who, e.what());
      return;
    }
    finish_plan(plan, v.who);
  }

  // Whether step N+1 (next) can take its tokens from step N's picks on the device: every sampled row of N
  // takes its pick (so the host adds nothing before N+1), and every token of N+1 not yet known is the pick of
  // its sequence's row in N. feed[i]: that row for chunk i of next, −1 when the token is known (or the
  // sequence finished: its row is dropped).
  bool feed_plan(const StepPlan& now, const std::vector<Choice*>& who, const StepPlan& next, std::vector<int32_t>& feed) {
    if (!cfg.device_sampling || model.v41 || !model.v4->can_feed() || !model.v4->prepared_takes_feed()) return false;
    // A row with logit processors in N+1 takes N's token as its one pending token (logit_edits' pending: the
    // backend adds its occurrence), so it must be the only token its state lacks.
    for (const ScheduledChunk& c : next.chunks) {
      auto own = seq_owner.find(c.seq);
      if (own == seq_owner.end() || !c.sample) continue;
      const Req& r = reqs.at(own->second.first);
      const Choice& ch = r.choices[own->second.second];
      if (may_edit(r.params, ch, c) && c.start != (int64_t)ch.tokens.size()) return false;
    }
    std::map<uint64_t, int32_t> row_of;  // sequence → its sampled row of N (decode: row i = chunk i)
    for (size_t i = 0; i < now.chunks.size(); ++i) {
      const ScheduledChunk& c = now.chunks[i];
      if (!c.sample || !who[i]) continue;
      if (!device_samplable(reqs.at(seq_owner.at(c.seq).first).params, *who[i], c)) return false;
      if (who[i]->structured) return false;  // its next mask needs this token on the host first
      row_of[c.seq] = (int32_t)i;
    }
    feed.assign(next.chunks.size(), -1);
    for (size_t j = 0; j < next.chunks.size(); ++j) {
      const ScheduledChunk& c = next.chunks[j];
      auto own = seq_owner.find(c.seq);
      if (own == seq_owner.end()) continue;
      if (c.start < (int64_t)reqs.at(own->second.first).choices[own->second.second].tokens.size()) continue;
      auto it = row_of.find(c.seq);
      if (it == row_of.end()) return false;
      const ScheduledChunk& src = now.chunks[(size_t)it->second];
      if (src.start + src.len != c.start) return false;
      feed[j] = it->second;
    }
    return true;
  }

  // A launched step whose sequences all finished meanwhile: nobody waits for it, so it is done now (the engine
  // may then be idle).
  void drop_orphan_flight() {
    if (!flight) return;
    for (const auto& c : flight->chunks)
      if (seq_owner.count(c.seq)) return;
    const StepPlan dead = std::move(*flight);
    flight.reset();
    StepView dv = view_of(dead, true);
    finish_plan(dead, dv.who);
  }

  // Step N is on the device: plan and record N+1, then read N and launch N+1 (or, fed, launch N+1 and read N).
  bool step_pipelined() {
    const StepPlan now = std::move(*flight);
    flight.reset();
    StepPlan next = sched->schedule();
    count([&] { stats_snapshot.preemptions += (int64_t)next.preempted.size(); });
    bool ready = false;
    if (decode_shaped(next)) {
      StepView nv = view_of(next, true);
      try {
        model.v4->prepare(nv.chunks, *cache);
        ready = true;
      } catch (const std::exception&) {
        ready = false;  // run it the ordinary way below (which reports a real error)
      }
    }
    StepView v = view_of(now, true);  // the owners only (its tokens went in at launch)
    std::vector<int32_t> feed;
    if (ready && feed_plan(now, v.who, next, feed)) {
      std::string launch_error;
      try {
        const StepEdits edits = step_edits(next, &feed);
        model.v4->launch(known_ids(next), feed, &edits);
      } catch (const std::exception& e) {
        launch_error = e.what();
      }
      // N first, from its picks alone (either way: its logits may be gone), then N+1's fate.
      finish_plan(now, v.who, /*picks_only=*/true, launch_error.empty() ? 1 : 0);
      if (!launch_error.empty()) {
        StepView nv = view_of(next, true);
        fail_plan(next, nv.who, launch_error);
      } else {
        flight = std::move(next);
        count([&] { ++stats_snapshot.fed_steps; });
        drop_orphan_flight();
      }
      update_stats();
      return true;
    }
    finish_plan(now, v.who);
    if (next.empty()) {
      if (ready) throw Error("internal: an empty plan was prepared");
      update_stats();
      return !sched->idle();
    }
    if (ready) {
      if (!launch_prepared(next)) {
        update_stats();
        return true;
      }
      flight = std::move(next);
      drop_orphan_flight();
      update_stats();
      return true;
    }
    if (!try_launch(next)) run_plan(next);
    return true;
  }

  // A failed step fails the requests in it, never the engine.
  void fail_plan(const StepPlan& plan, const std::vector<Choice*>& who, const std::string& why) {
    for (size_t i = 0; i < who.size(); ++i) {
      if (!who[i]) continue;
      auto [rid, idx] = seq_owner.at(plan.chunks[i].seq);
      emit_finish(reqs.at(rid), *who[i], Finish::kError, why);
    }
    for (const auto& c : plan.chunks) edit_overflow.erase({c.seq, c.start});
    sched->on_step_done(plan);
    retire_finished_requests();
  }

  // A row the backend's pick (Backend::sample_rows) decides exactly as the host sampler would: no grammar, logprobs
  // only where the backend computes them (Backend::logprob_rows: the host's values bit for bit), its logit
  // processors applied there (its edits fitted the step: edit_overflow), and the position its spec was given
  // (view_of) is the one the host would use.
  bool device_samplable(const SamplingParams& p, const Choice& ch, const ScheduledChunk& c) const {
    return device_samplable_params(p, ch) && (uint64_t)(c.start + c.len) == ch.sampling.next_position() &&
           !edit_overflow.count({c.seq, c.start});
  }
  // The part that holds for the whole request (logit processors and grammar masks are applied on the backend:
  // step_edits), where the backend has what it needs on.
  bool device_samplable_params(const SamplingParams& p, const Choice& ch) const {
    if (!model.v4) return false;
    return (!ch.structured || model.v4->masks_on_backend()) &&
           (!p.logprobs || (*p.logprobs <= kMaxLogprobs && model.v4->logprobs_on_backend()));
  }
  std::set<std::pair<uint64_t, int64_t>> edit_overflow;  // (sequence, chunk start): its edits did not fit

  // Samples the last launched step's results and hands out the tokens: a row that is device_samplable takes the
  // backend's pick (only ids cross), the others are sampled on the host from their logits rows (all of them
  // downloaded at once when they are many, else row by row). A step that failed on the device fails its requests.
  // picks_only: every sampled row is a pick (feed_plan) and the logits may be gone (a step launched after this
  // one, which is then argmax(back = 1)): a row whose pick is no token fails with the host sampler's error.
  void finish_plan(const StepPlan& plan, const std::vector<Choice*>& who, bool picks_only = false, int back = 0) {
    std::vector<size_t> row_chunk;
    for (size_t i = 0; i < plan.chunks.size(); ++i)
      if (plan.chunks[i].sample && who[i]) row_chunk.push_back(i);
    std::vector<char> dev(row_chunk.size(), 0);  // the row takes the backend's pick
    bool any_dev = false;
    for (size_t k = 0; k < row_chunk.size(); ++k) {
      const size_t i = row_chunk[k];
      dev[k] = !model.v41 && cfg.device_sampling &&
               device_samplable(reqs.at(seq_owner.at(plan.chunks[i].seq).first).params, *who[i], plan.chunks[i]);
      any_dev = any_dev || dev[k];
    }
    std::span<const int32_t> picks;
    std::span<const RowLogprobs> lps;  // the device rows' logprobs, when one asked
    std::vector<char> wants_lp(row_chunk.size());
    bool any_lp = false;
    for (size_t k = 0; k < row_chunk.size(); ++k) {
      wants_lp[k] = reqs.at(seq_owner.at(plan.chunks[row_chunk[k]].seq).first).params.logprobs.has_value();
      any_lp = any_lp || (dev[k] && wants_lp[k]);
    }
    std::vector<size_t> host;  // places k sampled on the host
    std::vector<std::string> results_early(row_chunk.size());  // after_next: a pick that is no token
    std::vector<const float*> row_logits(row_chunk.size(), nullptr);
    try {
      if (any_dev) picks = model.v4->argmax(back);
      if (any_lp) lps = model.v4->logprobs(back);
      for (size_t k = 0; k < row_chunk.size(); ++k) {
        // −1 / −2 (all masked, NaN / +inf): the host sampler says what to do (the error)
        int32_t pick = dev[k] && row_chunk[k] < picks.size() ? picks[row_chunk[k]] : -1;
        if (pick >= vocab) pick = -3;  // not a token (never from a correct backend)
        if (pick >= 0 && wants_lp[k] && row_chunk[k] >= lps.size())
          pick = -4;  // a row that asked for logprobs without them (never from a correct model)
        if (picks_only && pick < 0) {  // the host sampler's error, without the token's place
          results_early[k] = pick == -2   ? "sampler: logits contain NaN or +inf"
                             : pick == -1 ? "sampler: every token is masked (all logits are -inf after processing)"
                             : pick == -4 ? "sampler: the backend returned no logprobs for the row"
                                          : "sampler: the backend's pick is outside the vocabulary";
          dev[k] = 0;
          continue;
        }
        if (dev[k]) dev[k] = pick >= 0;
        if (!dev[k]) host.push_back(k);
      }
      if (model.v41) {
        for (size_t k : host) row_logits[k] = logits_v41.data() + row_chunk[k] * vocab;
      } else if (4 * host.size() > row_chunk.size()) {  // many: one download of the step's logits
        const std::span<const float> all = model.v4->logits();
        for (size_t k : host) row_logits[k] = all.data() + row_chunk[k] * vocab;
      } else if (!host.empty()) {  // few: only their rows
        host_logits.resize(host.size() * (size_t)vocab);
        for (size_t j = 0; j < host.size(); ++j) {
          model.v4->logits_row((int64_t)row_chunk[host[j]], host_logits.data() + j * vocab);
          row_logits[host[j]] = host_logits.data() + j * vocab;
        }
      }
    } catch (const std::exception& e) {
      fail_plan(plan, who, e.what());
      return;
    }
    std::vector<SampleResult> results(row_chunk.size());
    for (size_t k = 0; k < row_chunk.size(); ++k)
      if (!results_early[k].empty()) results[k].token = -1, results[k].error = results_early[k];
    int64_t n_dev = 0;
    for (size_t k = 0; k < row_chunk.size(); ++k) {
      if (!dev[k]) continue;
      results[k].token = picks[row_chunk[k]], ++n_dev;
      if (wants_lp[k]) {
        const RowLogprobs& l = lps[row_chunk[k]];
        results[k].logprob = l.token;
        for (int32_t j = 0; j < l.n; ++j) results[k].top_logprobs.push_back({l.ids[j], l.lps[j]});
      }
    }
    if (!host.empty()) {
      std::vector<SampleRow> rows;  // rows[j] is place host[j]
      for (size_t k : host) {
        const size_t i = row_chunk[k];
        Req& r = reqs.at(seq_owner.at(plan.chunks[i].seq).first);
        rows.push_back({row_logits[k], &r.params, &who[i]->sampling, who[i]->sampling.next_position()});
      }
      // Grammar masks, one per structured row (each matcher is its own; rows run in parallel).
      // A matcher that fails (a limit on live parse stacks) fails its row only: no throw may leave a
      // pool worker, so the error is kept per row and the row is not sampled.
      std::vector<size_t> masked_rows;
      for (size_t j = 0; j < rows.size(); ++j)
        if (who[row_chunk[host[j]]]->structured) masked_rows.push_back(j);
      std::vector<std::string> mask_error(rows.size());
      if (!masked_rows.empty())
        backend.pool().parallel_for((int64_t)masked_rows.size(), [&](int64_t b, int64_t e) {
          for (int64_t q = b; q < e; ++q) {
            const size_t j = masked_rows[q];
            try {
              rows[j].allowed = who[row_chunk[host[j]]]->structured->fill_mask();
            } catch (const std::exception& ex) {
              mask_error[j] = std::string("structured output: ") + ex.what();
            }
          }
        });
      std::vector<SampleRow> ok_rows;
      std::vector<size_t> ok_index;  // ok_rows[q] is rows[ok_index[q]]
      for (size_t j = 0; j < rows.size(); ++j)
        if (mask_error[j].empty()) ok_rows.push_back(rows[j]), ok_index.push_back(j);
      auto ok_results = sample_batch(ok_rows, (int)vocab, &backend.pool());
      for (size_t q = 0; q < ok_index.size(); ++q) results[host[ok_index[q]]] = std::move(ok_results[q]);
      for (size_t j = 0; j < rows.size(); ++j)
        if (!mask_error[j].empty()) results[host[j]].error = mask_error[j];
    }
    for (const auto& c : plan.chunks) edit_overflow.erase({c.seq, c.start});
    sched->on_step_done(plan);
    for (size_t k = 0; k < results.size(); ++k) {
      const size_t i = row_chunk[k];
      auto [rid, idx] = seq_owner.at(plan.chunks[i].seq);
      Req& r = reqs.at(rid);
      if (results[k].token < 0) emit_finish(r, *who[i], Finish::kError, results[k].error);
      else on_token(r, *who[i], results[k]);
    }
    count([&] {
      for (const auto& c : plan.chunks) stats_snapshot.prompt_tokens += c.sample ? c.len - 1 : c.len;
      stats_snapshot.generated_tokens += (int64_t)results.size();
      stats_snapshot.device_sampled_tokens += n_dev;
      ++stats_snapshot.steps;
    });
    retire_finished_requests();
    update_stats();
  }

  // Counters of stats_snapshot change under the lock that Engine::stats() copies them under.
  template <class F>
  void count(F&& f) {
    std::lock_guard<std::mutex> lk(mu);
    f();
  }

  void update_stats() {
    std::lock_guard<std::mutex> lk(mu);
    stats_snapshot.running = (int64_t)sched->num_running();
    stats_snapshot.waiting = (int64_t)sched->num_waiting() + (int64_t)pending.size();
    if (model.v41) {
      stats_snapshot.cache_pages_used = v41_pages->num_used();
      stats_snapshot.cache_pages_total = v41_pages->total();
      stats_snapshot.cache_slots_used = v41_slots->num_used();
      stats_snapshot.cache_slots_total = v41_slots->total();
      stats_snapshot.cache_page_bytes = v41_page_bytes;
      stats_snapshot.cache_slot_bytes = v41_slot_bytes;
      stats_snapshot.cache_tokens_per_page = kV41TokensPerPage;
      return;
    }
    stats_snapshot.cache_pages_used = cache->page_manager().num_used();
    stats_snapshot.cache_pages_total = cache->page_manager().total();
    stats_snapshot.cache_slots_used = cache->slot_manager().num_used();
    stats_snapshot.cache_slots_total = cache->slot_manager().total();
    stats_snapshot.cache_page_bytes = cache->layout().page_bytes();
    stats_snapshot.cache_slot_bytes = cache->layout().slot_bytes();
    stats_snapshot.cache_tokens_per_page = cache->layout().tokens_per_page;
  }
};

Engine::Engine(const EngineConfig& cfg) : impl_(std::make_unique<Impl>(cfg)) {
  Impl& m = *impl_;
  m.dir = cfg.model_dir.empty() ? default_model_dir() : cfg.model_dir;
  if (!std::filesystem::is_directory(m.dir))
    throw Error("model directory '" + m.dir + "' does not exist" +
                (cfg.model_dir.empty() ? " (the embedded default model is missing from this build)" : ""));
  if (cfg.progress) std::fprintf(stderr, "loading %s ...\n", m.dir.c_str());
  const std::string be_name = resolve_backend(cfg.backend);
  if (be_name != "cpu") m.device = make_backend(be_name, cfg.threads, cfg.dtype);
  m.model = load_model(m.dir, m.model_backend(), cfg.progress);
  if (m.model.v4) m.model.v4->set_device_argmax(true);  // greedy batches read ids, not logits
  for (const auto& n : m.model.unused) std::fprintf(stderr, "deepinfer: warning: tensor '%s' is not used\n", n.c_str());
  // The few config values the engine needs, from either architecture.
  const int vocab = m.model.vocab_size();
  const std::vector<int> eos = m.model.v41 ? m.model.v41->config().eos_token_ids : m.model.v4->config().eos_token_ids;
  const int64_t max_pos = m.model.v41 ? m.model.v41->config().max_position_embeddings
                                      : m.model.v4->config().max_position_embeddings;
  m.vocab = vocab;
  std::string tp = cfg.tokenizer.empty() ? m.dir : cfg.tokenizer;
  namespace fs = std::filesystem;
  bool has_tok = fs::is_regular_file(tp) || fs::exists(fs::path(tp) / "tokenizer.json") ||
                 fs::exists(fs::path(tp) / "tokenizer.json.gz");
  if (has_tok) m.tok = tokenizer::Tokenizer::from_file(tp);
  else if (!cfg.tokenizer.empty()) throw Error("tokenizer '" + cfg.tokenizer + "' not found");
  m.eos_ids = eos;
  if (m.tok && m.tok->eos_id() >= 0 &&
      std::find(m.eos_ids.begin(), m.eos_ids.end(), m.tok->eos_id()) == m.eos_ids.end())
    m.eos_ids.push_back(m.tok->eos_id());
  m.structured.emplace(m.tok ? &*m.tok : nullptr, m.vocab, m.eos_ids);
  m.max_len = cfg.max_model_len > 0 ? std::min<int64_t>(cfg.max_model_len, max_pos) : max_pos;
  if (cfg.max_num_seqs < 1) throw Error("max_num_seqs must be >= 1");
  if (cfg.max_batched_tokens < 1) throw Error("max_batched_tokens must be >= 1");
  SchedulerConfig sc{cfg.max_num_seqs, cfg.max_batched_tokens, 0};
  if (m.model.v41) {
    // Accounting pools: per sequence the sliding rings and open ratio-2 groups, per token the
    // compressed entries and index keys of every KV source (float32, as V41SeqState holds them).
    const V41Config& c = m.model.v41->config();
    m.v41_slot_bytes = (int64_t)c.num_layers * c.sliding_window * c.head_dim * 4;
    double per_token = 0;
    for (int l : c.kv_source_layers) {
      per_token += (double)(c.head_dim + c.index_head_dim) * 4 / c.compress_ratios[l];
      if (c.compress_ratios[l] == 2) m.v41_slot_bytes += 2LL * c.head_dim * 4;
    }
    m.v41_page_bytes = std::max<int64_t>(1, (int64_t)(per_token * kV41TokensPerPage));
    const int64_t pages = (cfg.cache_bytes - (int64_t)cfg.max_num_seqs * m.v41_slot_bytes) / m.v41_page_bytes;
    if (pages < cfg.max_num_seqs)
      throw Error("cache budget of " + std::to_string(cfg.cache_bytes >> 20) + " MiB cannot hold " +
                  std::to_string(cfg.max_num_seqs) + " DeepSeek-V4.1 sequences");
    m.v41_slots.emplace(cfg.max_num_seqs);
    m.v41_pages.emplace((int32_t)std::min<int64_t>(pages, INT32_MAX));
    sc.tokens_per_page = kV41TokensPerPage;
    m.sched.emplace(sc, *m.v41_slots, *m.v41_pages);
    m.max_len = std::min<int64_t>(m.max_len, (int64_t)m.v41_pages->total() * sc.tokens_per_page);
  } else {
    const V4Config& c = m.model.v4->config();
    if (!m.device) {
      m.cache.emplace(V4Cache::from_budget(c, cfg.cache_bytes, cfg.max_num_seqs));
    } else {
      // Device memory: the cache takes a fraction of what is free after the weights, less the
      // activations of the largest step (float32; the forward pass allocates them per step).
      if (!(cfg.gpu_memory_fraction > 0 && cfg.gpu_memory_fraction <= 1))
        throw Error("gpu_memory_fraction must be in (0, 1]");
      const int64_t T = cfg.max_batched_tokens, D = c.hidden_size, hc = c.hc_mult, I = c.moe_intermediate_size;
      const int64_t per_token = 3 * hc * D + 4 * D + 3 * (int64_t)c.num_heads * c.head_dim + c.q_lora_rank +
                                6 * c.head_dim + 5 * c.index_head_dim + (int64_t)c.index_n_heads * c.index_head_dim +
                                (c.num_experts_per_tok + 1) * (2 * D + 3 * I) + c.vocab_size;
      const int64_t activations = 2 * 4 * T * per_token + (256ll << 20);
      const int64_t free = m.device->free_memory();
      const int64_t budget = (int64_t)(cfg.gpu_memory_fraction * (double)std::max<int64_t>(0, free - activations));
      m.cache.emplace(V4Cache::from_budget(c, budget, cfg.max_num_seqs, m.device.get()));
    }
    sc.tokens_per_page = m.cache->layout().tokens_per_page;
    m.sched.emplace(sc, m.cache->slot_manager(), m.cache->page_manager());
    // A request can never need more pages than the pool holds.
    m.max_len = std::min<int64_t>(m.max_len, (int64_t)m.cache->page_manager().total() * sc.tokens_per_page);
  }
  m.update_stats();
}

Engine::~Engine() { stop(); }

uint64_t Engine::add_request(Request req, OutputSink sink) {
  Impl& m = *impl_;
  req.params.validate(m.vocab);
  if (req.params.prompt_logprobs) throw Error("prompt_logprobs is not supported yet");
  std::vector<int32_t> ids = std::move(req.prompt_ids);
  if (ids.empty()) {
    if (!m.tok) throw Error("this model has no tokenizer: send prompt token ids");
    ids = m.tok->encode(req.prompt, req.add_special_tokens);
  }
  if (ids.empty()) throw Error("prompt is empty");
  for (int32_t t : ids)
    if (t < 0 || t >= m.vocab)
      throw Error("prompt token id " + std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(m.vocab) + ")");
  if (m.model.v41 && std::find(ids.begin(), ids.end(), m.model.v41->config().image_token_id) != ids.end())
    throw Error("image inputs are not supported: the prompt holds the image placeholder token " +
                std::to_string(m.model.v41->config().image_token_id) + " and DeepSeek-V4.1's vision tower is not implemented");
  if ((int64_t)ids.size() >= m.max_len)
    throw Error("prompt has " + std::to_string(ids.size()) + " tokens; the context limit is " + std::to_string(m.max_len));
  if (!req.params.stop.empty() && !m.tok) throw Error("stop strings need a tokenizer");
  std::shared_ptr<const grammar::Grammar> g;
  if (req.params.structured.active()) g = m.structured->compile(req.params.structured);  // throws for a bad spec
  Req r;
  r.params = req.params;
  r.sink = std::move(sink);
  r.prompt_len = (int64_t)ids.size();
  r.length_limit = m.max_len - r.prompt_len;
  if (r.params.max_tokens) r.length_limit = std::min(r.length_limit, *r.params.max_tokens);
  const uint64_t seed = resolve_seed(r.params);
  auto masked = min_tokens_masked_ids(r.params, m.eos_ids);
  for (int i = 0; i < r.params.n; ++i) {
    r.choices.emplace_back(ids, seed, i, masked, r.params);
    if (m.tok) r.choices.back().detok.emplace(*m.tok, r.params.skip_special_tokens);
    if (g) r.choices.back().structured.emplace(g, &m.structured->eos_ids());
  }
  r.unfinished = r.params.n;
  std::lock_guard<std::mutex> lk(m.mu);
  if (m.draining) throw Error("the engine is shutting down");
  r.id = m.next_req++;
  const uint64_t id = r.id;
  m.pending.push_back(std::move(r));
  ++m.live;
  m.cv.notify_all();
  return id;
}

void Engine::abort(uint64_t id) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->pending_aborts.push_back(id);
  impl_->cv.notify_all();
}

bool Engine::step() { return impl_->step(); }
bool Engine::has_work() const { return impl_->live.load() > 0; }

void Engine::start() {
  Impl& m = *impl_;
  if (m.loop.joinable()) return;
  m.stop_loop = false;
  m.loop = std::thread([&m] {
    while (!m.stop_loop) {
      if (!m.step()) {
        std::unique_lock<std::mutex> lk(m.mu);
        m.cv.wait_for(lk, std::chrono::milliseconds(50),
                      [&] { return m.stop_loop || !m.pending.empty() || !m.pending_aborts.empty(); });
      }
    }
  });
}

void Engine::stop() {
  Impl& m = *impl_;
  if (!m.loop.joinable()) return;
  m.stop_loop = true;
  m.cv.notify_all();
  m.loop.join();
}

void Engine::drain(int64_t timeout_ms) {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lk(m.mu);
    m.draining = true;
  }
  auto t0 = std::chrono::steady_clock::now();
  while (has_work() && std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(timeout_ms))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (has_work()) {
    // Abort every id issued so far (the loop thread owns the request table; aborts are queued and
    // unknown or finished ids are ignored). next_req is written under the lock by add_request.
    uint64_t end = 0;
    {
      std::lock_guard<std::mutex> lk(m.mu);
      end = m.next_req;
    }
    for (uint64_t id = 1; id < end; ++id) abort(id);
    while (has_work()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::vector<GenerateResult> Engine::generate(const std::vector<Request>& reqs) {
  if (impl_->loop.joinable()) throw Error("generate() needs the engine loop to be stopped");
  std::vector<GenerateResult> out(reqs.size());
  std::map<uint64_t, size_t> where;
  // An invalid request throws from add_request: the ones already queued hold sinks into `out`, so
  // they are aborted and run off before the error leaves (nothing stays queued behind the caller).
  size_t added = 0;
  try {
  for (size_t i = 0; i < reqs.size(); ++i, ++added) {
    out[i].outputs.resize(reqs[i].params.n);
    for (int k = 0; k < reqs[i].params.n; ++k) out[i].outputs[k].index = k;
    out[i].request_id = add_request(reqs[i], [&out, &where](const RequestOutput& o) {
      Completion& c = out[where.at(o.request_id)].outputs[o.index];
      c.token_ids.insert(c.token_ids.end(), o.token_ids.begin(), o.token_ids.end());
      c.text += o.text;
      c.logprobs.insert(c.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
      if (o.finished) {
        c.finish = o.finish;
        c.stop_reason = o.stop_reason;
        c.error = o.error;
      }
    });
    where[out[i].request_id] = i;
    out[i].prompt_ids = reqs[i].prompt_ids.empty() && impl_->tok
                            ? impl_->tok->encode(reqs[i].prompt, reqs[i].add_special_tokens)
                            : reqs[i].prompt_ids;
  }
  } catch (...) {
    for (size_t i = 0; i < added; ++i) abort(out[i].request_id);
    while (has_work()) step();
    throw;
  }
  while (has_work()) step();
  return out;
}

bool Engine::has_tokenizer() const { return impl_->tok.has_value(); }
const tokenizer::Tokenizer& Engine::tokenizer() const {
  if (!impl_->tok) throw Error("this model has no tokenizer");
  return *impl_->tok;
}
int64_t Engine::vocab_size() const { return impl_->vocab; }
const char* Engine::architecture() const { return impl_->model.architecture(); }
int64_t Engine::max_model_len() const { return impl_->max_len; }
const std::string& Engine::model_dir() const { return impl_->dir; }
EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->stats_snapshot;
}
std::string Engine::check_invariants() const { return impl_->sched->check_invariants(); }

}  // namespace deepinfer
