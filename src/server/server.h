#pragma once
// deepinfer's OpenAI-compatible HTTP server (cpp-httplib): /v1/chat/completions,
// /v1/completions (SSE streaming), /v1/models, /health, /metrics, /tokenize, /detokenize.
// docs/server.md is the reference for routes, flags, errors, metrics and limits.
//
//   deepinfer::Engine engine(ecfg);
//   engine.start();
//   deepinfer::server::Server srv(engine, scfg);
//   int port = srv.bind();       // throws Error when the address is taken
//   srv.serve();                 // returns after shutdown() (from another thread)
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "deepinfer/engine.h"
#include "server/openai.h"

namespace deepinfer::server {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8000;                    // 0: any free port (bind() returns it)
  std::string api_key;                // "": no authentication
  std::vector<std::string> model_names;  // accepted "model" values; [0] is reported. Empty: the
                                         // model directory's basename
  RequestLimits limits;
  size_t max_body_bytes = 8u << 20;   // larger bodies: 413
  int http_threads = 128;             // connections served at once (a stream holds one)
  int64_t max_queued_sequences = 256; // sequences admitted and unfinished; more: 429
  int64_t shutdown_timeout_ms = 30000;  // drain bound on shutdown; the rest is aborted
  int read_timeout_s = 10, write_timeout_s = 10;
  double watchdog_s = 60;             // /health is 503 when work is pending and no step ran this long
  bool log_requests = false;
};

class Server {
 public:
  // The engine's background loop must be running (Engine::start) while serving.
  Server(Engine& engine, ServerConfig cfg);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int bind();    // returns the bound port; throws deepinfer::Error
  void serve();  // blocks until shutdown() has drained and stopped the listener
  // Thread-safe, idempotent: new requests get 503, running ones finish (up to the shutdown
  // timeout, then they are aborted), then serve() returns.
  void shutdown();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepinfer::server
