#include "util/kernel_timeline.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <map>

namespace deepinfer {

KernelTimeline summarize_kernels(std::vector<KernelRecord> recs) {
  KernelTimeline t;
  t.kernels = (int64_t)recs.size();
  if (recs.empty()) return t;
  std::sort(recs.begin(), recs.end(), [](const KernelRecord& a, const KernelRecord& b) {
    return a.start_ns != b.start_ns ? a.start_ns < b.start_ns : a.end_ns < b.end_ns;
  });
  std::map<std::string, KernelSummaryRow> by;
  const uint64_t first = recs.front().start_ns;
  uint64_t latest = first;  // the latest end so far
  for (const KernelRecord& r : recs) {
    KernelSummaryRow& row = by[r.name];
    row.name = r.name;
    ++row.calls;
    const uint64_t end = std::max(r.end_ns, r.start_ns);
    row.dur_us += 1e-3 * (double)(end - r.start_ns);
    if (r.start_ns > latest) {
      const double idle = 1e-3 * (double)(r.start_ns - latest);
      row.idle_us += idle, t.idle_us += idle;
      latest = r.start_ns;
    } else {
      row.early_us += 1e-3 * (double)(latest - r.start_ns);
    }
    if (end > latest) row.marginal_us += 1e-3 * (double)(end - latest), latest = end;
  }
  t.span_us = 1e-3 * (double)(latest - first);
  for (auto& [name, row] : by) t.rows.push_back(row);
  std::sort(t.rows.begin(), t.rows.end(), [](const KernelSummaryRow& a, const KernelSummaryRow& b) {
    return a.marginal_us != b.marginal_us ? a.marginal_us > b.marginal_us : a.name < b.name;
  });
  return t;
}

std::string short_kernel_name(const char* mangled) {
  if (!mangled) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : mangled;
  std::free(d);
  // Drop the parameter list: the last '(' at template depth 0.
  int depth = 0;
  size_t cut = std::string::npos;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    else if (s[i] == '>') --depth;
    else if (s[i] == '(' && depth == 0 && s.compare(i, 11, "(anonymous ") != 0) {
      cut = i;
      break;
    }
  }
  if (cut != std::string::npos) s.resize(cut);
  // Drop the namespaces: everything up to the last "::" at template depth 0.
  depth = 0;
  size_t from = 0;
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    else if (s[i] == '>') --depth;
    else if (depth == 0 && s[i] == ':' && s[i + 1] == ':') from = i + 2;
  }
  s = s.substr(from);
  if (s.rfind("void ", 0) == 0) s = s.substr(5);  // a function template's return type
  return s.empty() ? std::string(mangled) : s;
}

}  // namespace deepinfer
