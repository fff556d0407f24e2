#pragma once
// CPU implementation of the op table: OpenBLAS for GEMMs, plain loops (threaded over rows) for the
// rest. It is the reference every other backend is tested against.
#include <memory>

#include "ops/backend.h"
#include "util/thread_pool.h"

namespace deepinfer {

enum class CpuGemm {
  Deterministic,  // own fixed-order kernel (ops/cpu/gemm.h): batch-invariant, the default
  OpenBLAS,       // OpenBLAS sgemm: fast, but a row's result depends on the batch size
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads = 0, CpuGemm gemm = CpuGemm::Deterministic);
  const char* name() const override { return "cpu"; }
  ThreadPool& pool() { return pool_; }
  // Tests: answer chains_side_by_side() with `on`, so that a model orders its ops for side chains (fork and join
  // still run them one after another here: the results must not change).
  void set_side_chain_order(bool on) { side_chain_order_ = on; }
  bool chains_side_by_side(int64_t) const override { return side_chain_order_; }

  // Memory is host memory: upload/download/copy are memcpy.
  void* alloc(int64_t bytes) override;
  void release(void* p) override;
  void upload(void* dst, const void* host_src, int64_t bytes) override;
  void download(void* host_dst, const void* src, int64_t bytes) override;
  void copy(void* dst, const void* src, int64_t bytes) override;
  void fill(float* x, int64_t n, float v) override;
  void scale(float* x, int64_t n, float a) override;
  void copy_rows(const float* src, int64_t lds, const int32_t* src_rows, float* dst, int64_t ldd,
                 const int32_t* dst_rows, int64_t n, int64_t width) override;
  void ring_write(const float* src, int64_t lds, int64_t n, int64_t width, int64_t p0, float* ring,
                  int64_t R) override;
  void ring_read(const float* ring, int64_t R, int64_t width, int64_t t0, int64_t n, float* dst) override;
  void add_rows(const float* src, int64_t n, int64_t width, const float* w, const int32_t* dst_rows,
                float* dst) override;
  void compress_windows(const float* ring_kv, const float* ring_gate, const float* kv, const float* gate,
                        int64_t ld, int64_t p0, const float* ape, int m, int width, bool overlap,
                        const int32_t* win_ids, const int32_t* ring_rows, int64_t nw, float* skv, float* sg) override;

  using Backend::make_weight;
  WeightPtr make_weight(const float* w, int64_t N, int64_t K) override;
  void linear(const float* x, int64_t M, int64_t ldx, const Weight& w, float* y, int64_t ldy) override;
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
  void feed_tokens(int32_t* pack, int64_t T, int hc, const int32_t* feed, const int32_t* picks, int64_t V) override;
  void select_topk(const float* score, int64_t M, int64_t n, const int32_t* n_vis, int topk, const int32_t* rowmap, int64_t rowmap_ld,
                   const int64_t* out_off, int32_t* out) override;
  void rms_norm(const float* x, int64_t M, int64_t D, int64_t ld, const float* w, float eps, float* y) override;
  void rope(float* x, int64_t M, int64_t ld, int heads, int head_dim, int rope_dim, const int32_t* pos,
            const float* inv_freq, bool inverse) override;
  void hc_pre(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
              const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps, float* u, float* post,
              float* comb) override;
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
  void compress_pool(const float* kv, const float* gate, int64_t W, int S, int d, float* out) override;
  void swiglu_clamp(const float* gu, int64_t M, int64_t I, float limit, const float* row_scale,
                    float* act) override;
  void kv_qdq(float* x, int64_t n, KvQdq format) override;
  void engram_gate(float* X, int64_t M, int hc, int64_t D, const float* kv, const float* w, double eps) override;

 private:
  ThreadPool pool_;
  CpuGemm gemm_;
  bool side_chain_order_ = false;
};

}  // namespace deepinfer
