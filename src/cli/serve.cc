// deepinfer serve: the OpenAI-compatible HTTP server (src/server, docs/server.md).
//
//   deepinfer serve [--model DIR] [--host 127.0.0.1] [--port 8000] [--api-key KEY] ...
//
// SIGTERM / SIGINT: stop admitting, drain running requests (bounded by --shutdown-timeout), exit 0.
// A second signal exits at once (status 1).
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <thread>

#include "cli/flags.h"
#include "cli/commands.h"
#include "deepinfer/engine.h"
#include "server/server.h"
#include "util/error.h"

namespace deepinfer::cli {
namespace {

const char* kUsage =
    "usage: deepinfer serve [--model DIR] [--host 127.0.0.1] [--port 8000] [--api-key KEY] [options]\n"
    "  --model DIR              model directory (default: the embedded nano model)\n"
    "  --served-model-name NAME the model name clients use (default: the directory's basename)\n"
    "  --host ADDR              address to listen on (default 127.0.0.1)\n"
    "  --port N                 port (default 8000; 0 = any free port, printed on stderr)\n"
    "  --api-key KEY            require 'Authorization: Bearer KEY' on every route (or env DEEPINFER_API_KEY)\n"
    "  --threads N              CPU threads for the model (0 = all cores)\n"
    "  --cache-mb MB            paged-cache budget (default 256)\n"
    "  --max-num-seqs N         sequences running at once (default 16)\n"
    "  --max-model-len N        context limit (default: the model's)\n"
    "  --async-scheduling 0|1   plan the next decode step while one runs (default 1)\n"
    "  --device-sampling 0|1    sample on the backend where the host would pick the same token (default 1)\n"
    "  --max-queued N           sequences admitted (running + waiting) before 429 (default 256)\n"
    "  --max-body-mb MB         request body limit, larger: 413 (default 8)\n"
    "  --max-n N                choices per prompt (default 16)\n"
    "  --max-tokens-limit N     cap on max_tokens (default: the context length)\n"
    "  --max-logit-bias N       logit_bias entries (default 1024)\n"
    "  --http-threads N         connections served at once (default 128)\n"
    "  --shutdown-timeout S     drain bound on SIGTERM in seconds (default 30)\n"
    "  --timeout S              socket read/write timeout in seconds (default 10)\n"
    "  --log-requests           one stderr line per HTTP request\n";


std::atomic<int> g_signals{0};
void on_signal(int) { g_signals.fetch_add(1); }

}  // namespace

int cmd_serve(int argc, char** argv) {
  EngineConfig ecfg;
  server::ServerConfig scfg;
  if (const char* k = std::getenv("DEEPINFER_API_KEY")) scfg.api_key = k;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "-h" || a == "--help") {
        std::fputs(kUsage, stdout);
        return 0;
      }
      if (a == "--log-requests") {
        scfg.log_requests = true;
        continue;
      }
      static const char* kValueFlags[] = {"--model", "--served-model-name", "--host", "--port", "--api-key",
                                          "--threads", "--cache-mb", "--max-num-seqs", "--max-model-len",
                                          "--max-queued", "--max-body-mb", "--max-n", "--max-tokens-limit",
                                          "--max-logit-bias", "--http-threads", "--shutdown-timeout", "--timeout",
                                          "--async-scheduling", "--device-sampling"};
      bool known = false;
      for (const char* f : kValueFlags) known = known || a == f;
      if (!known) throw Error("unknown option '" + a + "' (see --help)");
      if (i + 1 >= argc) throw Error(a + ": missing value");
      std::string v = argv[++i];
      if (a == "--model") ecfg.model_dir = v;
      else if (a == "--served-model-name") scfg.model_names.push_back(v);
      else if (a == "--host") scfg.host = v;
      else if (a == "--port") scfg.port = (int)flag_int(a, v);
      else if (a == "--api-key") scfg.api_key = v;
      else if (a == "--threads") ecfg.threads = (int)flag_int(a, v);
      else if (a == "--cache-mb") ecfg.cache_bytes = flag_int(a, v) << 20;
      else if (a == "--max-num-seqs") ecfg.max_num_seqs = (int)flag_int(a, v);
      else if (a == "--max-model-len") ecfg.max_model_len = flag_int(a, v);
      else if (a == "--async-scheduling") ecfg.async_scheduling = flag_int(a, v) != 0;
    else if (a == "--device-sampling") ecfg.device_sampling = flag_int(a, v) != 0;
      else if (a == "--max-queued") scfg.max_queued_sequences = flag_int(a, v);
      else if (a == "--max-body-mb") scfg.max_body_bytes = (size_t)flag_int(a, v) << 20;
      else if (a == "--max-n") scfg.limits.max_n = (int)flag_int(a, v);
      else if (a == "--max-tokens-limit") scfg.limits.max_tokens = flag_int(a, v);
      else if (a == "--max-logit-bias") scfg.limits.max_logit_bias = (int)flag_int(a, v);
      else if (a == "--http-threads") scfg.http_threads = (int)flag_int(a, v);
      else if (a == "--shutdown-timeout") scfg.shutdown_timeout_ms = flag_int(a, v) * 1000;
      else if (a == "--timeout") scfg.read_timeout_s = scfg.write_timeout_s = (int)flag_int(a, v);
    }
    if (scfg.port < 0 || scfg.port > 65535) throw Error("--port must be in [0, 65535]");
    if (scfg.max_queued_sequences < 1) throw Error("--max-queued must be at least 1");
    if (scfg.limits.max_n < 1) throw Error("--max-n must be at least 1");
    if (scfg.max_body_bytes < 1024) throw Error("--max-body-mb must be at least 1");
    if (scfg.read_timeout_s < 1) throw Error("--timeout must be at least 1 second");
    if (scfg.shutdown_timeout_ms < 0) throw Error("--shutdown-timeout must not be negative");
    if (scfg.http_threads < 4) throw Error("--http-threads must be at least 4");
    if (scfg.limits.max_logit_bias < 0) throw Error("--max-logit-bias must not be negative");
    if (scfg.limits.max_tokens < 0) throw Error("--max-tokens-limit must not be negative");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deepinfer serve: %s\n", e.what());
    return 2;
  }

  // OpenBLAS starts threads before main(), so signals cannot be steered to one thread by masks:
  // the handler only counts (the one global the process has), a watcher thread acts on it.
  // SIGPIPE is ignored so that a vanished client is a failed write, not the end of the process.
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  try {
    Engine engine(ecfg);
    engine.start();
    server::Server srv(engine, scfg);
    const int port = srv.bind();
    std::fprintf(stderr, "deepinfer serve: listening on http://%s:%d (model %s, context %lld)\n",
                 scfg.host.c_str(), port, engine.model_dir().c_str(), (long long)engine.max_model_len());
    if (scfg.api_key.empty() && scfg.host != "127.0.0.1" && scfg.host != "localhost" && scfg.host != "::1")
      std::fprintf(stderr, "deepinfer serve: warning: listening on %s without --api-key\n", scfg.host.c_str());
    std::fflush(stderr);

    std::atomic<bool> stop_watch{false};
    std::thread shutdown_thread;
    std::thread watcher([&] {
      int handled = 0;
      while (!stop_watch) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        if (g_signals.load() == handled) continue;
        if (++handled == 1) {
          std::fprintf(stderr, "deepinfer serve: shutting down (draining running requests)\n");
          shutdown_thread = std::thread([&srv] { srv.shutdown(); });
        } else {
          std::fprintf(stderr, "deepinfer serve: second signal, exiting now\n");
          std::_Exit(1);
        }
      }
    });
    srv.serve();
    srv.shutdown();  // serve() can also end on a listener error
    stop_watch = true;
    watcher.join();
    if (shutdown_thread.joinable()) shutdown_thread.join();
    engine.stop();
    std::fprintf(stderr, "deepinfer serve: stopped\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deepinfer serve: %s\n", e.what());
    return 1;
  }
}

}  // namespace deepinfer::cli
