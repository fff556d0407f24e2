#include "model/model.h"

#include <algorithm>
#include <cstdio>

#include "util/error.h"

namespace deepinfer {

LoadedModel load_model(const std::string& dir, Backend& backend, bool progress) {
  LoadedModel m;
  m.ckpt = Checkpoint::open(dir);
  const auto& j = m.ckpt->config();
  std::string type = j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>() : "";
  const bool v41 = is_v41_config(j);
  if (!v41 && type != "deepseek_v4")
    throw Error(dir + "/config.json: model_type '" + type + "' is not supported (expected deepseek_v4 or deepseek_v41)");
  LoadProgress bar;
  if (progress)
    bar = [](int done, int total) {
      const int width = 40, fill = total ? done * width / total : width;
      std::fprintf(stderr, "\rloading weights [%.*s%*s] %d/%d layers", fill,
                   "########################################", width - fill, "", done, total);
      if (done == total) std::fprintf(stderr, "\n");
    };
  if (v41) {
    V41Config cfg = parse_v41_config(j);
    auto map = read_engram_token_map(dir, cfg);
    m.v41 = std::make_unique<DeepseekV41Model>(cfg, *m.ckpt, backend, std::move(map), bar);
  } else {
    V4Config cfg = parse_v4_config(j);
    m.v4 = std::make_unique<DeepseekV4Model>(cfg, *m.ckpt, backend, bar);
  }
  for (auto& n : m.ckpt->unused()) {
    const bool optional = v41 && (n.rfind("mtp.", 0) == 0 || n.rfind("vision.", 0) == 0 ||
                                  n.rfind("aligner.", 0) == 0 || n.rfind("image_", 0) == 0);
    (optional ? m.ignored : m.unused).push_back(n);
  }
  return m;
}

std::vector<float> sequence_logits(LoadedModel& m, const std::vector<int32_t>& ids, int64_t first, int64_t step) {
  const int64_t T = (int64_t)ids.size();
  std::vector<float> out;
  int64_t done = 0;
  if (m.v41) {
    V41SeqState st = m.v41->new_state();
    while (done < T) {
      const int64_t n = done == 0 ? std::min(first, T) : std::min(step, T - done);
      V41SeqChunk c{&st, std::span<const int32_t>(ids.data() + done, n), true};
      auto l = m.v41->forward(std::span<const V41SeqChunk>(&c, 1));
      out.insert(out.end(), l.begin(), l.end());
      done += n;
    }
    return out;
  }
  V4Cache cache(m.v4->config(), 1, (int32_t)V4CacheLayout::make(m.v4->config()).pages_for(T), &m.v4->backend());
  V4SeqState st;
  if (!cache.open(&st) || !cache.reserve(&st, T)) throw Error("cannot allocate the cache");
  while (done < T) {
    const int64_t n = done == 0 ? std::min(first, T) : std::min(step, T - done);
    V4SeqChunk c{&st, std::span<const int32_t>(ids.data() + done, n), true};
    auto l = m.v4->forward(std::span<const V4SeqChunk>(&c, 1), cache);
    out.insert(out.end(), l.begin(), l.end());
    done += n;
  }
  return out;
}

}  // namespace deepinfer
