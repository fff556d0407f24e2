#pragma once
// Programmatic edges in a captured CUDA graph: the step graphs (CudaBackend) and the op test's timed graphs
// share this one mechanism.
#include <cuda_runtime.h>

#include <functional>

namespace deepinfer::cuda {

// True when n is a kernel node.
bool graph_kernel_node(cudaGraphNode_t n);
// Every default edge of g from a kernel node into a node for which into(node) holds becomes programmatic:
// the second kernel launches while the first finishes and waits in griddepcontrol.wait (DI_PDL_WAIT)
// before touching what the first wrote. Other edges are left as they are.
// from_ok (when given) must hold for the edge's source too: edges out of other nodes stay full dependencies.
cudaError_t graph_programmatic_edges(cudaGraph_t g, const std::function<bool(cudaGraphNode_t)>& into,
                                     const std::function<bool(cudaGraphNode_t)>& from_ok = {});

}  // namespace deepinfer::cuda
