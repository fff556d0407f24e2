#pragma once
// Reads a model's weights out of an opened checkpoint with their logical shapes checked, dequantized
// to float32 and handed to the backend. Shared by the model files (deepseek_v4.cc, deepseek_v41.cc):
// the stored formats are the checkpoint's, not the architecture's.
#include <cstdint>
#include <string>
#include <vector>

#include "ops/backend.h"

namespace deepinfer {

class Checkpoint;

// "[2, 3]" for error messages.
std::string shape_str(const std::vector<int64_t>& shape);

class WeightReader {
 public:
  // fp8_block_rows × fp8_block_cols: the block-scale grid of FP8 weights (128×128 for V4, 32×32 for V4.1).
  WeightReader(Checkpoint& ck, int fp8_block_rows, int fp8_block_cols, Backend& be)
      : ck_(ck), block_rows_(fp8_block_rows), block_cols_(fp8_block_cols), be_(be) {}

  // One weight as float32 [shape]. FP8 weights carry a sibling `<base>.scale` block-scale grid;
  // packed FP4 experts (I8/U8, two values a byte, so the stored last dim is half) carry 1×32 scales.
  // Throws Error naming the directory and tensor on a missing tensor or a wrong shape.
  std::vector<float> f32(const std::string& name, std::vector<int64_t> shape);
  // A vector (or small table) in the backend's memory.
  Buffer<float> vec(const std::string& name, std::vector<int64_t> shape) { return Buffer<float>(be_, f32(name, shape)); }
  // A matrix for the backend's linear(): W[N, K], in its stored format when the backend takes it
  // (Backend::takes_stored), else dequantized to float32.
  WeightPtr mat(const std::string& name, int64_t N, int64_t K);
  // Two matrices [N, K] stacked along N (w1 over w3) into one [2N, K] weight.
  WeightPtr mat2(const std::string& a, const std::string& b, int64_t N, int64_t K) { return mat_cat({a, b}, {N, N}, K); }
  // Matrices [Ns[i], K] stacked along N into one [ΣNs, K] weight (projections of one input: one GEMM
  // instead of several). Kept in the stored format when every part has the same one (FP8: each part a
  // whole number of scale blocks) and the backend takes the stack, else float32.
  WeightPtr mat_cat(const std::vector<std::string>& names, const std::vector<int64_t>& Ns, int64_t K);
  // A [G·N, K] matrix as G weights of [N, K] (row blocks; wo_a's head groups).
  std::vector<WeightPtr> mat_rows(const std::string& name, int64_t G, int64_t N, int64_t K);
  // An integer table (I64 or I32) [shape] with every value in [0, max_value).
  std::vector<int32_t> ids(const std::string& name, std::vector<int64_t> shape, int64_t max_value);

  Backend& backend() { return be_; }
  Checkpoint& ckpt() { return ck_; }

  // A weight in host memory as a StoredWeight: a view of the checkpoint's bytes, or owned bytes
  // (float32 copy, stacked matrices, scale grids converted to float).
  struct Host {
    StoredWeight w;
    std::vector<float> f32;
    std::vector<uint8_t> bytes;
    std::vector<float> scale;
  };
  // `name` [N, K] in the stored format the backend takes, else as float32.
  Host host(const std::string& name, int64_t N, int64_t K);

 private:
  Checkpoint& ck_;
  int block_rows_, block_cols_;
  Backend& be_;
};

}  // namespace deepinfer
