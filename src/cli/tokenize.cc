// `deepinfer tokenize` / `deepinfer detokenize`: JSON Lines filters over the tokenizer.
//   tokenize   --tokenizer PATH [--add-special-tokens]  stdin: JSON strings  -> stdout: id arrays
//   detokenize --tokenizer PATH [--skip-special-tokens] stdin: id arrays     -> stdout: JSON strings
// PATH is a tokenizer.json file or a directory holding one. Output order = input order; one
// output line per input line. Special-token strings in the input text are recognised (as HF's
// default encode does); without --add-special-tokens no BOS/EOS is added.
#include <cstdio>
#include <climits>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/json.h"

namespace deepinfer::cli {
namespace {

struct Args {
  std::string path;
  bool flag = false;
  bool help = false;
};

Args parse(int argc, char** argv, const char* flag_name, const char* usage) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (s == "--tokenizer" && i + 1 < argc) {
      a.path = argv[++i];
    } else if (s.rfind("--tokenizer=", 0) == 0) {
      a.path = s.substr(12);
    } else if (s == flag_name) {
      a.flag = true;
    } else if (s == "-h" || s == "--help") {
      a.help = true;
    } else {
      throw Error("unknown or incomplete argument '" + s + "'\n" + usage);
    }
  }
  if (!a.help && a.path.empty()) throw Error(std::string("--tokenizer PATH is required\n") + usage);
  return a;
}

constexpr const char* kTokUsage =
    "usage: deepinfer tokenize --tokenizer PATH [--add-special-tokens]\n"
    "  reads JSON Lines from stdin (each line a JSON string), writes one JSON array of ids per line";
constexpr const char* kDetokUsage =
    "usage: deepinfer detokenize --tokenizer PATH [--skip-special-tokens]\n"
    "  reads JSON Lines from stdin (each line a JSON array of ids), writes one JSON string per line";

// Batches lines so that encoding can use all cores while output stays in input order.
constexpr size_t kBatch = 4096;

}  // namespace

int cmd_tokenize(int argc, char** argv) {
  try {
    Args a = parse(argc, argv, "--add-special-tokens", kTokUsage);
    if (a.help) {
      std::puts(kTokUsage);
      return 0;
    }
    auto tok = tokenizer::Tokenizer::from_file(a.path);
    std::ios::sync_with_stdio(false);
    std::string line, out;
    std::vector<std::string> texts;
    size_t lineno = 0;
    auto flush = [&]() {
      auto ids = tok.encode_batch(texts, a.flag, tokenizer::ParseSpecial::kAll);
      for (const auto& v : ids) {
        out.clear();
        out += '[';
        for (size_t i = 0; i < v.size(); ++i) {
          if (i) out += ',';
          out += std::to_string(v[i]);
        }
        out += "]\n";
        std::fwrite(out.data(), 1, out.size(), stdout);
      }
      texts.clear();
      std::fflush(stdout);
    };
    while (std::getline(std::cin, line)) {
      ++lineno;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        throw Error("stdin line " + std::to_string(lineno) + ": invalid JSON: " + e.what());
      }
      if (!j.is_string()) throw Error("stdin line " + std::to_string(lineno) + ": expected a JSON string");
      texts.push_back(j.get<std::string>());
      if (texts.size() >= kBatch) flush();
    }
    flush();
    return 0;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "deepinfer tokenize: %s\n", e.what());
    return 1;
  }
}

int cmd_detokenize(int argc, char** argv) {
  try {
    Args a = parse(argc, argv, "--skip-special-tokens", kDetokUsage);
    if (a.help) {
      std::puts(kDetokUsage);
      return 0;
    }
    auto tok = tokenizer::Tokenizer::from_file(a.path);
    std::ios::sync_with_stdio(false);
    std::string line;
    size_t lineno = 0;
    std::vector<int32_t> ids;
    while (std::getline(std::cin, line)) {
      ++lineno;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        throw Error("stdin line " + std::to_string(lineno) + ": invalid JSON: " + e.what());
      }
      if (!j.is_array()) throw Error("stdin line " + std::to_string(lineno) + ": expected a JSON array of ids");
      ids.clear();
      for (const auto& v : j) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
          throw Error("stdin line " + std::to_string(lineno) + ": ids must be non-negative integers");
        ids.push_back(int32_t(v.get<int64_t>()));
      }
      std::string s = nlohmann::json(tok.decode(ids, a.flag)).dump() + "\n";
      std::fwrite(s.data(), 1, s.size(), stdout);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "deepinfer detokenize: %s\n", e.what());
    return 1;
  }
}

}  // namespace deepinfer::cli
