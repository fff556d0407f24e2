#include "model/deepseek_v4.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <numeric>

#include "io/checkpoint.h"
#include "io/dequant.h"
#include "model/weight_reader.h"
#include "util/error.h"

namespace deepinfer {
namespace {

void load_compressor(WeightReader& r, const std::string& p, V4Compressor& c, int rate, int width, bool overlap) {
  c.rate = rate;
  c.width = width;
  c.overlap = overlap;
  int64_t cw = (overlap ? 2 : 1) * (int64_t)width;
  c.ape = r.vec(p + "ape", {rate, cw});
  c.norm = r.vec(p + "norm.weight", {width});
}

void load_layer(WeightReader& r, const V4Config& c, const std::string& p, AttnType type, bool hash, V4Layer& L) {
  const int64_t D = c.hidden_size, H = c.num_heads, d = c.head_dim, hc = c.hc_mult, mix = (2 + hc) * hc;
  const int64_t I = c.moe_intermediate_size, E = c.n_routed_experts;
  L.type = type;
  L.hash = hash;
  L.attn_norm = r.vec(p + "attn_norm.weight", {D});
  L.ffn_norm = r.vec(p + "ffn_norm.weight", {D});
  L.hc_attn_fn = r.vec(p + "hc_attn_fn", {mix, hc * D});
  L.hc_attn_base = r.vec(p + "hc_attn_base", {mix});
  L.hc_attn_scale = r.vec(p + "hc_attn_scale", {3});
  L.hc_ffn_fn = r.vec(p + "hc_ffn_fn", {mix, hc * D});
  L.hc_ffn_base = r.vec(p + "hc_ffn_base", {mix});
  L.hc_ffn_scale = r.vec(p + "hc_ffn_scale", {3});
  L.sinks = r.vec(p + "attn.attn_sink", {H});
  L.wqkv_a = r.mat_cat({p + "attn.wq_a.weight", p + "attn.wkv.weight"}, {c.q_lora_rank, d}, D);
  L.q_norm = r.vec(p + "attn.q_norm.weight", {c.q_lora_rank});
  L.wq_b = r.mat(p + "attn.wq_b.weight", H * d, c.q_lora_rank);
  L.kv_norm = r.vec(p + "attn.kv_norm.weight", {d});
  // block-diagonal: one [o_lora, H·d/g] matrix per head group
  L.wo_a = r.backend().make_groups(r.mat_rows(p + "attn.wo_a.weight", c.o_groups, c.o_lora_rank, H * d / c.o_groups));
  L.wo_b = r.mat(p + "attn.wo_b.weight", D, (int64_t)c.o_groups * c.o_lora_rank);
  if (type == AttnType::CSA) {
    load_compressor(r, p + "attn.compressor.", L.comp, c.compress_rate_csa, (int)d, true);
    load_compressor(r, p + "attn.indexer.compressor.", L.idx_comp, c.compress_rate_csa, c.index_head_dim, true);
    const std::string a = p + "attn.compressor.", b = p + "attn.indexer.compressor.";
    const int64_t cw = 2 * d, icw = 2 * (int64_t)c.index_head_dim;
    L.wcomp = r.mat_cat({a + "wkv.weight", a + "wgate.weight", b + "wkv.weight", b + "wgate.weight"}, {cw, cw, icw, icw},
                        D);
    L.idx_wq_b = r.mat(p + "attn.indexer.wq_b.weight", (int64_t)c.index_n_heads * c.index_head_dim, c.q_lora_rank);
    L.idx_weights_proj = r.mat(p + "attn.indexer.weights_proj.weight", c.index_n_heads, D);
  } else if (type == AttnType::HCA) {
    load_compressor(r, p + "attn.compressor.", L.comp, c.compress_rate_hca, (int)d, false);
    const std::string a = p + "attn.compressor.";
    L.wcomp = r.mat_cat({a + "wkv.weight", a + "wgate.weight"}, {d, d}, D);
  }
  L.gate = r.mat(p + "ffn.gate.weight", E, D);
  if (hash) L.tid2eid = Buffer<int32_t>(r.backend(), r.ids(p + "ffn.gate.tid2eid", {c.vocab_size, c.num_experts_per_tok}, E));
  else L.gate_bias = r.vec(p + "ffn.gate.bias", {E});
  std::vector<WeightPtr> w13(E), w2(E);
  for (int64_t e = 0; e < E; ++e) {
    std::string ep = p + "ffn.experts." + std::to_string(e) + ".";
    w13[e] = r.mat2(ep + "w1.weight", ep + "w3.weight", I, D);
    w2[e] = r.mat(ep + "w2.weight", D, I);
  }
  L.experts = r.backend().make_experts(std::move(w13), std::move(w2));
  if (c.n_shared_experts == 1) {
    L.shared_w13 = r.mat2(p + "ffn.shared_experts.w1.weight", p + "ffn.shared_experts.w3.weight", I, D);
    L.shared_w2 = r.mat(p + "ffn.shared_experts.w2.weight", D, I);
  }
}

}  // namespace

DeepseekV4Model::DeepseekV4Model(const V4Config& cfg, Checkpoint& ckpt, Backend& backend, const LoadProgress& progress)
    : cfg_(cfg), be_(backend) {
  const int64_t V = cfg.vocab_size, D = cfg.hidden_size, hc = cfg.hc_mult;
  WeightReader r(ckpt, cfg_.fp8_block_rows, cfg_.fp8_block_cols, backend);
  {
    std::vector<float> embed = r.f32("embed.weight", {V, D});
    embed_ = Buffer<float>(backend, embed);
    if (cfg.tie_word_embeddings && !ckpt.has("head.weight")) head_ = backend.make_weight(embed.data(), V, D);
    else head_ = r.mat("head.weight", V, D);
  }
  norm_ = r.vec("norm.weight", {D});
  hc_head_fn_ = r.vec("hc_head_fn", {hc, hc * D});
  hc_head_base_ = r.vec("hc_head_base", {hc});
  hc_head_scale_ = r.vec("hc_head_scale", {1});
  layers_.resize(cfg.num_layers);
  for (int l = 0; l < cfg.num_layers; ++l) {
    load_layer(r, cfg_, "layers." + std::to_string(l) + ".", cfg.layer_types[l], cfg.hash_layers[l], layers_[l]);
    if (progress) progress(l + 1, cfg.num_layers);
  }
  // MTP layers: present in published checkpoints (transformers drops them). Kept for speculative
  // decoding; a checkpoint without them simply has no draft head.
  for (int k = 0; k < cfg.num_mtp_layers; ++k) {
    std::string p = "mtp." + std::to_string(k) + ".";
    if (!ckpt.has(p + "e_proj.weight")) break;
    V4Mtp m;
    load_layer(r, cfg_, p, AttnType::Sliding, false, m.block);
    m.e_proj = r.mat(p + "e_proj.weight", D, D);
    m.h_proj = r.mat(p + "h_proj.weight", D, D);
    m.enorm = r.vec(p + "enorm.weight", {D});
    m.hnorm = r.vec(p + "hnorm.weight", {D});
    m.norm = r.vec(p + "norm.weight", {D});
    m.hc_head_fn = r.vec(p + "hc_head_fn", {hc, hc * D});
    m.hc_head_base = r.vec(p + "hc_head_base", {hc});
    m.hc_head_scale = r.vec(p + "hc_head_scale", {1});
    mtp_.push_back(std::move(m));
  }
  inv_freq_main_ = Buffer<float>(backend, rope_inv_freq(cfg.rope_main, cfg.rope_dim));
  inv_freq_compress_ = Buffer<float>(backend, rope_inv_freq(cfg.rope_compress, cfg.rope_dim));
  graph_owner_ = backend.new_graph_owner();
  picks_ = Buffer<int32_t>(backend, 2 * kPickSlot);  // before any graph: never moves
  edits_ = Buffer<LogitEdit>(backend, 2 * kEditCap);
  edits_raw_ = Buffer<float>(backend, 2 * kEditCap);
  if (backend.masks_on_backend()) masks_ = Buffer<uint32_t>(backend, 2 * kMaskRows * mask_words(cfg_.vocab_size));
}

namespace {
// Pushes of rows r0 + i (i < n, positions p0 + i) of a step buffer into a ring of R rows at ring_row0 (of
// the slot pool, in rows of the buffer's width): the last min(n, R) rows land. Collected for every
// sequence, then one copy_rows.
struct RingPush {
  std::vector<int32_t> src, dst;
  void add(int64_t r0, int64_t n, int64_t p0, int64_t R, int32_t ring_row0) {
    for (int64_t i = std::max<int64_t>(0, n - R); i < n; ++i) {
      src.push_back((int32_t)(r0 + i));
      dst.push_back((int32_t)(ring_row0 + (p0 + i) % R));
    }
  }
};

// A step's index arrays packed for one upload. add() returns an array's place in 32-bit words (8-byte aligned types at
// an even word: the allocation is at least 8-byte aligned); ptr() gives it in backend memory after upload().
// Sizes and order are functions of the step's graph key, so the places are the same in every replay.
class StepUploads {
 public:
  template <class T>
  size_t add(const std::vector<T>& a) {
    static_assert(sizeof(T) % 4 == 0 && alignof(T) <= 8, "arrays of whole 32-bit words, at most 8-byte aligned");
    if (alignof(T) == 8 && words_.size() % 2) words_.push_back(0);
    const size_t at = words_.size();
    words_.resize(at + a.size() * sizeof(T) / 4);
    if (!a.empty()) std::memcpy(words_.data() + at, a.data(), a.size() * sizeof(T));
    return at;
  }
  void upload(Backend& be) { buf_ = Buffer<int32_t>(be, words_); }
  template <class T>
  const T* ptr(size_t at) const {
    return reinterpret_cast<const T*>(buf_.data() + at);
  }
  template <class T>
  T* ptr(size_t at) {  // an array the step rewrites on the backend (the fed token ids)
    return reinterpret_cast<T*>(buf_.data() + at);
  }

 private:
  std::vector<int32_t> words_;
  Buffer<int32_t> buf_;
};

}  // namespace

struct DeepseekV4Model::Step {
  std::span<const V4SeqChunk> batch;
  V4Cache* cache = nullptr;
  int64_t T = 0;                       // tokens in the step
  // Every chunk one token (decode): a fixed layout whose sizes depend only on the batch size and the
  // entry capacities below, so that the step's launches repeat from step to step (CUDA graphs).
  bool decode = false;
  int64_t cap_csa = 0, cap_hca = 0;    // decode: compressed entries a sequence's tables hold
  // Decode steps may be padded to a bucket of batch sizes (fewer graphs): sequences b ≥ n_real are
  // stand-ins (token 0 at position 0 of slot 0 / page 0) whose every write is skipped (row −1).
  int64_t n_real = 0;
  std::vector<int64_t> seq_begin;      // [B + 1] first row of each chunk
  std::vector<int32_t> tokens, pos;    // [T] (host)
  // Every index array of the step (token ids first, positions, entry tables, compressor and window plans) in
  // one upload: each upload is a host copy and a device copy of its own, a memcpy node of the step graph.
  StepUploads up;
  const int32_t* pos_d = nullptr;      // [T] positions in backend memory
  const int32_t* tok_pack = nullptr;   // [T + T·hc]: token ids (hash routing), then the embedding's rows
  const int32_t* tok_d = nullptr;      // [T] = tok_pack
  Buffer<float> h;                     // [T, D] normed sub-block input
  Buffer<float> y;                     // [T, D] sub-block output
  // Where compressed entry w of sequence b lives, per (compress rate, row width) that the layers use:
  // rows[b·ld + w] = its row within one layer's region of the page pool, counted in rows of `width`
  // floats from that region's start in page 0. page_floats and every layer's page offset are multiples
  // of the width, so one table serves every layer of that kind (the layer's offset goes into the base
  // pointer) and is uploaded once a step. ld = the most entries any sequence has after the step.
  struct EntryTable {
    int64_t ld = 0;
    std::vector<int32_t> host;        // [B, ld]
    size_t at = 0;                    // its place in the step's upload
    const int32_t* rows = nullptr;    // the same in backend memory
  };
  EntryTable csa_keys, csa_entries, hca_entries;
  // The sliding window of every layer, planned once a step (ring rows count from a layer's ring region
  // in slot 0, in rows of d: the layer's offset goes into the base pointer). Key buffer win [rows, d]:
  // per sequence its earlier tokens still in the window (from the ring), then its chunk (from kv).
  struct WindowPlan {
    int64_t rows = 0, n_ring = 0;
    // from_ring, to_win_r [n_ring]; to_win_k, push_row [T]; lo, hi [T]: each query's window rows [lo, hi) of win
    size_t at[6] = {};
    const int32_t *lo = nullptr, *hi = nullptr;
    // kv row m goes to win row to_win_k[m] and to ring row push_row[m] (−1: not pushed: a chunk keeps its
    // last W rows, a stand-in none)
    const int32_t *from_ring = nullptr, *to_win_r = nullptr, *to_win_k = nullptr, *push_row = nullptr;
  } window;
  // The compressors and entry choice of every layer of one compressed type (CSA or HCA), planned once a
  // step: ring rows count from a layer's ring region in slot 0 (rows of that ring's width), page rows
  // from a layer's region in page 0 (rows of the entry width); the layer's offsets go into the pointers.
  struct CompPlan {
    int m = 0;
    int64_t R = 0;                          // ring rows: 2m (CSA), m (HCA)
    std::vector<int64_t> ent_off;           // [T + 1] each query's entries
    std::vector<int64_t> n_keys, score_at;  // CSA: keys of each sequence after the step; its scores' offset
    const int64_t* ent_off_d = nullptr;
    const int32_t* hca_idx = nullptr;       // HCA: each query's visible entries, [ent_off[T]]
    size_t at[15] = {};                     // the arrays below, ent_off and hca_idx in the step's upload
    int64_t n_push = 0;                     // pushes of the step's rows into the rings
    const int32_t *push_src = nullptr, *push_kv = nullptr, *push_gate = nullptr;  // main compressor
    const int32_t *push_ikv = nullptr, *push_igate = nullptr;                     // CSA indexer compressor
    const int32_t *nvis_row = nullptr;      // [T] entries visible to each query
    const int32_t *nvis_seq = nullptr;      // [B] entries of each sequence after the step
    // Decode: every sequence's current window (n_close = B) — its id, first position, ring rows (main,
    // indexer) and page rows (main, indexer; −1 unless the window closes in this step).
    int64_t n_close = 0;
    const int32_t *close_win = nullptr, *close_pos = nullptr, *close_ring = nullptr, *close_page = nullptr;
    const int32_t *close_iring = nullptr, *close_ipage = nullptr;
  } csa, hca;
};

namespace {
template <class Table>  // Step::EntryTable (private to the model)
void build_entry_table(StepUploads& up, std::span<const V4SeqChunk> batch, const V4CacheLayout& lay, int m,
                       int64_t width, int64_t ld_min, Table& t) {
  const size_t B = batch.size();
  const int64_t TP = lay.tokens_per_page;
  t.ld = std::max<int64_t>(1, ld_min);
  for (const auto& c : batch) t.ld = std::max<int64_t>(t.ld, (c.state->pos + (int64_t)c.tokens.size()) / m);
  t.host.assign(B * t.ld, 0);
  const int64_t per = TP / m;  // entries a page holds (TP is a multiple of m)
  for (size_t b = 0; b < B; ++b) {
    const V4SeqState& S = *batch[b].state;
    const int64_t nk = (S.pos + (int64_t)batch[b].tokens.size()) / m;
    int32_t* row = t.host.data() + b * t.ld;
    // entry w = pg·per + j lives in page pages[pg], slot j (a page at a time: this runs over B × ld
    // entries every step)
    for (int64_t w0 = 0, pg = 0; w0 < nk; w0 += per, ++pg) {
      const int32_t base = (int32_t)((int64_t)S.pages[pg] * lay.page_floats / width);
      const int64_t e = std::min(per, nk - w0);
      for (int64_t j = 0; j < e; ++j) row[w0 + j] = base + (int32_t)j;
    }
  }
  t.at = up.add(t.host);
}

template <class Plan, class Table>  // Step::CompPlan, Step::EntryTable (private to the model)
void build_comp_plan(StepUploads& up, const V4Config& c, std::span<const V4SeqChunk> batch,
                     const std::vector<int64_t>& seq_begin, const V4CacheLayout& lay, bool csa,
                     const Table& hca_entries, int64_t cap_hca, int64_t n_real, Plan& p) {
  const int64_t d = c.head_dim, dI = c.index_head_dim, cw = (csa ? 2 : 1) * d, icw = 2 * dI;
  const int64_t TP = lay.tokens_per_page, B = (int64_t)batch.size(), T = seq_begin[B];
  const int m = csa ? c.compress_rate_csa : c.compress_rate_hca;
  const bool decode = B == T;
  p.m = m;
  p.R = csa ? 2 * m : m;
  p.ent_off.assign(T + 1, 0);
  p.n_keys.assign(B, 0);
  p.score_at.assign(B + 1, 0);
  std::vector<int32_t> src, kv, gate, ikv, igate, nvis_row(T), nvis_seq(B), hca;
  std::vector<int32_t> cwin, cpos, cring, cpage, ciring, cipage;  // decode: every sequence's current window
  for (int64_t b = 0; b < B; ++b) {
    const V4SeqState& S = *batch[b].state;
    const int64_t p0 = S.pos, r0 = seq_begin[b], n = seq_begin[b + 1] - r0;
    const int32_t ring0 = (int32_t)((int64_t)S.slot * lay.slot_floats / cw);
    const int32_t iring0 = (int32_t)((int64_t)S.slot * lay.slot_floats / icw);
    const bool pad = b >= n_real;  // a stand-in: its pushes are skipped
    for (int64_t i = std::max<int64_t>(0, n - p.R); i < n; ++i) {  // the last R rows land
      const int32_t at = (int32_t)((p0 + i) % p.R);
      src.push_back((int32_t)(r0 + i));
      kv.push_back(pad ? -1 : ring0 + at);
      gate.push_back(pad ? -1 : ring0 + (int32_t)p.R + at);  // the gate ring follows the kv ring
      if (csa) ikv.push_back(pad ? -1 : iring0 + at), igate.push_back(pad ? -1 : iring0 + (int32_t)p.R + at);
    }
    p.n_keys[b] = (p0 + n) / m;
    p.score_at[b + 1] = p.score_at[b] + n * p.n_keys[b];
    nvis_seq[b] = (int32_t)p.n_keys[b];
    const int32_t* rows = csa ? nullptr : hca_entries.host.data() + b * hca_entries.ld;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t nvis = (p0 + i + 1) / m;
      nvis_row[r0 + i] = (int32_t)nvis;
      p.ent_off[r0 + i + 1] = p.ent_off[r0 + i] + (csa ? std::min<int64_t>(c.index_topk, nvis) : nvis);
      if (!csa) hca.insert(hca.end(), rows, rows + nvis);
    }
    if (decode) {  // the window holding p0 is pooled every step; its entry is kept only when it closes
      const bool closes = (p0 + 1) % m == 0 && !pad;
      const int32_t win = (int32_t)(p0 / m);
      const int64_t first = (int64_t)win * m, page = S.pages[first / TP], slot = (first % TP) / m;
      cwin.push_back(win);
      cpos.push_back((int32_t)first);
      cring.push_back(ring0);
      cpage.push_back(closes ? (int32_t)(page * lay.page_floats / d + slot) : -1);
      if (csa) {
        ciring.push_back(iring0);
        cipage.push_back(closes ? (int32_t)(page * lay.page_floats / dI + slot) : -1);
      }
    }
  }
  p.n_push = (int64_t)src.size();
  p.n_close = (int64_t)cwin.size();
  if (decode && !csa) hca.resize(B * cap_hca, 0);  // a fixed size: the lists are read through ent_off
  int k = 0;
  for (const auto* a : {&src, &kv, &gate, &ikv, &igate, &nvis_row, &nvis_seq, &cwin, &cpos, &cring, &cpage, &ciring,
                        &cipage, &hca})
    p.at[k++] = up.add(*a);
  p.at[k] = up.add(p.ent_off);
}
// The plan's pointers into the step's upload.
template <class Plan>
void resolve_comp_plan(const StepUploads& up, Plan& p) {
  const auto* a = p.at;
  p.push_src = up.ptr<int32_t>(a[0]), p.push_kv = up.ptr<int32_t>(a[1]), p.push_gate = up.ptr<int32_t>(a[2]);
  p.push_ikv = up.ptr<int32_t>(a[3]), p.push_igate = up.ptr<int32_t>(a[4]);
  p.nvis_row = up.ptr<int32_t>(a[5]), p.nvis_seq = up.ptr<int32_t>(a[6]);
  p.close_win = up.ptr<int32_t>(a[7]), p.close_pos = up.ptr<int32_t>(a[8]), p.close_ring = up.ptr<int32_t>(a[9]);
  p.close_page = up.ptr<int32_t>(a[10]), p.close_iring = up.ptr<int32_t>(a[11]), p.close_ipage = up.ptr<int32_t>(a[12]);
  p.hca_idx = up.ptr<int32_t>(a[13]);
  p.ent_off_d = up.ptr<int64_t>(a[14]);
}
}  // namespace

void DeepseekV4Model::compressor_update(const V4Compressor& w, float* ring_kv, float* ring_gate, V4Cache& cache,
                                        const V4SeqState& s, int64_t page_off, const float* kv, const float* gate,
                                        int64_t ld, int64_t p0, int64_t n) {
  const int m = w.rate, width = w.width;
  // Windows that close inside this chunk; their rows come from the ring (earlier positions, still
  // intact: a window spans at most R positions) or from this chunk's projections.
  std::vector<int32_t> closed;  // window ids
  for (int64_t i = 0; i < n; ++i)
    if ((p0 + i + 1) % m == 0) closed.push_back((int32_t)((p0 + i) / m));
  if (closed.empty()) return;
  // Entry i goes to row (page·page_floats + page_off)/width + its slot in the page (page_floats and the
  // offsets are multiples of width).
  const V4CacheLayout& lay = cache.layout();
  const int64_t T = lay.tokens_per_page;
  std::vector<int32_t> rows(closed.size());  // from this layer's region in page 0
  for (size_t i = 0; i < closed.size(); ++i) {
    const int64_t first = (int64_t)closed[i] * m;
    rows[i] = (int32_t)((int64_t)s.pages[first / T] * lay.page_floats / width + (first % T) / m);
  }
  // One upload for the chunk's index arrays: window ids, their first positions, page rows.
  const int64_t nw = (int64_t)closed.size();
  std::vector<int32_t> idx(closed);
  for (int32_t win : closed) idx.push_back(win * m);
  idx.insert(idx.end(), rows.begin(), rows.end());
  Buffer<int32_t> idx_d(be_, idx);
  emit_entries(w, ring_kv, ring_gate, kv, gate, ld, p0, idx_d.data(), nullptr, idx_d.data() + nw,
               idx_d.data() + 2 * nw, nw, cache.pages_base() + page_off);
}

void DeepseekV4Model::emit_entries(const V4Compressor& w, const float* ring_kv, const float* ring_gate, const float* kv,
                                   const float* gate, int64_t ld, int64_t p0, const int32_t* wins,
                                   const int32_t* ring_rows, const int32_t* wpos, const int32_t* page_rows, int64_t nw,
                                   float* page_base) {
  // pool → norm → rope → scatter (rows −1 kept out): one op (Backend::compress_emit)
  be_.compress_emit(ring_kv, ring_gate, kv, gate, ld, p0, w.ape.data(), w.rate, w.width, w.overlap, wins, ring_rows, nw,
                    w.norm.data(), (float)cfg_.rms_norm_eps, cfg_.rope_dim, wpos, inv_freq_compress_.data(), page_base,
                    page_rows);
}

void DeepseekV4Model::attention(int l, Step& st) {
  const V4Layer& L = layers_[l];
  const int64_t T = st.T, D = cfg_.hidden_size, H = cfg_.num_heads, d = cfg_.head_dim, r = cfg_.rope_dim;
  const int64_t ql = cfg_.q_lora_rank;
  const float eps = (float)cfg_.rms_norm_eps;
  const float* inv_freq = L.type == AttnType::Sliding ? inv_freq_main_.data() : inv_freq_compress_.data();
  const float* h = st.h.data();
  const int32_t* pos = st.pos_d;

  // qkv [T, q_lora | d]: q's low-rank input and the key/value row, from one GEMM (row stride nqk).
  const int64_t nqk = ql + d;
  Buffer<float> qkv(be_, T * nqk), q(be_, T * H * d);  // [T, q_lora + d], [T, H, d]
  float* qr = qkv.data();
  float* kv = qkv.data() + ql;
  be_.linear(h, T, D, *L.wqkv_a, qkv.data(), nqk);
  // Sliding keys (ring tail + chunk) are gathered into one buffer for the step: the ring's rows here, in
  // one call with q's low-rank norm, before the norm_rope below pushes the step's kv rows over the oldest
  // of them (the ring keeps the last W positions).
  const Step::WindowPlan& wp = st.window;
  Buffer<float> win(be_, wp.rows * d);
  V4Cache& cache = *st.cache;
  const V4CacheLayout& lay = cache.layout();
  float* slots = cache.slots_base();
  float* swa_ring = slots + lay.slot_ring_off[l];  // this layer's [W, d] ring in slot 0
  {
    Backend::NormRope nr[2];
    nr[0].x = qr, nr[0].ld = nqk, nr[0].head_dim = (int)ql, nr[0].norm = true, nr[0].w = L.q_norm.data();
    nr[1].x = swa_ring, nr[1].ld = d, nr[1].head_dim = (int)d, nr[1].x_rows = wp.from_ring, nr[1].rows = wp.n_ring;
    nr[1].out[0] = win.data(), nr[1].out_ld[0] = d, nr[1].out_rows[0] = wp.to_win_r;
    be_.norm_rope(nr, wp.n_ring ? 2 : 1, T, pos, eps, false);
  }
  // A decode step of a layer with compressors may run them and the indexer as a side chain beside wq_b and its
  // norm (Backend::fork; where the backend runs chains side by side): they need only h and qr, and only the
  // attention needs what they write. The same ops either way (the indexer's q rope then gets a norm_rope call
  // of its own: its bits are those of the shared call).
  const bool csa = L.type == AttnType::CSA, comp = L.type != AttnType::Sliding;
  const bool decode = st.decode;
  const bool chains = decode && comp && be_.chains_side_by_side(T);
  if (!chains) be_.linear(qr, T, nqk, *L.wq_b, q.data(), H * d);

  // Compressor projections for the whole step, one GEMM: comp [T, cw | cw | icw | icw] (row stride nc)
  // = the compressor's kv and gate, then (CSA) the indexer compressor's kv and gate.
  const int64_t cw = comp ? (L.comp.overlap ? 2 : 1) * d : 0;
  const int64_t hI = cfg_.index_n_heads, dI = cfg_.index_head_dim, icw = 2 * dI;
  const int64_t nc = 2 * cw + (csa ? 2 * icw : 0);
  Buffer<float> cproj(be_, T * nc), iq, gamma;
  float* ckv = cproj.data();
  float* cgate = ckv + cw;
  float* ikv = cgate + cw;
  float* igate = ikv + icw;
  // The indexer's head weights γ carry a factor 1/sqrt(hI): folded into indexer_scores' qk_scale when it
  // is a power of two (hI = 4^k, V4's 64: exact, the same bits as scaling γ), else γ is scaled.
  const float gamma_scale = 1.0f / std::sqrt((float)hI);
  int gexp = 0;
  const bool gamma_fold = std::frexp(gamma_scale, &gexp) == 0.5f;
  const float idx_scale = 1.0f / std::sqrt((float)dI) * (gamma_fold ? gamma_scale : 1.0f);
  if (csa) iq = Buffer<float>(be_, T * hI * dI), gamma = Buffer<float>(be_, T * hI);

  // The compressors close their windows into the pages and take the step's tokens into their rings;
  // each query's compressed entries are chosen (CSA) or all taken (HCA) and read in place from the pages
  // (rows of d floats from this layer's region of the page pool).
  const size_t B = st.batch.size();
  // A step of single tokens (decode) closes every sequence's windows in one call per compressor (after
  // the pushes: each window then lies whole in its ring) and scores every sequence's keys in one call
  // (a key list per query). Chunks close and score per sequence (their queries share its keys).
  const Step::CompPlan* cp = csa ? &st.csa : comp ? &st.hca : nullptr;
  float* comp_ring = comp ? slots + lay.slot_comp_off[l] : nullptr;  // this layer's regions in slot 0
  float* idx_ring = csa ? slots + lay.slot_idx_off[l] : nullptr;
  float* ent_base = comp ? cache.pages_base() + lay.page_entries_off[l] : nullptr;  // and in page 0
  float* key_base = csa ? cache.pages_base() + lay.page_idx_off[l] : nullptr;
  const int64_t kld = csa ? st.csa_keys.ld : 0, R = comp ? cp->R : 0;
  // CSA: each query keeps min(index_topk, visible entries) entries (offsets known on the host); which
  // ones is chosen on the backend (indexer_scores, then select_topk; a chunk's scores [n, nk] at
  // score_at[b] of one buffer, a decode step's [B, ld]).
  Buffer<int32_t> ent_idx_d(be_, csa ? (decode ? T * cfg_.index_topk : cp->ent_off[T]) : 0);
  Buffer<float> score_d(be_, csa && decode ? (int64_t)B * kld : csa ? cp->score_at[B] : 0);

  if (chains) be_.fork();
  if (comp) be_.linear(h, T, D, *L.wcomp, cproj.data(), nc);
  if (csa) {
    be_.linear(qr, T, nqk, *L.idx_wq_b, iq.data(), hI * dI);
    be_.linear(h, T, D, *L.idx_weights_proj, gamma.data(), hI);
    if (!gamma_fold) be_.scale(gamma.data(), T * hI, gamma_scale);
  }
  // The indexer's q rope (a CSA layer's inv_freq is inv_freq_compress_), in the call below when one chain.
  Backend::NormRope iq_rope;
  if (csa) {
    iq_rope.x = iq.data(), iq_rope.ld = hI * dI, iq_rope.heads = (int)hI, iq_rope.head_dim = (int)dI;
    iq_rope.rope_dim = (int)r, iq_rope.inv_freq = inv_freq_compress_.data();
  }
  if (chains && csa) be_.norm_rope(&iq_rope, 1, T, pos, eps, false);
  // The compressors' closings and the indexer's choice (decode: after the pushes; chunks: per sequence).
  auto compress_and_index = [&] {
    for (size_t b = 0; comp && !decode && b < B; ++b) {
      const V4SeqState& S = *st.batch[b].state;
      float* slot = cache.slot_data(S.slot);
      const int64_t p0 = S.pos, r0 = st.seq_begin[b], n = st.seq_begin[b + 1] - r0;
      float* ring = slot + lay.slot_comp_off[l];
      compressor_update(L.comp, ring, ring + R * cw, cache, S, lay.page_entries_off[l], ckv + r0 * nc,
                        cgate + r0 * nc, nc, p0, n);
      if (!csa) continue;
      float* iring = slot + lay.slot_idx_off[l];
      compressor_update(L.idx_comp, iring, iring + R * icw, cache, S, lay.page_idx_off[l], ikv + r0 * nc,
                        igate + r0 * nc, nc, p0, n);
      const int64_t nk = cp->n_keys[b];
      if (nk == 0) continue;
      float* score = score_d.data() + cp->score_at[b];  // [n, nk]
      be_.indexer_scores(iq.data() + r0 * hI * dI, gamma.data() + r0 * hI, n, (int)hI, (int)dI, key_base,
                         st.csa_keys.rows + b * kld, 0, nk, cp->nvis_row + r0, idx_scale, score);
      be_.select_topk(score, n, nk, cp->nvis_row + r0, (int)cfg_.index_topk, st.csa_entries.rows + b * kld, 0,
                      cp->ent_off_d + r0, ent_idx_d.data());
    }
    if (comp && cp->n_push) {  // the step's tokens into the compressor rings, after the chunks' closings read them
      // kv, gate (then the indexer's kv, gate) column slices of the same rows: one op
      const Backend::RowCopy sets[4] = {{0, comp_ring, cw, cp->push_kv, cw},
                                        {cw, comp_ring, cw, cp->push_gate, cw},
                                        {2 * cw, idx_ring, icw, cp->push_ikv, icw},
                                        {2 * cw + icw, idx_ring, icw, cp->push_igate, icw}};
      be_.copy_rows_multi(ckv, nc, cp->push_src, sets, csa ? 4 : 2, cp->n_push);
    }
    if (decode && comp) {
      const int64_t all_ring = std::numeric_limits<int64_t>::max();  // every position from the rings
      emit_entries(L.comp, comp_ring, comp_ring + R * cw, ckv, cgate, nc, all_ring, cp->close_win,
                   cp->close_ring, cp->close_pos, cp->close_page, cp->n_close, ent_base);
      if (csa)
        emit_entries(L.idx_comp, idx_ring, idx_ring + R * icw, ikv, igate, nc, all_ring, cp->close_win,
                     cp->close_iring, cp->close_pos, cp->close_ipage, cp->n_close, key_base);
    }
    if (csa && decode) {  // every sequence's query against its own keys, after every closing wrote its key
      be_.indexer_scores(iq.data(), gamma.data(), (int64_t)B, (int)hI, (int)dI, key_base, st.csa_keys.rows, kld,
                         kld, cp->nvis_seq, idx_scale, score_d.data());
      be_.select_topk(score_d.data(), (int64_t)B, kld, cp->nvis_seq, (int)cfg_.index_topk, st.csa_entries.rows,
                      kld, cp->ent_off_d, ent_idx_d.data());
    }
  };
  if (chains) {
    compress_and_index();
    be_.to_main();
    be_.linear(qr, T, nqk, *L.wq_b, q.data(), H * d);
  }
  // One call: q per head rms_norm (unweighted) + rope; kv rms_norm (kv_norm) + rope, then into the
  // window buffer and the ring; the indexer's q rope when one chain.
  {
    Backend::NormRope nr[3];
    nr[0].x = q.data(), nr[0].ld = H * d, nr[0].heads = (int)H, nr[0].head_dim = (int)d, nr[0].norm = true;
    nr[0].rope_dim = (int)r, nr[0].inv_freq = inv_freq;
    nr[1].x = kv, nr[1].ld = nqk, nr[1].head_dim = (int)d, nr[1].norm = true, nr[1].w = L.kv_norm.data();
    nr[1].rope_dim = (int)r, nr[1].inv_freq = inv_freq;
    nr[1].out[0] = win.data(), nr[1].out_ld[0] = d, nr[1].out_rows[0] = wp.to_win_k;
    nr[1].out[1] = swa_ring, nr[1].out_ld[1] = d, nr[1].out_rows[1] = wp.push_row;
    if (csa) nr[2] = iq_rope;
    be_.norm_rope(nr, csa && !chains ? 3 : 2, T, pos, eps, false);
  }
  if (chains) be_.join();
  else compress_and_index();
  const int32_t* ent_idx = csa ? ent_idx_d.data() : comp ? cp->hca_idx : nullptr;
  Buffer<float> o(be_, T * H * d);  // [T, H, d]
  be_.sink_attention(q.data(), T, H * d, (int)H, (int)d, win.data(), wp.lo, wp.hi,
                     comp ? ent_base : cache.pages_base(), ent_idx, comp ? cp->ent_off_d : nullptr, L.sinks.data(),
                     1.0f / std::sqrt((float)d), o.data(), H * d);
  be_.rope(o.data(), T, H * d, (int)H, (int)d, (int)r, pos, inv_freq, true);

  // Grouped output projection: group g's heads (H·d/g wide) through wo_a[g], then wo_b.
  const int64_t G = cfg_.o_groups, ol = cfg_.o_lora_rank;
  Buffer<float> z(be_, T * G * ol);  // [T, g·o_lora]
  be_.linear_groups(o.data(), T, H * d, *L.wo_a, z.data(), G * ol);
  be_.linear(z.data(), T, G * ol, *L.wo_b, st.y.data(), D);
}

void DeepseekV4Model::moe(const V4Layer& L, const float* h, const int32_t* tokens, int64_t T, float* out) {
  const int64_t D = cfg_.hidden_size, E = cfg_.n_routed_experts, K = cfg_.num_experts_per_tok;
  const int64_t I = cfg_.moe_intermediate_size;
  // Routing and the routed experts stay in backend memory: no round trip to the host in a step.
  Buffer<float> logits(be_, T * E), wsel(be_, T * K);  // [T, E], [T, K]
  Buffer<int32_t> sel(be_, T * K);                     // [T, K]
  // The router needs only h, and only the routed experts need it: a side chain beside the shared expert
  // (Backend::fork; in a recorded decode step, where the backend runs chains side by side).
  const bool chains = be_.chains_side_by_side(T);
  if (chains) be_.fork();
  be_.linear(h, T, D, *L.gate, logits.data(), E);
  const RouteScoring scoring = cfg_.scoring == ScoringFunc::Sigmoid   ? RouteScoring::Sigmoid
                               : cfg_.scoring == ScoringFunc::Softmax ? RouteScoring::Softmax
                                                                      : RouteScoring::SqrtSoftplus;
  const bool normalize = cfg_.scoring != ScoringFunc::Softmax || cfg_.norm_topk_prob;
  be_.moe_route(logits.data(), T, (int)E, (int)K, scoring, L.hash ? nullptr : L.gate_bias.data(),
                L.hash ? L.tid2eid.data() : nullptr, tokens, normalize, (float)cfg_.routed_scaling_factor, sel.data(),
                wsel.data());
  if (chains) be_.to_main();
  // The shared expert first (w13 with its SwiGLU, then w2); moe_ffn adds its output after the routed sum
  // (the bits of the add_rows that followed the routed experts before).
  Buffer<float> act, ye;  // [T, I], [T, D]
  if (L.shared_w13) {
    act = Buffer<float>(be_, T * I);
    ye = Buffer<float>(be_, T * D);
    be_.linear_swiglu(h, T, D, *L.shared_w13, (float)cfg_.swiglu_limit, act.data());
    be_.linear(act.data(), T, I, *L.shared_w2, ye.data(), D);
  }
  if (chains) be_.join();
  be_.moe_ffn(h, T, *L.experts, sel.data(), wsel.data(), (int)K, (float)cfg_.swiglu_limit, ye.data(), out);
}

std::vector<float> DeepseekV4Model::forward(std::span<const V4SeqChunk> batch, V4Cache& cache) {
  std::span<const float> v = forward_view(batch, cache);
  return std::vector<float>(v.begin(), v.end());
}

namespace {
// Entries a decode step's tables hold per sequence: the next power of two ≥ the most any sequence has
// after the step (at least 16), so that the layout changes only when a sequence crosses it.
int64_t entry_capacity(std::span<const V4SeqChunk> batch, int m) {
  int64_t most = 0;
  for (const auto& c : batch) most = std::max<int64_t>(most, (c.state->pos + (int64_t)c.tokens.size()) / m);
  int64_t cap = 16;
  while (cap < most) cap *= 2;
  return cap;
}
uint64_t mix(uint64_t h, uint64_t v) { return (h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2))) * 0x100000001b3ull; }
}  // namespace

namespace {
// The first upload of a step: token ids [T], then each residual stream's embedding row [T·hc].
std::vector<int32_t> token_pack(std::span<const int32_t> tokens, int64_t hc) {
  const int64_t T = (int64_t)tokens.size();
  std::vector<int32_t> p(T + T * hc);
  for (int64_t i = 0; i < T; ++i) p[i] = tokens[i];
  for (int64_t i = 0; i < T * hc; ++i) p[T + i] = tokens[i / hc];
  return p;
}
}  // namespace

std::span<const float> DeepseekV4Model::forward_view(std::span<const V4SeqChunk> batch, V4Cache& cache) {
  enqueue(batch, cache, false, {});
  return logits();
}

void DeepseekV4Model::prepare(std::span<const V4SeqChunk> batch, V4Cache& cache) {
  if (ready_) throw Error("prepare: the prepared step was not launched");
  for (const auto& c : batch)
    if (!c.state || c.tokens.size() != 1 || c.all_logits)
      throw Error("prepare: a decode step takes one token a sequence");
  if (batch.empty()) throw Error("prepare: an empty step");
  if (enqueue(batch, cache, true, {})) return;
  // No graph for it: the step is kept (its sequences' states as they are now) and runs at launch.
  deferred_states_.clear(), deferred_specs_.clear(), deferred_edited_.clear(), deferred_masked_.clear();
  for (const auto& c : batch) {
    deferred_states_.push_back(*c.state), deferred_specs_.push_back(c.sample), deferred_edited_.push_back(c.edited);
    deferred_masked_.push_back(c.masked);
    c.state->pos += 1;
  }
  deferred_cache_ = &cache;
  ready_ = true;
  ready_rows_ = ready_padded_ = (int64_t)batch.size();
  ready_pick_slot_ = argmax_ && decode_rows_of((int64_t)batch.size()) <= kPickRows;  // as enqueue will find it
  ready_edited_ = ready_masked_ = false;
  for (const auto& c : batch) ready_masked_ |= argmax_ && c.masked && be_.masks_on_backend();
  for (const auto& c : batch) ready_edited_ |= argmax_ && c.edited;
  ready_edited_ |= ready_masked_;
}

int64_t DeepseekV4Model::decode_rows_of(int64_t B) const {
  return pad_decode_ < 0 ? be_.decode_rows(B) : pad_decode_ ? decode_bucket(B) : B;
}

void DeepseekV4Model::launch(std::span<const int32_t> ids, std::span<const int32_t> feed, const StepEdits* edits) {
  if (!ready_) throw Error("launch: no prepared step");
  // A step that cannot be launched as asked is abandoned (its positions have advanced: the caller fails its
  // requests), so that the model and the backend are free for the next one.
  auto refuse = [&](const std::string& why) {
    ready_ = false;
    deferred_cache_ = nullptr;
    be_.graph_unready();
    throw Error("launch: " + why);
  };
  if ((int64_t)ids.size() != ready_rows_) refuse("one token id a sequence of the prepared step");
  if (!feed.empty() && feed.size() != ids.size()) refuse("one feed entry a sequence of the prepared step");
  const int64_t prev_rows = out_pick_slot_ ? out_n_ / cfg_.vocab_size : 0;
  bool fed = false;
  for (int32_t f : feed) {
    if (f >= prev_rows) refuse("feed row " + std::to_string(f) + " outside the last step's picks");
    fed |= f >= 0;
  }
  if (fed && !ready_pick_slot_) refuse("the prepared step cannot take a feed");
  if (edits) {
    if (edits->rows.size() != ids.size()) refuse("one logit-edit row a sequence of the prepared step");
    if ((int64_t)edits->list.size() > kEditCap) refuse("more logit edits than a step holds");
    for (size_t i = 0; i < edits->rows.size(); ++i) {
      const RowEdits& r = edits->rows[i];
      if (r.count < 0 || r.first < 0 || (size_t)r.first + (size_t)edit_places(r) > edits->list.size() ||
          (edit_places(r) > 0 && !ready_edited_))
        refuse("logit edits outside the list, or for a step prepared without them");
      if (r.pend > 0 && (feed.empty() || feed[i] < 0)) refuse("a pending logit-edit token on a row that is not fed");
    }
    std::vector<std::pair<int64_t, int64_t>> spans;  // the rows' places in the list (a pending token's two too)
    for (const RowEdits& r : edits->rows)
      if (edit_places(r) > 0) spans.emplace_back(r.first, (int64_t)r.first + edit_places(r));
    std::sort(spans.begin(), spans.end());
    for (size_t k = 1; k < spans.size(); ++k)
      if (spans[k].first < spans[k - 1].second) refuse("logit-edit rows overlap in the list");
    const int64_t W = mask_words(cfg_.vocab_size), nmask = (int64_t)edits->masks.size() / W;
    if ((int64_t)edits->masks.size() % W != 0 || nmask > kMaskRows || (nmask > 0 && !ready_masked_))
      refuse("grammar masks of the wrong size, too many, or for a step prepared without them");
    for (size_t i = 0; i < edits->rows.size(); ++i)  // (a fed row's mask would need its pending token)
      if (edits->rows[i].mask >= nmask || (edits->rows[i].mask >= 0 && !feed.empty() && feed[i] >= 0))
        refuse("a grammar mask outside the step's masks, or on a fed row");
  }
  std::vector<int32_t> t(ready_padded_, 0), map(ready_padded_, -1);  // stand-in rows keep token 0
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!feed.empty() && feed[i] >= 0) {
      map[i] = feed[i];
      continue;
    }
    if (ids[i] < 0 || ids[i] >= cfg_.vocab_size) refuse("token id " + std::to_string(ids[i]) + " outside the vocabulary");
    t[i] = ids[i];
  }
  ready_ = false;
  if (deferred_cache_) {  // no graph: the whole step runs now
    V4Cache& cache = *deferred_cache_;
    deferred_cache_ = nullptr;
    std::vector<V4SeqChunk> batch;
    for (size_t i = 0; i < ids.size(); ++i) {
      batch.push_back({&deferred_states_[i], std::span<const int32_t>(&t[i], 1), false, deferred_specs_[i]});
      batch.back().edited = deferred_edited_[i];
      batch.back().masked = deferred_masked_[i];
      if (edits) {
        batch.back().edit_row = edits->rows[i];
        batch.back().edits = std::span<const LogitEdit>(edits->list.data() + edits->rows[i].first, edits->rows[i].count);
        const int64_t W = mask_words(cfg_.vocab_size);
        if (edits->rows[i].mask >= 0)
          batch.back().mask = std::span<const uint32_t>(edits->masks.data() + edits->rows[i].mask * W, (size_t)W);
      }
    }
    enqueue(batch, cache, false, fed ? std::span<const int32_t>(map.data(), ids.size()) : std::span<const int32_t>{});
    return;
  }
  // The token ids, then the feed, then the rows' logit edits (the upload's first arrays: run() in enqueue); the
  // edits themselves into edits_'s half of the step's parity, before the step on the stream.
  std::vector<int32_t> pack = token_pack(t, cfg_.hc_mult);
  pack.insert(pack.end(), map.begin(), map.end());
  if (ready_edited_) {
    std::vector<RowEdits> rows((size_t)ready_padded_);
    if (edits) std::copy(edits->rows.begin(), edits->rows.end(), rows.begin());
    for (size_t i = 0; i < rows.size(); ++i)
      if (rows[i].pend > 0) rows[i].pend = (int32_t)i + 1;  // its token: the step's id i (one a sequence)
    const size_t at = pack.size();
    pack.resize(at + rows.size() * sizeof(RowEdits) / 4);
    std::memcpy(pack.data() + at, rows.data(), rows.size() * sizeof(RowEdits));
    // (An upload outside the region, ordered before its launch; if it fails, the step is abandoned.)
    try {
      if (edits && !edits->list.empty())
        be_.upload(edits_.data() + ready_par_ * kEditCap, edits->list.data(),
                   (int64_t)(edits->list.size() * sizeof(LogitEdit)));
      if (edits && !edits->masks.empty())
        be_.upload(mask_half(ready_par_), edits->masks.data(), (int64_t)(edits->masks.size() * sizeof(uint32_t)));
    } catch (...) {
      be_.graph_unready();
      throw;
    }
  }
  be_.graph_launch(pack.data(), (int64_t)(pack.size() * sizeof(int32_t)));
  if (edits && ready_edited_)
    set_out(ready_logits_, ready_ids_, ready_n_, ready_pick_slot_, ready_par_, ready_lps_, edits->rows, edits->list);
  else
    set_out(ready_logits_, ready_ids_, ready_n_, ready_pick_slot_, ready_par_, ready_lps_);
}

void DeepseekV4Model::set_out(const float* logits, const int32_t* ids, int64_t n, bool pick_slot, uint64_t par,
                              const RowLogprobs* lps, std::vector<RowEdits> erows, std::vector<LogitEdit> elist) {
  // A decode step's picks (and logprobs) start for the host right behind it, so that reading them later waits for
  // this step only, not for the step launched next (Backend::stage). (First: a failure leaves the outputs as they
  // were.)
  const int64_t rows = n / cfg_.vocab_size;
  if (pick_slot)
    be_.stage((int)par, ids,
              lps ? kPickRows * 4 + rows * (int64_t)sizeof(RowLogprobs) : rows * (int64_t)sizeof(int32_t));
  prev_slot_ = out_pick_slot_ ? out_slot_ : -1;
  prev_rows_ = out_pick_slot_ ? out_n_ / cfg_.vocab_size : 0;
  prev_lps_ = out_pick_slot_ && out_lps_;
  out_lps_ = lps;
  out_logits_ = logits;
  out_ids_ = ids;
  out_n_ = n;
  out_pick_slot_ = pick_slot;
  parity_ = par;
  out_slot_ = (int)par;
  out_erows_ = std::move(erows);
  out_elist_ = std::move(elist);
}

void DeepseekV4Model::restore_row(int64_t r, float* dst) {
  if (r >= (int64_t)out_erows_.size() || edit_places(out_erows_[(size_t)r]) <= 0) return;
  const RowEdits& e = out_erows_[(size_t)r];
  const int32_t n = edit_places(e);  // (a pending token: its value and id after the edits')
  std::vector<float> raw((size_t)n);
  be_.download(raw.data(), edits_raw_.data() + out_slot_ * kEditCap + e.first, n * (int64_t)sizeof(float));
  RowEdits here = e;  // (the row's places, from 0 in the downloaded copy)
  here.first = 0;
  restore_edits(dst, cfg_.vocab_size, here, out_elist_.data() + e.first, raw.data());
}

std::span<const RowLogprobs> DeepseekV4Model::logprobs(int back) {
  if (back != 0 && back != 1) throw Error("logprobs: back is 0 or 1");
  if (back == 1 && (prev_slot_ < 0 || !prev_lps_)) return {};
  if (back == 0 && !out_lps_) return {};
  const int64_t rows = back ? prev_rows_ : out_n_ / cfg_.vocab_size;
  lps_host_.resize((size_t)rows);
  read_out(back, kPickRows * 4, out_lps_, lps_host_.data(), rows * (int64_t)sizeof(RowLogprobs));
  return lps_host_;
}

void DeepseekV4Model::read_out(int back, int64_t staged_at, const void* src, void* dst, int64_t bytes) {
  if (back || out_pick_slot_)
    std::memcpy(dst, static_cast<const char*>(be_.staged(back ? prev_slot_ : out_slot_)) + staged_at, (size_t)bytes);
  else
    be_.download(dst, src, bytes);
}

std::span<const int32_t> DeepseekV4Model::argmax(int back) {
  if (back != 0 && back != 1) throw Error("argmax: back is 0 or 1");
  if (back == 1 && prev_slot_ < 0) throw Error("argmax(1): the step before the last one kept no picks");
  if (back == 0 && !out_ids_) return {};
  const int64_t rows = back ? prev_rows_ : out_n_ / cfg_.vocab_size;
  ids_host_.resize((size_t)rows);
  read_out(back, 0, out_ids_, ids_host_.data(), rows * (int64_t)sizeof(int32_t));
  return ids_host_;
}

void DeepseekV4Model::logits_row(int64_t r, float* dst) {
  const int64_t V = cfg_.vocab_size;
  if (r < 0 || (r + 1) * V > out_n_) throw Error("logits_row: row " + std::to_string(r) + " outside the step's logits");
  be_.download(dst, out_logits_ + r * V, V * (int64_t)sizeof(float));
  restore_row(r, dst);
}

std::span<const float> DeepseekV4Model::logits() {
  const float* v = static_cast<const float*>(be_.download_view(out_logits_, out_n_ * (int64_t)sizeof(float)));
  bool edited = false;
  for (const RowEdits& e : out_erows_) edited |= edit_places(e) > 0;
  if (!edited) return {v, (size_t)out_n_};
  restored_.assign(v, v + out_n_);  // rows whose edits ran on the backend get their raw logits back
  for (int64_t r = 0; r < (int64_t)out_erows_.size(); ++r) restore_row(r, restored_.data() + r * cfg_.vocab_size);
  return restored_;
}

bool DeepseekV4Model::enqueue(std::span<const V4SeqChunk> batch, V4Cache& cache, bool ready_only,
                              std::span<const int32_t> feed) {
  // The previous step's kept logits would move the arena top under a graph: prepare only after graph steps.
  if (ready_only && out_buf_.data()) return false;
  if (!ready_only) out_buf_ = Buffer<float>(), out_ids_buf_ = Buffer<int32_t>();  // valid until the next step
  const int64_t D = cfg_.hidden_size, hc = cfg_.hc_mult, V = cfg_.vocab_size;
  const float eps = (float)cfg_.rms_norm_eps, hc_eps = (float)cfg_.hc_eps;
  std::vector<int64_t> seq_begin{0};
  std::vector<int32_t> tokens, positions;
  for (size_t b = 0; b < batch.size(); ++b) {
    const V4SeqChunk& c = batch[b];
    if (!c.state || c.tokens.empty()) throw Error("forward: every sequence needs a state and at least one token");
    if (c.state->slot < 0 || c.state->slot >= cache.slot_manager().total() ||
        cache.slot_manager().refs(c.state->slot) == 0)
      throw Error("forward: sequence has no cache slot");
    if (cache.layout().pages_for(c.state->pos + (int64_t)c.tokens.size()) > (int64_t)c.state->pages.size())
      throw Error("forward: sequence's cache pages do not cover position " +
                  std::to_string(c.state->pos + (int64_t)c.tokens.size() - 1));
    if (c.state->pos + (int64_t)c.tokens.size() > INT32_MAX) throw Error("forward: position overflow");
    for (size_t a = 0; a < b; ++a)
      if (batch[a].state == c.state) throw Error("forward: the same sequence appears twice in one step");
    for (size_t i = 0; i < c.tokens.size(); ++i) {
      int32_t t = c.tokens[i];
      if (t < 0 || t >= V) throw Error("forward: token id " + std::to_string(t) + " outside the vocabulary [0, " +
                                       std::to_string(V) + ")");
      tokens.push_back(t);
      positions.push_back((int32_t)(c.state->pos + (int64_t)i));
    }
    seq_begin.push_back((int64_t)tokens.size());
  }
  if (cache.backend() ? cache.backend() != &be_ : be_.free_memory() >= 0)
    throw Error(std::string("forward: the cache does not live in the memory of the ") + be_.name() + " backend");
  const int64_t T = (int64_t)tokens.size(), B = (int64_t)batch.size();
  bool has_csa = false, has_hca = false;
  for (AttnType t : cfg_.layer_types) has_csa |= t == AttnType::CSA, has_hca |= t == AttnType::HCA;
  const bool decode = B == T;
  const int64_t cap_csa = decode && has_csa ? entry_capacity(batch, cfg_.compress_rate_csa) : 0;
  const int64_t cap_hca = decode && has_hca ? entry_capacity(batch, cfg_.compress_rate_hca) : 0;
  // Rows that need logits.
  std::vector<int32_t> rows;
  for (int64_t b = 0; b < B; ++b) {
    if (batch[b].all_logits)
      for (int64_t t = seq_begin[b]; t < seq_begin[b + 1]; ++t) rows.push_back((int32_t)t);
    else
      rows.push_back((int32_t)(seq_begin[b + 1] - 1));
  }
  const int64_t R = (int64_t)rows.size();
  // The rows' sampling (greedy for every row but a chunk's last, and for the stand-ins below).
  std::vector<SampleSpec> specs((size_t)R);
  for (int64_t b = 0, r = 0; b < B; ++b) {
    r += batch[b].all_logits ? seq_begin[b + 1] - seq_begin[b] : 1;
    specs[(size_t)(r - 1)] = batch[b].sample;
  }
  // Raw logprobs on the backend for the rows that ask (Backend::logprob_rows), when it has them on; else none.
  bool lp = false;
  for (SampleSpec& sp : specs) {
    if (!argmax_ || !be_.logprobs_on_backend()) sp.logprobs = -1;
    lp |= sp.logprobs >= 0;
  }
  // Logit edits of the sampled rows (argmax_): RowEdits [Rp] in the upload after the feed map, the edits in
  // edits_'s half of the step's parity, uploaded before the step (their number is not part of a graph's key).
  // Grammar masks (Backend::mask_rows, before the edits): a row's mask_words(V) words in masks_'s half of the
  // step's parity, its place in its RowEdits (a masked step records the edits op too).
  bool edited = false, masked = false;
  for (const auto& c : batch) {
    if (!c.mask.empty() && !(argmax_ && be_.masks_on_backend()))
      throw Error("forward: a grammar mask for a backend without them (or without picks)");
    edited |= argmax_ && c.edited, masked |= argmax_ && be_.masks_on_backend() && (c.masked || !c.mask.empty());
  }
  edited |= masked;
  const int64_t W = mask_words(V);
  std::vector<RowEdits> erows;
  std::vector<LogitEdit> elist;
  std::vector<uint32_t> mlist;
  if (edited) {
    erows.resize((size_t)R);
    for (int64_t b = 0, r = 0; b < B; ++b) {
      r += batch[b].all_logits ? seq_begin[b + 1] - seq_begin[b] : 1;
      RowEdits& e = erows[(size_t)(r - 1)];
      e = batch[b].edit_row;
      e.first = (int32_t)elist.size(), e.count = (int32_t)batch[b].edits.size(), e.mask = -1;
      elist.insert(elist.end(), batch[b].edits.begin(), batch[b].edits.end());
      if (!batch[b].mask.empty()) {
        if ((int64_t)batch[b].mask.size() != W) throw Error("forward: a grammar mask of the wrong size");
        e.mask = (int32_t)((int64_t)mlist.size() / W);
        mlist.insert(mlist.end(), batch[b].mask.begin(), batch[b].mask.end());
      }
      if (e.pend > 0) {  // the row's input token (its last) is pending: two places kept free after its edits
        if (feed.empty() || feed[(size_t)b] < 0 || batch[b].tokens.size() != 1)
          throw Error("forward: a pending logit-edit token on a row that is not fed");
        e.pend = (int32_t)seq_begin[b + 1];
        elist.resize(elist.size() + 2, LogitEdit{-1, 0.0f, 0, 0u});
      }
    }
    if ((int64_t)elist.size() > kEditCap) throw Error("forward: more logit edits than a step holds");
    if ((int64_t)mlist.size() > kMaskRows * W) throw Error("forward: more grammar masks than a step holds");
  }
  // A decode step padded to a bucket of batch sizes: stand-in sequences after the real ones (every op
  // is batch invariant within the bucket, so the real rows' results do not change; their logits rows
  // come after the real ones and are not returned).
  const int64_t Bp = decode ? decode_rows_of(B) : B;
  V4SeqState stand_in;  // slot 0, page 0, position 0: read from, never written to
  stand_in.slot = 0;
  stand_in.pages = {0};
  const int32_t zero_token = 0;
  std::vector<V4SeqChunk> padded;
  std::span<const V4SeqChunk> steps = batch;
  if (Bp > B) {
    padded.assign(batch.begin(), batch.end());
    for (int64_t b = B; b < Bp; ++b) {
      padded.push_back(V4SeqChunk{&stand_in, std::span<const int32_t>(&zero_token, 1), false});
      tokens.push_back(0);
      positions.push_back(0);
      seq_begin.push_back(b + 1);
      rows.push_back((int32_t)b);
      specs.emplace_back();
      if (edited) erows.emplace_back();
    }
    steps = padded;
  }
  const int64_t Tp = (int64_t)tokens.size(), Rp = (int64_t)rows.size(), B_real = B;
  // A decode step's picks go to its parity's half of picks_ (so that the next step can take them as its tokens,
  // and the host can read them after that launch); it reads the other half when fed. Parity alternates by
  // decode step below, before run().
  const bool pick_slot = decode && argmax_ && Rp <= kPickRows;
  // This step's parity: the last launched step's, flipped for a decode step (it becomes parity_ once the step is
  // launched: a step that is not — it failed, or was not prepared — leaves the alternation as it was).
  const uint64_t par = decode ? parity_ ^ 1 : parity_;
  if (!feed.empty() && !(pick_slot && out_pick_slot_)) throw Error("forward: a feed needs picks on both sides");
  std::vector<int32_t> feed_map;  // [Tp] (decode: −1 = the token is given)
  if (decode) {
    feed_map.assign((size_t)Tp, -1);
    std::copy(feed.begin(), feed.end(), feed_map.begin());
  }

  Buffer<float> logits;  // [Rp, V] (the first R rows are the step's output)
  Buffer<int32_t> ids;   // [Rp] their picks, when argmax_ and not pick_slot (then their logprobs, when lp)
  int32_t* pick_out = nullptr;  // where they are
  RowLogprobs* lps_out = nullptr;  // and the logprobs
  bool in_graph = false;        // run() is recorded (Backend::graph_begin)
  // The step, from the uploads to the logits. A decode step's launches are a function of (this model,
  // B, R, the capacities): the backend may record them once and replay them (Backend::graph_begin).
  auto run = [&] {
    // From here on batch, B, T and R are the padded step's (stand-ins included); B_real and the outer R
    // are what the caller sees.
    const std::span<const V4SeqChunk> batch = steps;
    const int64_t T = Tp, B = Bp, R = Rp;
    Step st;
    st.n_real = B_real;
    st.batch = batch;
    st.cache = &cache;
    st.seq_begin = seq_begin;
    st.tokens = tokens;
    st.pos = positions;
    st.T = T;
    st.decode = decode;
    st.cap_csa = cap_csa;
    st.cap_hca = cap_hca;
    // The token ids, then a decode step's feed, first in the step's upload (prepare/launch replace them at launch).
    const size_t at_tok = st.up.add(token_pack(st.tokens, hc)), at_feed = st.up.add(feed_map);
    const size_t at_erows = edited ? st.up.add(erows) : 0, at_pos = st.up.add(st.pos);
    {
      const V4CacheLayout& lay = cache.layout();
      if (has_csa) {
        build_entry_table(st.up, batch, lay, cfg_.compress_rate_csa, cfg_.index_head_dim, cap_csa, st.csa_keys);
        build_entry_table(st.up, batch, lay, cfg_.compress_rate_csa, cfg_.head_dim, cap_csa, st.csa_entries);
      }
      if (has_hca) build_entry_table(st.up, batch, lay, cfg_.compress_rate_hca, cfg_.head_dim, cap_hca, st.hca_entries);
      if (has_csa)
        build_comp_plan(st.up, cfg_, batch, st.seq_begin, lay, true, st.hca_entries, cap_hca, st.n_real, st.csa);
      if (has_hca)
        build_comp_plan(st.up, cfg_, batch, st.seq_begin, lay, false, st.hca_entries, cap_hca, st.n_real, st.hca);
      // Sliding window (every layer): slot_floats is a multiple of d, so slot s's ring row i of a layer is
      // row s·slot_floats/d + i from that layer's ring region in slot 0. A decode step gives every
      // sequence W rows of win (ring rows of positions p0−W+1 .. p0−1, then its token; rows before
      // position 0 are copied but lie outside [lo, hi)); a chunked step packs what each sequence sees.
      const int64_t W = cfg_.sliding_window, d = cfg_.head_dim;
      std::vector<int32_t> from_ring, to_win_r, to_win_k, push_row(T, -1), lo(T), hi(T);
      RingPush push;
      int64_t b0 = 0;  // first row of this sequence's keys in win
      for (int64_t b = 0; b < B; ++b) {
        const V4SeqState& S = *batch[b].state;
        const int64_t p0 = S.pos, r0 = st.seq_begin[b], n = st.seq_begin[b + 1] - r0;
        const int64_t np = std::min<int64_t>(W - 1, p0);  // earlier tokens still inside the window
        const int32_t ring0 = (int32_t)((int64_t)S.slot * lay.slot_floats / d);
        const int64_t first = decode ? W - 1 : np;  // ring rows copied
        for (int64_t i = 0; i < first; ++i) {
          from_ring.push_back((int32_t)(ring0 + ((p0 - first + i) % W + W) % W));
          to_win_r.push_back((int32_t)(b0 + i));
        }
        for (int64_t i = 0; i < n; ++i) {
          to_win_k.push_back((int32_t)(b0 + first + i));
          hi[r0 + i] = (int32_t)(b0 + first + i + 1);
          lo[r0 + i] = (int32_t)std::max<int64_t>(b0 + first - np, hi[r0 + i] - W);
        }
        if (b < st.n_real) push.add(r0, n, p0, W, ring0);  // a stand-in writes nothing
        b0 += first + n;
      }
      Step::WindowPlan& wp = st.window;
      wp.rows = b0;
      wp.n_ring = (int64_t)from_ring.size();
      for (size_t j = 0; j < push.src.size(); ++j) push_row[push.src[j]] = push.dst[j];  // one push a row at most
      int k = 0;
      for (const auto* a : {&from_ring, &to_win_r, &to_win_k, &push_row, &lo, &hi}) wp.at[k++] = st.up.add(*a);
    }
    // the upload, then every pointer into it
    const size_t at_rows = st.up.add(rows), at_spec = argmax_ ? st.up.add(specs) : 0;
    st.up.upload(be_);
    st.tok_pack = st.tok_d = st.up.ptr<int32_t>(at_tok);
    st.pos_d = st.up.ptr<int32_t>(at_pos);
    for (Step::EntryTable* t : {&st.csa_keys, &st.csa_entries, &st.hca_entries}) t->rows = st.up.ptr<int32_t>(t->at);
    if (has_csa) resolve_comp_plan(st.up, st.csa);
    if (has_hca) resolve_comp_plan(st.up, st.hca);
    {
      Step::WindowPlan& wp = st.window;
      wp.from_ring = st.up.ptr<int32_t>(wp.at[0]), wp.to_win_r = st.up.ptr<int32_t>(wp.at[1]);
      wp.to_win_k = st.up.ptr<int32_t>(wp.at[2]), wp.push_row = st.up.ptr<int32_t>(wp.at[3]);
      wp.lo = st.up.ptr<int32_t>(wp.at[4]), wp.hi = st.up.ptr<int32_t>(wp.at[5]);
    }
    // Fed rows take the last step's picks (always in a recorded step: its feed is known only at launch).
    if (pick_slot && (in_graph || !feed.empty()))
      be_.feed_tokens(st.up.ptr<int32_t>(at_tok), T, (int)hc, st.up.ptr<int32_t>(at_feed),
                      pick_half(par ^ 1), V);
    Buffer<float> X(be_, T * hc * D), X2(be_, T * hc * D);  // [T, hc, D] residual streams
    // every stream starts as the token's embedding
    be_.copy_rows(embed_.data(), D, st.tok_pack + T, X.data(), D, nullptr, T * hc, D);
    Buffer<float> u(be_, T * D), post(be_, T * hc), comb(be_, T * hc * hc);
    st.h = Buffer<float>(be_, T * D);
    st.y = Buffer<float>(be_, T * D);
    for (int l = 0; l < cfg_.num_layers; ++l) {
      const V4Layer& L = layers_[l];
      be_.hc_pre_norm(X.data(), T, (int)hc, D, L.hc_attn_fn.data(), L.hc_attn_base.data(), L.hc_attn_scale.data(),
                      cfg_.hc_sinkhorn_iters, hc_eps, eps, u.data(), post.data(), comb.data(), L.attn_norm.data(), eps,
                      st.h.data());
      attention(l, st);
      be_.hc_post(X.data(), st.y.data(), post.data(), comb.data(), T, (int)hc, D, X2.data());
      std::swap(X, X2);
      be_.hc_pre_norm(X.data(), T, (int)hc, D, L.hc_ffn_fn.data(), L.hc_ffn_base.data(), L.hc_ffn_scale.data(),
                      cfg_.hc_sinkhorn_iters, hc_eps, eps, u.data(), post.data(), comb.data(), L.ffn_norm.data(), eps,
                      st.h.data());
      moe(L, st.h.data(), st.tok_d, T, st.y.data());
      be_.hc_post(X.data(), st.y.data(), post.data(), comb.data(), T, (int)hc, D, X2.data());
      std::swap(X, X2);
    }
    Buffer<float> Xr(be_, R * hc * D), ur(be_, R * D);
    logits = Buffer<float>(be_, R * V);
    be_.copy_rows(X.data(), hc * D, st.up.ptr<int32_t>(at_rows), Xr.data(), hc * D, nullptr, R, hc * D);
    be_.hc_head(Xr.data(), R, (int)hc, D, hc_head_fn_.data(), hc_head_base_.data(), hc_head_scale_.data(), hc_eps,
                eps, ur.data());
    be_.rms_norm(ur.data(), R, D, D, norm_.data(), eps, ur.data());
    be_.linear(ur.data(), R, D, *head_, logits.data(), V);
    if (argmax_) {  // picks on the backend: only R ids need to cross (argmax())
      constexpr int64_t kLpInts = (int64_t)(sizeof(RowLogprobs) / 4);
      if (!pick_slot) ids = Buffer<int32_t>(be_, R + (lp ? R * kLpInts : 0));  // [R] picks, then [R] RowLogprobs
      pick_out = pick_slot ? pick_half(par) : ids.data();
      const RowEdits* er = edited ? st.up.ptr<RowEdits>(at_erows) : nullptr;
      LogitEdit* el = edited ? edits_.data() + par * kEditCap : nullptr;
      float* raw = edited ? edits_raw_.data() + par * kEditCap : nullptr;
      if (masked) be_.mask_rows(logits.data(), R, V, V, er, mask_half(par));  // the grammar first, as the host
      be_.sample_rows(logits.data(), R, V, V, st.up.ptr<SampleSpec>(at_spec), er, el, raw, st.up.ptr<int32_t>(at_tok),
                      pick_out);
      if (lp) {  // the rows that asked get their raw logprobs (their edits put back first), next to the picks
        lps_out = reinterpret_cast<RowLogprobs*>(pick_out + (pick_slot ? kPickRows : R));
        be_.logprob_rows(logits.data(), R, V, V, st.up.ptr<SampleSpec>(at_spec), er, el, raw, pick_out, lps_out);
      }
    }
  };
  // The key: everything the recorded launches depend on besides the uploaded bytes (the step's own
  // buffers are checked by the backend). Consecutive decode steps alternate between two graphs (parity):
  // step N+1 is prepared (its uploads written into its graph's page-locked copies) while step N's graph
  // may still read its own.
  uint64_t key = 0xcbf29ce484222325ull;
  for (uint64_t v : {graph_owner_, (uint64_t)(uintptr_t)cache.pages_base(), (uint64_t)(uintptr_t)cache.slots_base(),
                     (uint64_t)Bp, (uint64_t)Rp, (uint64_t)cap_csa, (uint64_t)cap_hca, par, (uint64_t)argmax_,
                     (uint64_t)edited, (uint64_t)lp, (uint64_t)masked})
    key = mix(key, v);
  if (!elist.empty())  // before the region: not one of its uploads (their size is not in the key)
    be_.upload(edits_.data() + par * kEditCap, elist.data(), (int64_t)(elist.size() * sizeof(LogitEdit)));
  if (!mlist.empty()) be_.upload(mask_half(par), mlist.data(), (int64_t)(mlist.size() * sizeof(uint32_t)));
  const Backend::GraphMode mode = decode ? be_.graph_begin(key) : Backend::GraphMode::Off;
  bool graphed = mode != Backend::GraphMode::Off;
  in_graph = graphed;
  if (ready_only) {  // the step waits for its token ids (launch); nothing has run when it cannot
    if (mode == Backend::GraphMode::Off) return false;
    try {
      run();
      be_.graph_ready();
    } catch (const Error& e) {
      be_.graph_abort(e.what());
      return false;
    }
    ready_ = true;
    ready_rows_ = B_real;
    ready_padded_ = Tp;
    ready_logits_ = logits.data();  // the launched step's stay readable (logits()) until launch
    ready_ids_ = pick_out;
    ready_lps_ = lps_out;
    ready_pick_slot_ = pick_slot;
    ready_par_ = par;
    ready_edited_ = edited;
    ready_masked_ = masked;
    ready_n_ = R * V;
    for (const auto& c : batch) c.state->pos += (int64_t)c.tokens.size();
    return true;
  } else if (mode == Backend::GraphMode::Off) {
    run();
  } else {
    try {
      run();
      be_.graph_end();
    } catch (const Error& e) {  // nothing ran: the step again, without a graph
      be_.graph_abort(e.what());
      logits = Buffer<float>();
      ids = Buffer<int32_t>();
      graphed = in_graph = false;
      run();
    }
  }
  for (const auto& c : batch) c.state->pos += (int64_t)c.tokens.size();
  // A graph's logits are freed with its other buffers, so that every graph of a key starts at the same
  // arena top; nothing runs before the next launch, so they stay readable until then. Otherwise they are
  // kept until the next step.
  if (edited) set_out(logits.data(), pick_out, R * V, pick_slot, par, lps_out, std::move(erows), std::move(elist));
  else set_out(logits.data(), pick_out, R * V, pick_slot, par, lps_out);
  if (!graphed) out_buf_ = std::move(logits), out_ids_buf_ = std::move(ids);
  return true;
}

}  // namespace deepinfer
