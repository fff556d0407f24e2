#include "server/server.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>

#include "server/metrics.h"
#include "util/error.h"

namespace deepinfer::server {

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// State the engine's output callbacks touch. Shared (not owned by the Server) so that a callback
// running after the HTTP side has gone away never sees freed memory.
struct Shared {
  Metrics metrics;
  std::atomic<int64_t> sequences{0};  // admitted and not finished
  std::atomic<int64_t> open_streams{0};  // SSE responses not completely written yet
};

// One HTTP generation request: its engine requests and the events they produced.
struct Job {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<int, RequestOutput>> events;  // (choice index, event)
  int unfinished = 0;
  std::vector<uint64_t> ids;
  Clock::time_point arrival = Clock::now(), first_token, last_token;
  bool got_token = false;
  int64_t max_choice_tokens = 0;  // for TPOT: the longest choice's token count

  bool done() {
    std::lock_guard<std::mutex> lk(mu);
    return unfinished == 0;
  }
  // Waits up to `wait` for events; returns them (possibly none).
  std::deque<std::pair<int, RequestOutput>> take(std::chrono::milliseconds wait) {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait_for(lk, wait, [&] { return !events.empty(); });
    std::deque<std::pair<int, RequestOutput>> out;
    out.swap(events);
    return out;
  }
};

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s%016llx", prefix, (unsigned long long)rng());
  return buf;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Constant-time in the presented key: every byte of the expected key is always visited, and the
// lengths are compared without branching on the content.
bool key_equals(const std::string& expected, const std::string& given) {
  volatile unsigned char diff = (unsigned char)(expected.size() != given.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char g = i < given.size() ? (unsigned char)given[i] : 0;
    diff = diff | ((unsigned char)expected[i] ^ g);
  }
  return diff == 0;
}

void set_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(error_body(e), "application/json");
}

}  // namespace

struct Server::Impl {
  Engine& engine;
  ServerConfig cfg;
  ModelInfo info;
  httplib::Server http;
  std::shared_ptr<Shared> shared = std::make_shared<Shared>();
  std::atomic<bool> draining{false}, serving{false};
  std::once_flag shutdown_once;
  int port = 0;
  // Watchdog: last seen engine step count and when it changed.
  std::mutex wd_mu;
  int64_t wd_steps = -1;
  Clock::time_point wd_changed = Clock::now();

  Impl(Engine& e, ServerConfig c) : engine(e), cfg(std::move(c)) {
    if (!engine.has_tokenizer()) throw Error("the model has no tokenizer; the server needs one");
    info.tok = &engine.tokenizer();
    info.vocab_size = engine.vocab_size();
    info.max_model_len = engine.max_model_len();
    info.names = cfg.model_names;
    std::filesystem::path dir(engine.model_dir());
    std::string base = (dir.has_filename() ? dir.filename() : dir.parent_path().filename()).string();
    if (info.names.empty()) info.names.push_back(base.empty() ? "deepinfer" : base);
    info.names.push_back(engine.model_dir());  // the path the server was started with is accepted too
    if (auto id = info.tok->token_to_id("</think>")) info.think_end_id = *id;
    info.v41 = std::string(engine.architecture()) == "deepseek_v41";
    routes();
  }

  // ---- admission ----

  // Starts the engine requests of `g`; every sequence reports its events into the returned job.
  std::shared_ptr<Job> start(const GenRequest& g) {
    auto job = std::make_shared<Job>();
    const int64_t seqs = g.total_sequences();
    if (draining) {
      shared->metrics.on_rejected();
      throw ApiError(503, "the server is shutting down", "", "server_shutting_down");
    }
    if (shared->sequences.fetch_add(seqs) + seqs > cfg.max_queued_sequences) {
      shared->sequences -= seqs;
      shared->metrics.on_rejected();
      throw ApiError(429, "the server is at capacity (" + std::to_string(cfg.max_queued_sequences) +
                              " sequences queued or running); retry later", "", "queue_full");
    }
    job->unfinished = (int)seqs;
    int64_t started = 0;
    try {
      for (size_t p = 0; p < g.prompts.size(); ++p) {
        Request r;
        r.prompt_ids = g.prompts[p];
        r.params = g.params;
        const int base = (int)p * g.params.n;
        std::shared_ptr<Shared> sh = shared;
        uint64_t id = engine.add_request(std::move(r), [job, sh, base](const RequestOutput& o) {
          on_output(*job, *sh, base, o);
        });
        std::lock_guard<std::mutex> lk(job->mu);
        job->ids.push_back(id);
        started += g.params.n;
      }
    } catch (...) {
      // Sequences never queued are given back now; queued ones finish (abort) through the sink.
      shared->sequences -= seqs - started;
      {
        std::lock_guard<std::mutex> lk(job->mu);
        job->unfinished -= (int)(seqs - started);
      }
      for (uint64_t id : job->ids) engine.abort(id);
      try {
        throw;
      } catch (const Error& e) {
        if (draining || std::string(e.what()).find("shutting down") != std::string::npos)
          throw ApiError(503, "the server is shutting down", "", "server_shutting_down");
        const std::string msg = e.what();
        // Specs are compiled by add_request; name the field the client used.
        throw ApiError(400, msg, msg.rfind("structured output", 0) == 0 ? "response_format" : "");
      }
    }
    return job;
  }

  // Runs on the engine's loop thread: must be quick and never block on the HTTP side.
  static void on_output(Job& job, Shared& sh, int base, const RequestOutput& o) {
    const auto now = Clock::now();
    bool all_done = false;
    {
      std::lock_guard<std::mutex> lk(job.mu);
      if (!o.token_ids.empty()) {
        if (!job.got_token) job.first_token = now;
        job.got_token = true;
        job.last_token = now;
      }
      if (o.finished) {
        --job.unfinished;
        all_done = job.unfinished == 0;
        job.max_choice_tokens = std::max(job.max_choice_tokens, o.num_output_tokens);
        // Prompt tokens once per prompt: with its choice 0.
        sh.metrics.on_request_finished(finish_name(o.finish), o.index == 0 ? o.num_prompt_tokens : 0,
                                       o.num_output_tokens);
      }
      job.events.emplace_back(base + o.index, o);
      if (all_done) {
        const double e2e = seconds(now - job.arrival);
        const double ttft = job.got_token ? seconds(job.first_token - job.arrival) : -1.0;
        const bool has_tpot = job.got_token && job.max_choice_tokens > 1;
        const double tpot = has_tpot ? seconds(job.last_token - job.first_token) / double(job.max_choice_tokens - 1) : 0;
        sh.metrics.observe_latency(ttft, tpot, has_tpot, e2e);
      }
    }
    if (o.finished) sh.sequences -= 1;
    job.cv.notify_all();
  }

  // ---- response bodies ----

  static Json chat_choice_json(int index, const ChoiceState& c, const GenRequest& g, const ModelInfo& m) {
    Json msg = {{"role", "assistant"}, {"content", c.content}};
    msg["reasoning_content"] = g.thinking ? Json(c.reasoning) : Json(nullptr);
    msg["tool_calls"] = Json::array();
    Json ch = {{"index", index}, {"message", msg}, {"finish_reason", finish_reason(c.finish)}};
    ch["logprobs"] = g.want_logprobs ? chat_logprobs(c.logprobs, m) : Json(nullptr);
    return ch;
  }

  Json completion_choice_json(int index, const ChoiceState& c, const GenRequest& g) const {
    const std::string& prefix = g.echo ? g.prompt_texts[index / g.params.n] : std::string();
    Json ch = {{"index", index}, {"text", prefix + c.content}, {"finish_reason", finish_reason(c.finish)}};
    ch["logprobs"] = g.want_logprobs ? completion_logprobs(c.logprobs, info, 0) : Json(nullptr);
    return ch;
  }

  void generate_blocking(const GenRequest& g, httplib::Response& res) {
    auto job = start(g);
    std::vector<ChoiceState> choices(g.total_sequences());
    for (auto& c : choices) c.in_reasoning = g.thinking;
    for (;;) {
      auto evs = job->take(std::chrono::milliseconds(500));
      for (auto& [idx, o] : evs) apply_output(choices[idx], o, info);
      if (job->done()) {
        // Events of the final finish may have raced with done(): take what is left.
        for (auto& [idx, o] : job->take(std::chrono::milliseconds(0))) apply_output(choices[idx], o, info);
        bool all = true;
        for (auto& c : choices) all = all && c.finished;
        if (all) break;
      }
    }
    for (auto& c : choices)
      if (c.finish == Finish::kError) throw ApiError(500, "generation failed: " + c.error);
    int64_t completion_tokens = 0;
    for (auto& c : choices) completion_tokens += c.num_tokens;
    int64_t prompt_tokens = 0;
    for (auto& p : g.prompts) prompt_tokens += (int64_t)p.size();
    Json out;
    Json arr = Json::array();
    if (g.kind == Kind::kChat) {
      out = {{"id", random_id("chatcmpl-")}, {"object", "chat.completion"}, {"created", unix_now()}, {"model", g.model}};
      for (size_t i = 0; i < choices.size(); ++i) arr.push_back(chat_choice_json((int)i, choices[i], g, info));
    } else {
      out = {{"id", random_id("cmpl-")}, {"object", "text_completion"}, {"created", unix_now()}, {"model", g.model}};
      for (size_t i = 0; i < choices.size(); ++i) arr.push_back(completion_choice_json((int)i, choices[i], g));
    }
    out["choices"] = arr;
    out["usage"] = usage_json(prompt_tokens, completion_tokens);
    res.set_content(dump(out), "application/json");
  }

  // Server-sent events: one "data: {chunk}\n\n" per output event, "data: [DONE]\n\n" at the end.
  void generate_stream(const GenRequest& g, httplib::Response& res) {
    struct St {
      std::shared_ptr<Job> job;
      GenRequest g;
      std::vector<ChoiceState> choices;
      std::vector<size_t> text_offset;
      std::string id;
      int64_t created = unix_now();
      bool started = false;
      std::atomic<bool> released{false};
      Clock::time_point last_write = Clock::now();
    };
    auto st = std::make_shared<St>();
    st->job = start(g);
    st->g = g;
    st->choices.resize(g.total_sequences());
    for (auto& c : st->choices) c.in_reasoning = g.thinking;
    st->text_offset.assign(st->choices.size(), 0);
    st->id = random_id(g.kind == Kind::kChat ? "chatcmpl-" : "cmpl-");
    Engine* eng = &engine;
    std::shared_ptr<Shared> sh = shared;
    ++sh->open_streams;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, st](size_t, httplib::DataSink& sink) -> bool {
          try {
            return stream_step(*st, sink);
          } catch (const std::exception& e) {
            std::fprintf(stderr, "deepinfer serve: stream failed: %s\n", e.what());
            return false;
          }
        },
        [st, eng, sh](bool) {
          if (st->released.exchange(true)) return;  // once, even if httplib copied the response
          // Runs when the response is over, whatever the reason: a client that went away leaves
          // unfinished sequences behind, and they are aborted here (freed within one step).
          if (!st->job->done()) {
            std::vector<uint64_t> ids;
            {
              std::lock_guard<std::mutex> lk(st->job->mu);
              ids = st->job->ids;
            }
            for (uint64_t id : ids) eng->abort(id);
          }
          --sh->open_streams;
        });
  }

  template <class St>
  bool stream_step(St& st, httplib::DataSink& sink) {
    const GenRequest& g = st.g;
    std::string out;
    auto chunk = [&](Json choices_arr) {
      Json c = {{"id", st.id},
                {"object", g.kind == Kind::kChat ? "chat.completion.chunk" : "text_completion"},
                {"created", st.created},
                {"model", g.model},
                {"choices", std::move(choices_arr)}};
      if (g.include_usage) c["usage"] = nullptr;
      out += "data: " + dump(c) + "\n\n";
    };
    if (!st.started) {
      st.started = true;
      for (size_t i = 0; i < st.choices.size(); ++i) {
        if (g.kind == Kind::kChat) {
          Json delta = {{"role", "assistant"}, {"content", ""}};
          chunk(Json::array({{{"index", i}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", nullptr}}}));
        } else if (g.echo) {
          const std::string& text = g.prompt_texts[i / g.params.n];
          chunk(Json::array({{{"index", i}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", nullptr}}}));
        }
      }
    }
    auto evs = st.job->take(std::chrono::milliseconds(out.empty() ? 250 : 0));
    for (auto& [idx, o] : evs) {
      ChoiceState& c = st.choices[idx];
      Delta d = apply_output(c, o, info);
      if (o.finish == Finish::kError) {
        ApiError e(500, "generation failed: " + o.error);
        out += "data: " + error_body(e) + "\n\n";
        continue;
      }
      const bool has_text = !d.content.empty() || !d.reasoning.empty();
      const bool has_lp = g.want_logprobs && !o.logprobs.empty();
      if (!has_text && !has_lp && !o.finished) continue;
      Json ch = {{"index", idx}};
      if (g.kind == Kind::kChat) {
        Json delta = Json::object();
        if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
        if (!d.content.empty() || (has_lp && d.reasoning.empty())) delta["content"] = d.content;
        ch["delta"] = delta;
        ch["logprobs"] = has_lp ? chat_logprobs(o.logprobs, info) : Json(nullptr);
      } else {
        ch["text"] = d.content;
        ch["logprobs"] = has_lp ? completion_logprobs(o.logprobs, info, st.text_offset[idx]) : Json(nullptr);
        st.text_offset[idx] += d.content.size();
      }
      ch["finish_reason"] = o.finished ? Json(finish_reason(o.finish)) : Json(nullptr);
      chunk(Json::array({ch}));
    }
    bool all = st.job->done();
    if (all) {
      // take() may have missed the last events if they raced with done(); drain once more.
      for (auto& c : st.choices) all = all && c.finished;
    }
    if (all) {
      if (g.include_usage) {
        int64_t completion_tokens = 0, prompt_tokens = 0;
        for (auto& c : st.choices) completion_tokens += c.num_tokens;
        for (auto& p : g.prompts) prompt_tokens += (int64_t)p.size();
        Json c = {{"id", st.id},
                  {"object", g.kind == Kind::kChat ? "chat.completion.chunk" : "text_completion"},
                  {"created", st.created},
                  {"model", g.model},
                  {"choices", Json::array()},
                  {"usage", usage_json(prompt_tokens, completion_tokens)}};
        out += "data: " + dump(c) + "\n\n";
      }
      out += "data: [DONE]\n\n";
    } else if (out.empty() && Clock::now() - st.last_write > std::chrono::seconds(1)) {
      // An SSE comment: clients ignore it, and writing it finds a vanished client while the
      // request still waits in the queue.
      out = ": keep-alive\n\n";
    }
    if (!out.empty()) {
      if (!sink.write(out.data(), out.size())) return false;
      st.last_write = Clock::now();
    }
    if (all) sink.done();
    return true;
  }

  // ---- routes ----

  bool authorized(const httplib::Request& req) const {
    if (cfg.api_key.empty()) return true;
    std::string given;
    const std::string auth = req.get_header_value("Authorization");
    if (auth.size() > 7 && (auth.compare(0, 7, "Bearer ") == 0 || auth.compare(0, 7, "bearer ") == 0))
      given = auth.substr(7);
    else if (req.has_header("X-Api-Key"))
      given = req.get_header_value("X-Api-Key");
    return key_equals(cfg.api_key, given);
  }

  bool healthy(std::string& why) {
    if (draining) {
      why = "the server is shutting down";
      return false;
    }
    EngineStats s = engine.stats();
    std::lock_guard<std::mutex> lk(wd_mu);
    const auto now = Clock::now();
    if (s.steps != wd_steps) {
      wd_steps = s.steps;
      wd_changed = now;
    }
    const bool pending = shared->sequences.load() > 0 || s.running > 0 || s.waiting > 0;
    if (pending && seconds(now - wd_changed) > cfg.watchdog_s) {
      why = "the engine has made no progress for " + std::to_string((int)cfg.watchdog_s) + " s";
      return false;
    }
    if (!pending) wd_changed = now;
    return true;
  }

  template <class F>
  httplib::Server::Handler json_route(F f) {
    return [this, f](const httplib::Request& req, httplib::Response& res) {
      try {
        f(req, res);
      } catch (const ApiError& e) {
        if (e.status == 429) res.set_header("Retry-After", "1");
        set_error(res, e);
      } catch (const Error& e) {
        set_error(res, ApiError(400, e.what()));
      } catch (const std::bad_alloc&) {
        set_error(res, ApiError(413, "the request needs more memory than the server allows"));
      } catch (const std::length_error&) {
        set_error(res, ApiError(413, "the request is too large"));
      }
    };
  }

  static constexpr size_t kMaxHeaders = 100;

  Json model_card() const {
    return {{"id", info.names[0]},     {"object", "model"},          {"created", unix_now()},
            {"owned_by", "deepinfer"}, {"root", engine.model_dir()}, {"parent", nullptr},
            {"max_model_len", info.max_model_len}};
  }

  void routes() {
    http.set_payload_max_length(cfg.max_body_bytes);
    http.set_read_timeout(cfg.read_timeout_s, 0);
    http.set_write_timeout(cfg.write_timeout_s, 0);
    http.set_keep_alive_max_count(1000);
    http.set_keep_alive_timeout(5);
    const int threads = std::max(4, cfg.http_threads);
    http.new_task_queue = [threads] { return new httplib::ThreadPool((size_t)threads); };

    // Deny by default: authentication runs before routing, so no path (known or not) skips it.
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      // httplib caps each header line (8 KiB) but not their number.
      if (req.headers.size() > kMaxHeaders) {
        set_error(res, ApiError(431, "more than " + std::to_string(kMaxHeaders) + " request headers"));
        return httplib::Server::HandlerResponse::Handled;
      }
      if (!authorized(req)) {
        res.set_header("WWW-Authenticate", "Bearer");
        set_error(res, ApiError(401, "invalid or missing API key", "", "invalid_api_key"));
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    http.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      std::string msg;
      switch (res.status) {
        case 404: msg = "no route for " + req.method + " " + tokenizer::utf8::to_valid(req.path.substr(0, 200)); break;
        case 413: msg = "the request body is larger than the server allows"; break;
        case 414: msg = "the request URI is too long"; break;
        default: msg = "bad request"; break;
      }
      set_error(res, ApiError(res.status, msg));
      return httplib::Server::HandlerResponse::Handled;
    }));
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      std::fprintf(stderr, "deepinfer serve: internal error: %s\n", what.c_str());
      set_error(res, ApiError(500, "internal server error"));
    });
    http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      shared->metrics.on_http_response(res.status);
      if (cfg.log_requests)
        std::fprintf(stderr, "%s %s -> %d\n", req.method.c_str(), tokenizer::utf8::to_valid(req.path.substr(0, 200)).c_str(),
                     res.status);
    });

    http.Post("/v1/chat/completions", json_route([this](const httplib::Request& req, httplib::Response& res) {
      GenRequest g = parse_chat(parse_body(req.body, cfg.limits.max_json_depth), info, cfg.limits);
      g.stream ? generate_stream(g, res) : generate_blocking(g, res);
    }));
    http.Post("/v1/completions", json_route([this](const httplib::Request& req, httplib::Response& res) {
      GenRequest g = parse_completion(parse_body(req.body, cfg.limits.max_json_depth), info, cfg.limits);
      g.stream ? generate_stream(g, res) : generate_blocking(g, res);
    }));
    http.Get("/v1/models", json_route([this](const httplib::Request&, httplib::Response& res) {
      res.set_content(dump(Json{{"object", "list"}, {"data", Json::array({model_card()})}}), "application/json");
    }));
    http.Get(R"(/v1/models/(.+))", json_route([this](const httplib::Request& req, httplib::Response& res) {
      const std::string id = req.matches[1];
      if (std::find(info.names.begin(), info.names.end(), id) == info.names.end())
        throw ApiError(404, "The model '" + id + "' does not exist", "model", "model_not_found");
      res.set_content(dump(model_card()), "application/json");
    }));
    http.Get("/health", json_route([this](const httplib::Request&, httplib::Response& res) {
      std::string why;
      if (!healthy(why)) throw ApiError(503, why, "", "unhealthy");
      res.set_content("{\"status\":\"ok\"}", "application/json");
    }));
    http.Get("/metrics", json_route([this](const httplib::Request&, httplib::Response& res) {
      res.set_content(shared->metrics.render(engine.stats(), shared->sequences.load(), draining),
                      "text/plain; version=0.0.4; charset=utf-8");
    }));
    http.Post("/tokenize", json_route([this](const httplib::Request& req, httplib::Response& res) {
      res.set_content(dump(handle_tokenize(parse_body(req.body, cfg.limits.max_json_depth), info, cfg.limits)),
                      "application/json");
    }));
    http.Post("/detokenize", json_route([this](const httplib::Request& req, httplib::Response& res) {
      res.set_content(dump(handle_detokenize(parse_body(req.body, cfg.limits.max_json_depth), info)),
                      "application/json");
    }));
  }
};

Server::Server(Engine& engine, ServerConfig cfg) : impl_(std::make_unique<Impl>(engine, std::move(cfg))) {}

Server::~Server() {
  shutdown();
}

int Server::bind() {
  Impl& m = *impl_;
  if (m.cfg.port == 0) {
    m.port = m.http.bind_to_any_port(m.cfg.host);
    if (m.port <= 0) throw Error("cannot bind to " + m.cfg.host);
  } else {
    if (!m.http.bind_to_port(m.cfg.host, m.cfg.port))
      throw Error("cannot bind to " + m.cfg.host + ":" + std::to_string(m.cfg.port) + " (in use, or not a local address)");
    m.port = m.cfg.port;
  }
  return m.port;
}

void Server::serve() {
  Impl& m = *impl_;
  m.serving = true;
  if (!m.draining) m.http.listen_after_bind();
  m.serving = false;
}

void Server::shutdown() {
  Impl& m = *impl_;
  std::call_once(m.shutdown_once, [&m] {
    m.draining = true;  // from now on new requests get 503
    // Running requests finish (or are aborted at the timeout); their streams then end with [DONE].
    m.engine.drain(m.cfg.shutdown_timeout_ms);
    // Let the stream writers flush their last events: httplib ends chunked responses as soon as
    // the listener stops, so it stops only after that.
    const auto t0 = Clock::now();
    while ((m.shared->sequences.load() > 0 || m.shared->open_streams.load() > 0) &&
           Clock::now() - t0 < std::chrono::seconds(10))
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    m.http.stop();
    // A signal right at start-up can come before listen() is running: stop it again until serve()
    // has returned.
    while (m.serving) {
      m.http.stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
}

}  // namespace deepinfer::server
