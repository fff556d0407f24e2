// deepinfer generate / chat: text generation on the engine (default: the embedded nano model).
//
//   deepinfer generate [--model DIR] --prompt TEXT [--chat] [sampling flags]    streams the text
//   deepinfer generate [--model DIR] --prompts-file F.jsonl [sampling flags]    batch + throughput
//   deepinfer chat [--model DIR] [sampling flags]                               interactive
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "deepinfer/engine.h"
#include "tokenizer/chat.h"
#include "util/error.h"
#include "util/json.h"

namespace deepinfer::cli {
namespace {

const char* kUsage =
    "usage: deepinfer generate [--model DIR] (--prompt TEXT | --prompts-file F.jsonl) [--chat] [options]\n"
    "       deepinfer chat [--model DIR] [options]\n"
    "options: --max-tokens N (default 128)  --min-tokens N  --temperature T (default 0 = greedy)\n"
    "         --top-k K  --top-p P  --min-p P  --seed S  --n N  --stop STR (repeatable)  --ignore-eos\n"
    "         --repetition-penalty X  --presence-penalty X  --frequency-penalty X\n"
    "         --threads N  --cache-mb MB  --max-num-seqs N  --quiet\n"
    "         --backend cuda|cpu (default: cuda when a GPU is present)  --gpu-memory-fraction F (default 0.9)\n"
    "         --dtype auto|float32 (cuda: weights as stored, or dequantized to float32 like the cpu backend)\n"
    "         --async-scheduling 0|1 (default 1: the next decode step is planned while one runs)\n"
    "         --device-sampling 0|1 (default 1: sample on the backend when the host would pick the same token)\n"
    "structured output (one of): --json-schema FILE  --regex R  --grammar FILE (GBNF)  --json-object\n"
    "         --compact-json (JSON without whitespace between tokens)\n"
    "--prompts-file: one JSON string or {\"prompt\": ...} object per line; prints one JSON result per line\n";

struct Options {
  EngineConfig engine;
  SamplingParams params;
  std::string prompt, prompts_file;
  bool chat = false, quiet = false, compact_json = false;
};

double to_double(const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    double x = std::stod(v, &used);
    if (used != v.size()) throw 0;
    return x;
  } catch (...) {
    throw Error(flag + ": expected a number, got '" + v + "'");
  }
}
int64_t to_int(const std::string& flag, const std::string& v) {
  double x = to_double(flag, v);
  if (x != (double)(int64_t)x) throw Error(flag + ": expected an integer, got '" + v + "'");
  return (int64_t)x;
}

std::string read_file(const std::string& flag, const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(flag + ": cannot open '" + path + "'");
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void set_structured(Options& o, const std::string& flag, StructuredKind kind, std::string text) {
  if (o.params.structured.active())
    throw Error(flag + ": only one of --json-schema, --regex, --grammar, --json-object may be given");
  o.params.structured = {kind, std::move(text)};
}

// Returns false for --help.
bool parse(int argc, char** argv, Options& o) {
  o.params.max_tokens = 128;
  o.params.temperature = 0.0f;
  o.engine.progress = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") return false;
    if (a == "--chat") { o.chat = true; continue; }
    if (a == "--ignore-eos") { o.params.ignore_eos = true; continue; }
    if (a == "--quiet") { o.quiet = true; o.engine.progress = false; continue; }
    if (a == "--json-object") { set_structured(o, a, StructuredKind::kJsonObject, ""); continue; }
    if (a == "--compact-json") { o.compact_json = true; continue; }
    if (i + 1 >= argc) throw Error(a + ": missing value");
    std::string v = argv[++i];
    if (a == "--model") o.engine.model_dir = v;
    else if (a == "--tokenizer") o.engine.tokenizer = v;
    else if (a == "--prompt") o.prompt = v;
    else if (a == "--prompts-file") o.prompts_file = v;
    else if (a == "--max-tokens") o.params.max_tokens = to_int(a, v);
    else if (a == "--min-tokens") o.params.min_tokens = to_int(a, v);
    else if (a == "--temperature") o.params.temperature = (float)to_double(a, v);
    else if (a == "--top-k") o.params.top_k = (int)to_int(a, v);
    else if (a == "--top-p") o.params.top_p = (float)to_double(a, v);
    else if (a == "--min-p") o.params.min_p = (float)to_double(a, v);
    else if (a == "--seed") o.params.seed = (uint64_t)to_int(a, v);
    else if (a == "--n") o.params.n = (int)to_int(a, v);
    else if (a == "--stop") o.params.stop.push_back(v);
    else if (a == "--repetition-penalty") o.params.repetition_penalty = (float)to_double(a, v);
    else if (a == "--presence-penalty") o.params.presence_penalty = (float)to_double(a, v);
    else if (a == "--frequency-penalty") o.params.frequency_penalty = (float)to_double(a, v);
    else if (a == "--threads") o.engine.threads = (int)to_int(a, v);
    else if (a == "--cache-mb") o.engine.cache_bytes = to_int(a, v) << 20;
    else if (a == "--backend") o.engine.backend = v;
    else if (a == "--dtype") o.engine.dtype = v;
    else if (a == "--gpu-memory-fraction") o.engine.gpu_memory_fraction = to_double(a, v);
    else if (a == "--async-scheduling") o.engine.async_scheduling = to_int(a, v) != 0;
    else if (a == "--device-sampling") o.engine.device_sampling = to_int(a, v) != 0;
    else if (a == "--max-num-seqs") o.engine.max_num_seqs = (int)to_int(a, v);
    else if (a == "--json-schema") set_structured(o, a, StructuredKind::kJsonSchema, read_file(a, v));
    else if (a == "--regex") set_structured(o, a, StructuredKind::kRegex, v);
    else if (a == "--grammar") set_structured(o, a, StructuredKind::kGrammar, read_file(a, v));
    else throw Error("unknown option '" + a + "'");
  }
  o.params.structured.disable_any_whitespace = o.compact_json;
  return true;
}

// The prompt token ids of a conversation in the model's chat format.
std::vector<int32_t> chat_ids(const Engine& e, const tokenizer::chat::Json& messages) {
  if (std::string(e.architecture()) == "deepseek_v41")
    return tokenizer::chat::render_v41(messages, tokenizer::chat::V41Options{}).encode(e.tokenizer());
  tokenizer::chat::V4Options opt;
  return tokenizer::chat::render_v4(messages, opt).encode(e.tokenizer());
}

Request make_request(const Engine& e, const Options& o, const std::string& prompt) {
  Request r;
  r.params = o.params;
  if (o.chat) {
    tokenizer::chat::Json msgs = tokenizer::chat::Json::array();
    msgs.push_back({{"role", "user"}, {"content", prompt}});
    r.prompt_ids = chat_ids(e, msgs);
  } else {
    r.prompt = prompt;
    r.add_special_tokens = true;  // BOS as the tokenizer config says
  }
  return r;
}

// Streams one request's choice 0 to stdout; returns the full text.
std::string stream(Engine& e, Request r) {
  std::string text;
  Finish fin = Finish::kNone;
  std::string err;
  r.params.n = 1;
  e.add_request(std::move(r), [&](const RequestOutput& o) {
    std::fwrite(o.text.data(), 1, o.text.size(), stdout);
    std::fflush(stdout);
    text += o.text;
    if (o.finished) {
      fin = o.finish;
      err = o.error;
    }
  });
  while (e.has_work()) e.step();
  if (fin == Finish::kError) throw Error("generation failed: " + err);
  return text;
}

int run_batch(Engine& e, const Options& o) {
  std::ifstream f(o.prompts_file);
  if (!f) throw Error(o.prompts_file + ": cannot open prompts file");
  std::vector<Request> reqs;
  std::string line;
  int lineno = 0;
  while (std::getline(f, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception&) {
      throw Error(o.prompts_file + ":" + std::to_string(lineno) + ": not valid JSON");
    }
    std::string p;
    if (j.is_string()) p = j.get<std::string>();
    else if (j.is_object() && j.contains("prompt") && j["prompt"].is_string()) p = j["prompt"].get<std::string>();
    else throw Error(o.prompts_file + ":" + std::to_string(lineno) + ": expected a string or {\"prompt\": string}");
    reqs.push_back(make_request(e, o, p));
  }
  if (reqs.empty()) throw Error(o.prompts_file + ": no prompts");
  auto t0 = std::chrono::steady_clock::now();
  auto res = e.generate(reqs);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t in = 0, out = 0;
  for (auto& r : res) {
    in += (int64_t)r.prompt_ids.size() * (int64_t)r.outputs.size();
    nlohmann::json j;
    j["outputs"] = nlohmann::json::array();
    for (auto& c : r.outputs) {
      out += (int64_t)c.token_ids.size();
      j["outputs"].push_back({{"text", c.text}, {"token_ids", c.token_ids}, {"finish_reason", finish_name(c.finish)}});
    }
    std::cout << j.dump() << "\n";
  }
  std::fprintf(stderr, "%zu requests, %lld prompt + %lld generated tokens in %.2f s: %.1f tok/s generated, %.1f tok/s total\n",
               res.size(), (long long)in, (long long)out, s, out / s, (in + out) / s);
  return 0;
}

int run_chat(Engine& e, const Options& o) {
  tokenizer::chat::Json msgs = tokenizer::chat::Json::array();
  std::string line;
  std::fprintf(stderr, "chat with %s (empty line or Ctrl-D to quit)\n", e.model_dir().c_str());
  for (;;) {
    std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line) || line.empty()) break;
    msgs.push_back({{"role", "user"}, {"content", line}});
    Request r;
    r.params = o.params;
    r.prompt_ids = chat_ids(e, msgs);
    std::string reply = stream(e, std::move(r));
    std::printf("\n");
    msgs.push_back({{"role", "assistant"}, {"content", reply}});
  }
  return 0;
}

int run(int argc, char** argv, bool chat_mode) {
  Options o;
  try {
    if (!parse(argc, argv, o)) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (!chat_mode && o.prompt.empty() == o.prompts_file.empty())
      throw Error("give exactly one of --prompt and --prompts-file");
    o.params.validate(1 << 30);  // field errors before the model loads; ids are checked later
    Engine e(o.engine);
    if (!e.has_tokenizer()) throw Error("model '" + e.model_dir() + "' has no tokenizer");
    if (chat_mode) return run_chat(e, o);
    if (!o.prompts_file.empty()) return run_batch(e, o);
    stream(e, make_request(e, o, o.prompt));
    std::printf("\n");
    return 0;
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "deepinfer %s: %s\n", chat_mode ? "chat" : "generate", ex.what());
    return 1;
  }
}

}  // namespace

int cmd_generate(int argc, char** argv) { return run(argc, argv, false); }
int cmd_chat(int argc, char** argv) { return run(argc, argv, true); }

}  // namespace deepinfer::cli
