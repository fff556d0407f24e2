#pragma once
// Helpers shared by the tests/unit/test_io_*.cc tests: a self-deleting temp dir and raw file writers.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "util/error.h"

namespace deepinfer::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "deepinfer_io_XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// A safetensors image with the given header text and `data_size` zero bytes of data.
inline std::vector<uint8_t> raw_image(const std::string& header, size_t data_size, uint64_t header_len_override = 0,
                                      bool override_len = false) {
  std::vector<uint8_t> b(8);
  uint64_t len = override_len ? header_len_override : header.size();
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(len >> (8 * i));
  b.insert(b.end(), header.begin(), header.end());
  b.resize(b.size() + data_size, 0);
  return b;
}

// Runs fn, expects deepinfer::Error, and checks its message contains every one of `parts`.
template <typename Fn>
void expect_error(Fn fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected deepinfer::Error containing '" << (parts.empty() ? "" : parts[0]) << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nlacks: " << p;
  }
}

}  // namespace deepinfer::testing
