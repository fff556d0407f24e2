// Scalar format conversions and weight dequantization, against hand-computed values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "io/dequant.h"
#include "io_test_util.h"
#include "util/numeric.h"

namespace deepinfer {
namespace {

const std::string kFile = "test.safetensors";

// A TensorView over bytes owned by the test.
struct Owned {
  std::vector<uint8_t> bytes;
  TensorView v;
};
template <typename T>
Owned make(const std::string& name, DType dt, std::vector<int64_t> shape, const std::vector<T>& values) {
  Owned o;
  o.bytes.resize(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(o.bytes.data(), values.data(), o.bytes.size());
  o.v.name = name;
  o.v.dtype = dt;
  o.v.shape = std::move(shape);
  o.v.data = o.bytes.data();
  o.v.nbytes = o.bytes.size();
  o.v.file = &kFile;
  return o;
}

TEST(Numeric, Bf16) {
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(bf16_to_f32(0x4049), 3.140625f);
  EXPECT_TRUE(std::isinf(bf16_to_f32(0x7f80)));
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(3.14159265f), 0x4049);
  // Ties round to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> 1.
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3f82);  // 1 + 3*2^-8 -> up to 1 + 2^-6
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(Numeric, F16) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x03ff), 1023 * std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x3555), 0.333251953125f);
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
  EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)));
}

TEST(Numeric, E4m3fn) {
  EXPECT_EQ(e4m3fn_to_f32(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(e4m3fn_to_f32(0x80)));
  EXPECT_EQ(e4m3fn_to_f32(0x38), 1.0f);     // exp 7, man 0
  EXPECT_EQ(e4m3fn_to_f32(0x3c), 1.5f);     // exp 7, man 4
  EXPECT_EQ(e4m3fn_to_f32(0x40), 2.0f);
  EXPECT_EQ(e4m3fn_to_f32(0xb8), -1.0f);
  EXPECT_EQ(e4m3fn_to_f32(0x7e), 448.0f);   // max finite: exp 15, man 6
  EXPECT_EQ(e4m3fn_to_f32(0xfe), -448.0f);
  EXPECT_EQ(e4m3fn_to_f32(0x78), 256.0f);   // exp 15, man 0 is finite in the fn variant
  EXPECT_EQ(e4m3fn_to_f32(0x08), 0.015625f);  // smallest normal 2^-6
  EXPECT_EQ(e4m3fn_to_f32(0x01), 0.001953125f);  // smallest subnormal 2^-9
  EXPECT_EQ(e4m3fn_to_f32(0x07), 7 * 0.001953125f);
  EXPECT_TRUE(std::isnan(e4m3fn_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3fn_to_f32(0xff)));
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) != 0x7f) {
      EXPECT_LE(std::fabs(e4m3fn_to_f32(uint8_t(b))), 448.0f);
    }
  }
}

TEST(Numeric, E5m2) {
  EXPECT_EQ(e5m2_to_f32(0x3c), 1.0f);
  EXPECT_EQ(e5m2_to_f32(0xc0), -2.0f);
  EXPECT_EQ(e5m2_to_f32(0x7b), 57344.0f);
  EXPECT_TRUE(std::isinf(e5m2_to_f32(0x7c)));
  EXPECT_TRUE(std::isnan(e5m2_to_f32(0x7d)));
}

TEST(Numeric, E8m0) {
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(128), 2.0f);
  EXPECT_EQ(e8m0_to_f32(126), 0.5f);
  EXPECT_EQ(e8m0_to_f32(117), 1.0f / 1024);
  EXPECT_EQ(e8m0_to_f32(254), std::ldexp(1.0f, 127));
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(e8m0_to_f32(1), std::ldexp(1.0f, -126));
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
}

TEST(Numeric, E2m1) {
  const float want[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(e2m1_to_f32(uint8_t(i)), want[i]) << i;
  EXPECT_TRUE(std::signbit(e2m1_to_f32(8)));
}

TEST(Numeric, CheckedArithmetic) {
  uint64_t r;
  EXPECT_TRUE(checked_mul(1ull << 31, 1ull << 32, &r));
  EXPECT_EQ(r, 1ull << 63);
  EXPECT_FALSE(checked_mul(1ull << 32, 1ull << 32, &r));
  EXPECT_FALSE(checked_add(~0ull, 1, &r));
}

TEST(Dequant, PlainFloats) {
  auto f32 = make<float>("a", DType::F32, {2, 2}, {1, -2, 3.5f, 0});
  EXPECT_EQ(dequantize_to_f32(f32.v, nullptr), (std::vector<float>{1, -2, 3.5f, 0}));
  auto bf = make<uint16_t>("b", DType::BF16, {3}, {0x3f80, 0xc000, 0x4049});
  EXPECT_EQ(dequantize_to_f32(bf.v, nullptr), (std::vector<float>{1, -2, 3.140625f}));
  auto h = make<uint16_t>("h", DType::F16, {1, 3}, {0x3c00, 0xc000, 0x3555});
  EXPECT_EQ(dequantize_to_f32(h.v, nullptr), (std::vector<float>{1, -2, 0.333251953125f}));
  auto d = make<double>("d", DType::F64, {2}, {0.25, -1e10});
  EXPECT_EQ(dequantize_to_f32(d.v, nullptr), (std::vector<float>{0.25f, -1e10f}));
  auto scalar = make<float>("s", DType::F32, {}, {7});
  EXPECT_EQ(dequantize_to_f32(scalar.v, nullptr), (std::vector<float>{7}));
  auto empty = make<float>("e", DType::F32, {0, 4}, {});
  EXPECT_TRUE(dequantize_to_f32(empty.v, nullptr).empty());
}

TEST(Dequant, PlainFloatWithScaleIsAnError) {
  auto w = make<float>("layers.0.attn.wq_a.weight", DType::F32, {2}, {1, 2});
  auto s = make<float>("layers.0.attn.wq_a.scale", DType::F32, {1, 1}, {1});
  testing::expect_error([&] { dequantize_to_f32(w.v, &s.v); },
                        {"test.safetensors", "'layers.0.attn.wq_a.weight'", "layers.0.attn.wq_a.scale"});
}

TEST(Dequant, UnsupportedDtype) {
  auto w = make<int64_t>("layers.0.ffn.gate.tid2eid", DType::I64, {2}, {1, 2});
  testing::expect_error([&] { dequantize_to_f32(w.v, nullptr); }, {"'layers.0.ffn.gate.tid2eid'", "I64"});
}

// w [3, 5] in e4m3 with 2x2 blocks -> scale grid [2, 3].
//   w = [[1, 2, -1, 1.5, 448], [0, 1, 1, 1, 1], [2, 2, 2, 2, 2]]
//   S = [[1, 2, 4], [0.5, 8, 16]]
const std::vector<uint8_t> kFp8W = {0x38, 0x40, 0xb8, 0x3c, 0x7e, 0x00, 0x38, 0x38,
                                    0x38, 0x38, 0x40, 0x40, 0x40, 0x40, 0x40};
const std::vector<float> kFp8Want = {1, 2, -2, 3, 1792, 0, 1, 2, 2, 4, 1, 1, 16, 16, 32};

TEST(Dequant, Fp8WithF32Scales) {
  auto w = make<uint8_t>("w.weight", DType::F8_E4M3, {3, 5}, kFp8W);
  auto s = make<float>("w.scale", DType::F32, {2, 3}, {1, 2, 4, 0.5f, 8, 16});
  EXPECT_EQ(dequantize_to_f32(w.v, &s.v, 2, 2), kFp8Want);
}

TEST(Dequant, Fp8WithE8m0Scales) {
  auto w = make<uint8_t>("w.weight", DType::F8_E4M3, {3, 5}, kFp8W);
  auto s = make<uint8_t>("w.scale", DType::F8_E8M0, {2, 3}, {127, 128, 129, 126, 130, 131});
  EXPECT_EQ(dequantize_to_f32(w.v, &s.v, 2, 2), kFp8Want);
}

TEST(Dequant, Fp8WithBf16Scales) {
  auto w = make<uint8_t>("w.weight", DType::F8_E4M3, {3, 5}, kFp8W);
  auto s = make<uint16_t>("w.scale", DType::BF16, {2, 3}, {0x3f80, 0x4000, 0x4080, 0x3f00, 0x4100, 0x4180});
  EXPECT_EQ(dequantize_to_f32(w.v, &s.v, 2, 2), kFp8Want);
}

TEST(Dequant, Fp8NanAndUnscaled) {
  auto w = make<uint8_t>("w.weight", DType::F8_E4M3, {1, 3}, {0x7f, 0x38, 0xff});
  auto out = dequantize_to_f32(w.v, nullptr);
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_EQ(out[1], 1.0f);
  EXPECT_TRUE(std::isnan(out[2]));
  auto s = make<uint8_t>("w.scale", DType::F8_E8M0, {1, 1}, {255});  // NaN scale byte
  EXPECT_TRUE(std::isnan(dequantize_to_f32(w.v, &s.v)[1]));
}

TEST(Dequant, Fp8DefaultBlocksOnNonMultipleOf128Shape) {
  // [130, 200] all 1.0 -> grid [ceil(130/128), ceil(200/128)] = [2, 2].
  const int64_t R = 130, C = 200;
  auto w = make<uint8_t>("x.weight", DType::F8_E4M3, {R, C}, std::vector<uint8_t>(R * C, 0x38));
  auto s = make<uint8_t>("x.scale", DType::F8_E8M0, {2, 2}, {127, 128, 129, 130});  // 1, 2, 4, 8
  auto out = dequantize_to_f32(w.v, &s.v);
  ASSERT_EQ(out.size(), size_t(R * C));
  EXPECT_EQ(out[0 * C + 0], 1);
  EXPECT_EQ(out[127 * C + 127], 1);
  EXPECT_EQ(out[0 * C + 128], 2);
  EXPECT_EQ(out[127 * C + 199], 2);
  EXPECT_EQ(out[128 * C + 0], 4);
  EXPECT_EQ(out[129 * C + 127], 4);
  EXPECT_EQ(out[128 * C + 128], 8);
  EXPECT_EQ(out[129 * C + 199], 8);
}

TEST(Dequant, Fp8ScaleShapeMismatchNamesTensor) {
  auto w = make<uint8_t>("layers.3.attn.wkv.weight", DType::F8_E4M3, {130, 200}, std::vector<uint8_t>(130 * 200));
  auto s = make<uint8_t>("layers.3.attn.wkv.scale", DType::F8_E8M0, {1, 2}, {127, 127});
  testing::expect_error([&] { dequantize_to_f32(w.v, &s.v); },
                        {"test.safetensors", "'layers.3.attn.wkv.weight'", "[1, 2]", "expected [2, 2]"});
  auto bad_dtype = make<int32_t>("layers.3.attn.wkv.scale", DType::I32, {2, 2}, {1, 1, 1, 1});
  testing::expect_error([&] { dequantize_to_f32(w.v, &bad_dtype.v); }, {"'layers.3.attn.wkv.weight'", "I32"});
  auto w3 = make<uint8_t>("w3d", DType::F8_E4M3, {1, 1, 1}, {0x38});
  auto s1 = make<uint8_t>("s", DType::F8_E8M0, {1, 1}, {127});
  testing::expect_error([&] { dequantize_to_f32(w3.v, &s1.v); }, {"'w3d'", "2-D"});
}

TEST(Dequant, Fp8ThreadsDoNotChangeResult) {
  const int64_t R = 300, C = 1000;
  std::vector<uint8_t> bytes(R * C);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t((i * 2654435761u) >> 13) & 0xfe;  // never NaN
  auto w = make<uint8_t>("w", DType::F8_E4M3, {R, C}, bytes);
  std::vector<uint8_t> sb(3 * 8);
  for (size_t i = 0; i < sb.size(); ++i) sb[i] = uint8_t(120 + i % 14);
  auto s = make<uint8_t>("s", DType::F8_E8M0, {3, 8}, sb);
  std::vector<float> a(R * C), b(R * C);
  dequantize_to_f32(w.v, &s.v, a.data(), a.size(), 128, 128, 1);
  dequantize_to_f32(w.v, &s.v, b.data(), b.size(), 128, 128, 7);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  std::vector<float> small(3);
  testing::expect_error([&] { dequantize_to_f32(w.v, &s.v, small.data(), small.size()); }, {"'w'", "output buffer"});
}

// Packed FP4 [2, 20] -> logical [2, 40], scale [2, 2] (groups: columns 0..31, 32..39).
//   row 0: byte0 0x21 -> e0 = nib 1 = 0.5, e1 = nib 2 = 1; byte1 0xF7 -> e2 = 6, e3 = -6;
//          byte16 0x9A -> e32 = nib 0xA = -1, e33 = nib 9 = -0.5; scales (1, 4)
//   row 1: byte0 0x6C -> e0 = -2, e1 = 4; byte19 0x35 -> e38 = 3, e39 = 1.5; scales (2, 0.25)
std::vector<uint8_t> fp4_bytes() {
  std::vector<uint8_t> b(2 * 20, 0);
  b[0] = 0x21;
  b[1] = 0xF7;
  b[16] = 0x9A;
  b[20 + 0] = 0x6C;
  b[20 + 19] = 0x35;
  return b;
}
void check_fp4(const std::vector<float>& out) {
  ASSERT_EQ(out.size(), 80u);
  std::vector<float> want(80, 0.0f);
  want[0] = 0.5f, want[1] = 1, want[2] = 6, want[3] = -6, want[32] = -4, want[33] = -2;
  want[40 + 0] = -4, want[40 + 1] = 8, want[40 + 38] = 0.75f, want[40 + 39] = 0.375f;
  EXPECT_EQ(out, want);
}

TEST(Dequant, Fp4WithE8m0Scales) {
  auto w = make<uint8_t>("layers.0.ffn.experts.0.w1.weight", DType::I8, {2, 20}, fp4_bytes());
  auto s = make<uint8_t>("layers.0.ffn.experts.0.w1.scale", DType::F8_E8M0, {2, 2}, {127, 129, 128, 125});
  EXPECT_EQ(logical_shape(w.v, &s.v), (std::vector<int64_t>{2, 40}));
  check_fp4(dequantize_to_f32(w.v, &s.v));
  w.v.dtype = DType::U8;  // same bytes stored as U8
  check_fp4(dequantize_to_f32(w.v, &s.v));
}

TEST(Dequant, Fp4WithF32Scales) {
  auto w = make<uint8_t>("e.weight", DType::I8, {2, 20}, fp4_bytes());
  auto s = make<float>("e.scale", DType::F32, {2, 2}, {1, 4, 2, 0.25f});
  check_fp4(dequantize_to_f32(w.v, &s.v));
}

TEST(Dequant, Fp4NonMultipleOf32) {
  // [1, 3] packed -> 6 logical columns, one (partial) group.
  auto w = make<uint8_t>("e.weight", DType::I8, {1, 3}, {0x10, 0x32, 0x54});
  auto s = make<uint8_t>("e.scale", DType::F8_E8M0, {1, 1}, {128});
  EXPECT_EQ(dequantize_to_f32(w.v, &s.v), (std::vector<float>{0, 1, 2, 3, 4, 6}));
}

TEST(Dequant, Fp4Errors) {
  auto w = make<uint8_t>("layers.1.ffn.experts.2.w2.weight", DType::I8, {2, 20}, fp4_bytes());
  testing::expect_error([&] { dequantize_to_f32(w.v, nullptr); }, {"'layers.1.ffn.experts.2.w2.weight'", "no scale"});
  auto s = make<uint8_t>("layers.1.ffn.experts.2.w2.scale", DType::F8_E8M0, {2, 1}, {127, 127});
  testing::expect_error([&] { dequantize_to_f32(w.v, &s.v); },
                        {"'layers.1.ffn.experts.2.w2.weight'", "[2, 1]", "expected [2, 2]"});
}

TEST(Dequant, ScaleNameFor) {
  EXPECT_EQ(scale_name_for("layers.0.attn.wq_a.weight"), "layers.0.attn.wq_a.scale");
  EXPECT_EQ(scale_name_for("foo"), "foo.scale");
}

}  // namespace
}  // namespace deepinfer
