#pragma once
// Each sub-command of the `deepinfer` executable is one function: argv[0] is the sub-command name.
// Returns the process exit code. Errors are reported on stderr by the command itself.
namespace deepinfer::cli {

int cmd_logits(int argc, char** argv);      // cli/logits.cc
int cmd_tokenize(int argc, char** argv);    // cli/tokenize.cc
int cmd_detokenize(int argc, char** argv);  // cli/tokenize.cc
int cmd_inspect(int argc, char** argv);     // cli/inspect.cc: list a checkpoint's tensors
int cmd_generate(int argc, char** argv);    // cli/generate.cc
int cmd_chat(int argc, char** argv);        // cli/generate.cc
int cmd_serve(int argc, char** argv);       // cli/serve.cc: OpenAI-compatible HTTP server
int cmd_bench(int argc, char** argv);       // cli/bench.cc: throughput on a random-weight model slice

}  // namespace deepinfer::cli
