#pragma once
// Paged storage for DeepSeek-V4's decode state (spec §4), in two pools sized from a memory budget:
//
//  * pages — prefix-global state, block-major: one page holds, for `tokens_per_page` consecutive
//    positions, every CSA layer's compressed entries and indexer keys and every HCA layer's
//    compressed entries. A sequence holds one page per tokens_per_page positions (a page table);
//    pages never change once their positions are final, so they can later be shared by prefix caching.
//  * slots — position-local state of fixed size per running sequence: every layer's sliding-window
//    ring (W rows, row = position mod W) and every compressor's rows of the open window, as rings
//    indexed by position (CSA keeps two windows, so the "overlap" halves of the previous window are
//    simply still there).
//
// Both pools are plain float arrays plus a BlockManager each (ids only). Rows never straddle pages.
// The arrays live in host memory, or in a backend's memory (device memory for CUDA) when the cache is
// built with that backend; the model's forward pass then reads and writes them only through ops.
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "ops/backend.h"
#include "util/block_manager.h"

namespace deepinfer {

struct V4CacheLayout {
  int64_t tokens_per_page = 256;
  int64_t page_floats = 0;  // multiple of head_dim and index_head_dim
  int64_t slot_floats = 0;
  // Per layer (−1 where absent). Page offsets are in floats from the page start; rows are contiguous.
  std::vector<int64_t> page_entries_off;  // CSA/HCA: [tokens_per_page / m, d]
  std::vector<int64_t> page_idx_off;      // CSA: [tokens_per_page / m, dI]
  std::vector<int64_t> slot_ring_off;     // all: [W, d]
  std::vector<int64_t> slot_comp_off;     // CSA: kv [2m, 2d] then gate [2m, 2d]; HCA: kv [m, d], gate [m, d]
  std::vector<int64_t> slot_idx_off;      // CSA: kv [2m, 2dI] then gate [2m, 2dI]

  static V4CacheLayout make(const V4Config& cfg);
  int64_t page_bytes() const { return page_floats * 4; }
  int64_t slot_bytes() const { return slot_floats * 4; }
  // Pages needed to hold positions [0, tokens).
  int64_t pages_for(int64_t tokens) const { return (tokens + tokens_per_page - 1) / tokens_per_page; }
};

// A sequence's share of the cache: its slot, its page table and how far it has been processed.
struct V4SeqState {
  int64_t pos = 0;                // tokens processed = next absolute position
  int32_t slot = -1;              // id in the slot pool
  std::vector<int32_t> pages;     // page i holds positions [i·T, (i+1)·T)
};

class V4Cache {
 public:
  // backend: allocate the pools in that backend's memory (zeroed); null = host memory.
  V4Cache(const V4Config& cfg, int32_t num_slots, int32_t num_pages, Backend* backend = nullptr);
  // Pools sized from a byte budget: `max_seqs` slots, the rest of the budget in pages. Throws Error
  // if the budget cannot hold the slots plus one page per sequence.
  static V4Cache from_budget(const V4Config& cfg, int64_t budget_bytes, int32_t max_seqs,
                             Backend* backend = nullptr);
  Backend* backend() const { return backend_; }  // null: host memory

  const V4CacheLayout& layout() const { return layout_; }
  BlockManager& slot_manager() { return slots_mgr_; }
  BlockManager& page_manager() { return pages_mgr_; }
  const BlockManager& slot_manager() const { return slots_mgr_; }
  const BlockManager& page_manager() const { return pages_mgr_; }
  int64_t capacity_bytes() const {
    return ((int64_t)slots_mgr_.total() * layout_.slot_floats + (int64_t)pages_mgr_.total() * layout_.page_floats) * 4;
  }

  // A fresh sequence with a slot (false if none is free).
  bool open(V4SeqState* s);
  // Grows s's page table to cover `tokens` positions (false, unchanged, if pages run out).
  bool reserve(V4SeqState* s, int64_t tokens);
  // Returns the slot and every page; s becomes empty.
  void close(V4SeqState* s);

  // ---- benchmark only (`deepinfer bench`); the engine never calls these ----
  // Fills both pools with N(0, 1) values (a random pattern of 2^22 values, repeated at random
  // rotations), standing in for the state that a real prefill would have left there.
  void fill_random_for_bench(uint64_t seed);
  // Makes the opened sequence `s` look as if `tokens` positions had been processed without computing
  // anything: pages for `tokens + extra` positions, s->pos = tokens. Its slot and pages hold whatever
  // the pools hold (fill_random_for_bench). False (s unchanged) if pages run out.
  bool fast_forward_for_bench(V4SeqState* s, int64_t tokens, int64_t extra);

  float* slot_data(int32_t slot) { return slots_base() + (int64_t)slot * layout_.slot_floats; }
  float* page_data(int32_t page) { return pages_base() + (int64_t)page * layout_.page_floats; }
  float* pages_base() { return backend_ ? dev_pages_.data() : pages_.data(); }
  float* slots_base() { return backend_ ? dev_slots_.data() : slots_.data(); }

 private:
  V4CacheLayout layout_;
  Backend* backend_ = nullptr;
  std::vector<float> slots_;  // [num_slots, slot_floats] (host memory)
  std::vector<float> pages_;  // [num_pages, page_floats]
  Buffer<float> dev_slots_, dev_pages_;  // the same in the backend's memory
  BlockManager slots_mgr_, pages_mgr_;
};

}  // namespace deepinfer
