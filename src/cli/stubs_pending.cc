// Temporary: sub-commands whose modules are being written. Each is replaced by its own file
// (cli/logits.cc, cli/tokenize.cc, cli/inspect.cc); delete the matching function here then.
#include <cstdio>

#include "cli/commands.h"

namespace deepinfer::cli {
[[maybe_unused]] static int pending(const char* what) {
  std::fprintf(stderr, "deepinfer %s: not available in this build yet\n", what);
  return 1;
}
}  // namespace deepinfer::cli
