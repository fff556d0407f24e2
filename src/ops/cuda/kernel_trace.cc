#include "ops/cuda/kernel_trace.h"

#include <cupti_activity.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <utility>

namespace deepinfer::cuda {

namespace {
using RegisterCallbacksFn = CUptiResult (*)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
using KindFn = CUptiResult (*)(CUpti_ActivityKind);
using FlushFn = CUptiResult (*)(uint32_t);
using NextRecordFn = CUptiResult (*)(uint8_t*, size_t, CUpti_Activity**);
using TimestampFn = CUptiResult (*)(uint64_t*);
constexpr size_t kBufferBytes = 8u << 20;
}  // namespace

struct KernelTracer::Impl {
  void* lib = nullptr;
  RegisterCallbacksFn register_callbacks = nullptr;
  KindFn enable = nullptr, disable = nullptr;
  FlushFn flush = nullptr;
  NextRecordFn next = nullptr;
  TimestampFn timestamp = nullptr;
  std::mutex mu;  // CUPTI hands buffers back on its own thread
  std::vector<std::pair<uint64_t, uint64_t>> windows;  // [open, close) in CUPTI's clock; the last may be open
  std::vector<KernelRecord> kept;

  bool in_window(uint64_t t) const {
    for (const auto& [a, b] : windows)
      if (t >= a && t < b) return true;
    return false;
  }
  void take_buffer(uint8_t* buf, size_t valid) {
    CUpti_Activity* rec = nullptr;
    std::lock_guard<std::mutex> lk(mu);
    while (valid > 0 && next(buf, valid, &rec) == CUPTI_SUCCESS) {
      if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      if (!in_window(k->start)) continue;
      KernelRecord r;
      r.name = short_kernel_name(k->name);
      r.start_ns = k->start, r.end_ns = k->end;
      r.graph_node = k->graphNodeId;
      r.stream = k->streamId;
      r.blocks = (int64_t)k->gridX * k->gridY * k->gridZ;
      r.threads = k->blockX * k->blockY * k->blockZ;
      kept.push_back(std::move(r));
    }
  }
};

namespace {
// The tracer whose buffers CUPTI returns (its callbacks carry no context: one a process).
std::mutex g_active_mu;
KernelTracer::Impl* g_active = nullptr;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}
void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  {
    std::lock_guard<std::mutex> lk(g_active_mu);
    if (g_active && buffer) g_active->take_buffer(buffer, valid);
  }
  std::free(buffer);
}

void* open_cupti(std::string* why) {
  std::vector<std::string> names;
  if (const char* p = std::getenv("DEEPINFER_CUPTI")) names.push_back(p);
  for (const char* n : {"libcupti.so.13", "libcupti.so", "/usr/local/cuda/lib64/libcupti.so.13",
                        "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13",
                        "/usr/local/cuda/targets/x86_64-linux/lib/libcupti.so.13", "/usr/local/cuda/lib/libcupti.so.13"})
    names.push_back(n);
  std::string tried;
  for (const std::string& n : names) {
    if (void* h = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    tried += (tried.empty() ? "" : ", ") + n;
  }
  *why = "CUPTI not found (tried " + tried + "; DEEPINFER_CUPTI=path names it)";
  return nullptr;
}
}  // namespace

KernelTracer::KernelTracer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<KernelTracer> KernelTracer::start(std::string* why) {
  std::string none;
  if (!why) why = &none;
  auto m = std::make_unique<Impl>();
  m->lib = open_cupti(why);
  if (!m->lib) return nullptr;
  m->register_callbacks = reinterpret_cast<RegisterCallbacksFn>(dlsym(m->lib, "cuptiActivityRegisterCallbacks"));
  m->enable = reinterpret_cast<KindFn>(dlsym(m->lib, "cuptiActivityEnable"));
  m->disable = reinterpret_cast<KindFn>(dlsym(m->lib, "cuptiActivityDisable"));
  m->flush = reinterpret_cast<FlushFn>(dlsym(m->lib, "cuptiActivityFlushAll"));
  m->next = reinterpret_cast<NextRecordFn>(dlsym(m->lib, "cuptiActivityGetNextRecord"));
  m->timestamp = reinterpret_cast<TimestampFn>(dlsym(m->lib, "cuptiGetTimestamp"));
  if (!m->register_callbacks || !m->enable || !m->disable || !m->flush || !m->next || !m->timestamp) {
    *why = "CUPTI lacks an activity function";
    return nullptr;
  }
  {
    std::lock_guard<std::mutex> lk(g_active_mu);
    g_active = m.get();
  }
  if (m->register_callbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      m->enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::lock_guard<std::mutex> lk(g_active_mu);
    g_active = nullptr;
    *why = "CUPTI refused kernel activity records";
    return nullptr;
  }
  return std::unique_ptr<KernelTracer>(new KernelTracer(std::move(m)));
}

KernelTracer::~KernelTracer() {
  impl_->disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  impl_->flush(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lk(g_active_mu);
  if (g_active == impl_.get()) g_active = nullptr;
  // (CUPTI stays loaded: it is attached to the process's CUDA context.)
}

void KernelTracer::window(bool open) {
  uint64_t t = 0;
  impl_->timestamp(&t);
  std::lock_guard<std::mutex> lk(impl_->mu);
  auto& w = impl_->windows;
  if (open && (w.empty() || w.back().second != UINT64_MAX)) w.emplace_back(t, UINT64_MAX);
  if (!open && !w.empty() && w.back().second == UINT64_MAX) w.back().second = t;
}

std::vector<KernelRecord> KernelTracer::take() {
  impl_->flush(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lk(impl_->mu);
  std::vector<KernelRecord> out = std::move(impl_->kept);
  impl_->kept.clear();
  // Windows still open stay open; closed ones are done.
  std::erase_if(impl_->windows, [](const auto& w) { return w.second != UINT64_MAX; });
  std::sort(out.begin(), out.end(), [](const KernelRecord& a, const KernelRecord& b) { return a.start_ns < b.start_ns; });
  return out;
}

}  // namespace deepinfer::cuda
