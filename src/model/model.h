#pragma once
// Opening a model directory: reads config.json, picks the architecture file, loads the weights and
// reports every checkpoint tensor the architecture did not use.
#include <memory>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "model/deepseek_v4.h"

namespace deepinfer {

struct LoadedModel {
  std::unique_ptr<Checkpoint> ckpt;      // keeps the mappings alive
  std::unique_ptr<DeepseekV4Model> v4;   // the architecture (V4.1 will sit beside it)
  std::vector<std::string> unused;       // tensors in the files the model did not take
};

// Throws Error with a clear message for a bad directory, config or checkpoint.
// progress: draw a loading bar on stderr (one tick per layer).
LoadedModel load_model(const std::string& dir, Backend& backend, bool progress = false);

}  // namespace deepinfer
