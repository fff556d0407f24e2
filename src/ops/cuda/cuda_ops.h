#pragma once
// CUDA (Hopper, sm_90a) kernels for the DeepSeek-V4 op table. Every launcher takes plain parameters:
// device pointers, sizes, strides and a stream; shapes are written next to each parameter, row-major.
// Launchers return cudaSuccess or the launch error (cudaErrorNotSupported when a shape or a library
// path is not available); they never synchronize.
//
// Storage types on the GPU: activations that feed tensor cores are bf16 (or e4m3 with scales),
// everything that the CPU twin keeps in float32 for numerics (norm statistics, HC mixes, softmax,
// router, accumulators, GEMM outputs) stays float32. Each op computes the formula of its CPU twin
// (src/ops/cpu/cpu_backend.cc or, for ops the model does inline, src/model/deepseek_v4.cc).
//
// Batch invariance: each output row depends only on its own inputs and every kernel's per-row
// reduction order is fixed, but three dispatches pick a kernel by size, so a row's rounding can depend
// on the batch: cuBLASLt (heuristics by M), gemm_dq (GEMV for M ≤ 4) and gemm_grouped (GEMV for
// experts with ≤ 4 rows). docs/cuda-notes.md tracks the fix (one wgmma kernel for every M).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "ops/sampling.h"

#include <cstdint>

namespace deepinfer::cuda {

using bf16 = __nv_bfloat16;

// Sets the function attributes of every kernel that needs more than 48 KiB of dynamic shared memory
// (its maximum, and the carveout where two blocks must share an SM), for the current device. Call it
// once per device before any launch (CudaBackend's constructor does; so does test_cuda_ops): the
// launchers make no attribute calls of their own (host cost on every launch, and no process-global
// "configured" flags), so a launch before it fails with cudaErrorInvalidValue.
cudaError_t init_kernel_attributes();

// ------------------------------------------------------------------------------------------------
// Conversions and quantization
// ------------------------------------------------------------------------------------------------
// y[n] = bf16(x[n]) (round to nearest even).
cudaError_t f32_to_bf16(const float* x, int64_t n, bf16* y, cudaStream_t s);
// y[M, K] (row stride K) = bf16(x[M, K]) with x's row stride ldx.
cudaError_t f32_to_bf16_rows(const float* x, int64_t M, int64_t K, int64_t ldx, bf16* y, cudaStream_t s);
// Row-wise 1×128 activation quantization to e4m3 with power-of-two (ue8m0) scales, as [OFF]:
// sc = 2^ceil(log2(max(amax, 1e-4) / 448)), q = e4m3(clamp(x / sc, ±448)).
// x[M, K] (row stride ldx) → q[M, K] (row stride K, e4m3 bytes), sc_t[ceil(K/128), M] (k-block major:
// sc_t[kb·M + m], the layout cuBLASLt's VEC128 scale mode wants). K % 128 == 0.
cudaError_t quant_act_fp8(const float* x, int64_t M, int64_t K, int64_t ldx, uint8_t* q, float* sc_t,
                          cudaStream_t s);

// ------------------------------------------------------------------------------------------------
// GEMMs: y[M, N] (row stride ldy, float32) = x[M, K] · W[N, K]ᵀ, float32 accumulate
// ------------------------------------------------------------------------------------------------
struct GemmContext;  // cuBLASLt handle + workspace
GemmContext* gemm_context_create();
void gemm_context_destroy(GemmContext*);

// cuBLASLt, bf16 operands. x[M, K] (ldx), w[N, K] (row stride K), y[M, N] f32 (ldy).
// K, ldx, ldy multiples of 8.
cudaError_t gemm_bf16_lt(GemmContext* ctx, const bf16* x, int64_t M, int64_t K, int64_t ldx, const bf16* w,
                         int64_t N, float* y, int64_t ldy, cudaStream_t s);

// cuBLASLt FP8 with DeepSeek block scales (cuBLAS ≥ 12.9 on Hopper): xq[M, K] e4m3 (row stride K),
// xs_t[K/128, M] f32 (from quant_act_fp8), wq[N, K] e4m3, ws[ceil(N/128), ldws] f32 (128×128 block
// scales, ldws = round_up(K/128, 4) as cuBLASLt wants; the loader pads), y[M, N] f32 or bf16 (ldy).
// K % 128 == 0, N % 16 == 0.
cudaError_t gemm_fp8_block_lt(GemmContext* ctx, const uint8_t* xq, const float* xs_t, int64_t M, int64_t K,
                              const uint8_t* wq, const float* ws, int64_t ldws, int64_t N, float* y, int64_t ldy,
                              cudaStream_t s);
// Shapes cuBLASLt has no block-scaled kernel for (M = 1 on CUDA 13.0) fall back, first to its bf16
// output (widened to f32), then to gemm_dq (exact for power-of-two scales). These report whether
// either fallback has been taken on this context.
bool gemm_fp8_lt_used_bf16_out(const GemmContext* ctx);
bool gemm_fp8_lt_used_own_fallback(const GemmContext* ctx);

// Weight storage formats understood by our own dequantize-on-load tensor-core GEMM (mma.sync bf16,
// exact dequantization: e4m3/e2m1 values times power-of-two scales are exact in bf16).
enum class WFmt : int {
  BF16 = 0,      // w[N, K] bf16
  FP8_B128 = 1,  // w[N, K] e4m3, ws[ceil(N/128), ldws] f32 block scales (powers of two for exactness)
  FP4_B32 = 2,   // w[N, K/2] two e2m1 a byte (element 2k = low nibble), ws[N, K/32] e8m0 bytes (uint8)
};
enum class AFmt : int {
  BF16 = 0,      // x[M, K] bf16 (ldx)
  FP8_V128 = 1,  // x[M, K] e4m3 (ldx), xs_t[K/128, M_total] f32 (power-of-two scales, from quant_act_fp8)
};
struct WeightRef {
  WFmt fmt;
  const void* w;      // see WFmt
  const void* scale;  // f32 (FP8_B128) or uint8 e8m0 (FP4_B32); null for BF16
  int64_t ldws;       // FP8_B128: row stride of the scale grid (elements)
};
// Dense: y[M, N] f32 (ldy) = dequant(x)[M, K] · dequant(W)[N, K]ᵀ. K % 64 == 0, N % 8 == 0.
// M ≤ 4 (decode) runs a warp-per-row GEMV (x in shared memory, K ≤ 10240); larger M the tile kernel.
cudaError_t gemm_dq(AFmt afmt, const void* x, const float* xs_t, int64_t M, int64_t K, int64_t ldx, WeightRef W,
                    int64_t N, float* y, int64_t ldy, cudaStream_t s);

// Decode GEMV on tensor cores (gemv_q.cu), f32 activations, weights in their stored format:
// y[M, N] f32 (row stride ldy) = bf16(x)[M, K] · dequant(W)[N, K]ᵀ, f32 accumulate.
// x[M, K] f32 (row stride ldx, ldx % 4 == 0, x 16-byte aligned) is rounded to bf16 (nearest even) as it
// is staged, so the products are those of gemm_dq with a bf16 x; W (16-byte aligned) dequantizes
// exactly: FP8_B128 with power-of-two scales (other scales are rounded to bf16 first), FP4_B32 with any
// e8m0 byte but 255 (NaN). K % 8 (BF16), K % 128 (FP8), K % 32 (FP4), K ≤ 32768; any N.
// v4 (K ≤ 16384, fp4 K % 128 == 0, scale 4-byte aligned): M ≤ 32 is one launch (larger M in launches
// of 32); other shapes run v3 (launches of 8 rows). Batch invariant: each output's summation order
// depends only on (W.fmt, N, K) (and the device's SM count), so row m is bitwise the same for every M
// and every position in the batch.
//
// Launch plan (optional `plan` of every GEMV launcher): the host data of a launch that needs device
// queries (SM count; v4's resident clusters from cudaOccupancyMaxActiveClusters for clusters of ≥ 4),
// made once per weight by gemv_q_plan and kept by the caller next to it. With it a launch does no host
// work but the launch itself; without it (null) the launcher makes the same queries itself on every
// call. The schedule (hence every result bit) is the same either way. A plan made for another
// (fmt, N, K, grouped) is rejected (cudaErrorInvalidValue).
struct GemvPlan {
  WFmt fmt = WFmt::BF16;
  int64_t N = 0, K = 0;
  bool grouped = false;  // for gemv_q_grouped(_v3), else gemv_q(_v3)
  int sms = 0;           // multiprocessors of the device (0: no plan)
  int clusters[6] = {};  // v4, cluster size ≥ 4: resident clusters at 1, 2, 4, 8, 16, 32 padded rows (0: unknown)
  int v6_sched = 1;      // gemv_q_v6's default schedules: 1 = session 8's (> 6 MB with < 1024 tiles: 2 blocks an
                         // SM), 0 = session 6's (DEEPINFER_CUDA_OFF=v6_s8); other bits, both batch invariant
};
// Makes the plan of weight W (only its fmt is read) [N, K] on the current device. Needs
// init_kernel_attributes() first (occupancy depends on the shared-memory attribute).
cudaError_t gemv_q_plan(WeightRef W, int64_t N, int64_t K, bool grouped, GemvPlan* plan);
cudaError_t gemv_q(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float* y, int64_t ldy,
                   cudaStream_t s, const GemvPlan* plan = nullptr);
// gemv_q / gemv_q_v3 with gemv_q_grouped's fused SwiGLU epilogue, for a dense FFN's w13 (the shared
// expert): W [N = 2I, K] = gate rows over up rows, act[M, I] (row stride lda) = swiglu_clamp(y, limit) of
// the unfused y = x·Wᵀ — the same tiles, plan and sums, so bitwise swiglu_clamp of gemv_q's (gemv_q_v3's)
// output. N % 32 == 0, limit > 0 (else cudaErrorInvalidValue); otherwise gemv_q's (gemv_q_v3's) contract.
cudaError_t gemv_q_swiglu(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float limit,
                          float* act, int64_t lda, cudaStream_t s, const GemvPlan* plan = nullptr);
cudaError_t gemv_q_v3_swiglu(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float limit,
                             float* act, int64_t lda, cudaStream_t s, const GemvPlan* plan = nullptr);
// Rows one gemv_q / gemv_q_grouped launch covers for this weight and K: 32 where v4 runs, else 8 (v3).
int gemv_q_rows(WeightRef W, int64_t K);
// GEMV v3 (launches of 8 rows, short-lived blocks), same contract: kept for the op test's side by side.
cudaError_t gemv_q_v3(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float* y,
                      int64_t ldy, cudaStream_t s, const GemvPlan* plan = nullptr);
// GEMV v6 (gemv_q_v6.cu; docs/cuda-notes.md "GEMV v6"): the same product for BF16 and FP8_B128 weights,
// built to stream at HBM rate (fp8 decoded by the hardware e4m3 → f16 conversion, f16 MMA with x
// pre-scaled by a power of two a 128-k block, block scales applied once a 128-k step; a register ring of
// weight loads; K split over warps and cluster ranks so that every SM streams). Contract as gemv_q_v3 but
// K % 128 == 0 and K ≤ 32768 (gemv_q_v6_supported), M any (launches of 8 rows); FP4_B32 and other K:
// cudaErrorNotSupported. x products are bf16(x)·w exactly (f16 holds bf16(x)·2^(14−E) exactly down to
// 2^-31 of a 128-k block's largest |x|). Batch invariant (the schedule depends only on fmt, N, K); bits
// differ from v3. The backend takes it for M ≤ 8 where supported; DEEPINFER_CUDA_OFF=gemv_v6: v3.
// The kernel loads its first weights before griddepcontrol.wait (they stream while the previous kernel of
// a step graph runs). The schedule is chosen per shape (g6_default_tune in gemv_q_v6.cu).
bool gemv_q_v6_supported(WFmt f, int64_t K);
cudaError_t gemv_q_v6(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float* y, int64_t ldy,
                      cudaStream_t s, const GemvPlan* plan = nullptr);
// v6 with the fused SwiGLU of gemv_q_swiglu (W [N = 2I, K] gate rows over up rows, act[M, I] (row stride
// lda) bitwise swiglu_clamp of gemv_q_v6's y): a block's round takes gate tiles and their up tiles in pairs
// (the same K split and sums). Shapes: gemv_q_v6_swiglu_ok (N % 32 == 0 and a schedule with ≥ 2 tiles a
// block), else cudaErrorNotSupported; limit > 0.
bool gemv_q_v6_swiglu_ok(WFmt f, int64_t N, int64_t K);
cudaError_t gemv_q_v6_swiglu(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float limit,
                             float* act, int64_t lda, cudaStream_t s, const GemvPlan* plan = nullptr);
// v6's schedule knobs, for a sweep in the op test's perf mode (the backend uses the per-shape default): K is split
// until tiles · slices ≥ items while every slice keeps ≥ min_steps steps of 128 k (64 for bf16), and
// over up to `ranks` cluster ranks before a block's warps take the rest. Same contract as gemv_q_v6;
// another schedule gives other (equally valid) bits.
struct GemvV6Tune {
  int items = 2048, min_steps = 1, ranks = 4;  // items ≈ 2 blocks × 8 warps × 128 SMs
};
cudaError_t gemv_q_v6_tuned(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float* y,
                            int64_t ldy, cudaStream_t s, const GemvV6Tune& tune);
// Groups of one shape (linear_groups' layout, e.g. wo_a's 8 groups): for g < G,
//   y[m, g·N + n] (row stride ldy) = bf16(x[m, g·K .. g·K + K)) (row stride ldx) · dequant(W_g)[N, K]ᵀ,
// W_g = W.w + g·w_stride bytes, its scales W.scale + g·s_stride bytes (w_stride % 16, s_stride % 4). One
// launch (blockIdx.z = group); the schedule depends on (fmt, N, K, G), so a row's bits do not depend on M
// (batch invariant) but may differ from gemv_q_v6 on W_g alone. Plan: one made with grouped = true.
cudaError_t gemv_q_v6_groups(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t w_stride,
                             int64_t s_stride, int G, int64_t N, float* y, int64_t ldy, cudaStream_t s,
                             const GemvPlan* plan = nullptr);
// GEMV v8 (gemv_q_v8.cu; docs/cuda-notes.md "GEMV v8"): the same product as gemv_q_v6 (bf16(x)·w exact,
// fp8 through f16 MMAs with x pre-scaled a 128-k block) with the weights moved by bulk copies into a
// shared-memory ring of 32 KiB stages (one producer thread, the first stages requested before
// griddepcontrol.wait) and 16 warps computing from it: x as the MMA's A, 8 weight rows as its n8 columns;
// one block an SM over a contiguous range of tile groups. Shapes (gemv_q_v8_supported): BF16 / FP8_B128,
// row bytes % 1024 == 0 (fp8 K % 1024, bf16 K % 512), K ≤ 8192, N % (16·TPS) == 0 with TPS = 4096 /
// min(row bytes, 4096); fp8 scales 16-byte aligned with ldws % 4 == 0 (else cudaErrorInvalidValue). Batch
// invariant for every M (launches of 8 rows; a row's sum depends on K only); bits differ from v6. Opt-in in
// the backend (DEEPINFER_CUDA_ON=gemv_v8: not faster than v6 in the model, s7-run4).
// W must not be written by the kernel launched just before it (weights are read before the wait).
bool gemv_q_v8_supported(WFmt f, int64_t N, int64_t K);
cudaError_t gemv_q_v8(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float* y, int64_t ldy,
                      cudaStream_t s, const GemvPlan* plan = nullptr);
// The same with a given ring depth (stages of 32 KiB; the op test's sweep; the default is 4): same bits.
cudaError_t gemv_q_v8_ring(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float* y,
                           int64_t ldy, cudaStream_t s, int ring);
// Fused SwiGLU (gemv_q_v6_swiglu's contract; bitwise swiglu_clamp of gemv_q_v8's y): N % 32 == 0.
bool gemv_q_v8_swiglu_ok(WFmt f, int64_t N, int64_t K);
cudaError_t gemv_q_v8_swiglu(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t N, float limit,
                             float* act, int64_t lda, cudaStream_t s, const GemvPlan* plan = nullptr);
// Groups (gemv_q_v6_groups' layout and contract; s_stride % 16 == 0): a group's rows have the bits of
// gemv_q_v8 on W_g alone (the sum of an output depends on K only).
cudaError_t gemv_q_v8_groups(const float* x, int64_t M, int64_t K, int64_t ldx, WeightRef W, int64_t w_stride,
                             int64_t s_stride, int G, int64_t N, float* y, int64_t ldy, cudaStream_t s,
                             const GemvPlan* plan = nullptr);
// The backend takes v3 for M ≤ 8: measured faster than v4 there on the H200 (session 3, run 2: routed
// w13 T=1 45.7 vs 56.6 µs, the 6-layer b1 step's linears 1.02 vs 1.38 ms); v4 for 9..32 rows.
// DEEPINFER_CUDA_OFF=gemv_v3 makes it take v4 there too (the comparison inside the model, no rebuild).
cudaError_t gemv_q_grouped_v3(const float* x, int64_t ldx, bool x_per_slot, const int32_t* sel, int64_t T, int topk,
                              int64_t K, WeightRef W, int64_t w_stride, int64_t s_stride, int64_t N, bool swiglu,
                              float limit, float* y, int64_t ldy, cudaStream_t s, const GemvPlan* plan = nullptr);
// Routed experts at decode, routing read on the device (no host sync). For slot j = t·topk + k of
// sel[T, topk] (int32 expert ids, from moe_route), with e = sel[j]:
//   y[j, N] = bf16(x[r]) · dequant(W_e)[N, K]ᵀ, r = x_per_slot ? j : t   (x[*, K] f32, row stride ldx)
// (w13: x_per_slot = false, the token's hidden x[T, K]; w2: true, the slot's activation x[T·topk, K]).
// W_e = W.w + e·w_stride bytes (w_stride % 16 == 0), scales W.scale + e·s_stride bytes (gemm_grouped's
// layout); y[T·topk, N] f32 (row stride ldy). One launch covers every slot; the slots that pick the same
// expert are computed together (≤ min(32, T) at a time on v4, 8 on v3; the weight read once for them).
// swiglu (w13 only): N = 2·I with gu = [gate | up] rows, and y[T·topk, I] (ldy) receives swiglu_clamp's act instead
// (silu(min(g, limit)) · clamp(u, ±limit), the same bits as swiglu_clamp on the f32 gu); N % 32 == 0.
// Each slot's result is bitwise gemv_q of its row alone with W_e (same schedule: depends on fmt, N, K).
cudaError_t gemv_q_grouped(const float* x, int64_t ldx, bool x_per_slot, const int32_t* sel, int64_t T, int topk,
                           int64_t K, WeightRef W, int64_t w_stride, int64_t s_stride, int64_t N, bool swiglu,
                           float limit, float* y, int64_t ldy, cudaStream_t s, const GemvPlan* plan = nullptr);
// gemv_e4m3 (gemv_e4m3.cu; docs/cuda-notes.md "GEMV e4m3"): the decode linear for FP8_B128 weights on e4m3
// tensor cores, x quantized as DeepSeek's inference does before every fp8 GEMM (act_quant: per token and
// 128-k block, e4m3 with a power-of-two scale; quant_act_fp8's numerics):
//   y[m, g·N + n] (row stride ldy) = Σ_kb ws_g(n / 128, kb) · 2^e(m, g, kb) · Σ_{k in kb} W_g[n, k] · q(m, g, k)
// for the G groups of linear_groups' layout (x[m, g·K + k], row stride ldx; W_g = W.w + g·w_stride bytes, its
// scales W.scale + g·s_stride bytes; G = 1: a plain linear). Products exact, sums in f32 (the tensor cores'
// within a 128-k block, then f32 FMAs). swiglu (G = 1, N % 256 == 0): W = gate rows over up rows and
// y[m, n < N/2] = swiglu_clamp(gate, up, limit) of those sums (the same bits as swiglu_clamp of the unfused y).
// The weights go by 2-D tensor copies (a tensor map made once, in the plan) straight into wgmma's A operand.
// Any M (launches of 8 rows). Batch invariant: a row's bits depend on (N, K, G, swiglu, the SM count the plan
// was made for) only. `work`: plan.work_bytes of device memory, 256-byte aligned, zeroed once before the
// first launch (counters that every launch leaves zero; partial sums); launches that share it must be ordered
// (one stream). Shapes (gemv_e4m3_ok): K % 128 == 0, K ≤ 65536, 16-byte aligned W, ldws ≥ K / 128;
// groups: w_stride % 16 == 0, w_stride ≥ N·K, s_stride % 4 == 0.
// A tiled tensor map (cuTensorMapEncodeTiled, looked up through the runtime: no link to the driver library) over
// bytes at `base`: rank 1..5, dims[0] innermost, strides[i] the bytes between steps of dimension i + 1, boxes of
// box[] elements, swizzle 0 / 32 / 64 / 128 bytes, L2 promotion 0 none / 1 128 B / 2 256 B. `out` receives the
// 128-byte CUtensorMap (kernels take it as a __grid_constant__ parameter).
cudaError_t tensor_map_u8(void* out, const void* base, int rank, const uint64_t* dims, const uint64_t* strides,
                          const uint32_t* box, int swizzle, int l2promo);
struct GemvE4m3Plan {
  alignas(64) unsigned char tmap[128] = {};  // CUtensorMap of W: bytes {K, N, G}, boxes 128 × 128 × 1, 128-byte swizzle
  bool fmt_ok = false;                       // a plan made by gemv_e4m3_plan
  const void* w = nullptr;
  const void* scale = nullptr;
  int64_t ldws = 0, N = 0, K = 0, w_stride = 0, s_stride = 0;
  int G = 1;
  bool swiglu = false;
  int sms = 0, sp = 0, P = 0, tiles = 0, tiles_g = 0, ks = 0, ring = 0;  // the schedule (see gemv_e4m3.cu)
  size_t smem = 0, work_bytes = 0;
  int ablate = 0;  // the op test's timing ablations only (gemv_e4m3.cu's GeParams::ablate; the results are wrong)
};
bool gemv_e4m3_ok(WeightRef W, int64_t N, int64_t K, int G, int64_t w_stride, int64_t s_stride, bool swiglu);
// The plan of weight W (kept next to it): the tensor map and the schedule for `sms` multiprocessors (0: the
// current device's); `split` > 0 forces that split of K (a power of two dividing K / 128; the op test's fused /
// unfused comparison and sweeps), else the schedule's own; l2promo: the tensor map's L2 promotion (0 none, 1 128 B,
// 2 or -1 256 B: the default). cudaErrorNotSupported for shapes gemv_e4m3_ok
// refuses (or a split the shared memory cannot take).
cudaError_t gemv_e4m3_plan(WeightRef W, int64_t N, int64_t K, int G, int64_t w_stride, int64_t s_stride, bool swiglu,
                           GemvE4m3Plan* plan, int sms = 0, int split = 0, int l2promo = -1);
cudaError_t gemv_e4m3(const GemvE4m3Plan& plan, const float* x, int64_t M, int64_t ldx, float* y, int64_t ldy,
                      float limit, void* work, cudaStream_t s);
// moe_gemv2 (moe_gemv2.cu; docs/cuda-notes.md "MoE decode GEMV v2"): gemv_q_grouped's contract for fp4
// (FP4_B32) experts, built for the routed experts at decode (T ≤ 8): TMA bulk copies of whole weight rows
// into a shared-memory ring, one block an SM, 32 rows × K a work item. Shapes it takes (moe_gemv2_ok):
// T·topk ≤ 64, N % 32 == 0, K % 512 == 0, 16-byte aligned W, scales and strides; others return
// cudaErrorNotSupported (the caller falls back to gemv_q_grouped). Only plan->sms is read from a plan.
// Batch invariant: a slot's bits depend on (N, K) only, not on the other slots' experts or on T; they
// differ from gemv_q_grouped's in the last bits (other k split). swiglu: the same bits as swiglu_clamp
// applied to this kernel's unfused output.
bool moe_gemv2_ok(WeightRef W, int64_t T, int topk, int64_t N, int64_t K, int64_t w_stride, int64_t s_stride);
cudaError_t moe_gemv2(const float* x, int64_t ldx, bool x_per_slot, const int32_t* sel, int64_t T, int topk, int64_t K,
                      WeightRef W, int64_t w_stride, int64_t s_stride, int64_t N, bool swiglu, float limit, float* y,
                      int64_t ldy, cudaStream_t s, const GemvPlan* plan = nullptr);
// The same kernel with the session-5 loads (a bulk copy a weight row and a scale row, padded rows in shared
// memory; moe_gemv2 moves an item's row blocks in 2–4 copies): the same bits, for the op test's comparison
// and DEEPINFER_CUDA_OFF=moe_blocks.
cudaError_t moe_gemv2_rows(const float* x, int64_t ldx, bool x_per_slot, const int32_t* sel, int64_t T, int topk,
                           int64_t K, WeightRef W, int64_t w_stride, int64_t s_stride, int64_t N, bool swiglu,
                           float limit, float* y, int64_t ldy, cudaStream_t s, const GemvPlan* plan = nullptr);
// moe_gemv2 with work before its PDL wait (the same bits). early = 1: the caller guarantees that sel was
// written ≥ 2 launches before this one (in a graph with programmatic edges the predecessor has then passed
// its own wait): the routing and the first ring stages' weight copies go before the wait. early = 2: x
// too (its staging also before the wait). The model's routed w13 (sel and h precede the shared expert's
// two launches) takes 2, its w2 (x = w13's output) 1. early = 0 is moe_gemv2. wide = false: 32-row work
// items only (moe_gemv2 takes 64 rows where they fit: unfused, K ≤ 2048-ish; the same bits either way).
cudaError_t moe_gemv2_early(const float* x, int64_t ldx, bool x_per_slot, const int32_t* sel, int64_t T, int topk,
                            int64_t K, WeightRef W, int64_t w_stride, int64_t s_stride, int64_t N, bool swiglu,
                            float limit, float* y, int64_t ldy, int early, cudaStream_t s,
                            const GemvPlan* plan = nullptr, bool wide = true);
// moe_gemv2_early on e4m3 tensor cores (the backend's decode experts; DEEPINFER_CUDA_OFF=moe_gemv_fp8: moe_gemv2;
// docs/cuda-notes.md "MoE decode experts on fp8 MMAs"): x quantized per token and 128-k block to e4m3 with a
// power-of-two scale as moe_quant_fp8 does (DeepSeek's activation quantization), the weights' e2m1 → e4m3
// exactly, the e8m0 scale applied per 32-k group in f32: y = Σ_groups 2^e8m0 · s_x · Σ_k e2m1 · q (products
// exact; for e8m0 bytes b and x scales 2^e with 1 ≤ b + e + 6 ≤ 254, i.e. every checkpoint's). moe_gemv2_ok's
// shapes where the ring and B fit (moe_gemv2_fp8_ok: K ≤ 5120 at T ≤ 2, ≤ 4096 beyond); runs of ≤ 4 slots (B
// columns = 2 chunks × 2 or 4 tokens × 4 scale groups: an expert with more slots is read once per 4). Batch
// invariant in the same sense as moe_gemv2 (its own bits).
bool moe_gemv2_fp8_ok(WeightRef W, int64_t T, int topk, int64_t N, int64_t K, int64_t w_stride, int64_t s_stride);
cudaError_t moe_gemv2_fp8(const float* x, int64_t ldx, bool x_per_slot, const int32_t* sel, int64_t T, int topk,
                          int64_t K, WeightRef W, int64_t w_stride, int64_t s_stride, int64_t N, bool swiglu,
                          float limit, float* y, int64_t ldy, int early, cudaStream_t s, const GemvPlan* plan = nullptr,
                          bool wide = true);

// ------------------------------------------------------------------------------------------------
// Norms, RoPE, activations, pooling (float32 in/out like the op table; optional fused bf16 copy)
// ------------------------------------------------------------------------------------------------
// y[M, D] = x / sqrt(mean(x²) + eps) (* w[D] if w); x, y row stride ld; y may equal x.
// y_bf16[M, D] (row stride D), if not null, receives bf16(y) for the next GEMM.
cudaError_t rms_norm(const float* x, int64_t M, int64_t D, int64_t ld, const float* w, float eps, float* y,
                     bf16* y_bf16, cudaStream_t s);
// The kernel rms_norm runs for a shape (one rule for it and for hc_pre_dec's fused norm, which must give the
// same bits): 1-3 the warp-a-row kernel at NC = 2 / 4 / 8 (D ≤ 1024), 4-6 the 256-thread row kernel at NC = 2 / 4 / 8
// (D ≤ 8192, rows and w 16-byte aligned), 0 another kernel.
int rms_norm_kind(int64_t D, int64_t ld, const void* x, const void* y, const void* w);
// smallk: rms_norm keeps each row and its weights in registers (one read, every load before the
// reduction), bitwise the results of the two-pass kernels that rms_norm_v1 runs (DEEPINFER_CUDA_OFF=smallk).
cudaError_t rms_norm_v1(const float* x, int64_t M, int64_t D, int64_t ld, const float* w, float eps, float* y,
                        bf16* y_bf16, cudaStream_t s);
// Interleaved RoPE on the trailing rope_dim channels of each of `heads` vectors of width head_dim:
// x[M, heads, head_dim] (row stride ld), pos[M], inv_freq[rope_dim/2]; inverse rotates by −angle.
cudaError_t rope(float* x, int64_t M, int64_t ld, int heads, int head_dim, int rope_dim, const int32_t* pos,
                 const float* inv_freq, bool inverse, cudaStream_t s);
// Backend::norm_rope (per-head rms_norm, rope, row copies out) of n ≤ kNormRopeMax tensors in one launch,
// bitwise rms_norm + rope + copy_rows. Fields as Backend::NormRope. Supported (else cudaErrorInvalidValue;
// the backend then runs the unfused ops): head_dim % 4 == 0 and ≤ 1024, ld and out_ld multiples of 4,
// x, w and out 16-byte aligned; a gather (x_rows) neither normed nor roped.
constexpr int kNormRopeMax = 4;
struct NormRopeTensor {
  float* x;
  int64_t ld;
  int heads, head_dim;
  const int32_t* x_rows;  // a gather of `rows` rows (norm false, rope_dim 0; x not written)
  int64_t rows;
  bool norm;
  const float* w;
  int rope_dim;
  const float* inv_freq;
  float* out[2];
  int64_t out_ld[2];
  const int32_t* out_rows[2];
};
struct NormRopeArgs {
  NormRopeTensor t[kNormRopeMax];
  int64_t first[kNormRopeMax + 1];  // tensor i's warps (one a head vector) start at first[i]
  int n;
};
bool norm_rope_supported(const NormRopeTensor& t);
cudaError_t norm_rope(const NormRopeTensor* t, int n, int64_t M, const int32_t* pos, float eps, bool inverse,
                      cudaStream_t s);
// act[M, I] = silu(min(g, lim)) · clamp(u, ±lim) (· row_scale[m]); gu[M, 2I] = [g | u].
// act_bf16[M, I] optional bf16 copy (may replace act: act may be null when act_bf16 is set).
cudaError_t swiglu_clamp(const float* gu, int64_t M, int64_t I, float limit, const float* row_scale, float* act,
                         bf16* act_bf16, cudaStream_t s);
// out[W, d] = Σ_s softmax_s(gate[w, s, c]) · kv[w, s, c]; kv/gate[W, S, d]; gate −inf = absent slot.
cudaError_t compress_pool(const float* kv, const float* gate, int64_t W, int S, int d, float* out, cudaStream_t s);
// The previous pooling kernel, a thread a column (DEEPINFER_CUDA_OFF=smallk); compress_pool is bitwise it.
cudaError_t compress_pool_v1(const float* kv, const float* gate, int64_t W, int S, int d, float* out, cudaStream_t s);

// ------------------------------------------------------------------------------------------------
// Manifold-constrained hyper-connections (float32)
// ------------------------------------------------------------------------------------------------
// X[M, hc, D]; fn[(2+hc)·hc, hc·D]; base[(2+hc)·hc]; scale[3] → u[M, D], post[M, hc], comb[M, hc, hc].
// hc ∈ {1, 2, 3, 4, 8}, D % 4 == 0. u[M, D] doubles as the kernels' scratch (per-row partial sums): it
// must not overlap X, fn, base or scale. Two launches (the second with programmatic dependent launch).
// gemm: hc ≤ 4 with M ≥ 1024 takes the prefill path (whole rows a block, fn staged once per 8–32 rows);
// same sums in the same order, so results are bitwise those of the v3 kernels. false: v3 for every M.
cudaError_t hc_pre(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                   const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps, float* u, float* post,
                   float* comb, cudaStream_t s, bool gemm = true);
// hc_pre / hc_head with the previous finish kernel (DEEPINFER_CUDA_OFF=smallk); same results bitwise.
cudaError_t hc_pre_v1(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                      const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps, float* u, float* post,
                      float* comb, cudaStream_t s, bool gemm = true);
cudaError_t hc_head_v1(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                       const float* scale, float hc_eps, float norm_eps, float* u, cudaStream_t s);
// hc_pre's prefill path for any M (tests; falls back like hc_pre where hc > 4 or the shape has no v3).
cudaError_t hc_pre_gemm(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                        const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps, float* u, float* post,
                        float* comb, cudaStream_t s);
// hc_pre prefill path "hcfast" (one fused kernel; items in ticket order, X re-read from L2): bitwise the
// v3 rows. Shapes: hc_pre_fast_ok (hc ≤ 4, v3 slice length 128, hc·D % 128 == 0; V4-Flash and V4 both);
// any M. sync: hc_pre_fast_sync_ints(M) ints of device scratch (zeroed by the launcher). _use: the
// backend's choice (the shape and M ≥ 512). cudaErrorNotSupported for other shapes. nt: threads a block, 256 (a
// thread 2 rows of an A tile, 16 warps an SM) or 128 (4 rows, 8 warps: the session-6 form); the same bits.
bool hc_pre_fast_ok(int hc, int64_t D);
bool hc_pre_fast_use(int64_t M, int hc, int64_t D);
int64_t hc_pre_fast_sync_ints(int64_t M);
cudaError_t hc_pre_fast(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                        const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps, float* u, float* post,
                        float* comb, int32_t* sync, cudaStream_t s, int nt = 256);
// hc_pre decode path "hcdec" (one kernel, M ≤ 8, hc ≤ 4): bitwise the v3 rows. fn, base and scale are read
// before griddepcontrol.wait (constant weights: they must not be written by the kernel before it); X after.
// sync: hc_pre_dec_sync_ints() ints of device scratch, zero before the first launch and left zero by every
// launch (persistent, one per stream: two launches on it must not run at the same time). u is scratch as in
// hc_pre. _use: the shapes it takes (M ≤ 8, v3's slice plan, S ≥ M, fn slice ≤ 4096 floats); else
// cudaErrorNotSupported.
// h (optional, hc_pre_norm): also h[M, D] = rms_norm(u) with weights norm_w (may be null) and epsilon eps, bitwise
// what cuda::rms_norm(u, M, D, D, norm_w, eps, h) gives, in the same launch; _norm_ok: where that is taken (hc ≥ 3,
// D ≤ 8192, u / h / norm_w 16-byte aligned), else cudaErrorNotSupported.
bool hc_pre_dec_use(int64_t M, int hc, int64_t D);
bool hc_pre_dec_norm_ok(int64_t M, int hc, int64_t D, const float* u, const float* norm_w, const float* h);
int64_t hc_pre_dec_sync_ints();
cudaError_t hc_pre_dec(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                       const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps, float* u, float* post,
                       float* comb, int32_t* sync, cudaStream_t s, const float* norm_w = nullptr, float eps = 0.0f,
                       float* h = nullptr);
// out[M, hc, D]: out[m, k] = post[m, k]·y[m] + Σ_j comb[m, j, k]·X[m, j]. y[M, D]. D % 4 == 0.
cudaError_t hc_post(const float* X, const float* y, const float* post, const float* comb, int64_t M, int hc,
                    int64_t D, float* out, cudaStream_t s);
// The previous hc_post kernel (a thread a (row, float4 column), 256-thread blocks; DEEPINFER_CUDA_OFF=hcdec):
// hc_post is bitwise it.
cudaError_t hc_post_v1(const float* X, const float* y, const float* post, const float* comb, int64_t M, int hc,
                       int64_t D, float* out, cudaStream_t s);
// u[M, D] = Σ_j (sigmoid(scale·μ_j + base_j) + eps)·X_j, μ = rms · (fn · vec X); fn[hc, hc·D]. Same scheme and
// constraints as hc_pre.
cudaError_t hc_head(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                    const float* scale, float hc_eps, float norm_eps, float* u, cudaStream_t s);

// ------------------------------------------------------------------------------------------------
// Attention and the lightning indexer
// ------------------------------------------------------------------------------------------------
// Sink attention over a per-query key set (K = V, one shared KV head): rows [win_lo[m], win_hi[m]) of
// win[*, d] and rows ent_idx[ent_off[m] .. ent_off[m+1]) of ent[*, d] (ent_off may be null: none).
// q[M, H, d] bf16 (row stride ldq), win/ent bf16, sinks[H] f32, out[M, H, d] f32 (row stride ldo).
// p = exp(s) / (Σ exp(s) + exp(sink_h)), s = scale·q·k; logits, softmax and P·V in f32.
// d % 256 == 0 (V4: 512), H % 8 == 0. One kernel serves decode (M = batch) and prefill (M = tokens).
cudaError_t sink_attention(const bf16* q, int64_t M, int64_t ldq, int H, int d, const bf16* win,
                           const int32_t* win_lo, const int32_t* win_hi, const bf16* ent, const int32_t* ent_idx,
                           const int64_t* ent_off, const float* sinks, float scale, float* out, int64_t ldo,
                           cudaStream_t s);
// Same op on tensor cores (WMMA, experimental): per query S = Q·Kᵀ and O = P·V over 32-key chunks,
// 32 heads a block, P rounded to bf16 before P·V (as [OFF]). H % 32 == 0, d ∈ {256, 512}.
cudaError_t sink_attention_tc(const bf16* q, int64_t M, int64_t ldq, int H, int d, const bf16* win,
                              const int32_t* win_lo, const int32_t* win_hi, const bf16* ent, const int32_t* ent_idx,
                              const int64_t* ent_off, const float* sinks, float scale, float* out, int64_t ldo,
                              cudaStream_t s);
// score[m, w] = Σ_h γ[m, h]·(ReLU(qI[m, h]·K[key_rows[w]])·qk_scale) for w < n_vis[m], else −inf.
// qI[M, hI, dI] bf16, gamma[M, hI] f32, K: rows of dI bf16, key_rows[n_keys] (null: row w),
// score[M, n_keys] f32. hI % 16 == 0, dI % 16 == 0, hI·dI ≤ 16384.
cudaError_t indexer_scores(const bf16* qI, const float* gamma, int64_t M, int hI, int dI, const bf16* K,
                           const int32_t* key_rows, int64_t n_keys, const int32_t* n_vis, float qk_scale,
                           float* score, cudaStream_t s);
// Per row m: the k = min(topk, n_valid[m]) largest of score[m, 0 .. n_valid[m]) (ties: lower index
// first), written as indices in ascending order to idx[m, 0..k), idx[m, k..topk) = −1, count[m] = k.
// score[M, n] (row stride ld); idx[M, topk] int32; count[M] int32 (may be null).
cudaError_t topk_rows(const float* score, int64_t M, int64_t n, int64_t ld, const int32_t* n_valid, int topk,
                      int32_t* idx, int32_t* count, cudaStream_t s);

// out[out_off[m] + j] = rowmap[m·rowmap_ld + idx[m, j]] for j < count[m] (idx[M, topk], count[M] from
// topk_rows; rowmap_ld = 0: one map for every row).
cudaError_t map_topk(const int32_t* idx, const int32_t* count, int64_t M, int topk, const int32_t* rowmap,
                     int64_t rowmap_ld, const int64_t* out_off, int32_t* out, cudaStream_t s);

// ------------------------------------------------------------------------------------------------
// MoE
// ------------------------------------------------------------------------------------------------
enum class Scoring : int { SqrtSoftplus = 0, Sigmoid = 1, Softmax = 2 };
// Router on f32 logits[T, E] (E ≤ 1024, K ≤ 16): scores by `scoring`; selection = top-K of
// score + bias[E] (ties: lower id; order: best first) or, when tid2eid is set, tid2eid[tokens[t], 0..K)
// (tid2eid[V, K] int32, tokens[T]); weights = score[sel] · route_scale / (Σ + 1e-20) when normalize,
// else score[sel] · route_scale. sel[T, K] int32, wsel[T, K] f32.
cudaError_t moe_route(const float* logits, int64_t T, int E, int K, Scoring scoring, const float* bias,
                      const int32_t* tid2eid, const int32_t* tokens, bool normalize, float route_scale,
                      int32_t* sel, float* wsel, cudaStream_t s);
// The previous router kernel (DEEPINFER_CUDA_OFF=smallk): 32 score registers a lane, shuffle top-k;
// moe_route gives the same selection and weights bitwise.
cudaError_t moe_route_v1(const float* logits, int64_t T, int E, int K, Scoring scoring, const float* bias,
                         const int32_t* tid2eid, const int32_t* tokens, bool normalize, float route_scale,
                         int32_t* sel, float* wsel, cudaStream_t s);
// Groups the T·K routed slots by expert, tokens ascending within an expert (deterministic).
// Outputs (device): offsets[E+1]; perm_tok[T·K] (token of each grouped row); slot_row[T·K] (grouped
// row of slot t·K+k); tiles: tile_info[max_tiles] int2 {expert, first grouped row}, n_tiles[1]
// with tile height `tile_m` (64 for gemm_grouped). max_tiles = moe_max_tiles(T·K, E, tile_m).
int64_t moe_max_tiles(int64_t slots, int E, int tile_m);
cudaError_t moe_group(const int32_t* sel, int64_t T, int K, int E, int tile_m, int32_t* offsets, int32_t* perm_tok,
                      int32_t* slot_row, int2* tile_info, int32_t* n_tiles, cudaStream_t s);
// Grouped GEMM over the experts: for each grouped row r of expert e,
// y[r, N] = dequant(x[row(r), K]) · dequant(W_e)[N, K]ᵀ with row(r) = gather ? gather[r] : r.
// W_e = W.w + e·w_stride (bytes), scales W.scale + e·s_stride (bytes). x bf16 [*, K] (ldx).
// Tiles from moe_group (tile_m = 64). K % 64 == 0, N % 8 == 0. y[T·K, N] f32 (row stride ldy).
cudaError_t gemm_grouped(const bf16* x, int64_t ldx, const int32_t* gather, int64_t K, WeightRef W,
                         int64_t w_stride, int64_t s_stride, int64_t N, const int2* tile_info, const int32_t* n_tiles,
                         int64_t max_tiles, const int32_t* offsets, float* y, int64_t ldy, cudaStream_t s);
// out[t, D] = Σ_k (experts ascending) wsel[t, k]·ye[slot_row[t·K+k], D] (+ shared[t, D] if not null);
// slot_row null: ye row t·K+k (ye in slot order, as gemv_q_grouped writes it).
cudaError_t moe_combine(const float* ye, const int32_t* sel, const float* wsel, const int32_t* slot_row, int64_t T,
                        int K, int64_t D, const float* shared, float* out, cudaStream_t s);
// The previous combine kernel, one block a token (DEEPINFER_CUDA_OFF=smallk); moe_combine is bitwise it.
cudaError_t moe_combine_v1(const float* ye, const int32_t* sel, const float* wsel, const int32_t* slot_row, int64_t T,
                           int K, int64_t D, const float* shared, float* out, cudaStream_t s);

// ------------------------------------------------------------------------------------------------
// float32 kernels for any shape (f32_ops.cu): the CUDA backend's model path (CudaBackend) keeps
// weights and activations in float32 so that the GPU reproduces the CPU oracle to f32 rounding.
// Every output element is a sequential fma chain in a fixed order (batch invariant).
// ------------------------------------------------------------------------------------------------
// y[M, N] (ldy) = x[M, K] (ldx) · W[N, K]ᵀ (W row stride K).
cudaError_t gemm_f32(const float* x, int64_t M, int64_t K, int64_t ldx, const float* w, int64_t N, float* y,
                     int64_t ldy, cudaStream_t s);
// The Backend::sink_attention contract in f32 (any H, 1 ≤ d ≤ 1024), flash-decoding (v2): a cluster of
// 8 blocks per (query, group of 16 heads) splits the query's keys in tiles of 32 (16 for d > 512) by
// contiguous tile ranges that depend only on that query's key count; each block reads a key tile once
// into shared memory for all 16 heads; the 8 partial (max, sum, out) are merged in rank order through
// distributed shared memory. No workspace. Batch invariant: a (query, head) result depends only on its
// own q, keys, sink, d and scale. Keys may be any f32 rows (16-byte aligned rows take the vector path).
cudaError_t sink_attention_f32(const float* q, int64_t M, int64_t ldq, int H, int d, const float* win,
                               const int32_t* win_lo, const int32_t* win_hi, const float* ent, const int32_t* ent_idx,
                               const int64_t* ent_off, const float* sinks, float scale, float* out, int64_t ldo,
                               cudaStream_t s);
// The Backend::sink_attention contract on tensor cores (attention_mma.cu): q, keys and out f32; keys
// (and q, once) rounded to bf16 on the way into shared memory, S = Q·Kᵀ and O = P·V on mma.sync bf16 with
// f32 accumulation, online softmax in f32 with the sink, P rounded to bf16 for P·V. Per (query, group of
// 64 heads) up to 4 key splits (they depend only on the query's key count: batch invariant), merged in a
// fixed order through distributed shared memory; no workspace. d ∈ {64, 128, 256, 512}, any H (heads
// padded to 64 a group), win/ent 16-byte aligned; otherwise cudaErrorNotSupported (the caller falls back
// to sink_attention_f32). v2 (sink_attention_mma): a cluster of 4 CTAs of 512 threads (one per split,
// both halves of d in the CTA). v1 (sink_attention_mma_v1, DEEPINFER_CUDA_OFF=attn_mma2): a cluster of
// 8 CTAs of 256 (split × half of d, partial S exchanged every 32-key tile). v1 and v2 give the same bits.
bool sink_attention_mma_supported(int H, int d, const float* win, const float* ent);
// Clusters of sink_attention_mma (version 2), _v1 (version 1) or _v3 (version 3, d = 512) that fit the device at once
// (diagnostics: v2 ~SMs/4, v1 ~2·SMs/8); −1 on error.
int sink_attention_mma_max_clusters(int d, int version = 2);
cudaError_t sink_attention_mma(const float* q, int64_t M, int64_t ldq, int H, int d, const float* win,
                               const int32_t* win_lo, const int32_t* win_hi, const float* ent, const int32_t* ent_idx,
                               const int64_t* ent_off, const float* sinks, float scale, float* out, int64_t ldo,
                               cudaStream_t s);
cudaError_t sink_attention_mma_v1(const float* q, int64_t M, int64_t ldq, int H, int d, const float* win,
                                  const int32_t* win_lo, const int32_t* win_hi, const float* ent,
                                  const int32_t* ent_idx, const int64_t* ent_off, const float* sinks, float scale,
                                  float* out, int64_t ldo, cudaStream_t s);
// v3 (prefill, d = 512 only, else cudaErrorNotSupported): v2's grid, splits and merge, and so its bits, with
// the tile's S and P·V on warpgroup MMAs (two warpgroups = the two halves of d) and the softmax in registers.
cudaError_t sink_attention_mma_v3(const float* q, int64_t M, int64_t ldq, int H, int d, const float* win,
                                  const int32_t* win_lo, const int32_t* win_hi, const float* ent,
                                  const int32_t* ent_idx, const int64_t* ent_off, const float* sinks, float scale,
                                  float* out, int64_t ldo, cudaStream_t s);
// v3 with q loaded once a cluster (each CTA a quarter of the heads, stored into all four by distributed shared
// memory): the same bits (session 15, branch attn_qshare).
cudaError_t sink_attention_mma_v3q(const float* q, int64_t M, int64_t ldq, int H, int d, const float* win,
                                   const int32_t* win_lo, const int32_t* win_hi, const float* ent,
                                   const int32_t* ent_idx, const int64_t* ent_off, const float* sinks, float scale,
                                   float* out, int64_t ldo, cudaStream_t s);
// attdec (attention_mma.cu): sink_attention_mma's arithmetic (same bits: same splits, bf16 roundings, MMA
// operands and k-order, softmax and merge order) on 8× its CTAs, for decode: a cluster of 8 per (query, group
// of 16 heads) = v2's 4 key splits × 2 halves of d, 256 threads, each staging all tiles of its split at once
// (up to 5 tiles a chunk) and running S, the softmax's max/sum and P·V of the chunk's tiles together (only
// the O and l chains stay tile by tile). Because the bits equal sink_attention_mma's, a caller may choose
// between the two by M. Same shapes as sink_attention_mma (cudaErrorNotSupported otherwise).
cudaError_t sink_attention_dec(const float* q, int64_t M, int64_t ldq, int H, int d, const float* win,
                               const int32_t* win_lo, const int32_t* win_hi, const float* ent, const int32_t* ent_idx,
                               const int64_t* ent_off, const float* sinks, float scale, float* out, int64_t ldo,
                               cudaStream_t s);
// The same with 2 tiles a chunk at d = 512 (87.9 KB of shared memory: two CTAs an SM, a 640-key split in 3
// chunks; other d: sink_attention_dec). Same bits; for the perf comparison only.
cudaError_t sink_attention_dec_narrow(const float* q, int64_t M, int64_t ldq, int H, int d, const float* win,
                                      const int32_t* win_lo, const int32_t* win_hi, const float* ent,
                                      const int32_t* ent_idx, const int64_t* ent_off, const float* sinks, float scale,
                                      float* out, int64_t ldo, cudaStream_t s);
// Clusters of sink_attention_dec (narrow: _narrow) that fit the device at once (diagnostics: ~2 a GPC at d = 512,
// ~4 narrow); −1 on error.
int sink_attention_dec_max_clusters(int d, bool narrow = false);
// The largest M for which CudaBackend::sink_attention takes sink_attention_dec (above: sink_attention_mma).
// (s7-run3, 640 keys, graph with programmatic edges: attdec 12.8 / 13.4 / 39.6 / 68 us at M = 1 / 2 / 8 / 16
// against v2 31.8 / 32.0 / 32.1 / 33.1: attdec only up to M = 4)
constexpr int64_t kAttDecMaxM = 4;
// v1 (kept for comparison in test_cuda_ops --perf): one block per (query, head), d ≤ 1024.
cudaError_t sink_attention_f32_v1(const float* q, int64_t M, int64_t ldq, int H, int d, const float* win,
                                  const int32_t* win_lo, const int32_t* win_hi, const float* ent,
                                  const int32_t* ent_idx, const int64_t* ent_off, const float* sinks, float scale,
                                  float* out, int64_t ldo, cudaStream_t s);
// The Backend::indexer_scores contract in f32 (any hI, dI): a warp per (query, key); key_ld as there.
cudaError_t indexer_scores_f32(const float* qI, const float* gamma, int64_t M, int hI, int dI, const float* K,
                               const int32_t* key_rows, int64_t key_ld, int64_t n_keys, const int32_t* n_vis, float qk_scale,
                               float* score, cudaStream_t s);
// The Backend::indexer_scores contract on tensor cores (indexer_mma.cu): q and K are rounded to bf16
// (round to nearest even) inside, products accumulate in f32 (mma.sync m16n8k16), the γ-weighted ReLU
// head sum and qk_scale in f32. score[m, w] = qk_scale · Σ_h γ[m, h]·ReLU(bf16(qI[m, h])·bf16(K[key_rows[w]]))
// for w < n_vis[m], else −inf. Batch invariant: a score's bits depend only on its query's q, γ and
// the key (not on M, the tile or the path). hI % 16 == 0, dI % 16 == 0, qI and K 16-byte aligned, the
// shared-memory tile (4 queries' q + two 128-key tiles, bf16) within the device limit (hI = 64, dI = 128:
// 137 KB); otherwise cudaErrorNotSupported without a launch. workspace: indexer_mma_workspace bytes
// (the keys converted once to bf16 when M > 8; 0 bytes, may be null, for M ≤ 8, where the kernel
// converts the keys it reads). Ties near the top-k boundary may resolve differently than in f32.
// key_ld > 0: per-query key lists (query m's key w is K[key_rows[m·key_ld + w]], key_ld ≥ n_keys, a
// decode step's layout), at any M, keys converted in the kernel (no workspace; a tile holds 128 keys of
// each of 4 queries: 205 KB of shared memory at hI = 64, dI = 128); the same bits as a shared list.
size_t indexer_mma_workspace(int64_t M, int64_t n_keys, int dI, int64_t key_ld = 0);
cudaError_t indexer_scores_mma(const float* qI, const float* gamma, int64_t M, int hI, int dI, const float* K,
                               const int32_t* key_rows, int64_t key_ld, int64_t n_keys, const int32_t* n_vis,
                               float qk_scale, float* score, void* workspace, cudaStream_t s);
// Row movement (Backend::copy_rows / ring_write / ring_read / add_rows / compress_windows contracts).
// Row i of src is src_row(i) = (src_rows ? src_rows[i] : s0 + i) mod sR (sR = 0: no modulus), dst likewise.
cudaError_t copy_rows(const float* src, int64_t lds, const int32_t* src_rows, int64_t s0, int64_t sR, float* dst,
                      int64_t ldd, const int32_t* dst_rows, int64_t d0, int64_t dR, int64_t n, int64_t width,
                      cudaStream_t s);
cudaError_t add_rows(const float* src, int64_t n, int64_t width, const float* w, const int32_t* dst_rows, float* dst,
                     cudaStream_t s);
// Backend::copy_rows_multi: for k < nsets (1..4) and i < n, dst_k[dr·ldd_k + c] = src[sr·lds + col_k + c]
// (c < width_k; sr = src_rows ? src_rows[i] : i, dr = dst_rows_k ? dst_rows_k[i] : i, dr < 0 skipped), one
// launch. The sets' destinations must not overlap each other or src.
struct RowCopySet {
  int64_t col;  // first source column
  float* dst;
  int64_t ldd;
  const int32_t* dst_rows;
  int64_t width;
};
cudaError_t copy_rows_multi(const float* src, int64_t lds, const int32_t* src_rows, const RowCopySet* sets, int nsets,
                            int64_t n, cudaStream_t s);
cudaError_t fill_f32(float* x, int64_t n, float v, cudaStream_t s);
cudaError_t scale_f32(float* x, int64_t n, float a, cudaStream_t s);
cudaError_t compress_windows(const float* ring_kv, const float* ring_gate, const float* kv, const float* gate,
                             int64_t ld, int64_t p0, const float* ape, int m, int width, bool overlap,
                             const int32_t* win_ids, const int32_t* ring_rows, int64_t nw, float* skv, float* sg, cudaStream_t s);
// Backend::compress_emit in one kernel (compress_emit.cu): for window i < nw (compress_windows' arguments),
// pool its S slots (softmax over the gates + ape, compress_pool), RMS-normalize the row (norm_w [width],
// eps), rotate its trailing rope_dim channels by position pos[i] (inv_freq [rope_dim / 2]) and write it to
// dst row dst_rows[i] (row stride width; < 0: the window is skipped, nothing computed). A block a window,
// a thread a column; the same expressions as the five unfused kernels. width % 4 == 0, width ≤ 1024, dst
// and norm_w 16-byte aligned, rope_dim even ≤ width; otherwise cudaErrorNotSupported (no launch).
cudaError_t compress_emit(const float* ring_kv, const float* ring_gate, const float* kv, const float* gate, int64_t ld,
                          int64_t p0, const float* ape, int m, int width, bool overlap, const int32_t* win_ids,
                          const int32_t* ring_rows, int64_t nw, const float* norm_w, float eps, int rope_dim,
                          const int32_t* pos, const float* inv_freq, float* dst, const int32_t* dst_rows,
                          cudaStream_t s);

// ------------------------------------------------------------------------------------------------
// DeepSeek-V4.1 (v41_ops.cu; float32, any shape; the Backend contracts of the same names)
// ------------------------------------------------------------------------------------------------
// Single-pass mHC: u[M, D] = Σ_j w[m, j]·X[m, j] and, when fn is not null, this site's pre[M, hc],
// post[M, hc], comb[M, hc, hc] as hc_pre computes them. X[M, hc, D]; hc ≤ 16; pre may alias w.
cudaError_t hc_mix(const float* X, int64_t M, int hc, int64_t D, const float* w, const float* fn, const float* base,
                   const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps, float* u, float* pre,
                   float* post, float* comb, cudaStream_t s);
// KV QAT simulation in place on x[n] (format = (int)deepinfer::KvQdq: 0 FP8 pow2 ×32, 1 FP4 pow2 ×32,
// 2 FP4 E4M3-scaled ×16); bitwise the CPU's result.
cudaError_t kv_qdq(float* x, int64_t n, int format, cudaStream_t s);
// Engram gate in place on X[M, hc, D] with kv[M, hc + 1, D] and w[hc, D]; double reductions.
cudaError_t engram_gate(float* X, int64_t M, int hc, int64_t D, const float* kv, const float* w, double eps,
                        cudaStream_t s);

// ------------------------------------------------------------------------------------------------
// Sampling
// ------------------------------------------------------------------------------------------------
// out[m] = lowest id of the largest value of row m of x[M, N] (stride ld); −1: all −inf; −2: a NaN or +inf
// in the row (Backend::argmax_rows). A cluster of 1 … 16 blocks a row (as sample_rows).
cudaError_t argmax_rows(const float* x, int64_t M, int64_t N, int64_t ld, int32_t* out, cudaStream_t s);
// Backend::sample_rows: out[m] = sample_row(row m of x[M, N], spec[m]) (ops/sampling.h) bit for bit (−1 / −2
// as argmax_rows). spec[M] in device memory. A cluster of 1 … 16 blocks of 512 threads a row (16 for M ≤ SMs / 16:
// a small batch's rows spread over the SMs); the token does not depend on it.
// rows / edits / edit_raw: the rows' logit processors, applied to x in place first, the values before into
// edit_raw (Backend::sample_rows; null: none).
// tokens: the step's token ids for rows with a pending token (RowEdits::pend; may be null when none has).
cudaError_t sample_rows(float* x, int64_t M, int64_t N, int64_t ld, const SampleSpec* spec, const RowEdits* rows,
                        const LogitEdit* edits, float* edit_raw, const int32_t* tokens, int32_t* out,
                        cudaStream_t s);
// Backend::mask_rows: rows with rows[m].mask = k ≥ 0 get x[i] = −inf where bit i of masks + k·mask_words(N) is
// clear (NaN / +inf kept). A grid of (row, 8192-token span) blocks.
cudaError_t mask_rows(float* x, int64_t M, int64_t N, int64_t ld, const RowEdits* rows, const uint32_t* masks,
                      cudaStream_t s);
// Backend::logprob_rows: the rows with spec[m].logprobs ≥ 0 get their edits put back (rows / edits / edit_raw as
// sample_rows took them; null: none), then out[m] = row_logprobs(row m, picks[m], spec[m].logprobs) bit for bit.
// One block a row for the restore, then sample_rows' clusters.
cudaError_t logprob_rows(float* x, int64_t M, int64_t N, int64_t ld, const SampleSpec* spec, const RowEdits* rows,
                         const LogitEdit* edits, const float* edit_raw, const int32_t* picks, RowLogprobs* out,
                         cudaStream_t s);
// Backend::feed_tokens (a step's token ids from the previous step's picks). One block.
cudaError_t feed_tokens(int32_t* pack, int64_t T, int hc, const int32_t* feed, const int32_t* picks, int64_t V,
                        cudaStream_t s);

}  // namespace deepinfer::cuda
