// Batched pack of many tensors into one fusion buffer and unpack back, with an optional
// scale folded into the copy. One launch covers up to 65535 tensors: blockIdx.y picks the
// segment from a device array of (ptr, numel, offset) descriptors, blockIdx.x/threadIdx.x
// stride over its elements with 16-byte vector accesses where both sides are aligned.
//
// Kernel names: ripples_pack_<tensor dtype>_<buffer dtype> and
// ripples_unpack_<buffer dtype>_<tensor dtype>, dtypes f16, bf16, f32, f64.
#include "common.cuh"
#include "launch.cuh"

#define RIPPLES_DEFINE_FUSION(ts, T, bs, B)                                                 \
  extern "C" __global__ void ripples_pack_##ts##_##bs(const ripples::Segment* segments,   \
                                                      B* buffer, double scale) {          \
    ripples::pack_segment<T, B>(segments[blockIdx.y], buffer, scale,                      \
                                (ripples::i64)blockIdx.x * blockDim.x + threadIdx.x,           \
                                (ripples::i64)gridDim.x * blockDim.x);                         \
  }                                                                                       \
  extern "C" __global__ void ripples_unpack_##bs##_##ts(const ripples::Segment* segments, \
                                                        const B* buffer, double scale) {  \
    ripples::unpack_segment<B, T>(segments[blockIdx.y], buffer, scale,                    \
                                  (ripples::i64)blockIdx.x * blockDim.x + threadIdx.x,         \
                                  (ripples::i64)gridDim.x * blockDim.x);                       \
  }

#define RIPPLES_FUSION_WITH_EVERY_BUFFER(ts, T)      \
  RIPPLES_DEFINE_FUSION(ts, T, f16, ripples::f16)    \
  RIPPLES_DEFINE_FUSION(ts, T, bf16, ripples::bf16)  \
  RIPPLES_DEFINE_FUSION(ts, T, f32, float)           \
  RIPPLES_DEFINE_FUSION(ts, T, f64, double)

RIPPLES_FOR_EACH_FLOAT(RIPPLES_FUSION_WITH_EVERY_BUFFER)

#if !defined(__CUDACC_RTC__) && !defined(RIPPLES_KERNELS_ONLY)
// (RIPPLES_KERNELS_ONLY leaves this out, as NVRTC does.)
// Host entry point for builds that link the kernels with nvcc instead of loading them
// through NVRTC. Dtype codes: 0 f16, 1 bf16, 2 f32, 3 f64. `segments` is device memory.
#include <cuda_runtime.h>

typedef void (*ripples_fusion_fn)(const ripples::Segment*, void*, double);

#define RIPPLES_PACK_PTR(ts, T, bs, B) (ripples_fusion_fn)ripples_pack_##ts##_##bs,
#define RIPPLES_UNPACK_PTR(ts, T, bs, B) (ripples_fusion_fn)ripples_unpack_##bs##_##ts,
#define RIPPLES_ROW(PTR, ts, T) \
  {PTR(ts, T, f16, ripples::f16) PTR(ts, T, bf16, ripples::bf16) PTR(ts, T, f32, float) PTR(ts, T, f64, double)},
#define RIPPLES_PACK_ROW(ts, T) RIPPLES_ROW(RIPPLES_PACK_PTR, ts, T)
#define RIPPLES_UNPACK_ROW(ts, T) RIPPLES_ROW(RIPPLES_UNPACK_PTR, ts, T)

extern "C" cudaError_t ripples_fusion_launch(int unpack, int tensor_dtype, int buffer_dtype,
                                             const ripples::Segment* segments, int count,
                                             long long max_numel, void* buffer, double scale,
                                             cudaStream_t stream) {
  static const ripples_fusion_fn pack_table[4][4] = {RIPPLES_FOR_EACH_FLOAT(RIPPLES_PACK_ROW)};
  static const ripples_fusion_fn unpack_table[4][4] = {
      RIPPLES_FOR_EACH_FLOAT(RIPPLES_UNPACK_ROW)};
  if (tensor_dtype < 0 || tensor_dtype > 3 || buffer_dtype < 0 || buffer_dtype > 3 ||
      count < 0 || count > 65535 || max_numel < 0)
    return cudaErrorInvalidValue;
  if (count == 0 || max_numel == 0) return cudaSuccess;
  long long blocks = (max_numel + RIPPLES_ELEMENTS_PER_BLOCK - 1) / RIPPLES_ELEMENTS_PER_BLOCK;
  if (blocks > RIPPLES_MAX_BLOCKS) blocks = RIPPLES_MAX_BLOCKS;
  const ripples_fusion_fn fn = (unpack ? unpack_table : pack_table)[tensor_dtype][buffer_dtype];
  void* args[] = {(void*)&segments, &buffer, &scale};
  cudaError_t err = cudaLaunchKernel((const void*)fn, dim3((unsigned)blocks, (unsigned)count),
                                     dim3(RIPPLES_THREADS), args, 0, stream);
  return err != cudaSuccess ? err : cudaGetLastError();
}
#endif
