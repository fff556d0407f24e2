// The `deepinfer` command: a thin dispatcher over sub-commands (see commands.h).
#include <cstdio>
#include <cstring>
#include <string>

#include "cli/commands.h"

namespace {

struct Command {
  const char* name;
  int (*fn)(int, char**);
  const char* help;
};

const Command kCommands[] = {
    {"generate", deepinfer::cli::cmd_generate, "generate text (default model: the embedded nano model)"},
    {"chat", deepinfer::cli::cmd_chat, "interactive chat with the model's chat format"},
    {"serve", deepinfer::cli::cmd_serve, "OpenAI-compatible HTTP server (docs/server.md)"},
    {"logits", deepinfer::cli::cmd_logits, "compute logits for a list of token ids"},
    {"tokenize", deepinfer::cli::cmd_tokenize, "JSON Lines strings on stdin -> id arrays on stdout"},
    {"detokenize", deepinfer::cli::cmd_detokenize, "JSON Lines id arrays on stdin -> strings on stdout"},
    {"inspect", deepinfer::cli::cmd_inspect, "list the tensors of a checkpoint"},
    {"bench", deepinfer::cli::cmd_bench, "decode/prefill throughput on a random-weight V4 slice (docs/bench.md)"},
};

void usage(FILE* f) {
  std::fprintf(f, "usage: deepinfer <command> [options]\n\ncommands:\n");
  for (const auto& c : kCommands) std::fprintf(f, "  %-12s %s\n", c.name, c.help);
  std::fprintf(f, "\nrun `deepinfer <command> --help` for a command's options\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  std::string cmd = argv[1];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    usage(stdout);
    return 0;
  }
  for (const auto& c : kCommands)
    if (cmd == c.name) return c.fn(argc - 1, argv + 1);
  std::fprintf(stderr, "deepinfer: unknown command '%s'\n", cmd.c_str());
  usage(stderr);
  return 2;
}
