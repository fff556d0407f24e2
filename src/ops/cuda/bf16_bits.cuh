#pragma once
// Register-level helpers of the tensor-core kernels that dequantize stored weights into MMA operands
// (gemv_q.cu, gemv_q_v6.cu, moe_grouped.cu, moe_gemv2.cu): one
// definition, so all read a format the same way.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace deepinfer::cuda::detail {

__device__ __forceinline__ uint32_t u4get(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// c += A·B, m16n8k16, bf16 in, f32 accumulate (A: a0..a3, B: b0, b1 in mma.sync's fragment layout).
__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// c += A·B, m16n8k16, f16 in, f32 accumulate (fragment layout as mma16816).
__device__ __forceinline__ void mma16816_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// bf16x2 product, round to nearest.
__device__ __forceinline__ uint32_t bmul2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// Four e4m3 bytes b0..b3 → f16x2 {b0, b1} (lo) and {b2, b3} (hi), exact.
__device__ __forceinline__ void e4m3x4_f16(uint32_t w, uint32_t& lo, uint32_t& hi) {
  asm("{\n.reg .b16 a, b;\nmov.b32 {a, b}, %2;\ncvt.rn.f16x2.e4m3x2 %0, a;\ncvt.rn.f16x2.e4m3x2 %1, b;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low half
  return *reinterpret_cast<const uint32_t*>(&b);
}
// One 16-byte unit of x staged for a GEMV's MMAs (gemv_q_v6, gemv_q_v8): its 8 values (a, b) as bf16.
__device__ __forceinline__ uint4 x8_bf16(const float4& a, const float4& b) {
  return make_uint4(pack_bf16(a.x, a.y), pack_bf16(a.z, a.w), pack_bf16(b.x, b.y), pack_bf16(b.z, b.w));
}
// The same for f16 MMAs: f16(bf16(x) · 2^(14−E)), E the exponent of the largest |x| of the unit's 128-k
// block (held by 16 consecutive lanes, which must all call), so a bf16 value converts to f16 exactly down
// to 2^-31 of the block's max; factor = 2^(E−14) undoes the scaling on the f32 partial sum.
__device__ __forceinline__ uint4 x8_f16_prescaled(const float4& a, const float4& b, float& factor) {
  float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  float mx = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = __bfloat162float(__float2bfloat16_rn(v[j])), mx = fmaxf(mx, fabsf(v[j]));
#pragma unroll
  for (int off = 8; off; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  const int E = max((int)((__float_as_uint(mx) >> 23) & 0xFF) - 127, -110);  // zero / tiny blocks: −110
  const float up = __uint_as_float((uint32_t)(127 + 14 - E) << 23);
  uint32_t h[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const __half2 hv = __floats2half2_rn(v[2 * j] * up, v[2 * j + 1] * up);
    h[j] = *reinterpret_cast<const uint32_t*>(&hv);
  }
  factor = __uint_as_float((uint32_t)(127 - 14 + E) << 23);
  return make_uint4(h[0], h[1], h[2], h[3]);
}
// bf16 bits of 2^e, e ∈ [−126, 127], in both halves.
__device__ __forceinline__ uint32_t pow2_bf16x2(int e) {
  const uint32_t h = (uint32_t)(e + 127) << 7;
  return h | (h << 16);
}
// Four e4m3 bytes b0..b3 → bf16x2 {b0, b1} and {b2, b3}, each value·2^-120 (exact, subnormals included).
__device__ __forceinline__ void e4m3x4_raw(uint32_t w, uint32_t& lo, uint32_t& hi) {
  const uint32_t p = __byte_perm(w, 0u, 0x1404), q = __byte_perm(w, 0u, 0x3424);  // bytes at bits 8, 24
  lo = (p & 0x80008000u) | ((p >> 4) & 0x07F007F0u);
  hi = (q & 0x80008000u) | ((q >> 4) & 0x07F007F0u);
}
// Eight e2m1 nibbles n0..n7 (n0 = low nibble of byte 0) → bf16x2 {n0, n4}, {n1, n5}, {n2, n6}, {n3, n7},
// each value·2^-126: the nibble's bits 0..2 go to bf16 bits 6..8, bit 3 (sign) to bit 15 (one multiply
// places both copies; the mask keeps the wanted bits). moe_grouped stores x in this pair order.
__device__ __forceinline__ void e2m1x8_raw(uint32_t w, uint32_t (&r)[4]) {
  const uint32_t w2 = w >> 8;
  r[0] = ((w & 0x000F000Fu) * 0x1040u) & 0x81C081C0u;
  r[1] = ((w & 0x00F000F0u) * 0x0104u) & 0x81C081C0u;
  r[2] = ((w2 & 0x000F000Fu) * 0x1040u) & 0x81C081C0u;
  r[3] = ((w2 & 0x00F000F0u) * 0x0104u) & 0x81C081C0u;
}

// Eight e2m1 nibbles n0..n7 (n0 = low nibble of byte 0) → e4m3 bytes, each value·2^-6 (exact: the nibble's
// bits 0..2 go to bits 2..4 — e1 e0 m as the exponent's low bits and the mantissa's top bit, e2m1's subnormal
// 0.5 landing on e4m3's subnormal 2^-7 —, its sign to bit 7): lo = {n0, n2, n4, n6}, hi = {n1, n3, n5, n7}.
// (v << 2 or v >> 2) & 0x3c puts a nibble at bits 2..5; adding 3·(bit 5) moves its sign to bit 7.
__device__ __forceinline__ void e2m1x8_e4m3(uint32_t v, uint32_t& lo, uint32_t& hi) {
  const uint32_t a = (v << 2) & 0x3C3C3C3Cu, b = (v >> 2) & 0x3C3C3C3Cu;
  lo = a + 3u * (a & 0x20202020u);
  hi = b + 3u * (b & 0x20202020u);
}

// The fp8 GEMV step (gemv_q). One 16-row tile × one chunk: rows g (w0) and g + 8 (w1), 16 e4m3
// each → 4 MMAs, dequantized by ×c1 (and ×c2 when BIG). B of MMA i: the (i % 2) half of x unit i / 2.
template <bool BIG>
__device__ __forceinline__ void fp8_mma(float (&acc)[4], const uint4& w0, const uint4& w1, const uint4 (&X)[2],
                                        uint32_t c1, uint32_t c2) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t a0, a2, a1, a3;
    e4m3x4_raw(u4get(w0, i), a0, a2);
    e4m3x4_raw(u4get(w1, i), a1, a3);
    a0 = bmul2(a0, c1), a1 = bmul2(a1, c1), a2 = bmul2(a2, c1), a3 = bmul2(a3, c1);
    if (BIG) a0 = bmul2(a0, c2), a1 = bmul2(a1, c2), a2 = bmul2(a2, c2), a3 = bmul2(a3, c2);
    mma16816(acc, a0, a1, a2, a3, u4get(X[i / 2], 2 * (i % 2)), u4get(X[i / 2], 2 * (i % 2) + 1));
  }
}
// The fp4 GEMV step (gemv_q, moe_gemv2). Rows g (w0, scale factors c0·c0b) and g + 8 (w1, c1·c1b), 32 e2m1
// each → 8 MMAs; word i gives MMAs {n0,n4 | n1,n5} and {n2,n6 | n3,n7} with x unit i stored in the same order.
template <bool BIG>
__device__ __forceinline__ void fp4_mma(float (&acc)[4], const uint4& w0, const uint4& w1, const uint4 (&X)[4],
                                        uint32_t c0, uint32_t c1, uint32_t c0b, uint32_t c1b) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t r0[4], r1[4];
    e2m1x8_raw(u4get(w0, i), r0);
    e2m1x8_raw(u4get(w1, i), r1);
#pragma unroll
    for (int j = 0; j < 4; ++j) r0[j] = bmul2(r0[j], c0), r1[j] = bmul2(r1[j], c1);
    if (BIG) {
#pragma unroll
      for (int j = 0; j < 4; ++j) r0[j] = bmul2(r0[j], c0b), r1[j] = bmul2(r1[j], c1b);
    }
    mma16816(acc, r0[0], r1[0], r0[1], r1[1], X[i].x, X[i].y);
    mma16816(acc, r0[2], r1[2], r0[3], r1[3], X[i].z, X[i].w);
  }
}
}  // namespace deepinfer::cuda::detail
