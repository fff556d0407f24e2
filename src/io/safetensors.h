#pragma once
// Safetensors files, memory-mapped and validated.
//
// The header is parsed and checked completely before any tensor byte is touched: every tensor's
// [begin, end) must lie inside the data section, tensors may not overlap, nbytes must equal
// prod(shape) * dtype size (packed fp4 is stored as I8/U8 and checked as such). A bad file throws
// deepinfer::Error naming the file and, where it applies, the tensor.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer {

enum class DType : uint8_t { BOOL, U8, I8, I16, U16, I32, U32, I64, U64, F16, BF16, F32, F64, F8_E4M3, F8_E5M2, F8_E8M0 };

std::string_view dtype_name(DType t);  // "BF16", ...
size_t dtype_size(DType t);            // bytes per element

// A tensor inside a mapped file. `data` stays valid while the owning SafetensorsFile lives.
struct TensorView {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  const std::string* file = nullptr;  // path of the file holding it (for error messages)
  int64_t numel() const;
};

// Parses a safetensors header (the JSON after the 8-byte length) and validates it against a data
// section of `data_size` bytes. Pure function, no I/O: this is what the fuzz target drives.
struct TensorEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // offsets into the data section
};
struct ParsedHeader {
  std::vector<TensorEntry> tensors;  // in file order of offsets
  std::map<std::string, std::string> metadata;
};
// `file_for_errors` only labels error messages.
ParsedHeader parse_safetensors_header(std::string_view header_json, uint64_t data_size,
                                      const std::string& file_for_errors);
// Parses a whole in-memory file image (8-byte little-endian header length + header + data).
ParsedHeader parse_safetensors_image(const uint8_t* bytes, size_t size, const std::string& file_for_errors);

class SafetensorsFile {
 public:
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);  // mmap + validate
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* find(std::string_view name) const;  // nullptr if absent

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
};

// Writes a safetensors file (used by `deepinfer logits` and by tests that build bad files).
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;
  size_t nbytes;
};
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace deepinfer
