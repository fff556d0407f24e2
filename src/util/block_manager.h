#pragma once
// A pool of fixed-size blocks known only by id (0 .. total-1): no tensors, no memory, just
// bookkeeping, so the scheduler can plan with it and tests can check it cheaply. Reference counts
// leave room for prefix sharing: a block returns to the free list when its last holder lets go.
#include <cstdint>
#include <string>
#include <vector>

namespace deepinfer {

class BlockManager {
 public:
  explicit BlockManager(int32_t total = 0);

  int32_t total() const { return (int32_t)refs_.size(); }
  int32_t num_free() const { return (int32_t)free_.size(); }
  int32_t num_used() const { return total() - num_free(); }

  // Takes n free blocks (appended to *out) or, if fewer than n are free, takes none and returns false.
  bool allocate(int32_t n, std::vector<int32_t>* out);
  void add_ref(int32_t id);
  // Drops one reference to each id; blocks that reach zero go back to the free list. Throws
  // std::logic_error on an id that is not held (a double free is a bug, never ignored).
  void release(const std::vector<int32_t>& ids);
  int32_t refs(int32_t id) const { return refs_.at(id); }

  // free + used = total, no id both free and used, no duplicate in the free list. Returns an empty
  // string when all holds, else what broke.
  std::string check_invariants() const;

 private:
  std::vector<int32_t> refs_;  // [total] holders of each block
  std::vector<int32_t> free_;  // ids with refs == 0, LIFO
};

}  // namespace deepinfer
