// deepinfer._core: the public Engine API for Python, kept thin. The vLLM-shaped classes (LLM,
// SamplingParams, RequestOutput) live in deepinfer/__init__.py; this file only moves plain data
// across and releases the GIL while the engine runs.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <limits>

#include "deepinfer/engine.h"
#include "tokenizer/chat.h"
#include "util/error.h"

namespace nb = nanobind;
using namespace deepinfer;

namespace {

// One prompt as the Python layer passes it: text, or token ids (then text is ignored).
struct PyRequest {
  std::string prompt;
  std::vector<int32_t> prompt_ids;
  bool add_special_tokens = false;
  SamplingParams params;
};

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "DeepInfer engine bindings (use the deepinfer package, not this module)";
  // Every user-facing failure of the engine becomes ValueError with the engine's message.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  nb::enum_<StructuredKind>(m, "StructuredKind")
      .value("none", StructuredKind::kNone)
      .value("regex", StructuredKind::kRegex)
      .value("json_schema", StructuredKind::kJsonSchema)
      .value("grammar", StructuredKind::kGrammar)
      .value("json_object", StructuredKind::kJsonObject);
  nb::class_<StructuredOutput>(m, "StructuredOutput")
      .def(nb::init<>())
      .def_rw("kind", &StructuredOutput::kind)
      .def_rw("text", &StructuredOutput::text)
      .def_rw("disable_any_whitespace", &StructuredOutput::disable_any_whitespace);

  nb::class_<SamplingParams>(m, "SamplingParams")
      .def(nb::init<>())
      .def_rw("n", &SamplingParams::n)
      .def_rw("max_tokens", &SamplingParams::max_tokens, nb::arg().none())
      .def_rw("min_tokens", &SamplingParams::min_tokens)
      .def_rw("temperature", &SamplingParams::temperature)
      .def_rw("top_k", &SamplingParams::top_k)
      .def_rw("top_p", &SamplingParams::top_p)
      .def_rw("min_p", &SamplingParams::min_p)
      .def_rw("repetition_penalty", &SamplingParams::repetition_penalty)
      .def_rw("presence_penalty", &SamplingParams::presence_penalty)
      .def_rw("frequency_penalty", &SamplingParams::frequency_penalty)
      .def_rw("logit_bias", &SamplingParams::logit_bias)
      .def_rw("stop", &SamplingParams::stop)
      .def_rw("stop_token_ids", &SamplingParams::stop_token_ids)
      .def_rw("ignore_eos", &SamplingParams::ignore_eos)
      .def_rw("include_stop_str_in_output", &SamplingParams::include_stop_str_in_output)
      .def_rw("seed", &SamplingParams::seed, nb::arg().none())
      .def_rw("logprobs", &SamplingParams::logprobs, nb::arg().none())
      .def_rw("prompt_logprobs", &SamplingParams::prompt_logprobs, nb::arg().none())
      .def_rw("skip_special_tokens", &SamplingParams::skip_special_tokens)
      .def_rw("structured", &SamplingParams::structured)
      // Range checks that need no model (vocab-bounded ones run again when a request is added).
      .def("validate", [](const SamplingParams& p, int64_t vocab_size) { p.validate(vocab_size); },
           nb::arg("vocab_size") = std::numeric_limits<int32_t>::max());

  nb::class_<PyRequest>(m, "Request")
      .def(nb::init<>())
      .def_rw("prompt", &PyRequest::prompt)
      .def_rw("prompt_ids", &PyRequest::prompt_ids)
      .def_rw("add_special_tokens", &PyRequest::add_special_tokens)
      .def_rw("params", &PyRequest::params);

  nb::class_<TokenLogprob>(m, "TokenLogprob")
      .def_ro("token", &TokenLogprob::token)
      .def_ro("logprob", &TokenLogprob::logprob);
  nb::class_<TokenLogprobs>(m, "TokenLogprobs")
      .def_ro("token", &TokenLogprobs::token)
      .def_ro("logprob", &TokenLogprobs::logprob)
      .def_ro("top", &TokenLogprobs::top);
  nb::class_<Completion>(m, "Completion")
      .def_ro("index", &Completion::index)
      .def_ro("token_ids", &Completion::token_ids)
      .def_ro("text", &Completion::text)
      .def_ro("logprobs", &Completion::logprobs)
      .def_prop_ro("finish_reason", [](const Completion& c) { return std::string(finish_name(c.finish)); })
      .def_ro("stop_reason", &Completion::stop_reason)
      .def_ro("error", &Completion::error);
  nb::class_<GenerateResult>(m, "GenerateResult")
      .def_ro("request_id", &GenerateResult::request_id)
      .def_ro("prompt_ids", &GenerateResult::prompt_ids)
      .def_ro("outputs", &GenerateResult::outputs);

  nb::class_<Engine>(m, "Engine")
      .def(
          "__init__",
          [](Engine* self, const std::string& model_dir, const std::string& tokenizer, int threads,
             int64_t cache_bytes, int max_num_seqs, int64_t max_batched_tokens, int64_t max_model_len,
             bool progress, bool async_scheduling, bool device_sampling) {
            EngineConfig cfg;
            cfg.model_dir = model_dir;
            cfg.tokenizer = tokenizer;
            cfg.threads = threads;
            cfg.cache_bytes = cache_bytes;
            cfg.max_num_seqs = max_num_seqs;
            cfg.max_batched_tokens = max_batched_tokens;
            cfg.max_model_len = max_model_len;
            cfg.progress = progress;
            cfg.async_scheduling = async_scheduling;
            cfg.device_sampling = device_sampling;
            nb::gil_scoped_release nogil;  // loading can take a while
            new (self) Engine(cfg);
          },
          nb::arg("model_dir"), nb::arg("tokenizer"), nb::arg("threads"), nb::arg("cache_bytes"),
          nb::arg("max_num_seqs"), nb::arg("max_batched_tokens"), nb::arg("max_model_len"),
          nb::arg("progress"), nb::arg("async_scheduling") = true, nb::arg("device_sampling") = true)
      .def("generate",
           [](Engine& e, const std::vector<PyRequest>& py_reqs) {
             std::vector<Request> reqs;
             reqs.reserve(py_reqs.size());
             for (const PyRequest& r : py_reqs)
               reqs.push_back({r.prompt, r.prompt_ids, r.add_special_tokens, r.params});
             nb::gil_scoped_release nogil;
             return e.generate(reqs);
           })
      .def("encode",
           [](const Engine& e, const std::string& text, bool add_special_tokens) {
             return e.tokenizer().encode(text, add_special_tokens);
           },
           nb::arg("text"), nb::arg("add_special_tokens") = false)
      .def("decode",
           [](const Engine& e, const std::vector<int32_t>& ids, bool skip_special_tokens) {
             return e.tokenizer().decode(ids, skip_special_tokens);
           },
           nb::arg("ids"), nb::arg("skip_special_tokens") = false)
      // Prompt ids of a conversation (OpenAI messages as a JSON string) in the model's chat format.
      .def("chat_prompt_ids",
           [](const Engine& e, const std::string& messages_json, bool thinking, const std::string& effort) {
             tokenizer::chat::Json msgs;
             try {
               msgs = tokenizer::chat::Json::parse(messages_json);
             } catch (const std::exception& ex) {
               throw Error(std::string("messages are not valid JSON: ") + ex.what());
             }
             if (std::string(e.architecture()) == "deepseek_v41") {  // V4.1's own format
               tokenizer::chat::V41Options opt;
               opt.thinking = thinking;
               opt.reasoning_effort = effort;
               return tokenizer::chat::render_v41(msgs, opt).encode(e.tokenizer());
             }
             tokenizer::chat::V4Options opt;
             opt.thinking = thinking;
             opt.reasoning_effort = effort;
             return tokenizer::chat::render_v4(msgs, opt).encode(e.tokenizer());
           },
           nb::arg("messages_json"), nb::arg("thinking") = false, nb::arg("reasoning_effort") = "")
      .def_prop_ro("has_tokenizer", &Engine::has_tokenizer)
      .def_prop_ro("vocab_size", &Engine::vocab_size)
      .def_prop_ro("max_model_len", &Engine::max_model_len)
      .def_prop_ro("model_dir", &Engine::model_dir)
      .def("check_invariants", &Engine::check_invariants)
      .def("stats", [](const Engine& e) {
        EngineStats s = e.stats();
        nb::dict d;
        d["running"] = s.running;
        d["waiting"] = s.waiting;
        d["cache_pages_used"] = s.cache_pages_used;
        d["cache_pages_total"] = s.cache_pages_total;
        d["cache_slots_used"] = s.cache_slots_used;
        d["cache_slots_total"] = s.cache_slots_total;
        d["steps"] = s.steps;
        d["prompt_tokens"] = s.prompt_tokens;
        d["generated_tokens"] = s.generated_tokens;
        d["preemptions"] = s.preemptions;
        d["device_sampled_tokens"] = s.device_sampled_tokens;
        d["fed_steps"] = s.fed_steps;
        return d;
      });

  m.def("default_model_dir", &default_model_dir);
}
