#include "util/block_manager.h"

#include <stdexcept>

namespace deepinfer {

BlockManager::BlockManager(int32_t total) : refs_(total, 0) {
  free_.reserve(total);
  for (int32_t i = total - 1; i >= 0; --i) free_.push_back(i);  // hand out low ids first
}

bool BlockManager::allocate(int32_t n, std::vector<int32_t>* out) {
  if (n < 0 || n > num_free()) return false;
  for (int32_t i = 0; i < n; ++i) {
    int32_t id = free_.back();
    free_.pop_back();
    refs_[id] = 1;
    out->push_back(id);
  }
  return true;
}

void BlockManager::add_ref(int32_t id) {
  if (id < 0 || id >= total() || refs_[id] == 0) throw std::logic_error("add_ref on a free block");
  ++refs_[id];
}

void BlockManager::release(const std::vector<int32_t>& ids) {
  for (int32_t id : ids) {
    if (id < 0 || id >= total() || refs_[id] == 0)
      throw std::logic_error("release of block " + std::to_string(id) + " that is not held");
    if (--refs_[id] == 0) free_.push_back(id);
  }
}

std::string BlockManager::check_invariants() const {
  std::vector<char> in_free(refs_.size(), 0);
  for (int32_t id : free_) {
    if (id < 0 || id >= total()) return "free list holds out-of-range id " + std::to_string(id);
    if (in_free[id]) return "block " + std::to_string(id) + " is twice in the free list";
    in_free[id] = 1;
    if (refs_[id] != 0) return "block " + std::to_string(id) + " is free but has holders";
  }
  int32_t used = 0;
  for (size_t i = 0; i < refs_.size(); ++i) {
    if (refs_[i] < 0) return "negative reference count";
    if (refs_[i] > 0) ++used;
    else if (!in_free[i]) return "block " + std::to_string(i) + " is neither free nor used";
  }
  if (used + num_free() != total()) return "free + used != total";
  return "";
}

}  // namespace deepinfer
