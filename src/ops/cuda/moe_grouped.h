#pragma once
// Routed experts for T > 8 tokens (moe_grouped.cu): a parallel deterministic grouping and the grouped
// expert GEMM that reads each expert's weights once per row tile in their stored format. Same conventions
// as cuda_ops.h (device pointers, row-major, launchers never synchronize). Kept in its own header so that
// adding it does not rebuild every kernel that includes cuda_ops.h; it may move there.
#include "ops/cuda/cuda_ops.h"

namespace deepinfer::cuda {

// Grouping of the T·K routed slots of sel[T, K] (expert ids in [0, E), E ≤ 1024) by expert, in parallel
// (count per 256-slot chunk → scan → place), with the outputs of moe_group, bitwise: offsets[E+1];
// perm_tok[T·K] (token of each grouped row); slot_row[T·K] (grouped row of slot t·K+k); an expert's rows
// are its slots in ascending slot (token) order; tile_info[max_tiles] int2 {expert, first grouped row}
// (experts ascending, tile_m rows a tile, max_tiles = moe_max_tiles(T·K, E, tile_m)), n_tiles[1].
// scratch: moe_group_scratch_ints(T·K, E) int32 of device memory (contents not needed afterwards).
int64_t moe_group_scratch_ints(int64_t slots, int E);
cudaError_t moe_group_par(const int32_t* sel, int64_t T, int K, int E, int tile_m, int32_t* offsets,
                          int32_t* perm_tok, int32_t* slot_row, int2* tile_info, int32_t* n_tiles, int32_t* scratch,
                          cudaStream_t s);

// The tile height (rows of one expert a work item) moe_expert_gemm wants for T tokens: 8 (T ≤ 8), 16
// (T ≤ 16), 32 (T ≤ 256: decode, 2 blocks an SM), 64 (prefill). Any tile_m ∈ {8, 16, 32, 64} works (and 128
// for fp4 weights: the wgmma kernel); an
// expert's rows beyond it take more tiles (its weights are then read once per tile, mostly from L2).
int moe_grouped_tile_m(int64_t T);
// The same with the prefill wgmma kernel allowed (wide: both expert matrices fp4 and the path not switched
// off, DEEPINFER_CUDA_OFF=moe_wgmma): 128 for T ≥ 2048 (measured faster only there). tile_m = 128 takes FP4_B32 weights only; a row's
// result is bitwise that of the other tile heights (same products, same k order, same MMA grouping). (CudaBackend
// runs its 128-row tiles on moe_expert_gemm_fp8 below unless DEEPINFER_CUDA_OFF=moe_fp8: fp8 numerics there.)
int moe_grouped_tile_m(int64_t T, bool wide);
// Shapes moe_expert_gemm takes: K % 64 (bf16), % 128 (fp8), % 256 (fp4); N % 256 (swiglu: I = N/2 % 128).
bool moe_expert_gemm_ok(WFmt f, int64_t N, int64_t K, bool swiglu);

// x[M, K] f32 (row stride ldx) → bf16 [M, K] (row stride K), round to nearest even. order 0: natural;
// 1 (pair order): each group of 8 k stored as k0 k4 k1 k5 k2 k6 k3 k7 (the order moe_expert_gemm wants for
// fp4 weights), K % 8 == 0; 2 (wg order, the x of the tile-128 wgmma kernels): pair order, then inside each 64-k chunk
// position p = 16t + 4i + 2h + l moved to 16i + 8h + 2t + l (t, i < 4; h, l < 2), K % 64 == 0.
cudaError_t moe_x_to_bf16(const float* x, int64_t M, int64_t K, int64_t ldx, int order, bf16* y, cudaStream_t s);

// Grouped expert GEMM over the tiles of moe_group_par (same tile_m): for grouped row r of expert e,
//   z[r, N] = bf16 x[row(r), K] · dequant(W_e)[N, K]ᵀ, f32 accumulate, row(r) = gather ? gather[r] : r,
// W_e = W.w + e·w_stride bytes (w_stride % 16 == 0), scales W.scale + e·s_stride bytes (fp4: 8-byte
// aligned); x[*, K] bf16 (ldx % 8 == 0, 16-byte aligned), for FP4_B32 weights in pair order (each 8 k
// stored k0 k4 k1 k5 k2 k6 k3 k7: moe_x_to_bf16 with order 1, or a previous swiglu launch with
// act_order 1) — with tile_m = 128 (the wgmma kernel) in wg order (order 2) —, for BF16 / FP8 in natural order.
// swiglu = false: y is f32 [rows, N] (row stride ldy) = z.
// swiglu = true (w13, N = 2I with gu = [gate | up] rows): y is bf16 [rows, I] (row stride ldy) =
//   bf16(silu(min(g, limit)) · clamp(u, ±limit)), the formula (and f32 bits before the rounding) of
//   swiglu_clamp on z; act_order: act's columns in natural (0), pair (1: the next GEMM has fp4 weights) or
//   wg order (2: the next GEMM has tile_m = 128).
// Each (tile, 256 weight rows) reads its weight slice once from memory; a row's result does not depend on
// the other rows (batch invariant for a fixed fmt, N, K).
cudaError_t moe_expert_gemm(const bf16* x, int64_t ldx, const int32_t* gather, int64_t K, WeightRef W,
                            int64_t w_stride, int64_t s_stride, int64_t N, bool swiglu, float limit,
                            int act_order, const int2* tile_info, const int32_t* n_tiles, int64_t max_tiles,
                            const int32_t* offsets, int tile_m, void* y, int64_t ldy, cudaStream_t s);

// ---- Prefill experts on fp8 MMAs (moe_fp8.cu; fp4 weights, tiles of 128 rows from moe_group_par) ----
// The stored position of k inside its 128-k block in the x order of moe_expert_gemm_fp8: k = 32t + 8j + 4h + i
// → 32j + 16h + 4t + i (t, j < 4; h < 2; i < 4).
inline int moe_fp8_pos(int k128) {
  return 32 * ((k128 >> 3) & 3) + 16 * ((k128 >> 2) & 1) + 4 * (k128 >> 5) + (k128 & 3);
}
// x[M, K] (f32 or bf16, row stride ldx, 16-byte aligned rows) → e4m3 q[M, K] (row stride K, each 128-k block
// in moe_fp8_pos order) and f32 scales sc[M, K / 128], DeepSeek's activation quantization: per 128-k block
// s = 2^ceil(log2(max(amax, 1e-4) / 448)) (amax/448 an f32 division), q = e4m3(x / s) round to nearest even,
// saturating. K % 128 == 0.
cudaError_t moe_quant_fp8(const float* x, int64_t M, int64_t K, int64_t ldx, uint8_t* q, float* sc, cudaStream_t s);
cudaError_t moe_quant_fp8_bf16(const bf16* x, int64_t M, int64_t K, int64_t ldx, uint8_t* q, float* sc,
                               cudaStream_t s);
// Shapes moe_expert_gemm_fp8 takes: FP4_B32 weights, K % 128 == 0, N % 256 == 0 (swiglu: I % 128 == 0).
bool moe_expert_fp8_ok(WFmt f, int64_t N, int64_t K, bool swiglu);
// Grouped expert GEMM on e4m3 tensor cores over the tile_m = 128 tiles of moe_group_par: for grouped row r of
// expert e, z[r, n] = Σ_blocks b of 128 k  sx[row(r), b] · Σ_{k in b} q[row(r), k] · W_e[n, k] (W_e's e2m1 ×
// e8m0 values, exact; f32 sums, the block's promotion as in moe_fp8.cu), row(r) = gather ? gather[r] : r;
// xq / xs from moe_quant_fp8 (row stride K / K/128). swiglu = false: y f32 [rows, N] (row stride ldy) = z;
// swiglu = true (N = 2I, gate | up): y bf16 [rows, I] natural order = bf16(swiglu_clamp_one(g, u, limit)).
// A row's result does not depend on the other rows. kernel: 0 = the register-A kernel (decode on the MMA warps) on
// a grid of (256-row block, tile), 1 = the warp-specialized kernel (decode-producer warpgroups; slower, session 14),
// 2 = the register-A kernel on a persistent grid (the backend's default; items claimed by `counter`: 2 ints, zero
// before the first launch and left zero by every launch; one launch at a time a counter): all three the same bits.
cudaError_t moe_expert_gemm_fp8(const uint8_t* xq, const float* xs, const int32_t* gather, int64_t K, WeightRef W,
                                int64_t w_stride, int64_t s_stride, int64_t N, bool swiglu, float limit,
                                const int2* tile_info, const int32_t* n_tiles, int64_t max_tiles,
                                const int32_t* offsets, void* y, int64_t ldy, cudaStream_t s, int kernel = 0,
                                int* counter = nullptr);

}  // namespace deepinfer::cuda
