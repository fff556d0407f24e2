#include "model/model.h"

#include <cstdio>

#include "util/error.h"

namespace deepinfer {

LoadedModel load_model(const std::string& dir, Backend& backend, bool progress) {
  LoadedModel m;
  m.ckpt = Checkpoint::open(dir);
  const auto& j = m.ckpt->config();
  std::string type = j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>() : "";
  if (type != "deepseek_v4")
    throw Error(dir + "/config.json: model_type '" + type + "' is not supported (expected deepseek_v4)");
  V4Config cfg = parse_v4_config(j);
  LoadProgress bar;
  if (progress)
    bar = [](int done, int total) {
      const int width = 40, fill = total ? done * width / total : width;
      std::fprintf(stderr, "\rloading weights [%.*s%*s] %d/%d layers", fill,
                   "########################################", width - fill, "", done, total);
      if (done == total) std::fprintf(stderr, "\n");
    };
  m.v4 = std::make_unique<DeepseekV4Model>(cfg, *m.ckpt, backend, bar);
  m.unused = m.ckpt->unused();
  return m;
}

}  // namespace deepinfer
