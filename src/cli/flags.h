#pragma once
// Flag-value parsing shared by the sub-commands: a bad value is an Error naming the flag.
#include <cstdint>
#include <string>

#include "util/error.h"

namespace deepinfer::cli {

// The whole of `v` as a decimal integer ("12", "-3"; not "12x", "1e3" or "").
inline int64_t flag_int(const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    long long x = std::stoll(v, &used);
    if (used != v.size()) throw 0;
    return x;
  } catch (...) {
    throw Error(flag + ": expected an integer, got '" + v + "'");
  }
}

}  // namespace deepinfer::cli
