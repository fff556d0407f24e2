#include "model/weight_reader.h"

#include <cstring>

#include "io/checkpoint.h"
#include "io/dequant.h"
#include "util/error.h"

namespace deepinfer {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

std::vector<float> WeightReader::f32(const std::string& name, std::vector<int64_t> shape) {
  const TensorView& w = ck_.take(name);
  const TensorView* scale = nullptr;
  std::string base = name;
  if (base.size() > 7 && base.compare(base.size() - 7, 7, ".weight") == 0) {
    base.resize(base.size() - 7);
    if (ck_.has(base + ".scale")) scale = &ck_.take(base + ".scale");
  }
  std::vector<int64_t> logical = w.shape;
  bool fp4 = (w.dtype == DType::I8 || w.dtype == DType::U8) && scale;
  if (fp4 && !logical.empty()) logical.back() *= 2;
  if (logical != shape)
    throw Error(ck_.dir() + ": tensor '" + name + "' has shape " + shape_str(logical) + ", expected " +
                shape_str(shape));
  if (fp4) return dequantize_to_f32(w, scale, 1, 32);
  return dequantize_to_f32(w, scale, block_rows_, block_cols_);
}

WeightPtr WeightReader::mat(const std::string& name, int64_t N, int64_t K) {
  auto w = f32(name, {N, K});
  return be_.make_weight(w.data(), N, K);
}

WeightPtr WeightReader::mat2(const std::string& a, const std::string& b, int64_t N, int64_t K) {
  auto w = f32(a, {N, K});
  auto w3 = f32(b, {N, K});
  w.insert(w.end(), w3.begin(), w3.end());
  return be_.make_weight(w.data(), 2 * N, K);
}

std::vector<int32_t> WeightReader::ids(const std::string& name, std::vector<int64_t> shape, int64_t max_value) {
  const TensorView& w = ck_.take(name);
  if (w.shape != shape)
    throw Error(ck_.dir() + ": tensor '" + name + "' has shape " + shape_str(w.shape) + ", expected " +
                shape_str(shape));
  std::vector<int32_t> out(w.numel());
  for (int64_t i = 0; i < w.numel(); ++i) {
    int64_t v;
    if (w.dtype == DType::I64) std::memcpy(&v, w.data + 8 * i, 8);
    else if (w.dtype == DType::I32) { int32_t x; std::memcpy(&x, w.data + 4 * i, 4); v = x; }
    else throw Error(ck_.dir() + ": tensor '" + name + "' must be I64 or I32, is " + std::string(dtype_name(w.dtype)));
    if (v < 0 || v >= max_value)
      throw Error(ck_.dir() + ": tensor '" + name + "' holds " + std::to_string(v) + ", outside [0, " +
                  std::to_string(max_value) + ")");
    out[i] = (int32_t)v;
  }
  return out;
}

}  // namespace deepinfer
