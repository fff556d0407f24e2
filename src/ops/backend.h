#pragma once
// The op set the DeepSeek-V4 forward pass is written in. Every op takes plain parameters (raw
// pointers, sizes, strides) so that a CUDA backend implements the same table with device pointers;
// the CPU backend (ops/cpu) is the correctness oracle for it. All tensors are float32, row-major;
// shapes are given next to each parameter.
//
// Batch invariance: every op computes a row from that row's inputs with a reduction order that does
// not depend on how many other rows are in the call, so a sequence gives bitwise the same result
// alone or inside any batch.
//
// Memory: every pointer an op takes lives in the backend's memory (host for the CPU backend, device
// for CUDA). The model allocates it through alloc()/Buffer<T> and crosses to the host only through
// upload()/download(), so one forward pass serves both backends. Ops run in submission order (one
// stream); download() waits for everything before it.
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ops/sampling.h"
#include "util/kernel_timeline.h"

namespace deepinfer {

// DeepSeek-V4.1's KV QAT formats (Backend::kv_qdq). Scales: pow2 = 2^ceil(log2(amax / max_code)),
// amax floored (1e-4 for FP8, 6·2^-126 for FP4); e4m3 = amax/6 (floored at 6·2^-9) cast to E4M3.
enum class KvQdq : int {
  Fp8Pow2x32 = 0,  // FP8 E4M3 values, power-of-two scale per 32 (sliding KV)
  Fp4Pow2x32 = 1,  // FP4 E2M1 values, power-of-two scale per 32 (index queries and keys)
  Fp4E4m3x16 = 2,  // FP4 E2M1 values, E4M3 scale per 16 (compressed KV entries)
};
inline int kv_qdq_block(KvQdq f) { return f == KvQdq::Fp4E4m3x16 ? 16 : 32; }

// Decode batch sizes padded to 1, 2, 4, 8, then multiples of 8 to 64, of 32 to 256, of 64 beyond (a
// backend's decode_rows may use it): the CUDA kernels' switch points (GEMV 8 | 9 and 32 | 33 rows,
// expert tiles at 16 and 256 tokens) are bucket edges, so a padded step takes the unpadded one's kernels.
inline int64_t decode_bucket(int64_t B) {
  if (B <= 8) {
    int64_t b = 1;
    while (b < B) b *= 2;
    return b;
  }
  const int64_t q = B <= 64 ? 8 : B <= 256 ? 32 : 64;
  return (B + q - 1) / q * q;
}

// A weight matrix W[N, K] (row-major [out, in]) in the backend's own layout: repacked for the CPU
// kernel, resident in device memory (and possibly bf16/fp8) for CUDA.
class Weight {
 public:
  virtual ~Weight() = default;
  int64_t N = 0, K = 0;
};
using WeightPtr = std::unique_ptr<Weight>;

// A weight as a checkpoint stores it (host memory, read-only view), for backends that compute on the
// stored format directly instead of a float32 copy (the CUDA fast path: bf16 / fp8 / fp4 GEMMs).
enum class WeightFormat : uint8_t {
  F32,   // data: float [N, K]
  BF16,  // data: bf16 bits (uint16) [N, K]
  FP8,   // data: e4m3fn bytes [N, K]; scale: float [ceil(N/block_rows), ceil(K/block_cols)] (block scales)
  FP4,   // data: e2m1 pairs [N, K/2] (element 2k = low nibble); scale: e8m0 bytes [N, K/32] as uint8
};
struct StoredWeight {
  WeightFormat fmt = WeightFormat::F32;
  int64_t N = 0, K = 0;         // logical shape [N, K]
  const void* data = nullptr;
  const void* scale = nullptr;  // FP8: float grid; FP4: uint8 e8m0; null otherwise
  int block_rows = 0, block_cols = 0;  // FP8 block-scale tile
};

// The routed experts of one MoE layer in the backend's layout (the CUDA backend packs them into one
// strided allocation per matrix kind so that a grouped kernel reads any expert by id).
class Experts {
 public:
  virtual ~Experts() = default;
  int64_t E = 0, I = 0, D = 0;  // experts, intermediate width, hidden width
};
using ExpertsPtr = std::unique_ptr<Experts>;

enum class RouteScoring : uint8_t { SqrtSoftplus, Sigmoid, Softmax };

// G weights of one shape [N, K] applied block-diagonally (V4's grouped output projection wo_a).
class WeightGroups {
 public:
  virtual ~WeightGroups() = default;
  int64_t G = 0, N = 0, K = 0;
};
using WeightGroupsPtr = std::unique_ptr<WeightGroups>;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // ---- memory (bytes) ----
  virtual void* alloc(int64_t bytes) = 0;  // uninitialized; null for 0 bytes; throws Error when out of memory
  virtual void release(void* p) = 0;
  virtual void upload(void* dst, const void* host_src, int64_t bytes) = 0;    // host → backend
  virtual void download(void* host_dst, const void* src, int64_t bytes) = 0;  // backend → host, synchronous
  // The same into host memory the backend owns (reused; valid until the next download_view): for large
  // results read once on the host (a step's logits). CUDA: page-locked memory, so the copy runs at the
  // link's speed instead of a pageable copy's.
  virtual const void* download_view(const void* src, int64_t bytes) {
    if ((int64_t)view_.size() < bytes) view_.resize((size_t)bytes);
    download(view_.data(), src, bytes);
    return view_.data();
  }
  // An early read of a launched step's small outputs (its picks): stage(slot, src, bytes) queues their copy to
  // host memory after the work launched so far and returns at once; staged(slot) waits for that copy only, not
  // for work launched after it (the next step), and returns the host copy, valid until the slot is staged
  // again. Slots 0 and 1. Host backends copy at stage() (their work is done when an op returns).
  virtual void stage(int slot, const void* src, int64_t bytes) {
    std::vector<char>& s = staged_.at((size_t)slot);
    s.resize((size_t)bytes);
    if (bytes > 0) download(s.data(), src, bytes);
  }
  virtual const void* staged(int slot) { return staged_.at((size_t)slot).data(); }
  virtual void copy(void* dst, const void* src, int64_t bytes) = 0;           // backend → backend
  // Bytes of backend memory still free (−1: host memory, no separate budget).
  virtual int64_t free_memory() const { return -1; }
  // Waits for all submitted work (a no-op on the CPU).
  virtual void synchronize() {}

  // ---- profiling (deepinfer bench --profile) ----
  // While on, the backend times each outermost call on the device (event pairs; adds host time per
  // call, so time steps with it off; a graph region recorded while profiling carries an event pair per op,
  // so its ops are timed from inside the graph). take_profile() returns the totals since the last take, per op
  // name (ops sorted by time), and resets them. busy = Σ op device time; gaps = device time between
  // one op's end and the next op's start inside the window (the device idles there). Backends
  // without a device return an empty profile.
  struct OpTime {
    std::string op;
    int64_t calls = 0;
    double ms = 0;
    double gap_ms = 0;  // device idle just before this op's calls (what the host did before launching it)
  };
  struct Profile {
    std::vector<OpTime> ops;
    double busy_ms = 0, gap_ms = 0;
    int64_t calls = 0;
    int64_t graph_steps = 0;  // graph regions (graph_begin) among them, timed op by op inside the graph
    double graph_gap_ms = 0;  // device idle before a graph's first op (between steps), summed over
    int64_t graph_gaps = 0;   // the graphs that had something before them in the profiled window
  };
  virtual void set_profiling(bool) {}
  virtual Profile take_profile() { return {}; }
  // Kernel timeline (a backend with a device and a tracer: CUDA through CUPTI, ops/cuda/kernel_trace.h): from
  // kernel_trace_start on, every kernel the process runs is recorded as it is launched (graph replays and their
  // programmatic edges untouched), and those that start while kernel_trace_window(true) is open are kept;
  // take_kernel_trace() returns them by start time and forgets them. Start it before any graph is recorded.
  // false (and *why) where there is none; the other two then do nothing.
  virtual bool kernel_trace_start(std::string* why) {
    if (why) *why = std::string("no kernel tracer on the ") + name() + " backend";
    return false;
  }
  virtual void kernel_trace_window(bool /*open*/) {}
  virtual std::vector<KernelRecord> take_kernel_trace() { return {}; }

  // ---- concurrent chains in a recorded step ----
  // After fork(), ops go to a side chain that starts after everything before the fork; to_main() returns to the
  // main chain, whose ops then run beside the side chain's; join() makes what follows wait for both (the side
  // chain's last ops complete before the joining op starts: no early start across the join). Results are those
  // of the same ops in order. Backend memory freed between fork and join is not reused before join. Only graph
  // regions may run chains side by side (CUDA: DEEPINFER_CUDA_ON=branches, decode steps of ≤ 8 tokens, whose
  // GEMVs need no workspace); elsewhere the calls do nothing. Call them only where chains_side_by_side says so.
  virtual void fork() {}
  virtual void to_main() {}
  virtual void join() {}
  // Whether a step of `rows` tokens should fork side chains now (the caller forks only then, and may order its ops
  // for it: the same answer while a recorded step is captured and while it is replayed). Between fork and join the
  // caller allocates nothing after a side-chain op (a replay must allocate as its capture did).
  virtual bool chains_side_by_side(int64_t /*rows*/) const { return false; }

  // ---- step graphs (CUDA graphs; the decode step) ----
  // graph_begin(key) opens a region whose backend calls — ops, their sizes, the buffers they touch and
  // the order of allocations and uploads — the caller guarantees to be a function of `key` alone; only
  // the bytes uploaded change from one region to the next. The backend may then record the region once
  // (Capture: nothing runs until graph_end) and afterwards replay it (Replay: ops are not issued again,
  // uploads refresh the recorded copies, allocations must come out as recorded), launching the whole
  // region at graph_end. Off: the calls run as usual and graph_end does nothing. Downloads are not
  // allowed inside a region (they throw in Capture/Replay). When a call throws inside a Capture/Replay
  // region nothing has run yet: the caller calls graph_abort(why) (the key is not captured again; the
  // backend says why on stderr, a few times) and reruns the region with graphs off.
  // Callers key their regions with an id of their own from here (unique for the backend's lifetime),
  // plus every pointer the region bakes in that may change (a model's cache).
  uint64_t new_graph_owner() { return ++graph_owners_; }
  // Rows a decode step of B sequences should have: B, or a bucket above it (fewer distinct graphs;
  // the model pads with stand-in rows when this is larger).
  virtual int64_t decode_rows(int64_t B) const { return B; }
  enum class GraphMode { Off, Capture, Replay };
  virtual GraphMode graph_begin(uint64_t /*key*/) { return GraphMode::Off; }
  virtual void graph_end() {}
  virtual void graph_abort(const char* /*why*/) {}
  // Pipelined steps (a decode step's host work overlapping the previous step on the device):
  // graph_ready() ends a Capture/Replay region like graph_end but launches nothing; graph_launch(src,
  // bytes) then replaces the first `bytes` bytes of the region's first upload (a step's token ids, known only once
  // the previous step has been sampled; null: keep them) and launches it. Between the two, no other region
  // may begin and nothing else is launched but plain uploads (ordered before the launch: a step's logit
  // edits, whose size is not part of the key). The region's own buffers are free for the caller's next
  // region (the arena), so its outputs stay valid only until the next launch.
  virtual void graph_ready() {}
  virtual void graph_launch(const void* /*first_upload*/, int64_t /*bytes*/) {}
  // Forgets a readied region without launching it (its step was abandoned: the caller fails its requests).
  virtual void graph_unready() {}

  // ---- data movement (float32 rows) ----
  virtual void fill(float* x, int64_t n, float v) = 0;
  virtual void scale(float* x, int64_t n, float a) = 0;  // x *= a
  // dst[drow(i), 0..width) = src[srow(i), 0..width) for i < n, srow(i) = src_rows ? src_rows[i] : i
  // (row stride lds), drow likewise (ldd). Destination rows must be distinct; no overlap of src and dst.
  // Rows i with dst_rows[i] < 0 are skipped (a fixed-size decode step scatters only what it has).
  virtual void copy_rows(const float* src, int64_t lds, const int32_t* src_rows, float* dst, int64_t ldd,
                         const int32_t* dst_rows, int64_t n, int64_t width) = 0;
  // Ring buffers of R rows indexed by position mod R (row stride = width):
  //  ring_write: ring[(p0 + i) % R] = src[i] (row stride lds) for the last min(n, R) of n rows;
  //  ring_read:  dst[i] = ring[(t0 + i) % R] for i < n (dst contiguous, n ≤ R).
  virtual void ring_write(const float* src, int64_t lds, int64_t n, int64_t width, int64_t p0, float* ring,
                          int64_t R) = 0;
  virtual void ring_read(const float* ring, int64_t R, int64_t width, int64_t t0, int64_t n, float* dst) = 0;
  // dst[drow(i), c] += w[i] · src[i, c] (or += src[i, c] when w is null); src [n, width] contiguous,
  // drow(i) = dst_rows ? dst_rows[i] : i (row stride width). Rows are applied in order i = 0, 1, ...;
  // destination rows must be distinct within one call.
  virtual void add_rows(const float* src, int64_t n, int64_t width, const float* w, const int32_t* dst_rows,
                        float* dst) = 0;
  // Several copy_rows with one source row list (a step's pushes of one projection's column slices into
  // their rings): for every set k < nsets (≤ 4), copy_rows(src + sets[k].col, lds, src_rows, sets[k].dst,
  // sets[k].ldd, sets[k].dst_rows, n, sets[k].width). The sets' destinations must not overlap each other
  // or src. Default: those copy_rows in set order (one launch on CUDA).
  struct RowCopy {
    int64_t col = 0;                   // first source column
    float* dst = nullptr;
    int64_t ldd = 0;                   // destination row stride
    const int32_t* dst_rows = nullptr;  // [n] (< 0: skipped); null: row i
    int64_t width = 0;
  };
  virtual void copy_rows_multi(const float* src, int64_t lds, const int32_t* src_rows, const RowCopy* sets, int nsets,
                               int64_t n);

  // Takes a float32 W[N, K] into the backend's layout (the caller may free w afterwards).
  virtual WeightPtr make_weight(const float* w, int64_t N, int64_t K) = 0;
  // Whether the backend computes on weights of this stored format and shape itself; otherwise the
  // loader hands it a float32 copy. The CPU backend always computes in float32.
  // (`w`'s format, shape and block size are read; its pointers may be null.)
  virtual bool takes_stored(const StoredWeight& w) const { return w.fmt == WeightFormat::F32; }
  // Takes a stored weight (only formats for which takes_stored() is true; the caller may free it).
  virtual WeightPtr make_weight(const StoredWeight& w) {
    return w.fmt == WeightFormat::F32 ? make_weight(static_cast<const float*>(w.data), w.N, w.K) : nullptr;
  }
  // Takes G weights of one shape [N, K].
  virtual WeightGroupsPtr make_groups(std::vector<WeightPtr> ws) = 0;
  // y[m, g·N + n] = Σ_k x[m, g·K + k] · W_g[n, k] for every group g (x row stride ldx, y row stride ldy).
  virtual void linear_groups(const float* x, int64_t M, int64_t ldx, const WeightGroups& w, float* y,
                             int64_t ldy) = 0;
  // y[M, N] (row stride ldy) = x[M, K] (row stride ldx) · Wᵀ. y may not alias x.
  virtual void linear(const float* x, int64_t M, int64_t ldx, const Weight& w, float* y, int64_t ldy) = 0;
  // act[M, I] (contiguous) = swiglu_clamp(x · W13ᵀ, limit), W13 [2I, K] = gate rows over up rows (a dense
  // FFN's first half, e.g. the shared expert). Default: linear into a [M, 2I] buffer, then swiglu_clamp
  // (CUDA: the GEMV's fused epilogue where the GEMV takes it; the same bits).
  virtual void linear_swiglu(const float* x, int64_t M, int64_t ldx, const Weight& w13, float limit, float* act);

  // ---- MoE ----
  // Takes the E experts of a layer: w13[e] [2I, D] (gate rows over up rows), w2[e] [D, I].
  virtual ExpertsPtr make_experts(std::vector<WeightPtr> w13, std::vector<WeightPtr> w2) = 0;
  // Router over logits[T, E] (E ≤ 1024, K ≤ 16): scores s = sqrt(softplus(l)), sigmoid(l) or softmax(l);
  // sel[T, K] = the K largest s + bias[E] (best first, ties to the lower id) or, when tid2eid [V, K] is
  // set, tid2eid[tokens[t], 0..K) (tokens[T]); wsel[T, K] = s[sel] · route_scale / (Σ_k s[sel] + 1e-20)
  // when normalize, else s[sel] · route_scale. All pointers in backend memory.
  virtual void moe_route(const float* logits, int64_t T, int E, int K, RouteScoring scoring, const float* bias,
                         const int32_t* tid2eid, const int32_t* tokens, bool normalize, float route_scale,
                         int32_t* sel, float* wsel) = 0;
  // out[T, D] = Σ_k wsel[t, k] · W2_e · swiglu_clamp(W13_e · h[t], limit), e = sel[t, k], summed over a
  // token's experts in ascending expert id (h [T, D], sel / wsel [T, K]), then + shared[t] when shared
  // [T, D] is not null (the shared expert's output: one f32 add after the routed sum, the bits of an
  // add_rows of shared into out afterwards). shared may not alias out. A non-null shared must have been
  // computed after sel and h were written (the V4 model's order: routing, shared expert, moe_ffn): the CUDA
  // backend then starts reading the routed experts' weights before its predecessor launch completes.
  virtual void moe_ffn(const float* h, int64_t T, const Experts& ex, const int32_t* sel, const float* wsel, int K,
                       float limit, const float* shared, float* out) = 0;

  // Per row m of score[M, n] (row stride n): the k = min(topk, n_vis[m]) largest of score[m, 0 .. n_vis[m])
  // (ties to the lower index), in ascending index order, mapped through rowmap (rowmap[j] when
  // rowmap_ld = 0, else rowmap[m·rowmap_ld + j]: a map per row) and written to
  // out[out_off[m] .. out_off[m] + k) (out_off[M] host-known offsets in backend memory, int64).
  virtual void select_topk(const float* score, int64_t M, int64_t n, const int32_t* n_vis, int topk,
                           const int32_t* rowmap, int64_t rowmap_ld, const int64_t* out_off, int32_t* out) = 0;

  // Greedy sampling on the backend: out[m] = the lowest id of the largest value of row m of x[M, N] (row
  // stride ld) — the host sampler's greedy pick (argmax_lowest_id) — or −1 when every value is −inf, −2
  // when the row holds a NaN or +inf (the host sampler rejects those rows: the caller asks it for the error).
  virtual void argmax_rows(const float* x, int64_t M, int64_t N, int64_t ld, int32_t* out) = 0;
  // Sampling on the backend: out[m] = sample_row(row m of x[M, N] (row stride ld), spec[m]) (ops/sampling.h:
  // the host sampler's token for a row without logit processors, bit for bit), spec[M] in backend memory.
  // −1 / −2 as argmax_rows. Every other row is decided: a pick may feed the next step's token directly
  // (DeepseekV4Model::launch), so a backend cannot leave a row to the host.
  // rows / edits / edit_raw (all null, or rows[M], the step's edit list and one float an edit, in backend
  // memory): row m's logit processors are applied to x in place first (apply_edits, the values before into
  // edit_raw), so that out[m] is the host sampler's token for a request with bias, penalties or a min_tokens
  // mask too. tokens: the step's token ids, for rows with a pending token (RowEdits::pend; null when none has).
  virtual void sample_rows(float* x, int64_t M, int64_t N, int64_t ld, const SampleSpec* spec, const RowEdits* rows,
                           const LogitEdit* edits, float* edit_raw, const int32_t* tokens, int32_t* out) = 0;
  // Structured-output masks on the backend, before sample_rows: row m with rows[m].mask = k ≥ 0 gets
  // apply_mask(row m, masks + k · mask_words(N)) in place. rows[M] and masks in backend memory.
  virtual void mask_rows(float* x, int64_t M, int64_t N, int64_t ld, const RowEdits* rows, const uint32_t* masks) = 0;
  // Whether mask_rows is on (else the engine samples structured rows on the host from their logits).
  virtual bool masks_on_backend() const { return true; }
  // Raw logprobs on the backend (ops/sampling.h row_logprobs: the host's values bit for bit), for the rows with
  // spec[m].logprobs ≥ 0, after sample_rows on the same arguments: row m's edits are put back first (its raw
  // logits, restore_edits: x holds them afterwards), then out[m] = row_logprobs(row m, picks[m],
  // spec[m].logprobs); −2 rows (NaN / +inf) get out[m].token NaN and n = 0. Other rows are left as they are.
  // spec, rows, edits, edit_raw, picks and out[M] in backend memory (rows … null: no edits).
  virtual void logprob_rows(float* x, int64_t M, int64_t N, int64_t ld, const SampleSpec* spec, const RowEdits* rows,
                            const LogitEdit* edits, const float* edit_raw, const int32_t* picks, RowLogprobs* out) = 0;
  // Whether logprob_rows is on (a backend may keep it off until it is proven: the engine then computes logprobs
  // on the host from the rows' logits).
  virtual bool logprobs_on_backend() const { return true; }
  // A step's token ids taken from the previous step's picks on the backend (DeepseekV4Model::launch's feed):
  // for i < T with feed[i] ≥ 0, t = picks[feed[i]] — 0 when that is no token (< 0 or ≥ V: the row's request
  // fails and its result is dropped) — goes to pack[i] and to pack[T + i·hc + j], j < hc (the step's token
  // ids, then the embedding's rows). pack, feed and picks in backend memory.
  virtual void feed_tokens(int32_t* pack, int64_t T, int hc, const int32_t* feed, const int32_t* picks,
                           int64_t V) = 0;

  // y[M, D] = x / sqrt(mean(x²) + eps) (* w[D] if w). In place allowed (y == x).
  virtual void rms_norm(const float* x, int64_t M, int64_t D, int64_t ld, const float* w, float eps,
                        float* y) = 0;

  // Interleaved (GPT-J) RoPE on the trailing `rope_dim` channels of each of `heads` vectors of width
  // `head_dim` per row: x[M, heads, head_dim] with row stride ld. pos[M] absolute positions,
  // inv_freq[rope_dim / 2]. inverse = rotate by −angle (used on the attention output).
  virtual void rope(float* x, int64_t M, int64_t ld, int heads, int head_dim, int rope_dim,
                    const int32_t* pos, const float* inv_freq, bool inverse) = 0;

  // Per-head RMSNorm and RoPE of several tensors in one call (the attention block's q, kv and indexer
  // q: one launch instead of a norm, a rope and a copy each). A tensor has the step's M rows (pos[M])
  // unless it is a gather (x_rows set).
  struct NormRope {
    float* x = nullptr;           // [M, heads, head_dim] (row stride ld), transformed in place
    int64_t ld = 0;
    int heads = 1, head_dim = 0;
    // A gather instead: `rows` rows, row m read from x row x_rows[m] and only copied to the outs (x is not
    // written; norm false, rope_dim 0).
    const int32_t* x_rows = nullptr;
    int64_t rows = 0;
    bool norm = false;            // first rms_norm of every head vector (D = head_dim, eps) ...
    const float* w = nullptr;     // ... with weights w[head_dim] (null: unweighted)
    int rope_dim = 0;             // then rope (rope_dim, inv_freq[rope_dim / 2]; 0: none)
    const float* inv_freq = nullptr;
    // then row m's heads·head_dim floats are also copied to row out_rows[k][m] (null: m; < 0: skipped)
    // of out[k] (row stride out_ld[k]), k < 2 (out[k] null: none). No out may overlap any tensor.
    float* out[2] = {nullptr, nullptr};
    int64_t out_ld[2] = {0, 0};
    const int32_t* out_rows[2] = {nullptr, nullptr};
  };
  // The result is that of rms_norm, rope, then copy_rows per tensor (this default: the composition).
  virtual void norm_rope(const NormRope* t, int n, int64_t M, const int32_t* pos, float eps, bool inverse) {
    for (int i = 0; i < n; ++i) {
      const NormRope& a = t[i];
      const int64_t width = (int64_t)a.heads * a.head_dim;
      if (a.x_rows) {
        for (int k = 0; k < 2; ++k)
          if (a.out[k] && a.rows) copy_rows(a.x, a.ld, a.x_rows, a.out[k], a.out_ld[k], a.out_rows[k], a.rows, width);
        continue;
      }
      if (a.norm) {
        if (a.ld == width) rms_norm(a.x, M * a.heads, a.head_dim, a.head_dim, a.w, eps, a.x);
        else
          for (int h = 0; h < a.heads; ++h)
            rms_norm(a.x + (int64_t)h * a.head_dim, M, a.head_dim, a.ld, a.w, eps, a.x + (int64_t)h * a.head_dim);
      }
      if (a.rope_dim) rope(a.x, M, a.ld, a.heads, a.head_dim, a.rope_dim, pos, a.inv_freq, inverse);
      for (int k = 0; k < 2; ++k)
        if (a.out[k]) copy_rows(a.x, a.ld, nullptr, a.out[k], a.out_ld[k], a.out_rows[k], M, width);
    }
  }

  // Manifold-constrained hyper-connection, pre side. X[M, hc, D]; fn[(2+hc)·hc, hc·D]; base[(2+hc)·hc];
  // scale[3]. Outputs u[M, D] = Σ_j pre_j X_j, post[M, hc], comb[M, hc, hc] (Sinkhorn-projected).
  virtual void hc_pre(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                      const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps, float* u,
                      float* post, float* comb) = 0;
  // hc_pre, then h[M, D] = rms_norm(u) (rows of D, weights w, epsilon eps): the pair that opens every V4 block, as
  // one op so that a backend may run the norm in hc_pre's pass (CUDA at decode: no launch of its own). The same
  // values as the two calls; u holds the collapsed rows as after hc_pre.
  virtual void hc_pre_norm(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                           const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps, float* u, float* post,
                           float* comb, const float* w, float eps, float* h) {
    hc_pre(X, M, hc, D, fn, base, scale, sinkhorn_iters, hc_eps, norm_eps, u, post, comb);
    rms_norm(u, M, D, D, w, eps, h);
  }
  // Single-pass mHC (DeepSeek-V4.1): one read of X[M, hc, D] both collapses it with weights that
  // are already known, u[M, D] = Σ_j w[m, j]·X_j (w[M, hc]: the previous site's pre), and computes
  // this site's coefficients pre[M, hc], post[M, hc], comb[M, hc, hc] exactly as hc_pre does.
  // fn == nullptr: collapse only (pre/post/comb untouched). u may not alias X.
  virtual void hc_mix(const float* X, int64_t M, int hc, int64_t D, const float* w, const float* fn,
                      const float* base, const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps,
                      float* u, float* pre, float* post, float* comb) = 0;
  // X'[m, k] = post[m, k]·y[m] + Σ_j comb[m, j, k]·X[m, j]. out may not alias X.
  virtual void hc_post(const float* X, const float* y, const float* post, const float* comb, int64_t M,
                       int hc, int64_t D, float* out) = 0;
  // Final head reduction: u[M, D] = Σ_j (sigmoid(scale·μ_j + base_j) + eps)·X_j, μ = rms·(fn · vec X).
  virtual void hc_head(const float* X, int64_t M, int hc, int64_t D, const float* fn, const float* base,
                       const float* scale, float hc_eps, float norm_eps, float* u) = 0;

  // Attention with a per-head sink logit over a per-query key set drawn from two pools of
  // d-wide rows (K = V): a contiguous range [win_lo[m], win_hi[m]) of `win` and the rows
  // `ent_idx[ent_off[m] .. ent_off[m+1])` of `ent`. q[M, H, d] (row stride ldq); out[M, H, d].
  // p = exp(s) / (Σ exp(s) + exp(sink_h)), s = scale · q·k.
  virtual void sink_attention(const float* q, int64_t M, int64_t ldq, int H, int d, const float* win,
                              const int32_t* win_lo, const int32_t* win_hi, const float* ent,
                              const int32_t* ent_idx, const int64_t* ent_off, const float* sinks,
                              float scale, float* out, int64_t ldo) = 0;

  // Lightning-indexer scores: score[m, w] = Σ_h γ[m, h] · ReLU(qI[m, h]·K[row(m, w)]) · qk_scale
  // for w < n_vis[m] (others −inf). qI[M, hI, dI]; K: rows of dI floats; row(m, w) = key_rows[w]
  // (key_ld = 0: one key list [n_keys] for every query) or key_rows[m·key_ld + w] (a list per query,
  // [M, key_ld], key_ld ≥ n_keys: the decode sequences of a batch in one call); key_rows null: row w.
  // γ[M, hI]; score[M, n_keys].
  virtual void indexer_scores(const float* qI, const float* gamma, int64_t M, int hI, int dI,
                              const float* K, const int32_t* key_rows, int64_t key_ld, int64_t n_keys,
                              const int32_t* n_vis, float qk_scale, float* score) = 0;

  // Softmax-gated pooling of compressor slots: out[W, d] with
  // out[w, c] = Σ_s softmax_s(gate[w, s, c]) · kv[w, s, c]; kv/gate [W, S, d]; gate −inf = absent slot.
  virtual void compress_pool(const float* kv, const float* gate, int64_t W, int S, int d, float* out) = 0;

  // Pooling input of nw closing compressor windows (ids win_ids[nw], rate m), read from a slot's
  // ring (ring_kv/ring_gate [R, cw], row = position mod R; R = 2m and cw = 2·width when overlap
  // (CSA), R = m and cw = width otherwise (HCA)) for positions < p0, and from this step's projections
  // kv/gate (row i = position p0 + i, row stride ld) for positions ≥ p0. Out skv/sg [nw, S, width],
  // S = overlap ? 2m : m. Slot j (< m) of window w: position w·m + j (HCA; CSA: its B half, at slot
  // m + j, cols [width, 2·width)); CSA slot j: the A half (cols [0, width)) of position (w−1)·m + j,
  // absent for w = 0 (kv 0, gate −inf). Gates get ape[j, col] (ape [m, cw]) added; ape may be null
  // (no position bias: DeepSeek-V4.1's ratio-2 compressor). ring_rows[nw] (may be null = 0): window i's
  // ring starts ring_rows[i] rows (of cw) into ring_kv / ring_gate, so that the windows of several
  // sequences (each its own slot's ring) close in one call (then every position comes from the rings:
  // p0 beyond them all).
  virtual void compress_windows(const float* ring_kv, const float* ring_gate, const float* kv, const float* gate,
                                int64_t ld, int64_t p0, const float* ape, int m, int width, bool overlap,
                                const int32_t* win_ids, const int32_t* ring_rows, int64_t nw, float* skv,
                                float* sg) = 0;

  // A compressor's entries, from its windows to the cache (DeepSeek-V4's emit step): for the nw windows
  // of compress_windows' arguments, entry i = rope(rms_norm(compress_pool(window i), norm_w, eps),
  // position pos[i]) — RoPE on the trailing rope_dim channels (one head of `width`, inv_freq
  // [rope_dim / 2]) — written to dst row dst_rows[i] (row stride width; < 0: not written, as copy_rows).
  // Default: compress_windows, compress_pool, rms_norm, rope, copy_rows (CUDA: one kernel where it applies).
  virtual void compress_emit(const float* ring_kv, const float* ring_gate, const float* kv, const float* gate,
                             int64_t ld, int64_t p0, const float* ape, int m, int width, bool overlap,
                             const int32_t* win_ids, const int32_t* ring_rows, int64_t nw, const float* norm_w,
                             float eps, int rope_dim, const int32_t* pos, const float* inv_freq, float* dst,
                             const int32_t* dst_rows);

  // ---- DeepSeek-V4.1 ----
  // KV QAT simulation in place (quantize, then dequantize to float32): x[n] in blocks of consecutive
  // values (n a multiple of the block), each block with its own scale, round to nearest even.
  virtual void kv_qdq(float* x, int64_t n, KvQdq format) = 0;
  // Engram gate, in place on the residual streams X[M, hc, D]: with kv[M, hc + 1, D] (hc keys, then
  // the value) and w[hc, D] (q_weight ⊙ k_weight), per stream j
  //   s = Σ_c X_j[c]·w_j[c]·key_j[c] / rms(X_j) / rms(key_j) / sqrt(D)  (rms over D, + eps),
  //   X_j += sigmoid(sign(s)·sqrt(max(|s|, 1e-6)))·value,
  // reductions and the update in double (eps is double: V4.1's 1e-20 is no float).
  virtual void engram_gate(float* X, int64_t M, int hc, int64_t D, const float* kv, const float* w,
                           double eps) = 0;

  // Clamped SwiGLU: gu[M, 2I] = [gate | up] → act[M, I] = silu(min(gate, lim)) · clamp(up, −lim, lim)
  // (* row_scale[m] if row_scale).
  virtual void swiglu_clamp(const float* gu, int64_t M, int64_t I, float limit, const float* row_scale,
                            float* act) = 0;

 private:
  std::vector<char> view_;  // download_view's buffer (host backends)
  std::array<std::vector<char>, 2> staged_;  // stage()'s copies (host backends)
  uint64_t graph_owners_ = 0;
};

// An owned array in a backend's memory (moves, never copies).
template <class T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend& be, int64_t n) : be_(&be), n_(n), p_(static_cast<T*>(be.alloc(n * (int64_t)sizeof(T)))) {}
  // A copy of host data.
  Buffer(Backend& be, const T* host, int64_t n) : Buffer(be, n) {
    if (n) be.upload(p_, host, n * (int64_t)sizeof(T));
  }
  Buffer(Backend& be, const std::vector<T>& host) : Buffer(be, host.data(), (int64_t)host.size()) {}
  Buffer(Buffer&& o) noexcept : be_(o.be_), n_(std::exchange(o.n_, 0)), p_(std::exchange(o.p_, nullptr)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      be_ = o.be_;
      n_ = std::exchange(o.n_, 0);
      p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
  }
  ~Buffer() { reset(); }
  void reset() {
    if (p_) be_->release(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  int64_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  std::vector<T> to_host() const {
    std::vector<T> h(n_);
    if (n_) be_->download(h.data(), p_, n_ * (int64_t)sizeof(T));
    return h;
  }

 private:
  Backend* be_ = nullptr;
  int64_t n_ = 0;
  T* p_ = nullptr;
};

// ---- the default (composed) fused ops: the existing ops in sequence, so their bits are those ops' ----
inline void Backend::copy_rows_multi(const float* src, int64_t lds, const int32_t* src_rows, const RowCopy* sets,
                                     int nsets, int64_t n) {
  for (int k = 0; k < nsets; ++k)
    copy_rows(src + sets[k].col, lds, src_rows, sets[k].dst, sets[k].ldd, sets[k].dst_rows, n, sets[k].width);
}
inline void Backend::linear_swiglu(const float* x, int64_t M, int64_t ldx, const Weight& w13, float limit,
                                   float* act) {
  const int64_t I = w13.N / 2;
  Buffer<float> gu(*this, M * 2 * I);  // [M, 2I]
  linear(x, M, ldx, w13, gu.data(), 2 * I);
  swiglu_clamp(gu.data(), M, I, limit, nullptr, act);
}
inline void Backend::compress_emit(const float* ring_kv, const float* ring_gate, const float* kv, const float* gate,
                                   int64_t ld, int64_t p0, const float* ape, int m, int width, bool overlap,
                                   const int32_t* win_ids, const int32_t* ring_rows, int64_t nw, const float* norm_w,
                                   float eps, int rope_dim, const int32_t* pos, const float* inv_freq, float* dst,
                                   const int32_t* dst_rows) {
  if (nw <= 0) return;
  const int S = overlap ? 2 * m : m;  // pooled slots per entry
  Buffer<float> skv(*this, nw * S * width), sg(*this, nw * S * width), out(*this, nw * width);
  compress_windows(ring_kv, ring_gate, kv, gate, ld, p0, ape, m, width, overlap, win_ids, ring_rows, nw, skv.data(),
                   sg.data());
  compress_pool(skv.data(), sg.data(), nw, S, width, out.data());
  rms_norm(out.data(), nw, width, width, norm_w, eps, out.data());
  rope(out.data(), nw, width, 1, width, rope_dim, pos, inv_freq, false);
  copy_rows(out.data(), width, nullptr, dst, width, dst_rows, nw, width);  // one scatter (−1: kept out)
}

}  // namespace deepinfer
