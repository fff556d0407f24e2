#include "model/weight_reader.h"

#include <cstdint>
#include <cstring>

#include "io/checkpoint.h"
#include "io/dequant.h"
#include "util/error.h"
#include "util/numeric.h"

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

namespace {

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bytes of `rows` rows of a stored weight.
int64_t row_bytes(const StoredWeight& w) {
  switch (w.fmt) {
    case WeightFormat::F32: return 4 * w.K;
    case WeightFormat::BF16: return 2 * w.K;
    case WeightFormat::FP8: return w.K;
    case WeightFormat::FP4: return w.K / 2;
  }
  return 0;
}
// Bytes of the scale rows that belong to weight rows [r0, r0 + n) (FP8: whole block rows only).
int64_t scale_row_bytes(const StoredWeight& w) {
  if (w.fmt == WeightFormat::FP8) return 4 * cdiv(w.K, w.block_cols);
  if (w.fmt == WeightFormat::FP4) return w.K / 32;
  return 0;
}

// Rows [r0, r0 + n) of a stored weight, as a view into it (FP8 needs whole scale blocks).
bool row_view(const StoredWeight& w, int64_t r0, int64_t n, StoredWeight* out) {
  if (w.fmt == WeightFormat::FP8 && (r0 % w.block_rows || (n % w.block_rows && r0 + n != w.N))) return false;
  *out = w;
  out->N = n;
  out->data = static_cast<const uint8_t*>(w.data) + r0 * row_bytes(w);
  if (w.scale) {
    const int64_t srow = w.fmt == WeightFormat::FP8 ? r0 / w.block_rows : r0;
    out->scale = static_cast<const uint8_t*>(w.scale) + srow * scale_row_bytes(w);
  }
  return true;
}

}  // namespace

WeightReader::Host WeightReader::host(const std::string& name, int64_t N, int64_t K) {
  Host h;
  const TensorView& t = ck_.take(name);
  const TensorView* sc = nullptr;
  if (name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0) {
    std::string s = name.substr(0, name.size() - 7) + ".scale";
    if (ck_.has(s)) sc = &ck_.take(s);
  }
  const bool fp4 = (t.dtype == DType::I8 || t.dtype == DType::U8) && sc;
  std::vector<int64_t> logical = t.shape;
  if (fp4 && !logical.empty()) logical.back() *= 2;
  if (logical != std::vector<int64_t>{N, K})
    throw Error(ck_.dir() + ": tensor '" + name + "' has shape " + shape_str(logical) + ", expected " +
                shape_str({N, K}));
  check_quantized(t, sc, fp4 ? 1 : block_rows_, fp4 ? 32 : block_cols_);
  StoredWeight& w = h.w;
  w.N = N;
  w.K = K;
  w.data = t.data;
  if (t.dtype == DType::F32 && !sc) w.fmt = WeightFormat::F32;
  else if (t.dtype == DType::BF16 && !sc) w.fmt = WeightFormat::BF16;
  else if (t.dtype == DType::F8_E4M3 && sc) w.fmt = WeightFormat::FP8;
  else if (fp4 && sc->dtype == DType::F8_E8M0 && K % 32 == 0) w.fmt = WeightFormat::FP4;
  else w.data = nullptr;  // another form (F16, E5M2, unscaled FP8, FP4 with float scales): float32
  if (w.fmt == WeightFormat::FP8) {
    w.block_rows = block_rows_;
    w.block_cols = block_cols_;
  }
  const bool aligned = ((uintptr_t)t.data % 16) == 0;  // mmapped views are only as aligned as the file
  if (w.data && w.fmt != WeightFormat::F32 && aligned && be_.takes_stored(w)) {
    if (w.fmt == WeightFormat::FP8) {  // the grid as float32, whatever the checkpoint stores
      const int64_t n = cdiv(N, block_rows_) * cdiv(K, block_cols_);
      h.scale.resize(n);  // check_quantized has checked the grid's shape and dtype
      for (int64_t i = 0; i < n; ++i) {
        if (sc->dtype == DType::F8_E8M0) h.scale[i] = e8m0_to_f32(sc->data[i]);
        else if (sc->dtype == DType::F32) std::memcpy(&h.scale[i], sc->data + 4 * i, 4);
        else {
          uint16_t b;
          std::memcpy(&b, sc->data + 2 * i, 2);
          h.scale[i] = bf16_to_f32(b);
        }
      }
      w.scale = h.scale.data();
    } else if (w.fmt == WeightFormat::FP4) {
      w.scale = sc->data;
    }
    return h;
  }
  h.f32 = dequantize_to_f32(t, sc, fp4 ? 1 : block_rows_, fp4 ? 32 : block_cols_);
  w = StoredWeight{WeightFormat::F32, N, K, h.f32.data(), nullptr, 0, 0};
  return h;
}

WeightPtr WeightReader::mat(const std::string& name, int64_t N, int64_t K) {
  Host h = host(name, N, K);
  return be_.make_weight(h.w);
}

WeightPtr WeightReader::mat_cat(const std::vector<std::string>& names, const std::vector<int64_t>& Ns, int64_t K) {
  if (names.empty() || names.size() != Ns.size()) throw Error("mat_cat: one row count per matrix");
  std::vector<Host> hs;
  int64_t Nt = 0;
  for (size_t i = 0; i < names.size(); ++i) hs.push_back(host(names[i], Ns[i], K)), Nt += Ns[i];
  const StoredWeight& w0 = hs[0].w;
  bool native = w0.fmt != WeightFormat::F32;
  for (const Host& h : hs)
    native = native && h.w.fmt == w0.fmt && (w0.fmt != WeightFormat::FP8 || h.w.N % w0.block_rows == 0);
  if (native) {
    StoredWeight t = w0;
    t.N = Nt;
    native = be_.takes_stored(t);
  }
  if (native) {  // stack the stored bytes, then their scale rows
    Host s;
    int64_t rb = 0, sb = 0;
    for (const Host& h : hs) {
      rb += row_bytes(h.w) * h.w.N;
      if (h.w.scale) sb += (h.w.fmt == WeightFormat::FP8 ? h.w.N / h.w.block_rows : h.w.N) * scale_row_bytes(h.w);
    }
    s.bytes.resize(rb + sb);
    int64_t at = 0, sat = rb;
    for (const Host& h : hs) {
      const int64_t n = row_bytes(h.w) * h.w.N;
      std::memcpy(s.bytes.data() + at, h.w.data, n);
      at += n;
      if (h.w.scale) {
        const int64_t m = (h.w.fmt == WeightFormat::FP8 ? h.w.N / h.w.block_rows : h.w.N) * scale_row_bytes(h.w);
        std::memcpy(s.bytes.data() + sat, h.w.scale, m);
        sat += m;
      }
    }
    s.w = w0;
    s.w.N = Nt;
    s.w.data = s.bytes.data();
    s.w.scale = sb ? s.bytes.data() + rb : nullptr;
    return be_.make_weight(s.w);
  }
  std::vector<float> f;
  for (size_t i = 0; i < names.size(); ++i) {
    auto part = f32(names[i], {Ns[i], K});
    f.insert(f.end(), part.begin(), part.end());
  }
  return be_.make_weight(f.data(), Nt, K);
}

std::vector<WeightPtr> WeightReader::mat_rows(const std::string& name, int64_t G, int64_t N, int64_t K) {
  Host h = host(name, G * N, K);
  if (h.w.fmt == WeightFormat::FP8 && N % h.w.block_rows) {  // groups cut scale blocks: float32
    h.f32 = f32(name, {G * N, K});
    h.w = StoredWeight{WeightFormat::F32, G * N, K, h.f32.data(), nullptr, 0, 0};
  }
  std::vector<WeightPtr> out;
  for (int64_t g = 0; g < G; ++g) {
    StoredWeight v;
    row_view(h.w, g * N, N, &v);
    out.push_back(be_.make_weight(v));
  }
  return out;
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
