#pragma once
// Dequantization of checkpoint weights to float32.
//
// Storage forms handled (spec §2.3):
//   F32 / F16 / BF16 / F64, no scale                      -> same shape
//   F8_E4M3 (fn) or F8_E5M2 [out, in], optional block scale grid
//       [ceil(out/block_rows), ceil(in/block_cols)] in F8_E8M0, F32 or BF16
//       W[i,j] = fp8(Wq[i,j]) * S[i/block_rows, j/block_cols]           -> [out, in]
//   packed FP4 (I8/U8) [out, in/2] with scale [out, ceil(in/32)] in F8_E8M0 or F32:
//       element 2k = low nibble, 2k+1 = high nibble, E2M1 values,
//       W[i,j] = e2m1(nib(i,j)) * S[i, j/32]                            -> [out, in]
// block_rows / block_cols apply to FP8 only (FP4 groups are always 1x32 along `in`).
// Any mismatch (wrong scale shape, a scale where none belongs, unsupported dtype) throws Error
// naming the tensor and its file.
#include <cstdint>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace deepinfer {

class Checkpoint;

constexpr int kFp8BlockRows = 128, kFp8BlockCols = 128;  // quantization_config.weight_block_size
constexpr int kFp4BlockCols = 32;                          // MXFP4-style 1x32 groups along `in`

// Logical (dequantized) shape: [out, 2 * packed_in] for packed FP4, otherwise w.shape.
std::vector<int64_t> logical_shape(const TensorView& w, const TensorView* scale);

// Checks that `scale` fits `w` (see the forms above); throws Error otherwise.
void check_quantized(const TensorView& w, const TensorView* scale, int block_rows = kFp8BlockRows,
                     int block_cols = kFp8BlockCols);

// Dequantizes into `out` (exactly numel(logical_shape) floats). `threads` <= 0 picks a count from
// the hardware for big tensors; the result does not depend on it.
void dequantize_to_f32(const TensorView& w, const TensorView* scale, float* out, size_t out_len,
                       int block_rows = kFp8BlockRows, int block_cols = kFp8BlockCols, int threads = 0);
std::vector<float> dequantize_to_f32(const TensorView& w, const TensorView* scale,
                                     int block_rows = kFp8BlockRows, int block_cols = kFp8BlockCols);

// Native name of the scale that belongs to weight `name`: "a.b.weight" -> "a.b.scale".
std::string scale_name_for(const std::string& weight_name);

// Takes `weight_name` and, if the checkpoint has it, its sibling scale; returns the weight as f32
// in its logical shape (written to *shape if non-null).
std::vector<float> take_f32(Checkpoint& ck, const std::string& weight_name, std::vector<int64_t>* shape = nullptr);

}  // namespace deepinfer
