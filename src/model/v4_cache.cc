#include "model/v4_cache.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "util/error.h"

namespace deepinfer {

V4CacheLayout V4CacheLayout::make(const V4Config& c) {
  V4CacheLayout L;
  const int64_t d = c.head_dim, dI = c.index_head_dim, W = c.sliding_window;
  // A page spans a whole number of windows of both ratios.
  const int64_t m_lcm = std::lcm<int64_t>(c.compress_rate_csa, c.compress_rate_hca);
  L.tokens_per_page = ((256 + m_lcm - 1) / m_lcm) * m_lcm;
  const int64_t align = std::lcm<int64_t>(d, dI);
  auto aligned = [&](int64_t x) { return (x + align - 1) / align * align; };
  const int n = c.num_layers;
  L.page_entries_off.assign(n, -1);
  L.page_idx_off.assign(n, -1);
  L.slot_ring_off.assign(n, -1);
  L.slot_comp_off.assign(n, -1);
  L.slot_idx_off.assign(n, -1);
  // Slot regions start at multiples of every ring's row width (d, 2d, 2dI), so that the model can
  // address any ring row of any slot as a row index from the slot pool's start (batched row copies).
  const int64_t salign = std::lcm<int64_t>(2 * d, 2 * dI);
  auto saligned = [&](int64_t x) { return (x + salign - 1) / salign * salign; };
  int64_t page = 0, slot = 0;
  for (int l = 0; l < n; ++l) {
    L.slot_ring_off[l] = slot;
    slot = saligned(slot + W * d);
    if (c.layer_types[l] == AttnType::Sliding) continue;
    const bool csa = c.layer_types[l] == AttnType::CSA;
    const int64_t m = c.compress_rate(l);
    L.page_entries_off[l] = page;
    page = aligned(page + (L.tokens_per_page / m) * d);
    L.slot_comp_off[l] = slot;
    slot = saligned(slot + (csa ? 2 * (2 * m) * (2 * d) : 2 * m * d));
    if (csa) {
      L.page_idx_off[l] = page;
      page = aligned(page + (L.tokens_per_page / m) * dI);
      L.slot_idx_off[l] = slot;
      slot = saligned(slot + 2 * (2 * m) * (2 * dI));
    }
  }
  L.page_floats = aligned(std::max<int64_t>(page, 1));
  L.slot_floats = saligned(std::max<int64_t>(slot, 1));
  return L;
}

V4Cache::V4Cache(const V4Config& cfg, int32_t num_slots, int32_t num_pages, Backend* backend)
    : layout_(V4CacheLayout::make(cfg)), backend_(backend), slots_mgr_(num_slots), pages_mgr_(num_pages) {
  const int64_t ns = (int64_t)num_slots * layout_.slot_floats, np = (int64_t)num_pages * layout_.page_floats;
  if (!backend_) {
    slots_.resize((size_t)ns);
    pages_.resize((size_t)np);
    return;
  }
  dev_slots_ = Buffer<float>(*backend_, ns);
  dev_pages_ = Buffer<float>(*backend_, np);
  backend_->fill(dev_slots_.data(), ns, 0.0f);
  backend_->fill(dev_pages_.data(), np, 0.0f);
}

V4Cache V4Cache::from_budget(const V4Config& cfg, int64_t budget_bytes, int32_t max_seqs, Backend* backend) {
  V4CacheLayout L = V4CacheLayout::make(cfg);
  const int64_t slots_bytes = (int64_t)max_seqs * L.slot_bytes();
  const int64_t pages = (budget_bytes - slots_bytes) / L.page_bytes();
  if (max_seqs < 1 || pages < max_seqs)
    throw Error("cache budget of " + std::to_string(budget_bytes >> 20) + " MiB cannot hold " +
                std::to_string(max_seqs) + " sequences (each needs " + std::to_string(L.slot_bytes()) +
                " B of fixed state plus pages of " + std::to_string(L.page_bytes()) + " B per " +
                std::to_string(L.tokens_per_page) + " tokens)");
  return V4Cache(cfg, max_seqs, (int32_t)std::min<int64_t>(pages, INT32_MAX), backend);
}

bool V4Cache::open(V4SeqState* s) {
  std::vector<int32_t> id;
  if (!slots_mgr_.allocate(1, &id)) return false;
  s->pos = 0;
  s->slot = id[0];
  s->pages.clear();
  return true;
}

bool V4Cache::reserve(V4SeqState* s, int64_t tokens) {
  const int64_t need = layout_.pages_for(tokens) - (int64_t)s->pages.size();
  if (need <= 0) return true;
  return pages_mgr_.allocate((int32_t)need, &s->pages);
}

void V4Cache::close(V4SeqState* s) {
  if (s->slot >= 0) slots_mgr_.release({s->slot});
  pages_mgr_.release(s->pages);
  s->slot = -1;
  s->pages.clear();
  s->pos = 0;
}

void V4Cache::fill_random_for_bench(uint64_t seed) {
  const int64_t base = int64_t(1) << 22;
  std::vector<float> pat(2 * base);  // the pattern twice, so any rotation is one contiguous copy
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
  auto next = [&] {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  for (int64_t i = 0; i < base; ++i) {  // Box-Muller
    const double u1 = ((next() >> 11) + 1) * 0x1.0p-53, u2 = (next() >> 11) * 0x1.0p-53;
    pat[i] = pat[i + base] = (float)(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  auto fill = [&](float* dst, int64_t n) {
    for (int64_t done = 0; done < n;) {
      const int64_t len = std::min(base, n - done);
      const float* src = pat.data() + (int64_t)(next() % (uint64_t)base);
      if (backend_) backend_->upload(dst + done, src, len * (int64_t)sizeof(float));
      else std::copy(src, src + len, dst + done);
      done += len;
    }
  };
  fill(slots_base(), (int64_t)slots_mgr_.total() * layout_.slot_floats);
  fill(pages_base(), (int64_t)pages_mgr_.total() * layout_.page_floats);
  if (backend_) backend_->synchronize();
}

bool V4Cache::fast_forward_for_bench(V4SeqState* s, int64_t tokens, int64_t extra) {
  if (s->slot < 0 || tokens < 0 || extra < 0 || !reserve(s, tokens + extra)) return false;
  s->pos = tokens;
  return true;
}

}  // namespace deepinfer
