// deepinfer logits --model DIR --ids-file IDS.json --out OUT.safetensors [--prefill N --chunk M]
// Writes one F32 tensor `logits` [T, vocab_size], one row per input position. Without --prefill it
// is one forward over all T tokens; with it, N tokens in one step, then steps of M tokens through
// the incremental path.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cli/flags.h"
#include "cli/commands.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "ops/select/backend_select.h"
#include "util/error.h"
#include "util/json.h"

namespace deepinfer::cli {
namespace {

const char* kUsage =
    "usage: deepinfer logits --model DIR --ids-file IDS.json --out OUT.safetensors [--prefill N --chunk M]\n"
    "                        [--threads K] [--backend cuda|cpu] [--dtype auto|float32]\n";


std::vector<int32_t> read_ids(const std::string& path, int64_t vocab) {
  std::ifstream f(path);
  if (!f) throw Error(path + ": cannot open ids file");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw Error(path + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  if (!j.is_array()) throw Error(path + ": expected a JSON array of token ids");
  if (j.empty()) throw Error(path + ": the array of token ids is empty");
  std::vector<int32_t> ids;
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_number_integer()) throw Error(path + ": element " + std::to_string(i) + " is not an integer");
    int64_t v = j[i].get<int64_t>();
    if (v < 0 || v >= vocab)
      throw Error(path + ": token id " + std::to_string(v) + " at index " + std::to_string(i) +
                  " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    ids.push_back((int32_t)v);
  }
  return ids;
}

}  // namespace

int cmd_logits(int argc, char** argv) {
  std::string model, ids_file, out;
  int64_t prefill = -1, chunk = -1, threads = 0;
  std::string backend_name, dtype = "auto";
  try {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "-h" || a == "--help") {
        std::fputs(kUsage, stdout);
        return 0;
      }
      if (i + 1 >= argc) throw Error(a + ": missing value");
      std::string v = argv[++i];
      if (a == "--model") model = v;
      else if (a == "--ids-file") ids_file = v;
      else if (a == "--out") out = v;
      else if (a == "--prefill") prefill = flag_int(a, v);
      else if (a == "--chunk") chunk = flag_int(a, v);
      else if (a == "--threads") threads = flag_int(a, v);
      else if (a == "--backend") backend_name = v;
      else if (a == "--dtype") dtype = v;
      else throw Error("unknown option '" + a + "'");
    }
    if (model.empty() || ids_file.empty() || out.empty()) throw Error("--model, --ids-file and --out are required");
    if (chunk != -1 && prefill == -1) throw Error("--chunk needs --prefill");
    if (prefill != -1 && prefill < 1) throw Error("--prefill must be >= 1");
    if (chunk == -1) chunk = 1;
    if (chunk < 1) throw Error("--chunk must be >= 1");

    std::unique_ptr<Backend> be = make_backend(resolve_backend(backend_name), (int)threads, dtype);
    Backend& backend = *be;
    LoadedModel m = load_model(model, backend);
    for (const auto& n : m.unused) std::fprintf(stderr, "deepinfer: warning: tensor '%s' is not used by the model\n", n.c_str());
    const int64_t V = m.vocab_size();
    std::vector<int32_t> ids = read_ids(ids_file, V);
    const int64_t T = (int64_t)ids.size();
    if (prefill > T) throw Error("--prefill " + std::to_string(prefill) + " is longer than the " + std::to_string(T) + " ids");
    // One full forward, or `prefill` tokens then steps of `chunk` (any architecture).
    std::vector<float> logits = prefill == -1 ? sequence_logits(m, ids, T, T) : sequence_logits(m, ids, prefill, chunk);
    write_safetensors(out, {{"logits", DType::F32, {T, V}, logits.data(), logits.size() * sizeof(float)}});
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deepinfer logits: %s\n", e.what());
    return 1;
  }
}

}  // namespace deepinfer::cli
