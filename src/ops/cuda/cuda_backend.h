#pragma once
// The op table on one CUDA device (Hopper): weights and activations in device memory, every op a
// kernel launch on the backend's one stream. Activations are float32 between ops; weights are kept as
// stored (bf16 / fp8 / fp4, CudaWeights::Stored) or as float32 (CudaWeights::Float32, the CPU oracle's
// numerics). Errors (launch, out of memory) throw deepinfer::Error.
#include <memory>

#include "ops/backend.h"

namespace deepinfer {

// How the backend keeps a checkpoint's weights. Stored: bf16 / fp8 (128×128 blocks) / fp4 weights stay in
// their stored format and the GEMMs round activations to bf16 (or fp8 for large fp8 GEMMs) — the fast
// path. Float32: every weight dequantized to float32 and float32 GEMMs — reproduces the CPU oracle to
// float32 rounding (parity tests; `--dtype float32`).
enum class CudaWeights { Stored, Float32 };

class CudaBackend final : public Backend {
 public:
  // Takes device `device` (throws Error when there is none).
  explicit CudaBackend(int device = 0, CudaWeights weights = CudaWeights::Stored);
  ~CudaBackend() override;
  const char* name() const override { return "cuda"; }

  // Number of usable CUDA devices (0 when there is no driver or no GPU); never throws.
  static int device_count();

  void* alloc(int64_t bytes) override;
  void release(void* p) override;
  void upload(void* dst, const void* host_src, int64_t bytes) override;
  void download(void* host_dst, const void* src, int64_t bytes) override;
  const void* download_view(const void* src, int64_t bytes) override;
  void stage(int slot, const void* src, int64_t bytes) override;
  const void* staged(int slot) override;
  void copy(void* dst, const void* src, int64_t bytes) override;
  int64_t free_memory() const override;
  void synchronize() override;
  void set_profiling(bool on) override;
  void fork() override;
  void to_main() override;
  void join() override;
  bool chains_side_by_side(int64_t rows) const override;
  // Steps that could not run from a graph (captured and failed, or refused): they run op by op (tests check 0).
  int64_t graph_fallbacks() const;
  bool kernel_trace_start(std::string* why) override;
  void kernel_trace_window(bool open) override;
  std::vector<KernelRecord> take_kernel_trace() override;
  int64_t decode_rows(int64_t B) const override;
  GraphMode graph_begin(uint64_t key) override;
  void graph_end() override;
  void graph_abort(const char* why) override;
  void graph_ready() override;
  void graph_launch(const void* first_upload, int64_t bytes) override;
  void graph_unready() override;
  Profile take_profile() override;

  void fill(float* x, int64_t n, float v) override;
  void scale(float* x, int64_t n, float a) override;
  void copy_rows(const float* src, int64_t lds, const int32_t* src_rows, float* dst, int64_t ldd,
                 const int32_t* dst_rows, int64_t n, int64_t width) override;
  void ring_write(const float* src, int64_t lds, int64_t n, int64_t width, int64_t p0, float* ring,
                  int64_t R) override;
  void ring_read(const float* ring, int64_t R, int64_t width, int64_t t0, int64_t n, float* dst) override;
  void add_rows(const float* src, int64_t n, int64_t width, const float* w, const int32_t* dst_rows,
                float* dst) override;
  void copy_rows_multi(const float* src, int64_t lds, const int32_t* src_rows, const RowCopy* sets, int nsets,
                       int64_t n) override;

  using Backend::make_weight;
  WeightPtr make_weight(const float* w, int64_t N, int64_t K) override;
  bool takes_stored(const StoredWeight& w) const override;
  WeightPtr make_weight(const StoredWeight& w) override;
  void linear(const float* x, int64_t M, int64_t ldx, const Weight& w, float* y, int64_t ldy) override;
  void linear_swiglu(const float* x, int64_t M, int64_t ldx, const Weight& w13, float limit, float* act) override;
  WeightGroupsPtr make_groups(std::vector<WeightPtr> ws) override;
  void linear_groups(const float* x, int64_t M, int64_t ldx, const WeightGroups& w, float* y, int64_t ldy) override;
  ExpertsPtr make_experts(std::vector<WeightPtr> w13, std::vector<WeightPtr> w2) override;
  void moe_route(const float* logits, int64_t T, int E, int K, RouteScoring scoring, const float* bias,
                 const int32_t* tid2eid, const int32_t* tokens, bool normalize, float route_scale, int32_t* sel,
                 float* wsel) override;
  void moe_ffn(const float* h, int64_t T, const Experts& ex, const int32_t* sel, const float* wsel, int K, float limit,
               const float* shared, float* out) override;
  void argmax_rows(const float* x, int64_t M, int64_t N, int64_t ld, int32_t* out) override;
  void sample_rows(float* x, int64_t M, int64_t N, int64_t ld, const SampleSpec* spec, const RowEdits* rows,
                   const LogitEdit* edits, float* edit_raw, const int32_t* tokens, int32_t* out) override;
  void mask_rows(float* x, int64_t M, int64_t N, int64_t ld, const RowEdits* rows, const uint32_t* masks) override;
  void logprob_rows(float* x, int64_t M, int64_t N, int64_t ld, const SampleSpec* spec, const RowEdits* rows,
                    const LogitEdit* edits, const float* edit_raw, const int32_t* picks, RowLogprobs* out) override;
  bool logprobs_on_backend() const override;
  bool masks_on_backend() const override;
  void feed_tokens(int32_t* pack, int64_t T, int hc, const int32_t* feed, const int32_t* picks, int64_t V) override;
  void select_topk(const float* score, int64_t M, int64_t n, const int32_t* n_vis, int topk, const int32_t* rowmap, int64_t rowmap_ld,
                   const int64_t* out_off, int32_t* out) override;
  void rms_norm(const float* x, int64_t M, int64_t D, int64_t ld, const float* w, float eps, float* y) override;
  void rope(float* x, int64_t M, int64_t ld, int heads, int head_dim, int rope_dim, const int32_t* pos,
            const float* inv_freq, bool inverse) override;
  void norm_rope(const NormRope* t, int n, int64_t M, const int32_t* pos, float eps, bool inverse) override;
  void hc_pre(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
              const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps, float* u, float* post,
              float* comb) override;
  void hc_pre_norm(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                   const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps, float* u, float* post,
                   float* comb, const float* w, float eps, float* h) override;
  void hc_mix(const float* X, int64_t M, int hc, int64_t D, const float* w, const float* fn, const float* base,
              const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps, float* u, float* pre,
              float* post, float* comb) override;
  void hc_post(const float* X, const float* y, const float* post, const float* comb, int64_t M, int hc,
               int64_t D, float* out) override;
  void hc_head(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
               const float* scale, float hc_eps, float norm_eps, float* u) override;
  void sink_attention(const float* q, int64_t M, int64_t ldq, int H, int d, const float* win,
                      const int32_t* win_lo, const int32_t* win_hi, const float* ent, const int32_t* ent_idx,
                      const int64_t* ent_off, const float* sinks, float scale, float* out, int64_t ldo) override;
  void indexer_scores(const float* qI, const float* gamma, int64_t M, int hI, int dI, const float* K,
                      const int32_t* key_rows, int64_t key_ld, int64_t n_keys, const int32_t* n_vis, float qk_scale,
                      float* score) override;
  void compress_windows(const float* ring_kv, const float* ring_gate, const float* kv, const float* gate,
                        int64_t ld, int64_t p0, const float* ape, int m, int width, bool overlap,
                        const int32_t* win_ids, const int32_t* ring_rows, int64_t nw, float* skv, float* sg) override;
  void compress_pool(const float* kv, const float* gate, int64_t W, int S, int d, float* out) override;
  void compress_emit(const float* ring_kv, const float* ring_gate, const float* kv, const float* gate, int64_t ld,
                     int64_t p0, const float* ape, int m, int width, bool overlap, const int32_t* win_ids,
                     const int32_t* ring_rows, int64_t nw, const float* norm_w, float eps, int rope_dim,
                     const int32_t* pos, const float* inv_freq, float* dst, const int32_t* dst_rows) override;
  void swiglu_clamp(const float* gu, int64_t M, int64_t I, float limit, const float* row_scale,
                    float* act) override;
  void kv_qdq(float* x, int64_t n, KvQdq format) override;
  void engram_gate(float* X, int64_t M, int hc, int64_t D, const float* kv, const float* w, double eps) override;

  struct Impl;  // opaque (public only so the .cc's helpers can name it)

 private:
  std::unique_ptr<Impl> impl_;
  // moe_ffn with the shared addend in the combine (null: none); after_shared: the shared expert's launches
  // ran after sel and h were written (moe_ffn's contract), so the routed GEMVs may read them early
  void moe_ffn_routed(const float* h, int64_t T, const Experts& ex, const int32_t* sel, const float* wsel, int K,
                      float limit, const float* shared, float* out, bool after_shared = false);
};

}  // namespace deepinfer
