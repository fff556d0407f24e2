// `deepinfer inspect --model DIR`: lists every tensor of a checkpoint under its native name.
#include <cstdio>
#include <cstring>
#include <string>

#include "cli/commands.h"
#include "io/checkpoint.h"
#include "io/dequant.h"
#include "util/error.h"

namespace deepinfer::cli {
namespace {

void usage(FILE* f) {
  std::fprintf(f,
               "usage: deepinfer inspect --model DIR\n"
               "  prints one line per tensor: native name, dtype, shape, file [, name in file]\n");
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

int cmd_inspect(int argc, char** argv) {
  std::string model;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "-h") || !std::strcmp(argv[i], "--help")) {
      usage(stdout);
      return 0;
    } else if (!std::strcmp(argv[i], "--model") && i + 1 < argc) {
      model = argv[++i];
    } else if (!std::strncmp(argv[i], "--model=", 8)) {
      model = argv[i] + 8;
    } else {
      std::fprintf(stderr, "deepinfer inspect: unknown argument '%s'\n", argv[i]);
      usage(stderr);
      return 1;
    }
  }
  if (model.empty()) {
    std::fprintf(stderr, "deepinfer inspect: --model DIR is required\n");
    usage(stderr);
    return 1;
  }
  try {
    auto ck = Checkpoint::open(model);
    const auto names = ck->names();
    for (const auto& n : names) {
      const TensorView* t = ck->find(n);
      std::string line = n + "\t" + std::string(dtype_name(t->dtype)) + "\t" + shape_str(t->shape) + "\t";
      const std::string& file = *t->file;
      line += file.substr(file.rfind('/') == std::string::npos ? 0 : file.rfind('/') + 1);
      const std::string in_file = ck->file_tensor_name(n);
      if (in_file != n) line += "\t(" + in_file + ")";
      std::printf("%s\n", line.c_str());
    }
    std::fprintf(stderr, "%zu tensors\n", names.size());
  } catch (const Error& e) {
    std::fprintf(stderr, "deepinfer inspect: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace deepinfer::cli
