// Per-element arithmetic shared by the CUDA kernels and the host-side tests.
//
// Everything here is __host__ __device__ (RIPPLES_HD), so the same code is compiled by
// nvcc/NVRTC for the GPU and by the system C++ compiler for tests that check it against
// torch. Contract: a scaled element is cast<Dst>(Compute(x) * Compute(scale)) where Compute
// is double when the source or destination is double and float otherwise, so fp16 and
// bf16 are computed in fp32 and rounded once.
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define RIPPLES_HD __host__ __device__ __forceinline__
#else
#define RIPPLES_HD inline
#endif

namespace ripples {

// Own integer names: NVRTC has no standard headers, and redefining the standard ones
// could clash with headers a compiler includes on its own.
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long uptr;

// Storage types for the 16-bit formats: raw bits, so no CUDA header is needed and the
// host compiler sees the same layout.
struct f16 { u16 bits; };
struct bf16 { u16 bits; };

// One packed-tensor segment: `numel` elements at `ptr`, at element `offset` of the buffer.
struct Segment {
  unsigned long long ptr;
  long long numel;
  long long offset;
};

RIPPLES_HD u32 float_bits(float f) {
  union { float f; u32 u; } v;
  v.f = f;
  return v.u;
}

RIPPLES_HD float bits_float(u32 u) {
  union { float f; u32 u; } v;
  v.u = u;
  return v.f;
}

// IEEE round-to-nearest-even float -> binary16, in integer arithmetic.
RIPPLES_HD u16 float_to_half_soft(float f) {
  u32 x = float_bits(f);
  const u32 sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return (u16)(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (x >= 0x477ff000u) return (u16)(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (x >= 0x38800000u) {                                   // normal half (>= 2^-14)
    x += 0xfffu + ((x >> 13) & 1u);
    return (u16)(sign | ((x - 0x38000000u) >> 13));
  }
  const u32 e = x >> 23;
  if (e < 102) return (u16)sign;  // below half the smallest subnormal (ties go to 0)
  const u32 m = (x & 0x7fffffu) | 0x800000u;
  const u32 shift = 126 - e;      // 14..24: value / 2^-24 = m >> shift
  u32 r = m >> shift;
  const u32 rem = m & ((1u << shift) - 1u);
  const u32 half = 1u << (shift - 1);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  return (u16)(sign | r);
}

RIPPLES_HD float half_to_float_soft(u16 h) {
  const u32 sign = (u32)(h & 0x8000u) << 16;
  u32 e = (h >> 10) & 0x1fu;
  u32 m = h & 0x3ffu;
  if (e == 0x1f) return bits_float(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    if (m == 0) return bits_float(sign);
    e = 113;  // subnormal: normalize the mantissa
    while (!(m & 0x400u)) { m <<= 1; --e; }
    return bits_float(sign | (e << 23) | ((m & 0x3ffu) << 13));
  }
  return bits_float(sign | ((e + 112) << 23) | (m << 13));
}

RIPPLES_HD u16 float_to_bf16_soft(float f) {
  const u32 x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (u16)((x >> 16) | 0x40u);  // quiet NaN
  return (u16)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

RIPPLES_HD float half_to_float(f16 h) {
#if defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
  return f;
#else
  return half_to_float_soft(h.bits);
#endif
}

RIPPLES_HD f16 float_to_half(float f) {
  f16 h;
#if defined(__CUDA_ARCH__)
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
#else
  h.bits = float_to_half_soft(f);
#endif
  return h;
}

RIPPLES_HD float bf16_to_float(bf16 b) { return bits_float((u32)b.bits << 16); }

RIPPLES_HD bf16 float_to_bf16(float f) {
  bf16 b;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b.bits) : "f"(f));
#else
  b.bits = float_to_bf16_soft(f);
#endif
  return b;
}

// Conversions into and out of the compute type.
template <class T> struct Widen;
template <> struct Widen<f16> { RIPPLES_HD static float to(f16 x) { return half_to_float(x); } };
template <> struct Widen<bf16> { RIPPLES_HD static float to(bf16 x) { return bf16_to_float(x); } };
template <> struct Widen<float> { RIPPLES_HD static float to(float x) { return x; } };
template <> struct Widen<double> { RIPPLES_HD static double to(double x) { return x; } };

template <class T> struct Narrow;
template <> struct Narrow<f16> {
  // double -> half goes through float, as torch's cast does.
  RIPPLES_HD static f16 from(double x) { return float_to_half((float)x); }
};
template <> struct Narrow<bf16> {
  RIPPLES_HD static bf16 from(double x) { return float_to_bf16((float)x); }
};
template <> struct Narrow<float> { RIPPLES_HD static float from(double x) { return (float)x; } };
template <> struct Narrow<double> { RIPPLES_HD static double from(double x) { return x; } };

template <class A, class B> struct Compute { typedef float type; };
template <class B> struct Compute<double, B> { typedef double type; };
template <class A> struct Compute<A, double> { typedef double type; };
template <> struct Compute<double, double> { typedef double type; };

// The one place the multiply happens. The product is formed in the compute type; when
// the compute type is float it is rounded to float before the final cast.
template <class Src, class Dst>
RIPPLES_HD Dst scaled_cast(Src x, typename Compute<Src, Dst>::type scale) {
  typedef typename Compute<Src, Dst>::type C;
  const C product = (C)Widen<Src>::to(x) * scale;
  return Narrow<Dst>::from(product);
}

// Elements per vector access: 16 bytes of the wider of the two types.
template <class Src, class Dst> struct VectorWidth {
  static const int bytes = sizeof(Src) > sizeof(Dst) ? sizeof(Src) : sizeof(Dst);
  static const int value = 16 / bytes;
};

template <class T, int N> struct alignas(sizeof(T) * N) Vec { T v[N]; };

// Number of leading elements handled one by one so that both src and dst are aligned to
// their vector size afterwards; returns n when the two pointers can never be aligned
// together (then everything is scalar).
template <class Src, class Dst>
RIPPLES_HD i64 vector_head(const Src* src, const Dst* dst, i64 n) {
  const int V = VectorWidth<Src, Dst>::value;
  const uptr src_align = (uptr)V * sizeof(Src);
  const uptr dst_align = (uptr)V * sizeof(Dst);
  const uptr misalign = (uptr)src % src_align;
  if (misalign % sizeof(Src) != 0) return n;
  const i64 head = misalign == 0 ? 0 : (i64)((src_align - misalign) / sizeof(Src));
  if ((uptr)(dst + head) % dst_align != 0) return n;
  return head < n ? head : n;
}

// dst[i] = src[i] * scale for i in [0, n), the share of lane `lane` out of `lanes`
// (grid-stride). Aligned middles move 16-byte vectors; head and tail are scalar.
// src == dst (in-place scale) is allowed.
template <class Src, class Dst>
RIPPLES_HD void scaled_copy_lane(const Src* src, Dst* dst, i64 n,
                                 typename Compute<Src, Dst>::type scale,
                                 i64 lane, i64 lanes) {
  const int V = VectorWidth<Src, Dst>::value;
  const i64 head = vector_head(src, dst, n);
  for (i64 i = lane; i < head; i += lanes) dst[i] = scaled_cast<Src, Dst>(src[i], scale);
  const i64 vectors = (n - head) / V;
  const Vec<Src, VectorWidth<Src, Dst>::value>* vsrc =
      reinterpret_cast<const Vec<Src, VectorWidth<Src, Dst>::value>*>(src + head);
  Vec<Dst, VectorWidth<Src, Dst>::value>* vdst =
      reinterpret_cast<Vec<Dst, VectorWidth<Src, Dst>::value>*>(dst + head);
  // Four loads in flight before the stores: src and dst may alias (in-place scale), so
  // the compiler cannot reorder one iteration's load past the previous one's store, and a
  // load-store-load chain leaves the memory system idle. Each element is still read and
  // written by one lane only.
  const int U = 4;
  i64 j = lane;
  for (; j + (U - 1) * lanes < vectors; j += U * lanes) {
    Vec<Src, VectorWidth<Src, Dst>::value> in[U];
    for (int u = 0; u < U; ++u) in[u] = vsrc[j + u * lanes];
    for (int u = 0; u < U; ++u) {
      Vec<Dst, VectorWidth<Src, Dst>::value> out;
      for (int k = 0; k < V; ++k) out.v[k] = scaled_cast<Src, Dst>(in[u].v[k], scale);
      vdst[j + u * lanes] = out;
    }
  }
  for (; j < vectors; j += lanes) {
    const Vec<Src, VectorWidth<Src, Dst>::value> in = vsrc[j];
    Vec<Dst, VectorWidth<Src, Dst>::value> out;
    for (int k = 0; k < V; ++k) out.v[k] = scaled_cast<Src, Dst>(in.v[k], scale);
    vdst[j] = out;
  }
  for (i64 i = head + vectors * V + lane; i < n; i += lanes)
    dst[i] = scaled_cast<Src, Dst>(src[i], scale);
}

// Segment `seg` of a pack (tensor -> buffer) or unpack (buffer -> tensor).
template <class T, class B>
RIPPLES_HD void pack_segment(const Segment& seg, B* buffer, double scale,
                             i64 lane, i64 lanes) {
  scaled_copy_lane<T, B>(reinterpret_cast<const T*>(seg.ptr), buffer + seg.offset, seg.numel,
                         (typename Compute<T, B>::type)scale, lane, lanes);
}

template <class B, class T>
RIPPLES_HD void unpack_segment(const Segment& seg, const B* buffer, double scale,
                               i64 lane, i64 lanes) {
  scaled_copy_lane<B, T>(buffer + seg.offset, reinterpret_cast<T*>(seg.ptr), seg.numel,
                         (typename Compute<B, T>::type)scale, lane, lanes);
}

}  // namespace ripples

// Dtype suffixes used in kernel names: X(suffix, type).
#define RIPPLES_FOR_EACH_FLOAT(X) \
  X(f16, ripples::f16) X(bf16, ripples::bf16) X(f32, float) X(f64, double)
