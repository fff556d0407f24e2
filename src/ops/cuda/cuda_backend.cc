#include "ops/cuda/cuda_backend.h"

#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/graph_edges.h"
#include "ops/cuda/kernel_trace.h"
#include "ops/cuda/moe_grouped.h"
#include "ops/expert_loop.h"
#include "util/error.h"

namespace deepinfer {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("cuda: ") + what + ": " + cudaGetErrorString(e));
}

int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

struct CudaWeight final : Weight {
  WeightFormat fmt = WeightFormat::F32;
  void* w = nullptr;      // device: float / bf16 / e4m3 [N, K], or e2m1 pairs [N, K/2]
  void* scale = nullptr;  // FP8: float [ceil(N/128), ldws]; FP4: e8m0 bytes [N, K/32]
  int64_t ldws = 0;       // FP8: round_up(ceil(K/128), 4), the padded grid cuBLASLt wants (gemm_dq takes it too)
  bool owned = true;      // false: a view into a packed allocation (WeightGroups)
  cuda::GemvPlan gemv;    // gemv_q's launch plan (device queries made once, here, not per launch)
  // gemv_e4m3's plans (FP8: the weight's tensor map and schedule; unfused and with the fused SwiGLU), made at load;
  // fmt_ok false where it does not take the weight
  cuda::GemvE4m3Plan e4m3, e4m3_swiglu;
  ~CudaWeight() override {
    if (!owned) return;
    if (w) cudaFree(w);
    if (scale) cudaFree(scale);
  }
  cuda::WeightRef ref() const {
    const cuda::WFmt f = fmt == WeightFormat::BF16 ? cuda::WFmt::BF16
                         : fmt == WeightFormat::FP8 ? cuda::WFmt::FP8_B128
                                                    : cuda::WFmt::FP4_B32;
    return cuda::WeightRef{f, w, scale, ldws};
  }
};

}  // namespace

struct CudaBackend::Impl {
  std::unique_ptr<cuda::KernelTracer> tracer;  // kernel_trace_start
  int device = 0;
  CudaWeights weights = CudaWeights::Stored;
  cudaStream_t stream = nullptr;
  // Backend::fork / to_main / join: `branch` 1 while ops go to the side chain, 2 back on the main chain (0: none);
  // hold_arena keeps freed arena blocks taken until join (captured or replayed alike, so that a replay allocates as
  // its capture did). In a capture the side chain is `side`,
  // forked from and joined to `main_stream` by events; its last nodes (`full_out`) keep full edges out of them.
  int branch = 0;
  bool hold_arena = false, side_active = false;
  cudaStream_t side = nullptr, main_stream = nullptr;
  cudaEvent_t ev_fork = nullptr, ev_join = nullptr;
  std::unordered_set<cudaGraphNode_t> full_out;
  // Side chains run in step graphs with DEEPINFER_CUDA_ON=branches, except while profiling (its event pairs assume
  // one stream) and where gemv_e4m3 has plans (its workspace is one for every weight: one stream must order it).
  bool chains() const { return graph != GraphMode::Off && on("branches") && !profiling && !e4m3_work; }
  int32_t* hc_sync = nullptr;  // hcdec's arrival counter / generation (zeroed once; every launch leaves it zero)
  int32_t* moe_ctr = nullptr;  // the persistent fp8 expert kernel's item counter (2 ints in hc_sync's allocation,
                               // zeroed with it; every launch leaves it zero)
  // gemv_e4m3's workspace (split-K counters, zeroed once and left zero by every launch, and partial sums): one
  // fixed buffer for every fp8 weight (one stream orders its users), allocated with the first plan; a plan that
  // would need more is dropped (that weight keeps gemv_q_v6), so the address never changes under a graph.
  static constexpr size_t kE4m3Work = 8ull << 20;
  void* e4m3_work = nullptr;
  cuda::GemmContext* gemm = nullptr;  // cuBLASLt handle and workspace (large bf16 / fp8 GEMMs)
  // Step-scoped buffers come and go dozens of times a layer, nearly always last-in first-out: a bump
  // arena serves them without an API call (one stream orders every reuse after the earlier work).
  // Buffers above kArenaMax, and any that do not fit, go to the stream-ordered pool.
  static constexpr size_t kArenaBytes = 512ull << 20, kArenaMax = 64ull << 20;
  char* arena = nullptr;
  size_t arena_top = 0;
  struct Block {
    size_t off, size;
    bool freed;
  };
  std::vector<Block> blocks;  // the arena's live blocks, in address order
  // Pops the freed blocks at the top of the arena (release; join, for what release held back).
  void pop_freed() {
    while (!blocks.empty() && blocks.back().freed) {
      arena_top = blocks.back().off;
      blocks.pop_back();
    }
  }
  // Pinned staging for small uploads (the per-step index arrays). A copy from pageable memory
  // synchronizes the stream first, which drains the GPU at every upload; from pinned memory it is
  // asynchronous. The buffer is a ring of kSegs segments; an event recorded when the ring leaves a
  // segment guards its reuse.
  static constexpr int kSegs = 4;
  static constexpr size_t kSegBytes = 4 << 20;
  char* staging = nullptr;
  void* view = nullptr;  // download_view's page-locked buffer
  size_t view_bytes = 0;
  // stage() / staged(): per slot a page-locked copy and the event after it.
  struct Staged {
    void* host = nullptr;
    size_t cap = 0;
    cudaEvent_t done = nullptr;
  } stg[2];
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
  // Kernel paths switched off by name (DEEPINFER_CUDA_OFF=name,name): a new fast path that fails on the
  // device can be set aside for a run (its fallback takes over) without a rebuild. Read once, here.
  std::string off_list = [] {
    const char* v = std::getenv("DEEPINFER_CUDA_OFF");
    return "," + std::string(v ? v : "") + ",";
  }();
  // Kernel paths that are built and tested but measured slower than what they would replace are taken only
  // when named in DEEPINFER_CUDA_ON=name,name (gemv_v8, gemv_e4m3, moe_fp8_ws), for the next measurement.
  // Those that stayed slower were deleted: moe_wg2 in session 10; gemv_v5, gemv_v7, moe_gemv3 in session 16.
  std::string on_list = [] {
    const char* v = std::getenv("DEEPINFER_CUDA_ON");
    return "," + std::string(v ? v : "") + ",";
  }();
  static bool listed(const std::string& list, const char* name) {
    if (list.size() <= 2) return false;
    const size_t n = std::strlen(name);
    for (size_t p = list.find(name); p != std::string::npos; p = list.find(name, p + 1))
      if (list[p - 1] == ',' && list[p + n] == ',') return true;
    return false;
  }
  // Asked on every launch of a fast path: no allocation, and nothing to search when the list is empty.
  bool off(const char* name) const { return listed(off_list, name); }
  bool on(const char* name) const { return listed(on_list, name); }

  // Step graphs (Backend::graph_begin): a region is captured once per key into a CUDA graph and then
  // replayed. Recorded with it: the allocations made outside ops (size, address: a replay must get the
  // same ones, which holds when the arena's top is where it was at capture) and the uploads (each from
  // its own page-locked copy that the graph reads: a replay refreshes those copies and launches).
  struct GraphUpload {
    void* dst;
    size_t bytes;
    char* host;  // the graph's page-locked source
  };
  struct GraphEntry {
    uint64_t key = 0;
    cudaGraphExec_t exec = nullptr;
    cudaEvent_t done = nullptr;  // after the last launch (its upload copies are free again)
    size_t top0 = 0;             // arena top at graph_begin
    std::vector<std::pair<size_t, void*>> allocs;
    std::vector<GraphUpload> uploads;
    std::vector<cudaEvent_t> pev;     // profiled graphs: an event pair per op, recorded as graph nodes
    std::vector<const char*> pop;     // their op names
    std::vector<char*> chunks;  // page-locked upload sources
    size_t chunk_bytes = 0, chunk_used = 0;  // of the last chunk
    uint64_t last_use = 0;
    ~GraphEntry() {
      if (exec) cudaGraphExecDestroy(exec);
      if (done) cudaEventDestroy(done);
      for (cudaEvent_t e : pev) cudaEventDestroy(e);
      for (char* c : chunks) cudaFreeHost(c);
    }
  };
  static constexpr size_t kMaxGraphs = 64;
  Backend::GraphMode graph = Backend::GraphMode::Off;
  std::vector<std::unique_ptr<GraphEntry>> graphs;
  std::unique_ptr<GraphEntry> capturing;  // the entry being captured
  GraphEntry* cur = nullptr;              // the entry being captured or replayed
  GraphEntry* ready = nullptr;            // ended by graph_ready, waiting for graph_launch
  GraphEntry* end_region();
  void launch(GraphEntry* e);
  cudaError_t programmatic_edges(cudaGraph_t g);
  size_t cur_alloc = 0, cur_upload = 0;   // replay cursors
  std::unordered_set<uint64_t> graph_failed;
  std::unordered_map<uint64_t, int> graph_recaptures;
  uint64_t use_clock = 0;
  int op_depth = 0;  // > 0 inside an op (its own allocations are not part of the recorded sequence)
  bool replaying() const { return graph == Backend::GraphMode::Replay; }
  char* graph_host(size_t bytes) {  // page-locked space for an upload source of the entry being captured
    GraphEntry& e = *cur;
    const size_t sz = (bytes + 255) / 256 * 256;
    if (e.chunks.empty() || e.chunk_used + sz > e.chunk_bytes) {
      e.chunk_bytes = std::max<size_t>(sz, 1 << 18);
      char* c = nullptr;
      check(cudaHostAlloc(reinterpret_cast<void**>(&c), e.chunk_bytes, cudaHostAllocDefault),
            "cudaHostAlloc (graph uploads)");
      e.chunks.push_back(c);
      e.chunk_used = 0;
    }
    char* p = e.chunks.back() + e.chunk_used;
    e.chunk_used += sz;
    return p;
  }

  // Device-time profile (Backend::set_profiling / take_profile): an event pair around each outermost
  // backend call, resolved in bulk. gaps = device time between one call's end and the next call's start
  // (the GPU idles there: launch overhead, host work, synchronizing downloads).
  bool profiling = false;
  int depth = 0;
  std::vector<cudaEvent_t> ev;      // pool: 2 per timed call
  std::vector<const char*> ev_op;   // op name per timed call
  size_t used = 0;                  // timed calls since the last fold
  cudaEvent_t spare = nullptr;      // holds the previous fold's last end event
  cudaEvent_t last_end = nullptr;   // = spare while a window is open, else null (no gap before the first call)
  std::vector<Backend::OpTime> acc; // totals since the last take
  double busy_ms = 0, gap_ms = 0;
  int64_t n_calls = 0;
  cudaEvent_t event(size_t i) {
    while (ev.size() <= i) {
      cudaEvent_t e;
      check(cudaEventCreate(&e), "cudaEventCreate (profile)");
      ev.push_back(e);
    }
    return ev[i];
  }
  void prof_begin(const char* op) {
    if (used >= (1u << 15)) fold();  // bounded event pool
    check(cudaEventRecord(event(2 * used), stream), "cudaEventRecord (profile)");
    if (ev_op.size() <= used) ev_op.resize(used + 1);
    ev_op[used] = op;
  }
  void prof_end() { check(cudaEventRecord(event(2 * used + 1), stream), "cudaEventRecord (profile)"), ++used; }
  void add_time(const char* op, cudaEvent_t prev, cudaEvent_t b, cudaEvent_t e) {
    float ms = 0, gap = 0;
    cudaEventElapsedTime(&ms, b, e);
    if (prev) cudaEventElapsedTime(&gap, prev, b);
    busy_ms += ms;
    gap_ms += gap;
    ++n_calls;
    auto it = std::find_if(acc.begin(), acc.end(), [&](const Backend::OpTime& o) { return o.op == op; });
    if (it == acc.end()) it = acc.insert(acc.end(), Backend::OpTime{op, 0, 0.0, 0.0});
    ++it->calls;
    it->ms += ms;
    it->gap_ms += gap;
  }
  // A graph region recorded while profiling: an event pair per op as graph nodes (cudaEventRecordExternal).
  int64_t n_graph_steps = 0;
  cudaEvent_t graph_tail[2] = {};  // recorded after a profiled graph (alternately): the next op's gap starts there
  int tail_i = 0;
  void gprof_event(const char* op) {
    cudaEvent_t e;
    check(cudaEventCreate(&e), "cudaEventCreate (graph profile)");
    cur->pev.push_back(e);
    if (op) cur->pop.push_back(op);
    check(cudaEventRecordWithFlags(e, stream, cudaEventRecordExternal), "cudaEventRecordWithFlags (graph profile)");
  }
  // A profiled graph's events are read once it has run, at the next fold (the next timed launch at the
  // latest): a pipelined step's host work overlaps the graph even while profiling.
  GraphEntry* timed_pending = nullptr;
  cudaEvent_t timed_prev = nullptr;  // what ended before it (its first gap)
  cudaEvent_t timed_prev_graph = nullptr;  // the end of the profiled graph before it (the step gap)
  cudaEvent_t last_graph_tail = nullptr;
  void resolve_graph() {
    if (!timed_pending) return;
    GraphEntry* e = timed_pending;
    timed_pending = nullptr;
    check(cudaEventSynchronize(e->pev.back()), "graph (profiled)");
    for (size_t i = 0; i < e->pop.size(); ++i)
      add_time(e->pop[i], i ? e->pev[2 * i - 1] : timed_prev, e->pev[2 * i], e->pev[2 * i + 1]);
    float gap = 0;
    if (timed_prev_graph && !e->pev.empty() &&
        cudaEventElapsedTime(&gap, timed_prev_graph, e->pev[0]) == cudaSuccess)
      graph_gap_ms += gap, ++n_graph_gaps;
    ++n_graph_steps;
  }
  double graph_gap_ms = 0;
  int64_t n_graph_gaps = 0;
  void fold() {
    resolve_graph();
    fold_ops();
  }
  // The ops timed since the last fold (their events are recorded; waits for the last one only).
  void fold_ops() {
    if (used == 0) return;
    check(cudaEventSynchronize(ev[2 * used - 1]), "profile");
    for (size_t i = 0; i < used; ++i) add_time(ev_op[i], i ? ev[2 * i - 1] : last_end, ev[2 * i], ev[2 * i + 1]);
    // The last end event opens the next fold's first gap: it moves out of the pool (a spare takes its slot).
    if (!spare) check(cudaEventCreate(&spare), "cudaEventCreate (profile)");
    std::swap(ev[2 * used - 1], spare);
    last_end = spare;
    used = 0;
  }
};

namespace {
// Scope of one backend call: host time by kind (DEEPINFER_CUDA_HOST_TIMES) and, while profiling is on,
// a pair of events around the outermost call's device work (nested calls are part of their caller).
// The op's name is the calling member function's (GCC's __builtin_FUNCTION as a default argument).
struct HostTimer {
  CudaBackend::Impl* m;
  int cat;
  bool outer = false;
  std::chrono::steady_clock::time_point t0;
  // timed false: no event pair (stage / staged: events recorded after the next step would make the profiler's
  // fold before the step after it wait for that step, serializing the fed steps being measured).
  HostTimer(CudaBackend::Impl* m_, int c, const char* op = __builtin_FUNCTION(), bool timed = true) : m(m_), cat(c) {
    if (m->timing) t0 = std::chrono::steady_clock::now();
    if (cat == CudaBackend::Impl::kOp) ++m->op_depth;
    // While a graph is recorded the pair becomes graph nodes (Impl::gprof_event); replays issue no ops.
    if (m->profiling && m->depth++ == 0 && timed && cat != CudaBackend::Impl::kAlloc &&
        cat != CudaBackend::Impl::kRelease && m->graph != Backend::GraphMode::Replay) {
      outer = true;
      if (m->graph == Backend::GraphMode::Capture) m->gprof_event(op);
      else m->prof_begin(op);
    }
  }
  ~HostTimer() {
    if (cat == CudaBackend::Impl::kOp) --m->op_depth;
    if (outer && m->graph == Backend::GraphMode::Capture) m->gprof_event(nullptr);
    else if (outer) m->prof_end();
    if (m->profiling) --m->depth;
    if (!m->timing) return;
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

CudaBackend::CudaBackend(int device, CudaWeights weights) : impl_(std::make_unique<Impl>()) {
  if (device_count() <= device) throw Error("--backend cuda: no CUDA device available (no GPU or no driver)");
  impl_->device = device;
  impl_->weights = weights;
  check(cudaSetDevice(device), "cudaSetDevice");
  check(cuda::init_kernel_attributes(), "kernel attributes");  // once, not in every launch
  check(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  // Activations come and go every step through the stream-ordered pool: keep freed memory cached.
  cudaMemPool_t pool;
  check(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool");
  uint64_t keep = UINT64_MAX;
  check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute");
  check(cudaHostAlloc(reinterpret_cast<void**>(&impl_->staging), Impl::kSegs * Impl::kSegBytes, cudaHostAllocDefault),
        "cudaHostAlloc (staging)");
  for (auto& e : impl_->seg_done) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  const size_t hc_sync_bytes = (size_t)(cuda::hc_pre_dec_sync_ints() + 2) * sizeof(int32_t);
  check(cudaMalloc(reinterpret_cast<void**>(&impl_->hc_sync), hc_sync_bytes), "hcdec scratch");
  check(cudaMemsetAsync(impl_->hc_sync, 0, hc_sync_bytes, impl_->stream), "hcdec scratch");  // before any op on the stream
  impl_->moe_ctr = impl_->hc_sync + cuda::hc_pre_dec_sync_ints();
  if (weights == CudaWeights::Stored && !(impl_->gemm = cuda::gemm_context_create()))
    throw Error("cuda: cuBLASLt initialisation failed");
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
  if (impl_->side) cudaStreamDestroy(impl_->side);
  for (cudaEvent_t e : {impl_->ev_fork, impl_->ev_join})
    if (e) cudaEventDestroy(e);
  for (auto& e : impl_->seg_done)
    if (e) cudaEventDestroy(e);
  for (auto& e : impl_->ev) cudaEventDestroy(e);
  if (impl_->spare) cudaEventDestroy(impl_->spare);
  for (auto& e : impl_->graph_tail)
    if (e) cudaEventDestroy(e);
  cuda::gemm_context_destroy(impl_->gemm);
  if (impl_->hc_sync) cudaFree(impl_->hc_sync);
  if (impl_->e4m3_work) cudaFree(impl_->e4m3_work);
  if (impl_->arena) cudaFree(impl_->arena);
  if (impl_->staging) cudaFreeHost(impl_->staging);
  if (impl_->view) cudaFreeHost(impl_->view);
  for (auto& s : impl_->stg) {
    if (s.host) cudaFreeHost(s.host);
    if (s.done) cudaEventDestroy(s.done);
  }
}

void* CudaBackend::alloc(int64_t bytes) {
  HostTimer ht_(impl_.get(), Impl::kAlloc);
  if (bytes <= 0) return nullptr;
  Impl& m = *impl_;
  const size_t sz = ((size_t)bytes + 255) / 256 * 256;
  if (m.graph != GraphMode::Off) {
    // Graph regions allocate from the arena only (addresses that repeat), any size that fits.
    if (!m.arena || m.arena_top + sz > Impl::kArenaBytes) throw Error("cuda graph: the step's buffers exceed the arena");
    m.blocks.push_back({m.arena_top, sz, false});
    m.arena_top += sz;
    void* p = m.arena + m.blocks.back().off;
    if (m.op_depth == 0) {
      if (m.graph == GraphMode::Capture) {
        m.cur->allocs.emplace_back(sz, p);
      } else if (m.cur_alloc >= m.cur->allocs.size() || m.cur->allocs[m.cur_alloc].first != sz ||
                 m.cur->allocs[m.cur_alloc].second != p) {
        throw Error("cuda graph: a replayed step allocated differently from its capture");
      } else {
        ++m.cur_alloc;
      }
    }
    return p;
  }
  if (sz <= Impl::kArenaMax) {
    if (!m.arena && cudaMalloc(&m.arena, Impl::kArenaBytes) != cudaSuccess) {
      cudaGetLastError();
      m.arena = nullptr;
    }
    if (m.arena && m.arena_top + sz <= Impl::kArenaBytes) {
      m.blocks.push_back({m.arena_top, sz, false});
      m.arena_top += sz;
      return m.arena + m.blocks.back().off;
    }
  }
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
  if (!p) return;
  Impl& m = *impl_;
  char* c = static_cast<char*>(p);
  if (m.arena && c >= m.arena && c < m.arena + Impl::kArenaBytes) {
    const size_t off = (size_t)(c - m.arena);
    for (size_t i = m.blocks.size(); i-- > 0;)
      if (m.blocks[i].off == off) {
        m.blocks[i].freed = true;
        break;
      }
    if (!m.hold_arena) m.pop_freed();
    return;
  }
  cudaFreeAsync(p, m.stream);
}
void CudaBackend::upload(void* dst, const void* src, int64_t bytes) {
  HostTimer ht_(impl_.get(), Impl::kUpload);
  if (bytes <= 0) return;
  Impl& m = *impl_;
  if (m.graph == GraphMode::Capture) {  // from the graph's own page-locked copy, which a replay refreshes
    char* h = m.graph_host((size_t)bytes);
    std::memcpy(h, src, (size_t)bytes);
    check(cudaMemcpyAsync(dst, h, (size_t)bytes, cudaMemcpyHostToDevice, m.stream), "upload (graph capture)");
    if (m.op_depth == 0) m.cur->uploads.push_back({dst, (size_t)bytes, h});
    return;
  }
  if (m.graph == GraphMode::Replay) {
    if (m.op_depth > 0) return;  // an op's own upload: not issued again (ops do not run in a replay)
    if (m.cur_upload >= m.cur->uploads.size() || m.cur->uploads[m.cur_upload].dst != dst ||
        m.cur->uploads[m.cur_upload].bytes != (size_t)bytes)
      throw Error("cuda graph: a replayed step uploaded differently from its capture");
    std::memcpy(m.cur->uploads[m.cur_upload++].host, src, (size_t)bytes);
    return;
  }
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
  if (impl_->graph != GraphMode::Off) throw Error("cuda graph: download inside a graph region");
  if (bytes > 0) check(cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDeviceToHost, impl_->stream), "download");
  check(cudaStreamSynchronize(impl_->stream), "download (a kernel before it failed)");
}
const void* CudaBackend::download_view(const void* src, int64_t bytes) {
  HostTimer ht_(impl_.get(), Impl::kDownload);
  Impl& m = *impl_;
  if (m.graph != GraphMode::Off) throw Error("cuda graph: download inside a graph region");
  if (bytes <= 0) return m.view;
  if ((size_t)bytes > m.view_bytes) {  // grow (page-locked; freeing waits for the device: rare)
    check(cudaStreamSynchronize(m.stream), "download_view");
    if (m.view) cudaFreeHost(m.view);
    m.view = nullptr;
    m.view_bytes = 0;
    check(cudaHostAlloc(&m.view, (size_t)bytes, cudaHostAllocDefault), "cudaHostAlloc (download_view)");
    m.view_bytes = (size_t)bytes;
  }
  check(cudaMemcpyAsync(m.view, src, (size_t)bytes, cudaMemcpyDeviceToHost, m.stream), "download_view");
  check(cudaStreamSynchronize(m.stream), "download_view (a kernel before it failed)");
  return m.view;
}
bool CudaBackend::kernel_trace_start(std::string* why) {
  if (!impl_->tracer) impl_->tracer = cuda::KernelTracer::start(why);
  return impl_->tracer != nullptr;
}
void CudaBackend::kernel_trace_window(bool open) {
  if (impl_->tracer) impl_->tracer->window(open);
}
std::vector<KernelRecord> CudaBackend::take_kernel_trace() {
  return impl_->tracer ? impl_->tracer->take() : std::vector<KernelRecord>{};
}

void CudaBackend::stage(int slot, const void* src, int64_t bytes) {
  HostTimer ht_(impl_.get(), Impl::kDownload, __builtin_FUNCTION(), false);
  Impl& m = *impl_;
  if (m.graph != GraphMode::Off) throw Error("cuda graph: stage inside a graph region");
  Impl::Staged& s = m.stg[slot & 1];
  if (!s.done) check(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming), "cudaEventCreate (stage)");
  if ((size_t)bytes > s.cap) {  // grow (the last copy into it must be done first: rare)
    check(cudaEventSynchronize(s.done), "stage");
    if (s.host) cudaFreeHost(s.host);
    s.host = nullptr;
    s.cap = 0;
    check(cudaHostAlloc(&s.host, std::max<size_t>((size_t)bytes, 16384), cudaHostAllocDefault), "cudaHostAlloc (stage)");
    s.cap = std::max<size_t>((size_t)bytes, 16384);
  }
  if (bytes > 0) check(cudaMemcpyAsync(s.host, src, (size_t)bytes, cudaMemcpyDeviceToHost, m.stream), "stage");
  check(cudaEventRecord(s.done, m.stream), "stage");
}
const void* CudaBackend::staged(int slot) {
  HostTimer ht_(impl_.get(), Impl::kDownload, __builtin_FUNCTION(), false);
  Impl::Staged& s = impl_->stg[slot & 1];
  if (s.done) check(cudaEventSynchronize(s.done), "staged (a kernel before it failed)");
  return s.host;
}
void CudaBackend::copy(void* dst, const void* src, int64_t bytes) {
  HostTimer ht_(impl_.get(), Impl::kCopy);
  if (impl_->replaying()) return;
  if (bytes > 0) check(cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDeviceToDevice, impl_->stream), "copy");
}
int64_t CudaBackend::free_memory() const {
  if (impl_->graph != GraphMode::Off) throw Error("cuda graph: free_memory inside a graph region");
  size_t fr = 0, tot = 0;
  cudaStreamSynchronize(impl_->stream);
  if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) return 0;
  return (int64_t)fr;
}
void CudaBackend::synchronize() {
  if (impl_->graph != GraphMode::Off) throw Error("cuda graph: synchronize inside a graph region");
  check(cudaStreamSynchronize(impl_->stream), "synchronize");
}

int64_t CudaBackend::decode_rows(int64_t B) const {
  // padded only where graphs run (a bucket keeps their number small)
  return impl_->weights == CudaWeights::Stored && !impl_->off("graphs") ? decode_bucket(B) : B;
}

Backend::GraphMode CudaBackend::graph_begin(uint64_t key) {
  Impl& m = *impl_;
  if (m.graph != GraphMode::Off) throw Error("cuda graph: graph_begin inside a graph region");
  if (m.ready) throw Error("cuda graph: graph_begin while a readied step waits for its launch");
  // The float32 mode brings MoE routing to the host (not capturable); DEEPINFER_CUDA_OFF=graphs turns
  // graphs off (every step runs op by op).
  if (m.profiling) key ^= 0x6a09e667f3bcc909ull;  // profiled graphs (an event pair per op) are recorded apart
  if (m.weights != CudaWeights::Stored || m.off("graphs") || m.graph_failed.count(key)) return GraphMode::Off;
  if (!m.arena) {
    if (cudaMalloc(&m.arena, Impl::kArenaBytes) != cudaSuccess) {
      cudaGetLastError();
      m.arena = nullptr;
      return GraphMode::Off;
    }
  }
  auto it = std::find_if(m.graphs.begin(), m.graphs.end(), [&](const auto& e) { return e->key == key; });
  if (it != m.graphs.end() && (*it)->top0 == m.arena_top) {
    m.cur = it->get();
    m.cur->last_use = ++m.use_clock;
    check(cudaEventSynchronize(m.cur->done), "cuda graph (previous launch)");  // its upload copies are ours again
    m.cur_alloc = m.cur_upload = 0;
    m.graph = GraphMode::Replay;
    return m.graph;
  }
  if (it != m.graphs.end()) {  // recorded at another arena top: record again (a few times, then op by op)
    if (it->get() == m.timed_pending) m.resolve_graph();
    m.graphs.erase(it);
    if (++m.graph_recaptures[key] > 3) {
      std::fprintf(stderr, "cuda graph: a step's buffers keep moving (arena top); it runs op by op\n");
      m.graph_failed.insert(key);
      return GraphMode::Off;
    }
  }
  m.capturing = std::make_unique<Impl::GraphEntry>();
  m.capturing->key = key;
  m.capturing->top0 = m.arena_top;
  m.cur = m.capturing.get();
  // Relaxed: the capture allocates page-locked upload copies as it goes (not a stream operation).
  check(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
  m.graph = GraphMode::Capture;
  return m.graph;
}

namespace {
// One of this library's kernels (they all start with DI_PDL_WAIT), not cuBLAS's: its mangled name is ours.
bool our_kernel(cudaGraphNode_t n) {
  if (!cuda::graph_kernel_node(n)) return false;
  cudaKernelNodeParams p{};
  const char* name = nullptr;
  if (cudaGraphKernelNodeGetParams(n, &p) != cudaSuccess || !p.func || cudaFuncGetName(&name, p.func) != cudaSuccess ||
      !name) {
    cudaGetLastError();
    return false;
  }
  return std::strstr(name, "9deepinfer") != nullptr;
}
}  // namespace

// Programmatic dependent launch in the step graphs: an edge from a kernel into one of our kernels becomes
// programmatic, so the second kernel is launched while the first finishes (hiding its launch latency)
// and waits in DI_PDL_WAIT, before touching memory, for the first to complete. Edges into cuBLAS's
// kernels and from or to copies stay full dependencies. DEEPINFER_CUDA_OFF=pdl keeps every edge.
cudaError_t CudaBackend::Impl::programmatic_edges(cudaGraph_t g) {
  std::unordered_map<cudaGraphNode_t, bool> ours;  // (a kernel name lookup a node, once)
  return cuda::graph_programmatic_edges(
      g,
      [&](cudaGraphNode_t x) {
        auto it = ours.find(x);
        return it != ours.end() ? it->second : (ours[x] = our_kernel(x));
      },
      [&](cudaGraphNode_t x) { return !full_out.count(x); });  // (a side chain's end joins by a full edge)
}

// Ends the region (Capture: instantiates its graph) and returns the entry to launch; null when Off.
CudaBackend::Impl::GraphEntry* CudaBackend::Impl::end_region() {
  if (graph == GraphMode::Off) return nullptr;
  GraphEntry* e = cur;
  if (graph == GraphMode::Capture) {
    cudaGraph_t g = nullptr;
    graph = GraphMode::Off;  // the stream leaves capture whatever happens below
    check(cudaStreamEndCapture(stream, &g), "cudaStreamEndCapture");
    cudaError_t ie = off("pdl") ? cudaSuccess : programmatic_edges(g);
    full_out.clear();
    if (ie == cudaSuccess) ie = cudaGraphInstantiate(&e->exec, g, 0);
    cudaGraphDestroy(g);
    check(ie, "cudaGraphInstantiate");
    check(cudaEventCreateWithFlags(&e->done, cudaEventDisableTiming), "cudaEventCreate (graph)");
    if (graphs.size() >= kMaxGraphs) {  // the least recently used goes
      auto lru = std::min_element(graphs.begin(), graphs.end(),
                                  [](const auto& a, const auto& b) { return a->last_use < b->last_use; });
      if (lru->get() == timed_pending) resolve_graph();
      graphs.erase(lru);
    }
    e->last_use = ++use_clock;
    graphs.push_back(std::move(capturing));
  } else {
    if (cur_alloc != e->allocs.size() || cur_upload != e->uploads.size())
      throw Error("cuda graph: a replayed step made fewer allocations or uploads than its capture");
    graph = GraphMode::Off;
  }
  cur = nullptr;
  branch = 0, hold_arena = false;  // (an unjoined fork: the model always joins)
  return e;
}
void CudaBackend::Impl::launch(GraphEntry* e) {
  const bool timed = !e->pev.empty() && e->pev.size() == 2 * e->pop.size();
  if (timed) fold_ops();  // the ops before it first (their last end opens the graph's first gap)
  check(cudaGraphLaunch(e->exec, stream), "cudaGraphLaunch");
  check(cudaEventRecord(e->done, stream), "cudaEventRecord (graph)");
  if (timed) {
    // The previous profiled graph is read now, while this one runs (reading it before the launch would
    // add its ~2 event queries an op to the idle time being measured); this one at the next launch or fold.
    resolve_graph();  // (before its first gap's start event, a graph_tail, is recorded again below)
    cudaEvent_t& tail = graph_tail[tail_i ^= 1];  // not the one last_end may hold
    if (!tail) check(cudaEventCreate(&tail), "cudaEventCreate (graph profile)");
    check(cudaEventRecord(tail, stream), "cudaEventRecord (graph profile)");
    timed_pending = e;
    timed_prev = last_end;
    timed_prev_graph = last_graph_tail;
    last_end = last_graph_tail = tail;
  }
}
void CudaBackend::graph_end() {
  if (Impl::GraphEntry* e = impl_->end_region()) impl_->launch(e);
}
void CudaBackend::graph_ready() {
  Impl& m = *impl_;
  if (m.ready) throw Error("cuda graph: a readied step was not launched");
  m.ready = m.end_region();
}
void CudaBackend::graph_unready() { impl_->ready = nullptr; }
void CudaBackend::graph_launch(const void* first_upload, int64_t bytes) {
  Impl& m = *impl_;
  Impl::GraphEntry* e = m.ready;
  if (!e) throw Error("cuda graph: graph_launch without a readied step");
  m.ready = nullptr;
  if (first_upload) {
    if (e->uploads.empty() || e->uploads[0].bytes < (size_t)bytes)
      throw Error("cuda graph: graph_launch's bytes exceed the step's first upload");
    std::memcpy(e->uploads[0].host, first_upload, (size_t)bytes);
  }
  m.launch(e);
}

void CudaBackend::graph_abort(const char* why) {
  Impl& m = *impl_;

  if (m.graph_failed.size() < 3)
    std::fprintf(stderr, "cuda graph: a step could not run from a graph (%s); it runs op by op\n", why ? why : "?");
  if (m.graph == GraphMode::Capture) {
    if (m.side_active) {  // an unjoined side stream would fail the end of the capture
      m.stream = m.main_stream;
      cudaEventRecord(m.ev_join, m.side);
      cudaStreamWaitEvent(m.stream, m.ev_join, 0);
    }
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(m.stream, &g);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
  }
  m.branch = 0, m.side_active = m.hold_arena = false;
  m.full_out.clear();
  m.resolve_graph();  // its entry may be the one erased below
  if (m.cur) {
    m.graph_failed.insert(m.cur->key);
    const uint64_t key = m.cur->key;
    m.graphs.erase(std::remove_if(m.graphs.begin(), m.graphs.end(), [&](const auto& e) { return e->key == key; }),
                   m.graphs.end());
  }
  m.capturing.reset();
  m.cur = nullptr;
  m.ready = nullptr;
  m.graph = GraphMode::Off;
}
// Concurrent chains (Backend::fork), where Impl::chains() holds: in a capture the side chain is captured from a
// second stream forked from and joined to the main one by events (the graph then has two branches); in a replay
// the calls only hold the arena as the capture did. Elsewhere they do nothing.
void CudaBackend::fork() {
  Impl& m = *impl_;
  if (!m.chains()) return;  // (graph regions only)
  if (m.branch) throw Error("cuda graph: fork inside a fork");
  m.branch = 1;
  m.hold_arena = true;  // captured and replayed alike: a replay allocates as its capture did
  if (m.graph != GraphMode::Capture) return;
  if (!m.side) check(cudaStreamCreateWithFlags(&m.side, cudaStreamNonBlocking), "cudaStreamCreate (fork)");
  for (cudaEvent_t* e : {&m.ev_fork, &m.ev_join})
    if (!*e) check(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "cudaEventCreate (fork)");
  check(cudaEventRecord(m.ev_fork, m.stream), "fork");
  check(cudaStreamWaitEvent(m.side, m.ev_fork, 0), "fork");
  m.main_stream = m.stream;
  m.stream = m.side;
  m.side_active = true;
}
// (≤ 8 rows: every decode GEMV is a plain kernel; above, cuBLASLt's one workspace and the ops' temporaries would
// be shared by the two chains.)
bool CudaBackend::chains_side_by_side(int64_t rows) const { return impl_->chains() && rows <= 8; }
int64_t CudaBackend::graph_fallbacks() const { return (int64_t)impl_->graph_failed.size(); }
void CudaBackend::to_main() {
  Impl& m = *impl_;
  if (m.branch != 1) return;
  m.branch = 2;
  if (m.side_active) m.stream = m.main_stream;
}
void CudaBackend::join() {
  Impl& m = *impl_;
  if (!m.branch) return;
  if (m.side_active) {
    m.stream = m.main_stream;
    m.side_active = false;
    cudaStreamCaptureStatus st{};
    const cudaGraphNode_t* ends = nullptr;
    size_t n = 0;
    check(cudaStreamGetCaptureInfo(m.side, &st, nullptr, nullptr, &ends, nullptr, &n), "join (capture info)");
    for (size_t i = 0; i < n; ++i) m.full_out.insert(ends[i]);
    check(cudaEventRecord(m.ev_join, m.side), "join");
    check(cudaStreamWaitEvent(m.stream, m.ev_join, 0), "join");
  }
  m.branch = 0;
  m.hold_arena = false;
  m.pop_freed();  // what release() held back
}

void CudaBackend::set_profiling(bool on) {
  // DEEPINFER_PROFILER_RANGE=1: the profiled steps are also what an external profiler started with
  // `ncu --profile-from-start off` looks at (kernel counters of exactly the steps `bench --profile` times).
  if (on != impl_->profiling && std::getenv("DEEPINFER_PROFILER_RANGE")) on ? cudaProfilerStart() : cudaProfilerStop();
  if (impl_->profiling && !on) impl_->fold();
  if (on && !impl_->profiling) impl_->last_end = impl_->last_graph_tail = nullptr;  // no gap before the window's first call
  impl_->profiling = on;
  impl_->depth = 0;
}
Backend::Profile CudaBackend::take_profile() {
  Impl& m = *impl_;
  m.fold();
  Profile p;
  p.ops = std::move(m.acc);
  std::sort(p.ops.begin(), p.ops.end(), [](const OpTime& a, const OpTime& b) { return a.ms > b.ms; });
  p.busy_ms = m.busy_ms;
  p.gap_ms = m.gap_ms;
  p.calls = m.n_calls;
  p.graph_steps = m.n_graph_steps;
  p.graph_gap_ms = m.graph_gap_ms;
  p.graph_gaps = m.n_graph_gaps;
  m.n_graph_steps = m.n_graph_gaps = 0;
  m.graph_gap_ms = 0;
  m.acc.clear();
  m.busy_ms = m.gap_ms = 0;
  m.n_calls = 0;
  m.last_end = m.last_graph_tail = nullptr;  // the next take starts a new window: no gap across it
  return p;
}

void CudaBackend::fill(float* x, int64_t n, float v) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  check(cuda::fill_f32(x, n, v, impl_->stream), "fill"); }
void CudaBackend::scale(float* x, int64_t n, float a) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  check(cuda::scale_f32(x, n, a, impl_->stream), "scale"); }
void CudaBackend::copy_rows(const float* src, int64_t lds, const int32_t* src_rows, float* dst, int64_t ldd,
                            const int32_t* dst_rows, int64_t n, int64_t width) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  check(cuda::copy_rows(src, lds, src_rows, 0, 0, dst, ldd, dst_rows, 0, 0, n, width, impl_->stream), "copy_rows");
}
void CudaBackend::ring_write(const float* src, int64_t lds, int64_t n, int64_t width, int64_t p0, float* ring,
                             int64_t R) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  const int64_t first = n > R ? n - R : 0;
  check(cuda::copy_rows(src + first * lds, lds, nullptr, 0, 0, ring, width, nullptr, p0 + first, R, n - first, width,
                        impl_->stream),
        "ring_write");
}
void CudaBackend::ring_read(const float* ring, int64_t R, int64_t width, int64_t t0, int64_t n, float* dst) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  check(cuda::copy_rows(ring, width, nullptr, t0, R, dst, width, nullptr, 0, 0, n, width, impl_->stream), "ring_read");
}
// DEEPINFER_CUDA_OFF=fusecomp: copy_rows_multi, compress_emit, linear_swiglu and moe_ffn's shared addend
// run the unfused kernels (Backend's compositions) instead of their one-launch forms.
void CudaBackend::copy_rows_multi(const float* src, int64_t lds, const int32_t* src_rows, const RowCopy* sets,
                                  int nsets, int64_t n) {
  if (impl_->off("fusecomp") || nsets < 1 || nsets > 4) return Backend::copy_rows_multi(src, lds, src_rows, sets, nsets, n);
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  cuda::RowCopySet cs[4];
  for (int k = 0; k < nsets; ++k) cs[k] = {sets[k].col, sets[k].dst, sets[k].ldd, sets[k].dst_rows, sets[k].width};
  check(cuda::copy_rows_multi(src, lds, src_rows, cs, nsets, n, impl_->stream), "copy_rows_multi");
}
void CudaBackend::add_rows(const float* src, int64_t n, int64_t width, const float* w, const int32_t* dst_rows,
                           float* dst) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  check(cuda::add_rows(src, n, width, w, dst_rows, dst, impl_->stream), "add_rows");
}

namespace {
// gemv_e4m3's plan for an fp8 weight (or its groups), or an empty plan where it does not take the shape or its
// workspace would not fit the backend's.
void make_e4m3_plan(CudaBackend::Impl& m, const cuda::WeightRef& r, int64_t N, int64_t K, int G, int64_t w_stride,
                    int64_t s_stride, bool swiglu, cuda::GemvE4m3Plan* pl) {
  *pl = cuda::GemvE4m3Plan{};
  // DEEPINFER_CUDA_ON=gemv_e4m3: every fp8 weight; gemv_e4m3_big: those of ≥ 24 MiB only (wq_b, wo_a's groups, wo_b:
  // where the op-level graph timings gain most, s13-run12); e4m3:NxK (groups: e4m3:NxKxG, the fused SwiGLU plan
  // e4m3:NxKs): that one shape, for measuring the weights one at a time in the model
  const bool big = (double)N * K * G >= 24.0 * (1 << 20);
  const std::string shape = "e4m3:" + std::to_string(N) + "x" + std::to_string(K) +
                            (G > 1 ? "x" + std::to_string(G) : "") + (swiglu ? "s" : "");
  if (!(m.on("gemv_e4m3") || (big && m.on("gemv_e4m3_big")) || m.on(shape.c_str())) ||
      !cuda::gemv_e4m3_ok(r, N, K, G, w_stride, s_stride, swiglu))
    return;
  cuda::GemvE4m3Plan p;
  check(cuda::gemv_e4m3_plan(r, N, K, G, w_stride, s_stride, swiglu, &p), "gemv_e4m3 plan");
  if (p.work_bytes > CudaBackend::Impl::kE4m3Work) return;
  if (!m.e4m3_work) {
    check(cudaMalloc(&m.e4m3_work, CudaBackend::Impl::kE4m3Work), "gemv_e4m3 workspace");
    check(cudaMemsetAsync(m.e4m3_work, 0, CudaBackend::Impl::kE4m3Work, m.stream), "gemv_e4m3 workspace");
  }
  *pl = p;
}
}  // namespace

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

bool CudaBackend::takes_stored(const StoredWeight& w) const {
  if (impl_->weights != CudaWeights::Stored || w.fmt == WeightFormat::F32) return false;
  if (w.K % 64 || w.N % 8) return false;  // gemm_dq's tiles
  if (w.fmt == WeightFormat::FP8 && (w.block_rows != 128 || w.block_cols != 128)) return false;
  return true;
}

WeightPtr CudaBackend::make_weight(const StoredWeight& sw) {
  if (sw.fmt == WeightFormat::F32) return make_weight(static_cast<const float*>(sw.data), sw.N, sw.K);
  if (!takes_stored(sw)) throw Error("cuda: make_weight: stored format not taken (the loader dequantizes those)");
  auto cw = std::make_unique<CudaWeight>();
  cw->N = sw.N;
  cw->K = sw.K;
  cw->fmt = sw.fmt;
  const int64_t bytes = sw.fmt == WeightFormat::BF16 ? 2 * sw.N * sw.K
                        : sw.fmt == WeightFormat::FP8 ? sw.N * sw.K
                                                      : sw.N * sw.K / 2;
  check(cudaMalloc(&cw->w, (size_t)bytes), "weight allocation");
  check(cudaMemcpyAsync(cw->w, sw.data, (size_t)bytes, cudaMemcpyHostToDevice, impl_->stream), "weight upload");
  std::vector<float> grid;
  if (sw.fmt == WeightFormat::FP8) {  // [ceil(N/128), ceil(K/128)] → rows padded to ldws
    const int64_t gr = (sw.N + 127) / 128, gc = (sw.K + 127) / 128;
    cw->ldws = round_up(gc, 4);
    grid.assign(gr * cw->ldws, 0.0f);
    const float* src = static_cast<const float*>(sw.scale);
    for (int64_t r = 0; r < gr; ++r)
      for (int64_t c = 0; c < gc; ++c) grid[r * cw->ldws + c] = src[r * gc + c];
    check(cudaMalloc(&cw->scale, grid.size() * sizeof(float)), "weight scale allocation");
    check(cudaMemcpyAsync(cw->scale, grid.data(), grid.size() * sizeof(float), cudaMemcpyHostToDevice, impl_->stream),
          "weight scale upload");
  } else if (sw.fmt == WeightFormat::FP4) {
    check(cudaMalloc(&cw->scale, (size_t)(sw.N * sw.K / 32)), "weight scale allocation");
    check(cudaMemcpyAsync(cw->scale, sw.scale, (size_t)(sw.N * sw.K / 32), cudaMemcpyHostToDevice, impl_->stream),
          "weight scale upload");
  }
  check(cudaStreamSynchronize(impl_->stream), "weight upload");  // the host copies may go away now
  check(cuda::gemv_q_plan(cw->ref(), cw->N, cw->K, false, &cw->gemv), "gemv plan");
  if (impl_->off("v6_s8")) cw->gemv.v6_sched = 0;
  if (cw->fmt == WeightFormat::FP8) {
    make_e4m3_plan(*impl_, cw->ref(), cw->N, cw->K, 1, 0, 0, false, &cw->e4m3);
    if (cw->N % 256 == 0) make_e4m3_plan(*impl_, cw->ref(), cw->N, cw->K, 1, 0, 0, true, &cw->e4m3_swiglu);
  }
  return cw;
}

namespace {
// The decode GEMV linear() takes for x[M, K] (row stride ldx) · Wᵀ, or None (the GEMMs below it);
// linear_swiglu fuses its SwiGLU into the same kernel where that kernel has the epilogue (v3, v4).
enum class GemvPick { None, V8, V6, V3, V4 };
// v8's extra conditions on a weight (its fp8 scale rows are read by 16-byte bulk copies)
bool v8_weight_ok(const cuda::WeightRef& r) {
  return r.fmt != cuda::WFmt::FP8_B128 || (r.ldws % 4 == 0 && (uintptr_t)r.scale % 16 == 0);
}
bool v8_pick(const cuda::WeightRef& r, int64_t N, int64_t K) {
  return r.fmt == cuda::WFmt::FP8_B128 && K >= 2048 && cuda::gemv_q_v8_supported(r.fmt, N, K) && v8_weight_ok(r);
}
GemvPick pick_gemv(const CudaBackend::Impl& m, const CudaWeight& w, int64_t M, const float* x, int64_t ldx) {
  if (w.fmt == WeightFormat::F32) return GemvPick::None;
  const int64_t K = w.K, N = w.N;
  // Decode sizes: the tensor-core GEMV reads x in float32 and the weight once (batch invariant for
  // M ≤ gemv_q_rows: 32 for v4's shapes, 8 for the rest).
  const int64_t kmul = w.fmt == WeightFormat::BF16 ? 8 : w.fmt == WeightFormat::FP8 ? 128 : 32;
  if (m.off("gemv_q") || M > cuda::gemv_q_rows(w.ref(), K) || K % kmul || K > 32768 || ldx % 4 ||
      (uintptr_t)x % 16)
    return GemvPick::None;
  // M ≤ 8: v6 where it applies (bf16/fp8, K % 128 == 0; DEEPINFER_CUDA_OFF=gemv_v6 → v3). Since its
  // per-shape schedule (session 6 sweep, graph-timed M = 1, weights cold: wq_a 6.6 vs v3 7.8 µs, wo_b
  // 18.1 vs 21.2, shared w13 12.4 vs 14.9; wq_b 14.1 vs 19.3 and the head 256 vs 291 before) it takes
  // every N; DEEPINFER_CUDA_OFF=gemv_v6_small keeps v3 for N < 16384 (the session-5 split). Else v3
  // (measured faster than v4 there), v4 with DEEPINFER_CUDA_OFF=gemv_v3. The choice depends on the
  // weight only, so each row's result stays independent of M.
  // M ≤ 8 with DEEPINFER_CUDA_ON=gemv_v8: v8 (bulk-copy ring, docs/cuda-notes.md "GEMV v8") for fp8 weights
  // with K ≥ 2048, where its op cases measured faster than v6 (s7-run3: wo_b 17.1 vs 18.2 us, shared w13
  // 11.7 vs 12.5); chosen by the weight only (batch invariant). Opt-in: in the 31-layer bench (s7-run4)
  // the step was faster without it (b1 6.85 vs 6.93 ms, b8 13.09 vs 13.36).
  if (M <= 8 && m.on("gemv_v8") && v8_pick(w.ref(), N, K)) return GemvPick::V8;
  if (M <= 8 && (N >= 16384 || !m.off("gemv_v6_small")) && !m.off("gemv_v6") &&
      cuda::gemv_q_v6_supported(w.ref().fmt, K))
    return GemvPick::V6;
  return M <= 8 && !m.off("gemv_v3") ? GemvPick::V3 : GemvPick::V4;
}
}  // namespace

void CudaBackend::linear(const float* x, int64_t M, int64_t ldx, const Weight& wt, float* y, int64_t ldy) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  const auto& w = static_cast<const CudaWeight&>(wt);
  cudaStream_t s = impl_->stream;
  if (w.fmt == WeightFormat::F32) {
    check(cuda::gemm_f32(x, M, w.K, ldx, static_cast<const float*>(w.w), w.N, y, ldy, s), "linear");
    return;
  }
  if (M <= 0) return;
  const int64_t K = w.K, N = w.N;
  // fp8 at M ≤ 8 with DEEPINFER_CUDA_ON=gemv_e4m3: gemv_e4m3 (e4m3 x, as DeepSeek's inference and the M > 8 path
  // quantize it; docs/cuda-notes.md "GEMV e4m3"), chosen by the weight for every M ≤ 8. Opt-in: slower than v6 in
  // the 31-layer decode so far (s13: b1 6.47 vs 6.25 ms, b8 12.10 vs 11.40).
  if (M <= 8 && w.e4m3.fmt_ok && ldx % 4 == 0 && (uintptr_t)x % 16 == 0) {
    check(cuda::gemv_e4m3(w.e4m3, x, M, ldx, y, ldy, 0.0f, impl_->e4m3_work, s), "linear (gemv e4m3)");
    return;
  }
  if (const GemvPick g = pick_gemv(*impl_, w, M, x, ldx); g != GemvPick::None) {
    if (g == GemvPick::V8)
      check(cuda::gemv_q_v8(x, M, K, ldx, w.ref(), N, y, ldy, s, &w.gemv), "linear (gemv v8)");
    else if (g == GemvPick::V6)
      check(cuda::gemv_q_v6(x, M, K, ldx, w.ref(), N, y, ldy, s, &w.gemv), "linear (gemv v6)");
    else
      check(g == GemvPick::V3 ? cuda::gemv_q_v3(x, M, K, ldx, w.ref(), N, y, ldy, s, &w.gemv)
                              : cuda::gemv_q(x, M, K, ldx, w.ref(), N, y, ldy, s, &w.gemv),
            "linear (gemv)");
    return;
  }
  // Large fp8 GEMMs: activations to e4m3 with 1×128 power-of-two scales, cuBLASLt's block-scaled kernel.
  // Decode-sized M stays on the bf16 path (cuBLASLt has no block-scaled kernel for M = 1).
  if (w.fmt == WeightFormat::FP8 && M > 4 && K % 128 == 0 && N % 16 == 0 && ldx % 4 == 0) {
    auto* q = static_cast<uint8_t*>(alloc(M * K));
    auto* sc = static_cast<float*>(alloc(4 * M * (K / 128)));
    cudaError_t e = cuda::quant_act_fp8(x, M, K, ldx, q, sc, s);
    if (e == cudaSuccess)
      e = cuda::gemm_fp8_block_lt(impl_->gemm, q, sc, M, K, static_cast<const uint8_t*>(w.w),
                                  static_cast<const float*>(w.scale), w.ldws, N, y, ldy, s);
    release(q);
    release(sc);
    check(e, "linear (fp8)");
    return;
  }
  auto* xb = static_cast<cuda::bf16*>(alloc(2 * M * K));  // [M, K] bf16
  cudaError_t e = cuda::f32_to_bf16_rows(x, M, K, ldx, xb, s);
  if (e == cudaSuccess && w.fmt == WeightFormat::BF16 && M > 4 && ldy % 8 == 0) {
    e = cuda::gemm_bf16_lt(impl_->gemm, xb, M, K, K, static_cast<const cuda::bf16*>(w.w), N, y, ldy, s);
    if (e == cudaErrorNotSupported) e = cuda::gemm_dq(cuda::AFmt::BF16, xb, nullptr, M, K, K, w.ref(), N, y, ldy, s);
  } else if (e == cudaSuccess) {
    e = cuda::gemm_dq(cuda::AFmt::BF16, xb, nullptr, M, K, K, w.ref(), N, y, ldy, s);
  }
  release(xb);
  check(e, "linear");
}
void CudaBackend::linear_swiglu(const float* x, int64_t M, int64_t ldx, const Weight& wt, float limit, float* act) {
  const auto& w = static_cast<const CudaWeight&>(wt);
  const int64_t K = w.K, N = w.N;
  // (as linear: gemv_e4m3 where it has a plan, fused where it has the fused plan)
  if (M > 0 && M <= 8 && (w.e4m3.fmt_ok || w.e4m3_swiglu.fmt_ok) && !impl_->off("fusecomp")) {
    if (!w.e4m3_swiglu.fmt_ok || limit <= 0.0f || ldx % 4 || (uintptr_t)x % 16)
      return Backend::linear_swiglu(x, M, ldx, wt, limit, act);
    HostTimer ht_(impl_.get(), Impl::kOp);
    if (impl_->replaying()) return;
    check(cuda::gemv_e4m3(w.e4m3_swiglu, x, M, ldx, act, N / 2, limit, impl_->e4m3_work, impl_->stream),
          "linear_swiglu (gemv e4m3)");
    return;
  }
  // linear()'s GEMV with its fused SwiGLU (the same bits as linear + swiglu_clamp); where linear takes
  // another kernel (the GEMMs, float32 weights, a v6 schedule of one tile a block) the two ops run.
  const GemvPick g = M > 0 ? pick_gemv(*impl_, w, M, x, ldx) : GemvPick::None;
  const bool fused = g == GemvPick::V3 || g == GemvPick::V4 ||
                     (g == GemvPick::V6 && cuda::gemv_q_v6_swiglu_ok(w.ref().fmt, N, K)) ||
                     (g == GemvPick::V8 && cuda::gemv_q_v8_swiglu_ok(w.ref().fmt, N, K));
  if (impl_->off("fusecomp") || !fused || N % 32 || limit <= 0.0f)
    return Backend::linear_swiglu(x, M, ldx, wt, limit, act);
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  const cudaStream_t s = impl_->stream;
  check(g == GemvPick::V8   ? cuda::gemv_q_v8_swiglu(x, M, K, ldx, w.ref(), N, limit, act, N / 2, s, &w.gemv)
        : g == GemvPick::V6 ? cuda::gemv_q_v6_swiglu(x, M, K, ldx, w.ref(), N, limit, act, N / 2, s, &w.gemv)
        : g == GemvPick::V3 ? cuda::gemv_q_v3_swiglu(x, M, K, ldx, w.ref(), N, limit, act, N / 2, s, &w.gemv)
                            : cuda::gemv_q_swiglu(x, M, K, ldx, w.ref(), N, limit, act, N / 2, s, &w.gemv),
        "linear_swiglu (gemv)");
}
void CudaBackend::rms_norm(const float* x, int64_t M, int64_t D, int64_t ld, const float* w, float eps, float* y) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  // DEEPINFER_CUDA_OFF=smallk: the previous small kernels (rms_norm, hc finish, route, combine, compress_pool)
  check((impl_->off("smallk") ? cuda::rms_norm_v1 : cuda::rms_norm)(x, M, D, ld, w, eps, y, nullptr, impl_->stream),
        "rms_norm");
}
void CudaBackend::rope(float* x, int64_t M, int64_t ld, int heads, int head_dim, int rope_dim, const int32_t* pos,
                       const float* inv_freq, bool inverse) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  check(cuda::rope(x, M, ld, heads, head_dim, rope_dim, pos, inv_freq, inverse, impl_->stream), "rope");
}
void CudaBackend::norm_rope(const NormRope* t, int n, int64_t M, const int32_t* pos, float eps, bool inverse) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  // One launch for all tensors (same bits as the unfused ops). DEEPINFER_CUDA_OFF=fuseattn, more than
  // kNormRopeMax tensors or a shape the kernel does not take: rms_norm, rope and copy_rows one by one.
  cuda::NormRopeTensor c[cuda::kNormRopeMax];
  bool fused = !impl_->off("fuseattn") && n <= cuda::kNormRopeMax;
  for (int i = 0; fused && i < n; ++i) {
    const NormRope& a = t[i];
    c[i] = {a.x, a.ld, a.heads, a.head_dim, a.x_rows, a.rows, a.norm, a.w, a.rope_dim, a.inv_freq, {a.out[0], a.out[1]},
            {a.out_ld[0], a.out_ld[1]}, {a.out_rows[0], a.out_rows[1]}};
    fused = cuda::norm_rope_supported(c[i]);
  }
  if (!fused) return Backend::norm_rope(t, n, M, pos, eps, inverse);
  check(cuda::norm_rope(c, n, M, pos, eps, inverse, impl_->stream), "norm_rope");
}
void CudaBackend::hc_pre(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                         const float* scale, int iters, float hc_eps, float norm_eps, float* u, float* post,
                         float* comb) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  // prefill (M ≥ 512, hc ≤ 4): the fused ticketed kernel, bitwise v3 (hc.cu "hcfast"); DEEPINFER_CUDA_OFF=hcfast:
  // the paths below; DEEPINFER_CUDA_OFF=hcfast_wide: its 128-thread form (same bits)
  if (!impl_->off("hcfast") && cuda::hc_pre_fast_use(M, hc, D)) {
    Buffer<int32_t> sync(*this, cuda::hc_pre_fast_sync_ints(M));
    check(cuda::hc_pre_fast(X, M, hc, D, fn, base, scale, iters, hc_eps, norm_eps, u, post, comb, sync.data(),
                            impl_->stream, impl_->off("hcfast_wide") ? 128 : 256),
          "hc_pre");
    return;
  }
  // decode (M ≤ 8, hc ≤ 4): one kernel with the fn slices read before griddepcontrol.wait, bitwise v3 (hc.cu
  // "hcdec"); DEEPINFER_CUDA_OFF=hcdec: v3's two kernels
  if (!impl_->off("hcdec") && cuda::hc_pre_dec_use(M, hc, D)) {
    check(cuda::hc_pre_dec(X, M, hc, D, fn, base, scale, iters, hc_eps, norm_eps, u, post, comb, impl_->hc_sync,
                           impl_->stream),
          "hc_pre");
    return;
  }
  // DEEPINFER_CUDA_OFF=hc_gemm: the v3 kernels for prefill too (hc.cu)
  check((impl_->off("smallk") ? cuda::hc_pre_v1 : cuda::hc_pre)(X, M, hc, D, fn, base, scale, iters, hc_eps, norm_eps, u,
                                                                post, comb, impl_->stream,
                     !impl_->off("hc_gemm")), "hc_pre");
}
void CudaBackend::hc_pre_norm(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                              const float* scale, int iters, float hc_eps, float norm_eps, float* u, float* post,
                              float* comb, const float* w, float eps, float* h) {
  // decode (hc_pre's hcdec path): the norm in the finisher blocks, bitwise rms_norm's kernel for D (hc.cu);
  // DEEPINFER_CUDA_OFF=hcnorm (or smallk, whose old rms_norm kernels have other bits): two launches
  if (impl_->off("hcdec") || impl_->off("hcnorm") || impl_->off("smallk") || !cuda::hc_pre_dec_use(M, hc, D) ||
      !cuda::hc_pre_dec_norm_ok(M, hc, D, u, w, h))
    return Backend::hc_pre_norm(X, M, hc, D, fn, base, scale, iters, hc_eps, norm_eps, u, post, comb, w, eps, h);
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  check(cuda::hc_pre_dec(X, M, hc, D, fn, base, scale, iters, hc_eps, norm_eps, u, post, comb, impl_->hc_sync,
                         impl_->stream, w, eps, h),
        "hc_pre");
}
void CudaBackend::hc_mix(const float* X, int64_t M, int hc, int64_t D, const float* w, const float* fn,
                         const float* base, const float* scale, int iters, float hc_eps, float norm_eps, float* u,
                         float* pre, float* post, float* comb) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  check(cuda::hc_mix(X, M, hc, D, w, fn, base, scale, iters, hc_eps, norm_eps, u, pre, post, comb, impl_->stream),
        "hc_mix");
}
void CudaBackend::kv_qdq(float* x, int64_t n, KvQdq format) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  check(cuda::kv_qdq(x, n, (int)format, impl_->stream), "kv_qdq");
}
void CudaBackend::engram_gate(float* X, int64_t M, int hc, int64_t D, const float* kv, const float* w, double eps) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  check(cuda::engram_gate(X, M, hc, D, kv, w, eps, impl_->stream), "engram_gate");
}
void CudaBackend::hc_post(const float* X, const float* y, const float* post, const float* comb, int64_t M, int hc,
                          int64_t D, float* out) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  // hcdec: more, smaller blocks and every load up front (bitwise hc_post_v1); DEEPINFER_CUDA_OFF=hcdec: v1
  check((impl_->off("hcdec") ? cuda::hc_post_v1 : cuda::hc_post)(X, y, post, comb, M, hc, D, out, impl_->stream),
        "hc_post");
}
void CudaBackend::hc_head(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                          const float* scale, float hc_eps, float norm_eps, float* u) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  check((impl_->off("smallk") ? cuda::hc_head_v1 : cuda::hc_head)(X, M, hc, D, fn, base, scale, hc_eps, norm_eps, u,
                                                                  impl_->stream),
        "hc_head");
}
void CudaBackend::sink_attention(const float* q, int64_t M, int64_t ldq, int H, int d, const float* win,
                                 const int32_t* win_lo, const int32_t* win_hi, const float* ent,
                                 const int32_t* ent_idx, const int64_t* ent_off, const float* sinks, float scale,
                                 float* out, int64_t ldo) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  // Stored weights: tensor cores (bf16 keys and P, f32 softmax and accumulation). Float32 mode keeps the
  // f32 kernel, which reproduces the CPU's order. DEEPINFER_CUDA_OFF=attn_mma switches the mma path off,
  // attn_mma2 takes its v1 kernel instead of v2 (same bits). Decode batches (M ≤ kAttDecMaxM) take attdec,
  // v2's bits on 8× the CTAs (so the choice by M keeps batch invariance); DEEPINFER_CUDA_OFF=attdec keeps v2.
  // Larger M at d = 512 take v3, v2's bits on warpgroup MMAs (DEEPINFER_CUDA_OFF=attn_v3 keeps v2; session 10:
  // −12 % attention time in a 4k prefill, docs/cuda-notes.md "Prefill attention v3"), by default as v3q: v3 with q
  // loaded once a cluster (the same bits; DEEPINFER_CUDA_OFF=attn_qshare keeps v3). Session 18: v3q 2-9 % faster
  // than v3 a call; v3qm (the key splits merged by remote stores) 8-10 % slower, deleted.
  if (impl_->weights == CudaWeights::Stored && !impl_->off("attn_mma") &&
      cuda::sink_attention_mma_supported(H, d, win, ent)) {
    auto* mma = impl_->off("attn_mma2")                               ? cuda::sink_attention_mma_v1
                : M <= cuda::kAttDecMaxM && !impl_->off("attdec") ? cuda::sink_attention_dec
                : d == 512 && !impl_->off("attn_v3") && impl_->off("attn_qshare") ? cuda::sink_attention_mma_v3
                : d == 512 && !impl_->off("attn_v3")              ? cuda::sink_attention_mma_v3q
                                                                      : cuda::sink_attention_mma;
    check(mma(q, M, ldq, H, d, win, win_lo, win_hi, ent, ent_idx, ent_off, sinks, scale, out, ldo, impl_->stream),
          "sink_attention (mma)");
    return;
  }
  check(cuda::sink_attention_f32(q, M, ldq, H, d, win, win_lo, win_hi, ent, ent_idx, ent_off, sinks, scale, out, ldo,
                                 impl_->stream),
        "sink_attention");
}
void CudaBackend::indexer_scores(const float* qI, const float* gamma, int64_t M, int hI, int dI, const float* K,
                                 const int32_t* key_rows, int64_t key_ld, int64_t n_keys, const int32_t* n_vis,
                                 float qk_scale, float* score) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  // Stored weights: tensor cores (q, K rounded to bf16; near-tie top-k choices may differ from f32).
  // Float32 mode keeps the f32 kernel, which reproduces the CPU oracle. Unsupported shapes fall back.
  // (Decode steps pass per-query lists, key_ld > 0, at every batch size, so a decode query's scores do not
  // depend on the batch; the tensor-core kernel takes them since session 6, DEEPINFER_CUDA_OFF=indexer_pq
  // sends them to the f32 kernel as before: 1 ms a call at b128 in s5.)
  if (impl_->weights == CudaWeights::Stored && !impl_->off("indexer_mma") && (key_ld == 0 || !impl_->off("indexer_pq"))) {
    const size_t ws = cuda::indexer_mma_workspace(M, n_keys, dI, key_ld);
    void* w = ws ? alloc((int64_t)ws) : nullptr;
    const cudaError_t e = cuda::indexer_scores_mma(qI, gamma, M, hI, dI, K, key_rows, key_ld, n_keys, n_vis, qk_scale,
                                                   score, w, impl_->stream);
    if (w) release(w);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotSupported) check(e, "indexer_scores (mma)");
  }
  check(cuda::indexer_scores_f32(qI, gamma, M, hI, dI, K, key_rows, key_ld, n_keys, n_vis, qk_scale, score,
                                 impl_->stream),
        "indexer_scores");
}
void CudaBackend::compress_windows(const float* ring_kv, const float* ring_gate, const float* kv, const float* gate,
                                   int64_t ld, int64_t p0, const float* ape, int m, int width, bool overlap,
                                   const int32_t* win_ids, const int32_t* ring_rows, int64_t nw, float* skv, float* sg) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  check(cuda::compress_windows(ring_kv, ring_gate, kv, gate, ld, p0, ape, m, width, overlap, win_ids, ring_rows, nw,
                               skv, sg,
                               impl_->stream),
        "compress_windows");
}
void CudaBackend::compress_pool(const float* kv, const float* gate, int64_t W, int S, int d, float* out) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  check((impl_->off("smallk") ? cuda::compress_pool_v1 : cuda::compress_pool)(kv, gate, W, S, d, out, impl_->stream),
        "compress_pool");
}
void CudaBackend::compress_emit(const float* ring_kv, const float* ring_gate, const float* kv, const float* gate,
                                int64_t ld, int64_t p0, const float* ape, int m, int width, bool overlap,
                                const int32_t* win_ids, const int32_t* ring_rows, int64_t nw, const float* norm_w,
                                float eps, int rope_dim, const int32_t* pos, const float* inv_freq, float* dst,
                                const int32_t* dst_rows) {
  if (nw <= 0) return;
  // (the kernel's shape conditions, checked here so that an unsupported shape takes the composition)
  const bool fits = width >= 4 && width <= 1024 && width % 4 == 0 && rope_dim % 2 == 0 && rope_dim <= width &&
                    (uintptr_t)dst % 16 == 0 && (uintptr_t)norm_w % 16 == 0;
  if (impl_->off("fusecomp") || !fits)
    return Backend::compress_emit(ring_kv, ring_gate, kv, gate, ld, p0, ape, m, width, overlap, win_ids, ring_rows, nw,
                                  norm_w, eps, rope_dim, pos, inv_freq, dst, dst_rows);
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  check(cuda::compress_emit(ring_kv, ring_gate, kv, gate, ld, p0, ape, m, width, overlap, win_ids, ring_rows, nw, norm_w,
                            eps, rope_dim, pos, inv_freq, dst, dst_rows, impl_->stream),
        "compress_emit");
}
void CudaBackend::swiglu_clamp(const float* gu, int64_t M, int64_t I, float limit, const float* row_scale,
                               float* act) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  check(cuda::swiglu_clamp(gu, M, I, limit, row_scale, act, nullptr, impl_->stream), "swiglu_clamp");
}


namespace {
// The routed experts of a layer. Packed (bf16 / fp8 / fp4 experts of one shape): one allocation per matrix
// kind, expert e at e·stride bytes, read by the grouped kernels with the expert ids on the device.
// Otherwise (float32 weights) the per-expert weights and a host loop over the routed experts.
struct CudaExperts final : Experts {
  std::vector<WeightPtr> w13, w2;
  bool packed = false;
  cuda::WeightRef r13{}, r2{};
  int64_t w13_stride = 0, s13_stride = 0, w2_stride = 0, s2_stride = 0;  // bytes
  cuda::GemvPlan plan13, plan2;  // gemv_q_grouped's launch plans (decode)
  ~CudaExperts() override {
    if (!packed) return;
    cudaFree(const_cast<void*>(r13.w));
    cudaFree(const_cast<void*>(r13.scale));
    cudaFree(const_cast<void*>(r2.w));
    cudaFree(const_cast<void*>(r2.scale));
  }
};

int64_t weight_bytes(const CudaWeight& w) {
  switch (w.fmt) {
    case WeightFormat::F32: return 4 * w.N * w.K;
    case WeightFormat::BF16: return 2 * w.N * w.K;
    case WeightFormat::FP8: return w.N * w.K;
    case WeightFormat::FP4: return w.N * w.K / 2;
  }
  return 0;
}
int64_t scale_bytes(const CudaWeight& w) {
  if (w.fmt == WeightFormat::FP8) return 4 * ((w.N + 127) / 128) * w.ldws;
  if (w.fmt == WeightFormat::FP4) return w.N * w.K / 32;
  return 0;
}
bool same_layout(const CudaWeight& a, const CudaWeight& b) {
  return a.fmt == b.fmt && a.N == b.N && a.K == b.K && a.ldws == b.ldws;
}
// Copies stored-format weights of one layout into one allocation (weight i at i·wstride bytes, its scales
// at i·sstride bytes in a second one); r describes weight 0 there.
void pack_weights(const std::vector<WeightPtr>& ws, cuda::WeightRef* r, int64_t* wstride, int64_t* sstride,
                  cudaStream_t stream) {
  const auto& w0 = static_cast<const CudaWeight&>(*ws[0]);
  *wstride = weight_bytes(w0);
  *sstride = scale_bytes(w0);
  void *w = nullptr, *sc = nullptr;
  check(cudaMalloc(&w, (size_t)(*wstride * (int64_t)ws.size())), "packed weight allocation");
  if (*sstride) check(cudaMalloc(&sc, (size_t)(*sstride * (int64_t)ws.size())), "packed scale allocation");
  for (size_t e = 0; e < ws.size(); ++e) {
    const auto& we = static_cast<const CudaWeight&>(*ws[e]);
    check(cudaMemcpyAsync(static_cast<char*>(w) + e * *wstride, we.w, (size_t)*wstride, cudaMemcpyDeviceToDevice,
                          stream),
          "weight packing");
    if (*sstride)
      check(cudaMemcpyAsync(static_cast<char*>(sc) + e * *sstride, we.scale, (size_t)*sstride,
                            cudaMemcpyDeviceToDevice, stream),
            "weight packing");
  }
  *r = w0.ref();
  r->w = w;
  r->scale = sc;
  check(cudaStreamSynchronize(stream), "weight packing");
}

// Block-diagonal groups: packed (one allocation, per-group views for the general path) when they are
// stored-format weights of one layout, else the weights as given.
constexpr int64_t kGroupsMaxT = 32;  // tokens of linear_groups' one-launch decode path
struct CudaGroups final : WeightGroups {
  std::vector<WeightPtr> w;  // per group (views into the pack when packed)
  bool packed = false;
  cuda::WeightRef r{};
  int64_t w_stride = 0, s_stride = 0;
  int32_t* sel = nullptr;  // [kGroupsMaxT, G]: sel[t, g] = g, gemv_q_grouped's "expert" ids
  cuda::GemvPlan plan;     // gemv_q_grouped's launch plan
  cuda::GemvE4m3Plan e4m3; // gemv_e4m3's (fp8, all groups in one launch)
  ~CudaGroups() override {
    w.clear();
    if (!packed) return;
    cudaFree(const_cast<void*>(r.w));
    cudaFree(const_cast<void*>(r.scale));
    cudaFree(sel);
  }
};
}  // namespace

WeightGroupsPtr CudaBackend::make_groups(std::vector<WeightPtr> ws) {
  auto g = std::make_unique<CudaGroups>();
  g->G = (int64_t)ws.size();
  g->N = ws.empty() ? 0 : ws[0]->N;
  g->K = ws.empty() ? 0 : ws[0]->K;
  bool pack = !ws.empty();
  for (size_t i = 0; pack && i < ws.size(); ++i) {
    const auto& a = static_cast<const CudaWeight&>(*ws[i]);
    pack = a.fmt != WeightFormat::F32 && same_layout(a, static_cast<const CudaWeight&>(*ws[0]));
  }
  if (!pack) {
    g->w = std::move(ws);
    return g;
  }
  pack_weights(ws, &g->r, &g->w_stride, &g->s_stride, impl_->stream);
  for (int64_t i = 0; i < g->G; ++i) {  // views for the per-group path
    auto v = std::make_unique<CudaWeight>();
    const auto& src = static_cast<const CudaWeight&>(*ws[i]);
    v->N = src.N, v->K = src.K, v->fmt = src.fmt, v->ldws = src.ldws, v->owned = false, v->gemv = src.gemv;
    v->w = static_cast<char*>(const_cast<void*>(g->r.w)) + i * g->w_stride;
    v->scale = g->s_stride ? static_cast<char*>(const_cast<void*>(g->r.scale)) + i * g->s_stride : nullptr;
    g->w.push_back(std::move(v));
  }
  ws.clear();
  std::vector<int32_t> sel(kGroupsMaxT * g->G);
  for (size_t i = 0; i < sel.size(); ++i) sel[i] = (int32_t)(i % g->G);
  check(cudaMalloc(&g->sel, sel.size() * sizeof(int32_t)), "groups allocation");
  check(cudaMemcpy(g->sel, sel.data(), sel.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "groups upload");
  check(cuda::gemv_q_plan(g->r, g->N, g->K, true, &g->plan), "gemv plan");
  if (impl_->off("v6_s8")) g->plan.v6_sched = 0;
  if (g->r.fmt == cuda::WFmt::FP8_B128)
    make_e4m3_plan(*impl_, g->r, g->N, g->K, (int)g->G, g->w_stride, g->s_stride, false, &g->e4m3);
  g->packed = true;
  return g;
}

void CudaBackend::linear_groups(const float* x, int64_t M, int64_t ldx, const WeightGroups& wg, float* y,
                                int64_t ldy) {
  const auto& g = static_cast<const CudaGroups&>(wg);
  const int64_t K = g.K, N = g.N;
  const int64_t kmul = g.packed ? (g.r.fmt == cuda::WFmt::BF16 ? 8 : g.r.fmt == cuda::WFmt::FP8_B128 ? 128 : 32) : 0;
  if (g.packed && !impl_->off("gemv_q") && M <= cuda::gemv_q_rows(g.r, K) && M <= kGroupsMaxT && ldx == g.G * K &&
      ldy == g.G * N && K % kmul == 0 && K % 4 == 0 && (uintptr_t)x % 16 == 0 && g.w_stride % 16 == 0 &&
      g.s_stride % 16 == 0) {
    // Decode: one launch; group g of token t is "slot" t·G + g, whose input row is x[t, g·K ..] (row stride K).
    HostTimer ht_(impl_.get(), Impl::kOp);
    if (impl_->replaying()) return;
    if (M <= 8 && g.e4m3.fmt_ok) {  // (as linear)
      check(cuda::gemv_e4m3(g.e4m3, x, M, ldx, y, ldy, 0.0f, impl_->e4m3_work, impl_->stream), "linear_groups (gemv e4m3)");
      return;
    }
    if (M <= 8 && impl_->on("gemv_v8") && v8_pick(g.r, N, K)) {  // (as in linear: opt-in)
      check(cuda::gemv_q_v8_groups(x, M, K, ldx, g.r, g.w_stride, g.s_stride, (int)g.G, N, y, ldy, impl_->stream,
                                   &g.plan),
            "linear_groups (gemv v8)");
      return;
    }
    if (M <= 8 && !impl_->off("gemv_v6") && cuda::gemv_q_v6_supported(g.r.fmt, K)) {  // (as in linear)
      check(cuda::gemv_q_v6_groups(x, M, K, ldx, g.r, g.w_stride, g.s_stride, (int)g.G, N, y, ldy, impl_->stream,
                                   &g.plan),
            "linear_groups (gemv v6)");
      return;
    }
    check((M <= 8 && !impl_->off("gemv_v3") ? cuda::gemv_q_grouped_v3 : cuda::gemv_q_grouped)(
              x, K, true, g.sel, M, (int)g.G, K, g.r, g.w_stride, g.s_stride, N, false, 0.0f, y, N, impl_->stream,
              &g.plan),
          "linear_groups");
    return;
  }
  for (int64_t i = 0; i < g.G; ++i) linear(x + i * K, M, ldx, *g.w[i], y + i * N, ldy);
}

ExpertsPtr CudaBackend::make_experts(std::vector<WeightPtr> w13, std::vector<WeightPtr> w2) {
  auto ex = std::make_unique<CudaExperts>();
  ex->E = (int64_t)w13.size();
  ex->I = w13.empty() ? 0 : w13[0]->N / 2;
  ex->D = w13.empty() ? 0 : w13[0]->K;
  bool pack = !w13.empty() && w13.size() == w2.size();
  for (size_t e = 0; pack && e < w13.size(); ++e) {
    const auto &a = static_cast<const CudaWeight&>(*w13[e]), &b = static_cast<const CudaWeight&>(*w2[e]);
    pack = a.fmt != WeightFormat::F32 && b.fmt != WeightFormat::F32 &&
           same_layout(a, static_cast<const CudaWeight&>(*w13[0])) &&
           same_layout(b, static_cast<const CudaWeight&>(*w2[0])) && a.K % 64 == 0 && b.K % 64 == 0 &&
           a.N % 8 == 0 && b.N % 8 == 0 && b.N % 4 == 0;
  }
  if (!pack) {
    ex->w13 = std::move(w13);
    ex->w2 = std::move(w2);
    return ex;
  }
  pack_weights(w13, &ex->r13, &ex->w13_stride, &ex->s13_stride, impl_->stream);
  pack_weights(w2, &ex->r2, &ex->w2_stride, &ex->s2_stride, impl_->stream);
  w13.clear();  // the per-expert copies go
  w2.clear();
  check(cuda::gemv_q_plan(ex->r13, 2 * ex->I, ex->D, true, &ex->plan13), "gemv plan");
  check(cuda::gemv_q_plan(ex->r2, ex->D, ex->I, true, &ex->plan2), "gemv plan");
  ex->packed = true;
  return ex;
}

void CudaBackend::moe_route(const float* logits, int64_t T, int E, int K, RouteScoring scoring, const float* bias,
                            const int32_t* tid2eid, const int32_t* tokens, bool normalize, float route_scale,
                            int32_t* sel, float* wsel) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  const cuda::Scoring sc = scoring == RouteScoring::Sigmoid   ? cuda::Scoring::Sigmoid
                           : scoring == RouteScoring::Softmax ? cuda::Scoring::Softmax
                                                              : cuda::Scoring::SqrtSoftplus;
  check((impl_->off("smallk") ? cuda::moe_route_v1 : cuda::moe_route)(logits, T, E, K, sc, bias, tid2eid, tokens,
                                                                      normalize, route_scale, sel, wsel, impl_->stream),
        "moe_route");
}

void CudaBackend::moe_ffn(const float* h, int64_t T, const Experts& exb, const int32_t* sel, const float* wsel, int K,
                          float limit, const float* shared, float* out) {
  // The shared expert's output goes into the combine (one add after the routed sum: add_rows' bits);
  // DEEPINFER_CUDA_OFF=fusecomp: an add_rows after the routed experts, as before.
  const bool fuse_add = shared && !impl_->off("fusecomp");
  moe_ffn_routed(h, T, exb, sel, wsel, K, limit, fuse_add ? shared : nullptr, out, shared != nullptr);
  if (shared && !fuse_add && T > 0) add_rows(shared, T, exb.D, nullptr, nullptr, out);
}

void CudaBackend::moe_ffn_routed(const float* h, int64_t T, const Experts& exb, const int32_t* sel, const float* wsel,
                                 int K, float limit, const float* shared, float* out, bool after_shared) {
  const auto& ex = static_cast<const CudaExperts&>(exb);
  const int64_t E = ex.E, D = ex.D, I = ex.I, S = T * K;
  if (T <= 0) return;
  cudaStream_t s = impl_->stream;
  if (ex.packed && !impl_->off("moe_gemv") && T <= 8 && I % 32 == 0 && ex.w13_stride % 16 == 0 && ex.w2_stride % 16 == 0 &&
      ex.s13_stride % 16 == 0 && ex.s2_stride % 16 == 0) {
    // Decode: one grouped GEMV per matrix kind reads the expert ids on the device; w13's SwiGLU is fused.
    HostTimer ht_(impl_.get(), Impl::kOp, "moe_ffn");  // (the profile's name)
    if (impl_->replaying()) return;
  if (impl_->replaying()) return;
    Buffer<float> act(*this, S * I), ye(*this, S * D);  // slot order
    auto gemv = impl_->off("gemv_v3") ? cuda::gemv_q_grouped : cuda::gemv_q_grouped_v3;  // (as in linear)
    // fp4 experts: moe_gemv2 (DEEPINFER_CUDA_OFF=moe_gemv2: the gemv above), for both matrices or neither
    auto g13 = gemv, g2 = gemv;
    bool early = false;
    if (!impl_->off("moe_gemv2") && cuda::moe_gemv2_ok(ex.r13, T, K, 2 * I, D, ex.w13_stride, ex.s13_stride) &&
        cuda::moe_gemv2_ok(ex.r2, T, K, D, I, ex.w2_stride, ex.s2_stride)) {
      g13 = g2 = impl_->off("moe_blocks") ? cuda::moe_gemv2_rows : cuda::moe_gemv2;  // (same bits)
      early = !impl_->off("moe_blocks") && !impl_->off("moe_early");
    }
    // moe_early (the same bits; DEEPINFER_CUDA_OFF=moe_early): work before the PDL wait. w13, when the shared
    // expert's two launches came between the routing and here: the routing, x (= h) and the first ring
    // stages (s8-run3: 31 layers b1 6.71 vs 6.91 ms). w2 (w13 came in between; its x is w13's output): one
    // stage before the wait, x and the rest after it (DEEPINFER_CUDA_OFF=moe_early_w2: none).
    const int early13 = early && after_shared ? 2 : 0, early2 = early && !impl_->off("moe_early_w2") ? 1 : 0;
    // w2 (K = I = 2048) in 64-row items (the same bits; DEEPINFER_CUDA_OFF=moe_wide: 32-row items)
    const bool wide = !impl_->off("moe_wide");
    // moe_gemv2_fp8: moe_gemv2 on e4m3 wgmma, x quantized per 128-k block as DeepSeek's inference does (its own
    // numerics; "MoE decode experts on fp8 MMAs" in the notes: s12-run6, 31 layers, two rounds in one call, b1
    // 6.07 / 6.07 against 6.15 / 6.15 ms, b8 11.25 / 11.21 against 11.45 / 11.42). DEEPINFER_CUDA_OFF=moe_gemv_fp8:
    // moe_gemv2 (bf16 x)
    const bool f8 = g13 == cuda::moe_gemv2 && !impl_->off("moe_gemv_fp8") &&
                    cuda::moe_gemv2_fp8_ok(ex.r13, T, K, 2 * I, D, ex.w13_stride, ex.s13_stride) &&
                    cuda::moe_gemv2_fp8_ok(ex.r2, T, K, D, I, ex.w2_stride, ex.s2_stride);
    const auto early_fn = f8 ? cuda::moe_gemv2_fp8 : cuda::moe_gemv2_early;
    cudaError_t e = early13 || f8 ? early_fn(h, D, false, sel, T, K, D, ex.r13, ex.w13_stride, ex.s13_stride, 2 * I, true,
                                             limit, act.data(), I, early13, s, &ex.plan13, true)
                                  : g13(h, D, false, sel, T, K, D, ex.r13, ex.w13_stride, ex.s13_stride, 2 * I, true,
                                        limit, act.data(), I, s, &ex.plan13);
    if (e == cudaSuccess)
      e = g2 == cuda::moe_gemv2
              ? early_fn(act.data(), I, true, sel, T, K, I, ex.r2, ex.w2_stride, ex.s2_stride, D, false, 0.0f, ye.data(),
                         D, early2, s, &ex.plan2, wide)
              : g2(act.data(), I, true, sel, T, K, I, ex.r2, ex.w2_stride, ex.s2_stride, D, false, 0.0f, ye.data(), D,
                   s, &ex.plan2);
    if (e == cudaSuccess) e = (impl_->off("smallk") ? cuda::moe_combine_v1 : cuda::moe_combine)(
                                ye.data(), sel, wsel, nullptr, T, K, D, shared, out, s);
    check(e, "moe_ffn (decode)");
    return;
  }
  if (ex.packed && !impl_->off("moe_grouped") && E <= 1024 && limit > 0.0f &&
      cuda::moe_expert_gemm_ok(ex.r13.fmt, 2 * I, D, true) &&
      cuda::moe_expert_gemm_ok(ex.r2.fmt, D, I, false) && ex.w13_stride % 16 == 0 && ex.w2_stride % 16 == 0 &&
      ex.s13_stride % 16 == 0 && ex.s2_stride % 16 == 0) {
    // T > 8 (decode batches, prefill): parallel grouping → bf16 h → grouped w13 with the SwiGLU fused (bf16
    // act in grouped order) → grouped w2 → combine (a token's experts in ascending id). Each expert's
    // weights are read once per row tile (moe_grouped.cu). DEEPINFER_CUDA_OFF=moe_grouped: the path below.
    HostTimer ht_(impl_.get(), Impl::kOp, "moe_ffn");
    if (impl_->replaying()) return;
    // prefill (T ≥ 2048) with fp4 experts: 128-row tiles, on the fp8 kernels below or the bf16 wgmma kernel
    // (DEEPINFER_CUDA_OFF=moe_wgmma: 64-row tiles, mma.sync)
    const bool wide = ex.r13.fmt == cuda::WFmt::FP4_B32 && ex.r2.fmt == cuda::WFmt::FP4_B32 && !impl_->off("moe_wgmma");
    const int tm = cuda::moe_grouped_tile_m(T, wide);
    const int64_t maxt = cuda::moe_max_tiles(S, (int)E, tm);
    Buffer<int32_t> offsets(*this, E + 1), perm(*this, S), slot(*this, S), n_tiles(*this, 1), tiles(*this, 2 * maxt),
        scratch(*this, cuda::moe_group_scratch_ints(S, (int)E));
    Buffer<cuda::bf16> act(*this, S * I);
    Buffer<float> ye(*this, S * D);
    cudaError_t e = cuda::moe_group_par(sel, T, K, (int)E, tm, offsets.data(), perm.data(), slot.data(),
                                        reinterpret_cast<int2*>(tiles.data()), n_tiles.data(), scratch.data(), s);
    const int2* tl = reinterpret_cast<const int2*>(tiles.data());
    // 128-row tiles (prefill, T ≥ 2048, fp4): the fp8 expert kernels (moe_fp8.cu): x and act quantized to e4m3
    // per 128-k block as DeepSeek's own inference does, e4m3 MMAs (DEEPINFER_CUDA_OFF=moe_fp8: the bf16 wgmma kernel)
    const bool fp8 = tm == 128 && !impl_->off("moe_fp8") && cuda::moe_expert_fp8_ok(ex.r13.fmt, 2 * I, D, true) &&
                     cuda::moe_expert_fp8_ok(ex.r2.fmt, D, I, false) && reinterpret_cast<uintptr_t>(h) % 16 == 0;
    if (fp8) {
      // the register-A kernel on a persistent grid (DEEPINFER_CUDA_OFF=moe_fp8_persist: on a grid of blocks, 2-4 %
      // slower in s15-run1); DEEPINFER_CUDA_ON=moe_fp8_ws: the warp-specialized one (13-19 % slower in session 14).
      // All three give the same bits.
      const int fk = impl_->on("moe_fp8_ws") ? 1 : impl_->off("moe_fp8_persist") ? 0 : 2;
      Buffer<uint8_t> xq(*this, T * D), aq(*this, S * I);
      Buffer<float> xs(*this, T * (D / 128)), as(*this, S * (I / 128));
      if (e == cudaSuccess) e = cuda::moe_quant_fp8(h, T, D, D, xq.data(), xs.data(), s);
      if (e == cudaSuccess)
        e = cuda::moe_expert_gemm_fp8(xq.data(), xs.data(), perm.data(), D, ex.r13, ex.w13_stride, ex.s13_stride, 2 * I,
                                      true, limit, tl, n_tiles.data(), maxt, offsets.data(), act.data(), I, s, fk, impl_->moe_ctr);
      if (e == cudaSuccess) e = cuda::moe_quant_fp8_bf16(act.data(), S, I, I, aq.data(), as.data(), s);
      if (e == cudaSuccess)
        e = cuda::moe_expert_gemm_fp8(aq.data(), as.data(), nullptr, I, ex.r2, ex.w2_stride, ex.s2_stride, D, false,
                                      0.0f, tl, n_tiles.data(), maxt, offsets.data(), ye.data(), D, s, fk, impl_->moe_ctr);
    } else {
      // fp4 weights take their x in e2m1 pair order (moe_grouped.h): h converted so, act written so; the
      // 128-row tiles (both fp4, the wgmma kernels) in wg order
      const bool p13 = ex.r13.fmt == cuda::WFmt::FP4_B32, p2 = ex.r2.fmt == cuda::WFmt::FP4_B32;
      const int o13 = tm == 128 ? 2 : p13 ? 1 : 0, o2 = tm == 128 ? 2 : p2 ? 1 : 0;
      Buffer<cuda::bf16> hb(*this, T * D);
      if (e == cudaSuccess) e = cuda::moe_x_to_bf16(h, T, D, D, o13, hb.data(), s);
      if (e == cudaSuccess)
        e = cuda::moe_expert_gemm(hb.data(), D, perm.data(), D, ex.r13, ex.w13_stride, ex.s13_stride, 2 * I, true, limit,
                                  o2, tl, n_tiles.data(), maxt, offsets.data(), tm, act.data(), I, s);
      if (e == cudaSuccess)
        e = cuda::moe_expert_gemm(act.data(), I, nullptr, I, ex.r2, ex.w2_stride, ex.s2_stride, D, false, 0.0f, 0, tl,
                                  n_tiles.data(), maxt, offsets.data(), tm, ye.data(), D, s);
    }
    if (e == cudaSuccess) e = (impl_->off("smallk") ? cuda::moe_combine_v1 : cuda::moe_combine)(
                                ye.data(), sel, wsel, slot.data(), T, K, D, shared, out, s);
    check(e, fp8 ? "moe_ffn (grouped experts, fp8)" : "moe_ffn (grouped experts)");
    return;
  }
  if (ex.packed) {
    // Fallback (DEEPINFER_CUDA_OFF=moe_grouped, or shapes moe_expert_gemm does not take):
    // route groups → bf16 h → grouped w13 (gathered rows) → SwiGLU (bf16 act) → grouped w2 → combine
    // (a token's experts summed in ascending id). No host round trip.
    HostTimer ht_(impl_.get(), Impl::kOp, "moe_ffn");
    if (impl_->replaying()) return;
  if (impl_->replaying()) return;
    const int64_t maxt = cuda::moe_max_tiles(S, (int)E, 64);
    Buffer<int32_t> offsets(*this, E + 1), perm(*this, S), slot(*this, S), n_tiles(*this, 1), tiles(*this, 2 * maxt);
    Buffer<cuda::bf16> hb(*this, T * D), act(*this, S * I);
    Buffer<float> gu(*this, S * 2 * I), ye(*this, S * D);
    cudaError_t e = cuda::moe_group(sel, T, K, (int)E, 64, offsets.data(), perm.data(), slot.data(),
                                    reinterpret_cast<int2*>(tiles.data()), n_tiles.data(), s);
    if (e == cudaSuccess) e = cuda::f32_to_bf16_rows(h, T, D, D, hb.data(), s);
    if (e == cudaSuccess)
      e = cuda::gemm_grouped(hb.data(), D, perm.data(), D, ex.r13, ex.w13_stride, ex.s13_stride, 2 * I,
                             reinterpret_cast<const int2*>(tiles.data()), n_tiles.data(), maxt, offsets.data(),
                             gu.data(), 2 * I, s);
    if (e == cudaSuccess) e = cuda::swiglu_clamp(gu.data(), S, I, limit, nullptr, nullptr, act.data(), s);
    if (e == cudaSuccess)
      e = cuda::gemm_grouped(act.data(), I, nullptr, I, ex.r2, ex.w2_stride, ex.s2_stride, D,
                             reinterpret_cast<const int2*>(tiles.data()), n_tiles.data(), maxt, offsets.data(),
                             ye.data(), D, s);
    if (e == cudaSuccess) e = (impl_->off("smallk") ? cuda::moe_combine_v1 : cuda::moe_combine)(
                                ye.data(), sel, wsel, slot.data(), T, K, D, shared, out, s);
    check(e, "moe_ffn");
    return;
  }
  // Float32 experts: the routing comes to the host and each routed expert is a GEMM pair over its tokens,
  // in the CPU backend's order (the float32 path reproduces the CPU oracle).
  std::vector<int32_t> sel_h(S);
  std::vector<float> w_h(S);
  download(sel_h.data(), sel, 4 * S);
  download(w_h.data(), wsel, 4 * S);
  moe_ffn_loop(*this, h, T, D, I, ex.w13, ex.w2, sel_h.data(), w_h.data(), K, limit, out);
  if (shared) add_rows(shared, T, D, nullptr, nullptr, out);  // (after the loop's adds: the CPU's order)
}

void CudaBackend::argmax_rows(const float* x, int64_t M, int64_t N, int64_t ld, int32_t* out) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  if (M > 0) check(cuda::argmax_rows(x, M, N, ld, out, impl_->stream), "argmax_rows");
}

void CudaBackend::sample_rows(float* x, int64_t M, int64_t N, int64_t ld, const SampleSpec* spec, const RowEdits* rows,
                              const LogitEdit* edits, float* edit_raw, const int32_t* tokens, int32_t* out) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  if (M > 0)
    check(cuda::sample_rows(x, M, N, ld, spec, rows, edits, edit_raw, tokens, out, impl_->stream), "sample_rows");
}

void CudaBackend::mask_rows(float* x, int64_t M, int64_t N, int64_t ld, const RowEdits* rows, const uint32_t* masks) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  if (M > 0) check(cuda::mask_rows(x, M, N, ld, rows, masks, impl_->stream), "mask_rows");
}
// Not yet run on a GPU (session 19): opt-in until its op cases and the engine's checks pass there
// (DEEPINFER_CUDA_ON=devmasks); off, the engine samples structured rows on the host from their logits.
bool CudaBackend::masks_on_backend() const { return impl_->on("devmasks"); }

void CudaBackend::logprob_rows(float* x, int64_t M, int64_t N, int64_t ld, const SampleSpec* spec, const RowEdits* rows,
                               const LogitEdit* edits, const float* edit_raw, const int32_t* picks, RowLogprobs* out) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  if (M > 0) check(cuda::logprob_rows(x, M, N, ld, spec, rows, edits, edit_raw, picks, out, impl_->stream), "logprob_rows");
}
// Not yet run on a GPU (written in session 19 without one): opt-in until the op cases and the engine's checks
// pass there (DEEPINFER_CUDA_ON=devlogprobs); off, the engine computes logprobs on the host from the rows.
bool CudaBackend::logprobs_on_backend() const { return impl_->on("devlogprobs"); }

void CudaBackend::feed_tokens(int32_t* pack, int64_t T, int hc, const int32_t* feed, const int32_t* picks,
                              int64_t V) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  if (T > 0) check(cuda::feed_tokens(pack, T, hc, feed, picks, V, impl_->stream), "feed_tokens");
}

void CudaBackend::select_topk(const float* score, int64_t M, int64_t n, const int32_t* n_vis, int topk,
                              const int32_t* rowmap, int64_t rowmap_ld, const int64_t* out_off, int32_t* out) {
  HostTimer ht_(impl_.get(), Impl::kOp);
  if (impl_->replaying()) return;
  if (M <= 0) return;
  Buffer<int32_t> idx(*this, M * topk), count(*this, M);
  cudaError_t e = cuda::topk_rows(score, M, n, n, n_vis, topk, idx.data(), count.data(), impl_->stream);
  if (e == cudaSuccess) e = cuda::map_topk(idx.data(), count.data(), M, topk, rowmap, rowmap_ld, out_off, out, impl_->stream);
  check(e, "select_topk");
}

}  // namespace deepinfer
