// Dequantization to float32. Rows are independent, so big tensors are split by rows over threads.
#include "io/dequant.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "io/checkpoint.h"
#include "util/error.h"
#include "util/numeric.h"

namespace deepinfer {
namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

[[noreturn]] void fail(const TensorView& w, const std::string& msg) {
  throw Error((w.file ? *w.file + ": " : std::string()) + "tensor '" + w.name + "': " + msg);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool is_plain_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F64; }
bool is_fp8(DType t) { return t == DType::F8_E4M3 || t == DType::F8_E5M2; }
bool is_fp4_packed(DType t) { return t == DType::I8 || t == DType::U8; }

// Unaligned little-endian loads (mmapped data carries no alignment guarantee).
template <typename T>
T load(const uint8_t* p, size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

float scale_at(const TensorView& s, size_t i) {
  switch (s.dtype) {
    case DType::F8_E8M0: return e8m0_to_f32(s.data[i]);
    case DType::F32: return load<float>(s.data, i);
    case DType::BF16: return bf16_to_f32(load<uint16_t>(s.data, i));
    default: return 0.f;  // rejected by check_quantized
  }
}

// Runs fn(row_begin, row_end) over [0, rows) on up to `threads` threads.
template <typename Fn>
void parallel_rows(int64_t rows, int64_t row_elems, int threads, Fn fn) {
  if (threads <= 0) {
    // Threads only pay off for big tensors; ~1M elements per thread.
    int64_t want = rows * row_elems / (1 << 20);
    threads = static_cast<int>(std::clamp<int64_t>(want, 1, std::max(1u, std::thread::hardware_concurrency())));
  }
  threads = static_cast<int>(std::min<int64_t>(threads, std::max<int64_t>(rows, 1)));
  if (threads <= 1) {
    fn(int64_t{0}, rows);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t per = ceil_div(rows, threads);
  for (int t = 0; t < threads; ++t) {
    int64_t b = t * per, e = std::min(rows, b + per);
    if (b < e) pool.emplace_back(fn, b, e);
  }
  for (auto& th : pool) th.join();
}

}  // namespace

std::vector<int64_t> logical_shape(const TensorView& w, const TensorView* scale) {
  if (is_fp4_packed(w.dtype) && scale && w.shape.size() == 2) return {w.shape[0], w.shape[1] * 2};
  return w.shape;
}

void check_quantized(const TensorView& w, const TensorView* scale, int block_rows, int block_cols) {
  if (is_plain_float(w.dtype)) {
    if (scale) fail(w, std::string(dtype_name(w.dtype)) + " weight has a scale tensor '" + scale->name + "'");
    return;
  }
  if (!is_fp8(w.dtype) && !is_fp4_packed(w.dtype))
    fail(w, "cannot dequantize dtype " + std::string(dtype_name(w.dtype)));
  if (is_fp8(w.dtype) && !scale) return;  // unscaled fp8 is plain conversion
  if (!scale) fail(w, "packed FP4 (" + std::string(dtype_name(w.dtype)) + ") weight has no scale tensor");
  if (w.shape.size() != 2) fail(w, "quantized weight must be 2-D, got " + shape_str(w.shape));
  if (scale->dtype != DType::F8_E8M0 && scale->dtype != DType::F32 && scale->dtype != DType::BF16)
    fail(w, "scale '" + scale->name + "' has dtype " + std::string(dtype_name(scale->dtype)) +
                " (expected F8_E8M0, F32 or BF16)");
  std::vector<int64_t> want;
  if (is_fp8(w.dtype)) {
    if (block_rows <= 0 || block_cols <= 0) fail(w, "block size must be positive");
    want = {ceil_div(w.shape[0], block_rows), ceil_div(w.shape[1], block_cols)};
  } else {
    want = {w.shape[0], ceil_div(w.shape[1] * 2, kFp4BlockCols)};
  }
  if (scale->shape != want)
    fail(w, "scale '" + scale->name + "' has shape " + shape_str(scale->shape) + ", expected " + shape_str(want) +
                " for weight " + shape_str(w.shape) + " (" + std::string(dtype_name(w.dtype)) + ")");
}

void dequantize_to_f32(const TensorView& w, const TensorView* scale, float* out, size_t out_len, int block_rows,
                       int block_cols, int threads) {
  check_quantized(w, scale, block_rows, block_cols);
  const std::vector<int64_t> shape = logical_shape(w, scale);
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  if (out_len != n) fail(w, "output buffer holds " + std::to_string(out_len) + " floats, need " + std::to_string(n));
  if (n == 0) return;
  const uint8_t* p = w.data;

  if (is_plain_float(w.dtype)) {
    // Treat as [n/cols rows, cols] so that the threading below applies too.
    const int64_t cols = shape.empty() ? 1 : std::max<int64_t>(shape.back(), 1);
    const int64_t rows = static_cast<int64_t>(n) / cols;
    const DType t = w.dtype;
    parallel_rows(rows, cols, threads, [=](int64_t r0, int64_t r1) {
      for (size_t i = static_cast<size_t>(r0 * cols); i < static_cast<size_t>(r1 * cols); ++i) {
        switch (t) {
          case DType::F32: out[i] = load<float>(p, i); break;
          case DType::F16: out[i] = f16_to_f32(load<uint16_t>(p, i)); break;
          case DType::BF16: out[i] = bf16_to_f32(load<uint16_t>(p, i)); break;
          default: out[i] = static_cast<float>(load<double>(p, i)); break;
        }
      }
    });
    return;
  }

  if (is_fp8(w.dtype)) {
    const int64_t rows = w.shape.size() == 2 ? w.shape[0] : 1;
    const int64_t cols = w.shape.size() == 2 ? w.shape[1] : static_cast<int64_t>(n);
    const bool e4m3 = w.dtype == DType::F8_E4M3;
    const int64_t scale_cols = scale ? scale->shape[1] : 0;
    parallel_rows(rows, cols, threads, [=](int64_t r0, int64_t r1) {
      for (int64_t i = r0; i < r1; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          const size_t k = static_cast<size_t>(i * cols + j);
          float v = e4m3 ? e4m3fn_to_f32(p[k]) : e5m2_to_f32(p[k]);
          if (scale) v *= scale_at(*scale, static_cast<size_t>((i / block_rows) * scale_cols + j / block_cols));
          out[k] = v;
        }
    });
    return;
  }

  // Packed FP4: byte (i, k) holds logical columns 2k (low nibble) and 2k+1 (high nibble).
  const int64_t rows = w.shape[0], packed = w.shape[1], cols = packed * 2;
  const int64_t scale_cols = scale->shape[1];
  parallel_rows(rows, cols, threads, [=](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i)
      for (int64_t k = 0; k < packed; ++k) {
        const uint8_t b = p[i * packed + k];
        const int64_t j = 2 * k;
        float* o = out + i * cols + j;
        // j and j+1 share a 32-group because j is even and 32 is even.
        const float s = scale_at(*scale, static_cast<size_t>(i * scale_cols + j / kFp4BlockCols));
        o[0] = e2m1_to_f32(b & 0xf) * s;
        o[1] = e2m1_to_f32(b >> 4) * s;
      }
  });
}

std::vector<float> dequantize_to_f32(const TensorView& w, const TensorView* scale, int block_rows, int block_cols) {
  check_quantized(w, scale, block_rows, block_cols);
  size_t n = 1;
  for (int64_t d : logical_shape(w, scale)) n *= static_cast<size_t>(d);
  std::vector<float> out(n);
  dequantize_to_f32(w, scale, out.data(), out.size(), block_rows, block_cols);
  return out;
}

std::string scale_name_for(const std::string& weight_name) {
  const std::string suffix = ".weight";
  if (weight_name.size() > suffix.size() && weight_name.compare(weight_name.size() - suffix.size(), suffix.size(), suffix) == 0)
    return weight_name.substr(0, weight_name.size() - suffix.size()) + ".scale";
  return weight_name + ".scale";
}

std::vector<float> take_f32(Checkpoint& ck, const std::string& weight_name, std::vector<int64_t>* shape) {
  const TensorView& w = ck.take(weight_name);
  const std::string sn = scale_name_for(weight_name);
  const TensorView* s = ck.has(sn) ? &ck.take(sn) : nullptr;
  if (shape) *shape = logical_shape(w, s);
  return dequantize_to_f32(w, s);
}

}  // namespace deepinfer
