// In-place scale of one tensor: ripples_scale_<dtype>(data, n, factor), dtypes f16, bf16,
// f32, f64. fp16/bf16 are computed in fp32 and rounded once; aligned runs move 16 bytes
// (8 halves) per access, misaligned heads and tails go element by element.
#include "common.cuh"
#include "launch.cuh"

#define RIPPLES_DEFINE_SCALE(ts, T)                                                         \
  extern "C" __global__ void ripples_scale_##ts(T* data, long long n, double factor) {    \
    ripples::scaled_copy_lane<T, T>(data, data, n,                                        \
                                    (typename ripples::Compute<T, T>::type)factor,        \
                                    (ripples::i64)blockIdx.x * blockDim.x + threadIdx.x,       \
                                    (ripples::i64)gridDim.x * blockDim.x);                     \
  }

RIPPLES_FOR_EACH_FLOAT(RIPPLES_DEFINE_SCALE)

#if !defined(__CUDACC_RTC__) && !defined(RIPPLES_KERNELS_ONLY)
// Host entry point for nvcc-linked builds. Dtype codes: 0 f16, 1 bf16, 2 f32, 3 f64.
#include <cuda_runtime.h>

typedef void (*ripples_scale_fn)(void*, long long, double);
#define RIPPLES_SCALE_PTR(ts, T) (ripples_scale_fn)ripples_scale_##ts,

extern "C" cudaError_t ripples_scale_launch(int dtype, void* data, long long n, double factor,
                                            cudaStream_t stream) {
  static const ripples_scale_fn table[4] = {RIPPLES_FOR_EACH_FLOAT(RIPPLES_SCALE_PTR)};
  if (dtype < 0 || dtype > 3 || n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  long long blocks = (n + RIPPLES_ELEMENTS_PER_BLOCK - 1) / RIPPLES_ELEMENTS_PER_BLOCK;
  if (blocks > RIPPLES_MAX_BLOCKS) blocks = RIPPLES_MAX_BLOCKS;
  void* args[] = {&data, &n, &factor};
  cudaError_t err = cudaLaunchKernel((const void*)table[dtype], dim3((unsigned)blocks),
                                     dim3(RIPPLES_THREADS), args, 0, stream);
  return err != cudaSuccess ? err : cudaGetLastError();
}
#endif
