/* A stand-in libopenblas.so.0 for GPU machines without OpenBLAS: the CUDA test binaries link the
 * CPU backend, whose default GEMM is its own fixed-order kernel, so OpenBLAS is only needed by the
 * loader. Build: cc -shared -fPIC -O2 -o libopenblas.so.0 openblas_stub.c */
#include <stdio.h>
#include <stdlib.h>

void openblas_set_num_threads(int n) { (void)n; }
void cblas_sgemm(void) {
  fprintf(stderr, "openblas stub: cblas_sgemm called (use CpuGemm::Deterministic)\n");
  abort();
}
