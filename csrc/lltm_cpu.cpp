// CPU pointwise kernels of one LLTM time step, and the CPU registrations of the ops.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "lltm.h"

namespace lltm {
namespace {

// Elements per parallel chunk: enough work that waking a second thread pays for itself.
int64_t grain_rows(int64_t H) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(H, 1)); }

// libm's transcendental functions, for float64 and the 16-bit types (float arithmetic).
struct LibmMath {
  template <typename T>
  static T exp(T x) { return std::exp(x); }
  template <typename T>
  static T expm1(T x) { return std::expm1(x); }
  template <typename T>
  static T tanh(T x) { return std::tanh(x); }
};

// float32: branch-free approximations that the compiler vectorises (libm calls would keep the loop
// scalar and cost about ten times more than the GEMM of a step). exp: Cody-Waite range reduction to
// |r| <= ln2/2, then the degree-7 Taylor polynomial (truncation error < 6e-9, about one ulp overall).
// Like expf it gives inf above the float range and 0 below it (so sigmoid(-inf) * inf is NaN, as in
// PyTorch), and NaN stays NaN.
struct FastFloatMath {
  static float exp(float x) {
    const float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x / ln2)
    const float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;  // x - n ln2, ln2 split in two
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;  // 2^n
    const float e = p * __builtin_bit_cast(float, bits);
    return x > 88.0f ? std::numeric_limits<float>::infinity() : (x < -87.0f ? 0.0f : e);
  }
  static float expm1(float x) { return exp(x) - 1.0f; }
  static float tanh(float x) { return 1.0f - 2.0f / (exp(2.0f * x) + 1.0f); }
};

template <typename scalar_t, typename M>
inline void forward_rows(scalar_t* __restrict__ gates, const scalar_t* __restrict__ c_prev,
                         scalar_t* __restrict__ c_new, scalar_t* __restrict__ h_new, int64_t b0,
                         int64_t b1, int64_t H) {
  using acc_t = at::opmath_type<scalar_t>;
  for (int64_t b = b0; b < b1; ++b) {
    scalar_t* __restrict__ g = gates + b * 3 * H;
    const scalar_t* __restrict__ cp = c_prev + b * H;
    scalar_t* __restrict__ cn = c_new + b * H;
    scalar_t* __restrict__ hn = h_new + b * H;
    for (int64_t j = 0; j < H; ++j) {
      const acc_t gi = g[j], go = g[H + j], gz = g[2 * H + j];
      const acc_t i = acc_t(1) / (acc_t(1) + M::exp(-gi));
      const acc_t o = acc_t(1) / (acc_t(1) + M::exp(-go));
      const acc_t z = gz > acc_t(0) ? gz : M::expm1(gz);
      const acc_t c = acc_t(cp[j]) + i * z;
      g[j] = i;
      g[H + j] = o;
      g[2 * H + j] = z;
      cn[j] = c;
      hn[j] = M::tanh(c) * o;
    }
  }
}

// grad_c and grad_c_prev may be the same buffer (the layer's running cell gradient): each element is
// read before it is written, by the same iteration.
template <typename scalar_t, typename M>
inline void backward_rows(const scalar_t* __restrict__ grad_h, const at::opmath_type<scalar_t>* grad_c,
                          const scalar_t* __restrict__ gates, const scalar_t* __restrict__ c_new,
                          scalar_t* __restrict__ grad_gates, at::opmath_type<scalar_t>* grad_c_prev,
                          int64_t b0, int64_t b1, int64_t H) {
  using acc_t = at::opmath_type<scalar_t>;
  for (int64_t b = b0; b < b1; ++b) {
    const scalar_t* __restrict__ g = gates + b * 3 * H;
    scalar_t* __restrict__ dg = grad_gates + b * 3 * H;
    for (int64_t j = 0; j < H; ++j) {
      const int64_t k = b * H + j;
      const acc_t i = g[j], o = g[H + j], z = g[2 * H + j];
      const acc_t tc = M::tanh(acc_t(c_new[k]));
      const acc_t dh = grad_h[k];
      const acc_t dc = grad_c[k] + dh * o * (acc_t(1) - tc * tc);
      dg[j] = dc * z * i * (acc_t(1) - i);
      dg[H + j] = dh * tc * o * (acc_t(1) - o);
      dg[2 * H + j] = dc * i * (z > acc_t(0) ? acc_t(1) : z + acc_t(1));  // elu'(x) = z + 1 for x <= 0
      grad_c_prev[k] = dc;
    }
  }
}

// float32 rows compiled for AVX-512, AVX2+FMA and baseline x86-64, picked when the library loads.
#if defined(__x86_64__) && defined(__GNUC__)
#define LLTM_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define LLTM_CPU_CLONES
#endif

LLTM_CPU_CLONES void forward_rows_f32(float* g, const float* cp, float* cn, float* hn, int64_t b0,
                                      int64_t b1, int64_t H) {
  forward_rows<float, FastFloatMath>(g, cp, cn, hn, b0, b1, H);
}

LLTM_CPU_CLONES void backward_rows_f32(const float* dh, const float* dc, const float* g,
                                       const float* cn, float* dg, float* dcp, int64_t b0,
                                       int64_t b1, int64_t H) {
  backward_rows<float, FastFloatMath>(dh, dc, g, cn, dg, dcp, b0, b1, H);
}

template <typename scalar_t>
void forward_rows_any(scalar_t* g, const scalar_t* cp, scalar_t* cn, scalar_t* hn, int64_t b0,
                      int64_t b1, int64_t H) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    forward_rows_f32(g, cp, cn, hn, b0, b1, H);
  } else {
    forward_rows<scalar_t, LibmMath>(g, cp, cn, hn, b0, b1, H);
  }
}

template <typename scalar_t, typename acc_t>
void backward_rows_any(const scalar_t* dh, const acc_t* dc, const scalar_t* g, const scalar_t* cn,
                       scalar_t* dg, acc_t* dcp, int64_t b0, int64_t b1, int64_t H) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    backward_rows_f32(dh, dc, g, cn, dg, dcp, b0, b1, H);
  } else {
    backward_rows<scalar_t, LibmMath>(dh, dc, g, cn, dg, dcp, b0, b1, H);
  }
}

void step_forward(const at::Tensor& gates, const at::Tensor& c_prev, const at::Tensor& c_new,
                  const at::Tensor& h_new) {
  const int64_t B = c_new.size(0), H = c_new.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, gates.scalar_type(), "lltm_step_forward", [&] {
    scalar_t* g = gates.data_ptr<scalar_t>();
    const scalar_t* cp = c_prev.data_ptr<scalar_t>();
    scalar_t* cn = c_new.data_ptr<scalar_t>();
    scalar_t* hn = h_new.data_ptr<scalar_t>();
    at::parallel_for(0, B, grain_rows(H), [&](int64_t b0, int64_t b1) {
      forward_rows_any<scalar_t>(g, cp, cn, hn, b0, b1, H);
    });
  });
}

void step_backward(const at::Tensor& grad_h, const at::Tensor& grad_c, const at::Tensor& gates,
                   const at::Tensor& c_new, const at::Tensor& grad_gates,
                   const at::Tensor& grad_c_prev) {
  const int64_t B = c_new.size(0), H = c_new.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, gates.scalar_type(), "lltm_step_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* dh = grad_h.data_ptr<scalar_t>();
    const acc_t* dc = grad_c.data_ptr<acc_t>();
    const scalar_t* g = gates.data_ptr<scalar_t>();
    const scalar_t* cn = c_new.data_ptr<scalar_t>();
    scalar_t* dg = grad_gates.data_ptr<scalar_t>();
    acc_t* dcp = grad_c_prev.data_ptr<acc_t>();
    at::parallel_for(0, B, grain_rows(H), [&](int64_t b0, int64_t b1) {
      backward_rows_any<scalar_t, acc_t>(dh, dc, g, cn, dg, dcp, b0, b1, H);
    });
  });
}

const StepKernels kCpu{step_forward, step_backward};

}  // namespace
}  // namespace lltm

TORCH_LIBRARY_IMPL(lltm, CPU, m) { lltm::register_kernels<lltm::kCpu>(m); }
