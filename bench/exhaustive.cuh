/*
 * exhaustive.cuh - shape_sweep check's runner of exhaustive comparisons: a
 * grid-stride kernel that counts the inputs on which a fast form and its
 * definition disagree and keeps the first, launched once and reported.
 */
#ifndef BEAMMOE_BENCH_EXHAUSTIVE_CUH
#define BEAMMOE_BENCH_EXHAUSTIVE_CUH

#include <stdio.h>

#include <cuda_runtime.h>

/* the kernel's report of input i disagreeing */
__device__ __forceinline__ void exh_bad(unsigned long long *bad, unsigned long long *first, unsigned long long i)
{
    atomicAdd(bad, 1ull);
    atomicMin(first, i);
}

/* run kernel(bad, first), print "what: N mismatches"; 0 when there were none */
template <typename K>
static int exh_run(K kernel, const char *what)
{
    unsigned long long *d, h[2] = {0, 0};
    if (cudaMalloc(&d, sizeof h) != cudaSuccess) {
        printf("%s: cudaMalloc failed\n", what);
        return 1;
    }
    cudaMemset(d, 0, sizeof(unsigned long long));
    cudaMemset(d + 1, 0xFF, sizeof(unsigned long long));
    kernel<<<4096, 256>>>(d, d + 1);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    cudaFree(d);
    if (e != cudaSuccess) {
        printf("%s: %s\n", what, cudaGetErrorString(e));
        return 1;
    }
    printf("%s: %llu mismatches", what, h[0]);
    if (h[0]) printf(" (first at 0x%llx)", h[1]);
    printf("\n");
    return h[0] ? 1 : 0;
}

#endif
