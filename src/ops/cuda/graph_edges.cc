#include "ops/cuda/graph_edges.h"

#include <vector>

namespace deepinfer::cuda {

bool graph_kernel_node(cudaGraphNode_t n) {
  cudaGraphNodeType t;
  return cudaGraphNodeGetType(n, &t) == cudaSuccess && t == cudaGraphNodeTypeKernel;
}

cudaError_t graph_programmatic_edges(cudaGraph_t g, const std::function<bool(cudaGraphNode_t)>& into,
                                     const std::function<bool(cudaGraphNode_t)>& from_ok) {
  size_t n = 0;
  cudaError_t e = cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &n);
  if (e != cudaSuccess || n == 0) return e;
  std::vector<cudaGraphNode_t> from(n), to(n), f, t;
  std::vector<cudaGraphEdgeData> data(n), old;
  if ((e = cudaGraphGetEdges(g, from.data(), to.data(), data.data(), &n)) != cudaSuccess) return e;
  for (size_t i = 0; i < n; ++i)
    if (data[i].type == cudaGraphDependencyTypeDefault && data[i].from_port == 0 && into(to[i]) &&
        graph_kernel_node(from[i]) && (!from_ok || from_ok(from[i])))
      f.push_back(from[i]), t.push_back(to[i]), old.push_back(data[i]);
  if (f.empty()) return cudaSuccess;
  if ((e = cudaGraphRemoveDependencies(g, f.data(), t.data(), old.data(), f.size())) != cudaSuccess) return e;
  cudaGraphEdgeData pdl{};
  pdl.from_port = cudaGraphKernelNodePortProgrammatic;
  pdl.type = cudaGraphDependencyTypeProgrammatic;
  std::vector<cudaGraphEdgeData> d(f.size(), pdl);
  return cudaGraphAddDependencies(g, f.data(), t.data(), d.data(), f.size());
}

}  // namespace deepinfer::cuda
