#include "ops/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ops/cuda/cuda_ops.h"
#include "util/error.h"

namespace deepinfer {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("cuda: ") + what + ": " + cudaGetErrorString(e));
}

struct CudaWeight final : Weight {
  float* w = nullptr;  // [N, K] float32, device
  ~CudaWeight() override {
    if (w) cudaFree(w);
  }
};

}  // namespace

struct CudaBackend::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
  // Pinned staging for small uploads (the per-step index arrays). A copy from pageable memory
  // synchronizes the stream first, which drains the GPU at every upload; from pinned memory it is
  // asynchronous. The buffer is a ring of kSegs segments; an event recorded when the ring leaves a
  // segment guards its reuse.
  static constexpr int kSegs = 4;
  static constexpr size_t kSegBytes = 4 << 20;
  char* staging = nullptr;
  cudaEvent_t seg_done[kSegs] = {};
  bool seg_used[kSegs] = {};
  int seg = 0;
  size_t seg_off = 0;
  // Host time spent in each kind of call (DEEPINFER_CUDA_HOST_TIMES=1 prints it at destruction):
  // where a launch- or sync-bound step spends its time, without a profiler.
  enum Cat { kAlloc, kRelease, kUpload, kDownload, kCopy, kOp, kCats };
  bool timing = std::getenv("DEEPINFER_CUDA_HOST_TIMES") != nullptr;
  int64_t calls[kCats] = {};
  double secs[kCats] = {};
};

namespace {
struct HostTimer {
  CudaBackend::Impl* m;
  int cat;
  std::chrono::steady_clock::time_point t0;
  HostTimer(CudaBackend::Impl* m_, int c) : m(m_->timing ? m_ : nullptr), cat(c) {
    if (m) t0 = std::chrono::steady_clock::now();
  }
  ~HostTimer() {
    if (!m) return;
    ++m->calls[cat];
    m->secs[cat] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};
}  // namespace

int CudaBackend::device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

CudaBackend::CudaBackend(int device) : impl_(std::make_unique<Impl>()) {
  if (device_count() <= device) throw Error("--backend cuda: no CUDA device available (no GPU or no driver)");
  impl_->device = device;
  check(cudaSetDevice(device), "cudaSetDevice");
  check(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  // Activations come and go every step through the stream-ordered pool: keep freed memory cached.
  cudaMemPool_t pool;
  check(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool");
  uint64_t keep = UINT64_MAX;
  check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute");
  check(cudaHostAlloc(reinterpret_cast<void**>(&impl_->staging), Impl::kSegs * Impl::kSegBytes, cudaHostAllocDefault),
        "cudaHostAlloc (staging)");
  for (auto& e : impl_->seg_done) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
}

CudaBackend::~CudaBackend() {
  if (impl_->timing) {
    static const char* names[] = {"alloc", "release", "upload", "download (incl. wait)", "copy", "op launches"};
    for (int c = 0; c < Impl::kCats; ++c)
      std::fprintf(stderr, "cuda host time: %-22s %8lld calls %9.3f ms (%.2f us/call)\n", names[c],
                   (long long)impl_->calls[c], 1e3 * impl_->secs[c],
                   impl_->calls[c] ? 1e6 * impl_->secs[c] / impl_->calls[c] : 0.0);
  }
  if (impl_->stream) {
    cudaStreamSynchronize(impl_->stream);
    cudaStreamDestroy(impl_->stream);
  }
  for (auto& e : impl_->seg_done)
    if (e) cudaEventDestroy(e);
  if (impl_->staging) cudaFreeHost(impl_->staging);
}

void* CudaBackend::alloc(int64_t bytes) {
  HostTimer ht_(impl_.get(), Impl::kAlloc);
  if (bytes <= 0) return nullptr;
  void* p = nullptr;
  cudaError_t e = cudaMallocAsync(&p, (size_t)bytes, impl_->stream);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw Error("cuda: out of device memory allocating " + std::to_string(bytes >> 20) + " MiB (" +
                cudaGetErrorString(e) + ")");
  }
  return p;
}
void CudaBackend::release(void* p) {
  HostTimer ht_(impl_.get(), Impl::kRelease);
  if (p) cudaFreeAsync(p, impl_->stream);
}
void CudaBackend::upload(void* dst, const void* src, int64_t bytes) {
  HostTimer ht_(impl_.get(), Impl::kUpload);
  if (bytes <= 0) return;
  Impl& m = *impl_;
  if ((size_t)bytes > Impl::kSegBytes) {  // large (weights): straight from pageable memory
    check(cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyHostToDevice, m.stream), "upload");
    return;
  }
  if (m.seg_off + (size_t)bytes > Impl::kSegBytes) {  // next segment, once its last copies are done
    check(cudaEventRecord(m.seg_done[m.seg], m.stream), "cudaEventRecord");
    m.seg_used[m.seg] = true;
    m.seg = (m.seg + 1) % Impl::kSegs;
    m.seg_off = 0;
    if (m.seg_used[m.seg]) check(cudaEventSynchronize(m.seg_done[m.seg]), "staging reuse");
  }
  char* p = m.staging + (size_t)m.seg * Impl::kSegBytes + m.seg_off;
  std::memcpy(p, src, (size_t)bytes);
  check(cudaMemcpyAsync(dst, p, (size_t)bytes, cudaMemcpyHostToDevice, m.stream), "upload");
  m.seg_off += ((size_t)bytes + 255) / 256 * 256;
}
void CudaBackend::download(void* dst, const void* src, int64_t bytes) {
  HostTimer ht_(impl_.get(), Impl::kDownload);
  if (bytes > 0) check(cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDeviceToHost, impl_->stream), "download");
  check(cudaStreamSynchronize(impl_->stream), "download (a kernel before it failed)");
}
void CudaBackend::copy(void* dst, const void* src, int64_t bytes) {
  HostTimer ht_(impl_.get(), Impl::kCopy);
  if (bytes > 0) check(cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDeviceToDevice, impl_->stream), "copy");
}
int64_t CudaBackend::free_memory() const {
  size_t fr = 0, tot = 0;
  cudaStreamSynchronize(impl_->stream);
  if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) return 0;
  return (int64_t)fr;
}
void CudaBackend::synchronize() { check(cudaStreamSynchronize(impl_->stream), "synchronize"); }

void CudaBackend::fill(float* x, int64_t n, float v) {
  HostTimer ht_(impl_.get(), Impl::kOp); check(cuda::fill_f32(x, n, v, impl_->stream), "fill"); }
void CudaBackend::scale(float* x, int64_t n, float a) {
  HostTimer ht_(impl_.get(), Impl::kOp); check(cuda::scale_f32(x, n, a, impl_->stream), "scale"); }
void CudaBackend::copy_rows(const float* src, int64_t lds, const int32_t* src_rows, float* dst, int64_t ldd,
                            const int32_t* dst_rows, int64_t n, int64_t width) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  check(cuda::copy_rows(src, lds, src_rows, 0, 0, dst, ldd, dst_rows, 0, 0, n, width, impl_->stream), "copy_rows");
}
void CudaBackend::ring_write(const float* src, int64_t lds, int64_t n, int64_t width, int64_t p0, float* ring,
                             int64_t R) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  const int64_t first = n > R ? n - R : 0;
  check(cuda::copy_rows(src + first * lds, lds, nullptr, 0, 0, ring, width, nullptr, p0 + first, R, n - first, width,
                        impl_->stream),
        "ring_write");
}
void CudaBackend::ring_read(const float* ring, int64_t R, int64_t width, int64_t t0, int64_t n, float* dst) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  check(cuda::copy_rows(ring, width, nullptr, t0, R, dst, width, nullptr, 0, 0, n, width, impl_->stream), "ring_read");
}
void CudaBackend::add_rows(const float* src, int64_t n, int64_t width, const float* w, const int32_t* dst_rows,
                           float* dst) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  check(cuda::add_rows(src, n, width, w, dst_rows, dst, impl_->stream), "add_rows");
}

WeightPtr CudaBackend::make_weight(const float* w, int64_t N, int64_t K) {
  auto cw = std::make_unique<CudaWeight>();
  cw->N = N;
  cw->K = K;
  if (N * K > 0) {
    // Weights live for the model's lifetime: plain cudaMalloc, outside the activation pool.
    check(cudaMalloc(&cw->w, sizeof(float) * (size_t)(N * K)), "weight allocation");
    check(cudaMemcpyAsync(cw->w, w, sizeof(float) * (size_t)(N * K), cudaMemcpyHostToDevice, impl_->stream),
          "weight upload");
    check(cudaStreamSynchronize(impl_->stream), "weight upload");
  }
  return cw;
}

void CudaBackend::linear(const float* x, int64_t M, int64_t ldx, const Weight& wt, float* y, int64_t ldy) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  const auto& w = static_cast<const CudaWeight&>(wt);
  check(cuda::gemm_f32(x, M, w.K, ldx, w.w, w.N, y, ldy, impl_->stream), "linear");
}
void CudaBackend::rms_norm(const float* x, int64_t M, int64_t D, int64_t ld, const float* w, float eps, float* y) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  check(cuda::rms_norm(x, M, D, ld, w, eps, y, nullptr, impl_->stream), "rms_norm");
}
void CudaBackend::rope(float* x, int64_t M, int64_t ld, int heads, int head_dim, int rope_dim, const int32_t* pos,
                       const float* inv_freq, bool inverse) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  check(cuda::rope(x, M, ld, heads, head_dim, rope_dim, pos, inv_freq, inverse, impl_->stream), "rope");
}
void CudaBackend::hc_pre(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                         const float* scale, int iters, float hc_eps, float norm_eps, float* u, float* post,
                         float* comb) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  check(cuda::hc_pre(X, M, hc, D, fn, base, scale, iters, hc_eps, norm_eps, u, post, comb, impl_->stream), "hc_pre");
}
void CudaBackend::hc_mix(const float* X, int64_t M, int hc, int64_t D, const float* w, const float* fn,
                         const float* base, const float* scale, int iters, float hc_eps, float norm_eps, float* u,
                         float* pre, float* post, float* comb) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  check(cuda::hc_mix(X, M, hc, D, w, fn, base, scale, iters, hc_eps, norm_eps, u, pre, post, comb, impl_->stream),
        "hc_mix");
}
void CudaBackend::kv_qdq(float* x, int64_t n, KvQdq format) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  check(cuda::kv_qdq(x, n, (int)format, impl_->stream), "kv_qdq");
}
void CudaBackend::engram_gate(float* X, int64_t M, int hc, int64_t D, const float* kv, const float* w, double eps) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  check(cuda::engram_gate(X, M, hc, D, kv, w, eps, impl_->stream), "engram_gate");
}
void CudaBackend::hc_post(const float* X, const float* y, const float* post, const float* comb, int64_t M, int hc,
                          int64_t D, float* out) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  check(cuda::hc_post(X, y, post, comb, M, hc, D, out, impl_->stream), "hc_post");
}
void CudaBackend::hc_head(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                          const float* scale, float hc_eps, float norm_eps, float* u) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  check(cuda::hc_head(X, M, hc, D, fn, base, scale, hc_eps, norm_eps, u, impl_->stream), "hc_head");
}
void CudaBackend::sink_attention(const float* q, int64_t M, int64_t ldq, int H, int d, const float* win,
                                 const int32_t* win_lo, const int32_t* win_hi, const float* ent,
                                 const int32_t* ent_idx, const int64_t* ent_off, const float* sinks, float scale,
                                 float* out, int64_t ldo) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  check(cuda::sink_attention_f32(q, M, ldq, H, d, win, win_lo, win_hi, ent, ent_idx, ent_off, sinks, scale, out, ldo,
                                 impl_->stream),
        "sink_attention");
}
void CudaBackend::indexer_scores(const float* qI, const float* gamma, int64_t M, int hI, int dI, const float* K,
                                 const int32_t* key_rows, int64_t n_keys, const int32_t* n_vis, float qk_scale,
                                 float* score) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  check(cuda::indexer_scores_f32(qI, gamma, M, hI, dI, K, key_rows, n_keys, n_vis, qk_scale, score, impl_->stream),
        "indexer_scores");
}
void CudaBackend::compress_windows(const float* ring_kv, const float* ring_gate, const float* kv, const float* gate,
                                   int64_t ld, int64_t p0, const float* ape, int m, int width, bool overlap,
                                   const int32_t* win_ids, int64_t nw, float* skv, float* sg) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  check(cuda::compress_windows(ring_kv, ring_gate, kv, gate, ld, p0, ape, m, width, overlap, win_ids, nw, skv, sg,
                               impl_->stream),
        "compress_windows");
}
void CudaBackend::compress_pool(const float* kv, const float* gate, int64_t W, int S, int d, float* out) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  check(cuda::compress_pool(kv, gate, W, S, d, out, impl_->stream), "compress_pool");
}
void CudaBackend::swiglu_clamp(const float* gu, int64_t M, int64_t I, float limit, const float* row_scale,
                               float* act) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  check(cuda::swiglu_clamp(gu, M, I, limit, row_scale, act, nullptr, impl_->stream), "swiglu_clamp");
}

}  // namespace deepinfer
