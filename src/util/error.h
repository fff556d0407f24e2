#pragma once
// One exception type for every user-facing failure (bad file, bad request, bad flag).
// Front-ends catch it at their boundary, print what(), and go on or exit non-zero.
#include <stdexcept>
#include <string>

namespace deepinfer {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace deepinfer
