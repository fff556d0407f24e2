#pragma once
// CHECK for the host models of the CUDA kernels (tests/cuda/*_model.cc): counts the failures in
// host_check::fails and prints the first 20.
#include <cstdio>

namespace host_check {
inline int fails = 0;
}  // namespace host_check

#define CHECK(c, ...)                                                          \
  do {                                                                         \
    if (!(c)) {                                                                \
      if (host_check::fails++ < 20) fprintf(stderr, "FAIL: " __VA_ARGS__);     \
    }                                                                          \
  } while (0)
