// Host build of the kernels' per-element code (common.cuh) for tests: the same functions a
// GPU thread runs, called here for every lane of an emulated grid, one lane after another.
// Built with the system C++ compiler into a shared library and called through ctypes.
#include "common.cuh"

namespace {

using ripples::Segment;
using ripples::i64;

template <class T, class B>
void pack_all(const Segment* segments, int count, void* buffer, double scale, i64 lanes) {
  for (int s = 0; s < count; ++s)
    for (i64 lane = 0; lane < lanes; ++lane)
      ripples::pack_segment<T, B>(segments[s], static_cast<B*>(buffer), scale, lane, lanes);
}

template <class T, class B>
void unpack_all(const Segment* segments, int count, const void* buffer, double scale,
                i64 lanes) {
  for (int s = 0; s < count; ++s)
    for (i64 lane = 0; lane < lanes; ++lane)
      ripples::unpack_segment<B, T>(segments[s], static_cast<const B*>(buffer), scale, lane,
                                    lanes);
}

template <class T>
void scale_all(void* data, i64 n, double factor, i64 lanes) {
  T* p = static_cast<T*>(data);
  for (i64 lane = 0; lane < lanes; ++lane)
    ripples::scaled_copy_lane<T, T>(p, p, n, (typename ripples::Compute<T, T>::type)factor,
                                    lane, lanes);
}

// Calls F<T, B> for dtype codes 0 f16, 1 bf16, 2 f32, 3 f64; returns false for bad codes.
template <template <class, class> class F, class... Args>
bool dispatch2(int t, int b, Args... args) {
  switch (t * 4 + b) {
#define RIPPLES_CASE(i, T, B) case i: F<T, B>::run(args...); return true;
    RIPPLES_CASE(0, ripples::f16, ripples::f16) RIPPLES_CASE(1, ripples::f16, ripples::bf16)
    RIPPLES_CASE(2, ripples::f16, float) RIPPLES_CASE(3, ripples::f16, double)
    RIPPLES_CASE(4, ripples::bf16, ripples::f16) RIPPLES_CASE(5, ripples::bf16, ripples::bf16)
    RIPPLES_CASE(6, ripples::bf16, float) RIPPLES_CASE(7, ripples::bf16, double)
    RIPPLES_CASE(8, float, ripples::f16) RIPPLES_CASE(9, float, ripples::bf16)
    RIPPLES_CASE(10, float, float) RIPPLES_CASE(11, float, double)
    RIPPLES_CASE(12, double, ripples::f16) RIPPLES_CASE(13, double, ripples::bf16)
    RIPPLES_CASE(14, double, float) RIPPLES_CASE(15, double, double)
#undef RIPPLES_CASE
    default: return false;
  }
}

template <class T, class B> struct Pack {
  static void run(const Segment* s, int c, void* b, double k, i64 l) { pack_all<T, B>(s, c, b, k, l); }
};
template <class T, class B> struct Unpack {
  static void run(const Segment* s, int c, const void* b, double k, i64 l) {
    unpack_all<T, B>(s, c, b, k, l);
  }
};

}  // namespace

extern "C" {

int ripples_host_pack(int tensor_dtype, int buffer_dtype, const Segment* segments, int count,
                      void* buffer, double scale, long long lanes) {
  return dispatch2<Pack>(tensor_dtype, buffer_dtype, segments, count, buffer, scale,
                         (i64)lanes) ? 0 : -1;
}

int ripples_host_unpack(int tensor_dtype, int buffer_dtype, const Segment* segments,
                        int count, const void* buffer, double scale, long long lanes) {
  return dispatch2<Unpack>(tensor_dtype, buffer_dtype, segments, count, buffer, scale,
                           (i64)lanes) ? 0 : -1;
}

int ripples_host_scale(int dtype, void* data, long long n, double factor, long long lanes) {
  switch (dtype) {
    case 0: scale_all<ripples::f16>(data, n, factor, lanes); return 0;
    case 1: scale_all<ripples::bf16>(data, n, factor, lanes); return 0;
    case 2: scale_all<float>(data, n, factor, lanes); return 0;
    case 3: scale_all<double>(data, n, factor, lanes); return 0;
    default: return -1;
  }
}

long long ripples_host_vector_head_f32_f16(const void* src, const void* dst, long long n) {
  return ripples::vector_head(static_cast<const float*>(src), static_cast<const ripples::f16*>(dst), n);
}

}  // extern "C"
