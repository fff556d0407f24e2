#pragma once
// Opening a model directory: reads config.json, picks the architecture file from it (model_type /
// architectures), loads the weights and reports every checkpoint tensor the architecture did not use.
#include <memory>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "model/deepseek_v4.h"
#include "model/deepseek_v41.h"

namespace deepinfer {

struct LoadedModel {
  std::unique_ptr<Checkpoint> ckpt;        // keeps the mappings alive (V4.1 reads Engram rows from them)
  std::unique_ptr<DeepseekV4Model> v4;     // exactly one of v4 / v41 is set
  std::unique_ptr<DeepseekV41Model> v41;
  std::vector<std::string> unused;         // tensors in the files the model did not take
  // V4.1: tensors of parts not implemented yet (DSpark drafter `mtp.*`, vision tower `vision.*`,
  // `aligner.*`, `image_*`), left out of `unused` so that a published checkpoint loads quietly.
  std::vector<std::string> ignored;

  const char* architecture() const { return v41 ? "deepseek_v41" : "deepseek_v4"; }
  int vocab_size() const { return v41 ? v41->config().vocab_size : v4->config().vocab_size; }
};

// Throws Error with a clear message for a bad directory, config or checkpoint.
// progress: draw a loading bar on stderr (one tick per layer).
LoadedModel load_model(const std::string& dir, Backend& backend, bool progress = false);

// Logits [T, vocab] of one token sequence, whichever the architecture: `first` tokens in one step,
// then steps of `step` tokens (first >= T: one full forward). Fresh state, discarded afterwards.
std::vector<float> sequence_logits(LoadedModel& m, const std::vector<int32_t>& ids, int64_t first, int64_t step);

}  // namespace deepinfer
