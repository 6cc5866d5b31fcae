// The CPU recurrence, and the CPU registrations of the ops.
//
// Batch rows never interact, so each thread takes a block of rows through the whole time loop: per step a
// single-threaded GEMM (h_{t-1} W_hh^T into its rows) and the fused pointwise work, with no barrier between
// threads until the loop ends. (One multi-threaded GEMM per step instead would synchronise the threads
// twice per step, which costs more than the step itself at small sizes.)
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
#include "lltm_math.h"

namespace lltm {
namespace {

// libm's functions, for float64 and the 16-bit types (which compute in float).
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

// One step's pointwise forward over `rows` rows: the activations overwrite the pre-activations in `g`.
template <typename scalar_t, typename M>
LLTM_HOST_DEVICE void forward_rows(scalar_t* __restrict__ g, const scalar_t* __restrict__ c_prev,
                         scalar_t* __restrict__ c_new, scalar_t* __restrict__ h_new, int64_t rows, int64_t H) {
  using acc_t = at::opmath_type<scalar_t>;
  for (int64_t r = 0; r < rows; ++r, g += 3 * H, c_prev += H, c_new += H, h_new += H) {
    for (int64_t j = 0; j < H; ++j) {
      acc_t i, o, z, c, h;
      math::forward<acc_t, M>(g[j], g[H + j], g[2 * H + j], c_prev[j], i, o, z, c, h);
      g[j] = i;
      g[H + j] = o;
      g[2 * H + j] = z;
      c_new[j] = c;
      h_new[j] = h;
    }
  }
}

// One step's pointwise backward over `rows` rows. dh_next: what the later steps pass back to h_t (zeroed
// here, ready to take the next recurrent product); dc: the running cell gradient; `g` the activations,
// `dg` the gate gradients written. grad_out may be null (no gradient reaches the output).
template <typename scalar_t, typename M>
LLTM_HOST_DEVICE void backward_rows(const scalar_t* __restrict__ grad_out, scalar_t* __restrict__ dh_next,
                          at::opmath_type<scalar_t>* __restrict__ dc, const scalar_t* __restrict__ g,
                          const scalar_t* __restrict__ c, scalar_t* __restrict__ dg, int64_t rows, int64_t H) {
  using acc_t = at::opmath_type<scalar_t>;
  for (int64_t r = 0; r < rows; ++r, g += 3 * H, dg += 3 * H, c += H, dh_next += H, dc += H) {
    const scalar_t* __restrict__ go = grad_out ? grad_out + r * H : nullptr;
    for (int64_t j = 0; j < H; ++j) {
      const acc_t dh = acc_t(dh_next[j]) + (go ? acc_t(go[j]) : acc_t(0));
      acc_t dcj = dc[j], d_i, d_o, d_z;
      math::backward<acc_t, M>(dh, dcj, g[j], g[H + j], g[2 * H + j], c[j], d_i, d_o, d_z);
      dc[j] = dcj;
      dg[j] = d_i;
      dg[H + j] = d_o;
      dg[2 * H + j] = d_z;
      dh_next[j] = scalar_t(0);
    }
  }
}

// float32 rows compiled for AVX-512, AVX2+FMA and baseline x86-64, picked when the library loads.
#if defined(__x86_64__) && defined(__GNUC__)
#define LLTM_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define LLTM_CPU_CLONES
#endif

LLTM_CPU_CLONES void forward_rows_f32(float* g, const float* cp, float* cn, float* hn, int64_t rows, int64_t H) {
  forward_rows<float, FastFloatMath>(g, cp, cn, hn, rows, H);
}

LLTM_CPU_CLONES void backward_rows_f32(const float* go, float* dh, float* dc, const float* g, const float* c,
                                       float* dg, int64_t rows, int64_t H) {
  backward_rows<float, FastFloatMath>(go, dh, dc, g, c, dg, rows, H);
}

template <typename scalar_t>
void forward_rows_any(scalar_t* g, const scalar_t* cp, scalar_t* cn, scalar_t* hn, int64_t rows, int64_t H) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    forward_rows_f32(g, cp, cn, hn, rows, H);
  } else {
    forward_rows<scalar_t, LibmMath>(g, cp, cn, hn, rows, H);
  }
}

template <typename scalar_t, typename acc_t>
void backward_rows_any(const scalar_t* go, scalar_t* dh, acc_t* dc, const scalar_t* g, const scalar_t* c,
                       scalar_t* dg, int64_t rows, int64_t H) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    backward_rows_f32(go, dh, dc, g, c, dg, rows, H);
  } else {
    backward_rows<scalar_t, LibmMath>(go, dh, dc, g, c, dg, rows, H);
  }
}

// Rows per thread: one block per thread, but at least 4 rows (thinner blocks are all call overhead).
int64_t grain_rows(int64_t B) {
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  return std::max<int64_t>((B + threads - 1) / threads, std::min<int64_t>(B, 4));
}

void forward(const at::Tensor& gates, const at::Tensor& h0, const at::Tensor& c0, const at::Tensor& weight_hh,
             const at::Tensor& lengths, const at::Tensor& output, const at::Tensor& cells, const at::Tensor& h_n,
             const at::Tensor& c_n) {
  const int64_t T = gates.size(0), B = gates.size(1), H = h0.size(1);
  const int64_t* lens = lengths.defined() ? lengths.data_ptr<int64_t>() : nullptr;
  const at::Tensor w_t = weight_hh.t();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, gates.scalar_type(), "lltm_forward_cpu", [&] {
    at::parallel_for(0, B, grain_rows(B), [&](int64_t b0, int64_t b1) {
      const int64_t rows = b1 - b0;
      scalar_t* g = gates.data_ptr<scalar_t>();
      scalar_t* out = output.data_ptr<scalar_t>();
      scalar_t* cs = cells.data_ptr<scalar_t>();
      for (int64_t t = 0; t < T; ++t) {
        const int64_t off = (t * B + b0) * H;
        const at::Tensor h_prev = (t == 0 ? h0 : output[t - 1]).narrow(0, b0, rows);
        const scalar_t* c_prev = t == 0 ? c0.data_ptr<scalar_t>() + b0 * H : cs + off - B * H;
        gates[t].narrow(0, b0, rows).addmm_(h_prev, w_t);  // single-threaded inside this parallel region
        forward_rows_any<scalar_t>(g + 3 * off, c_prev, cs + off, out + off, rows, H);
        for (int64_t r = 0; lens && r < rows; ++r) {
          if (t < lens[b0 + r]) continue;
          // A finished row: zero output, the cell state carried on; its other values are never read.
          std::fill_n(out + off + r * H, H, scalar_t(0));
          std::copy_n(c_prev + r * H, H, cs + off + r * H);
        }
      }
      // Each row's final state is the one after its own last step.
      scalar_t* hn = h_n.data_ptr<scalar_t>();
      scalar_t* cn = c_n.data_ptr<scalar_t>();
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t last = lens ? lens[b] : T;
        std::copy_n(last == 0 ? h0.data_ptr<scalar_t>() + b * H : out + ((last - 1) * B + b) * H, H, hn + b * H);
        std::copy_n(last == 0 ? c0.data_ptr<scalar_t>() + b * H : cs + ((last - 1) * B + b) * H, H, cn + b * H);
      }
    });
  });
}

void backward(const at::Tensor& grad_output, const at::Tensor& grad_h_n, const at::Tensor& grad_c_n,
              const at::Tensor& activations, const at::Tensor& cells, const at::Tensor& weight_hh,
              const at::Tensor& lengths, const at::Tensor& grad_gates, const at::Tensor& grad_h0,
              const at::Tensor& grad_c0) {
  const int64_t T = activations.size(0), B = activations.size(1), H = cells.size(2);
  const int64_t* lens = lengths.defined() ? lengths.data_ptr<int64_t>() : nullptr;
  const auto acc_type = at::toOpMathType(activations.scalar_type());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, activations.scalar_type(), "lltm_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    at::parallel_for(0, B, grain_rows(B), [&](int64_t b0, int64_t b1) {
      const int64_t rows = b1 - b0;
      const scalar_t* g = activations.data_ptr<scalar_t>();
      scalar_t* dg = grad_gates.data_ptr<scalar_t>();
      const scalar_t* cs = cells.data_ptr<scalar_t>();
      const scalar_t* go = grad_output.defined() ? grad_output.data_ptr<scalar_t>() : nullptr;
      // dh_next: what the steps after t pass back to h_t; after step 0 it is dL/dh_0.
      at::Tensor dh_next = grad_h0.narrow(0, b0, rows);
      if (grad_h_n.defined()) {
        dh_next.copy_(grad_h_n.narrow(0, b0, rows));
      } else {
        dh_next.zero_();
      }
      at::Tensor dc = grad_c_n.defined() ? grad_c_n.narrow(0, b0, rows).to(acc_type, false, true)
                                         : at::zeros({rows, H}, activations.options().dtype(acc_type));
      scalar_t* dh = dh_next.data_ptr<scalar_t>();
      acc_t* dcp = dc.data_ptr<acc_t>();
      for (int64_t t = T - 1; t >= 0; --t) {
        const int64_t off = (t * B + b0) * H;
        if (!lens) {
          backward_rows_any<scalar_t, acc_t>(go ? go + off : nullptr, dh, dcp, g + 3 * off, cs + off, dg + 3 * off,
                                             rows, H);
        } else {
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t k = off + r * H;
            if (t < lens[b0 + r]) {
              backward_rows_any<scalar_t, acc_t>(go ? go + k : nullptr, dh + r * H, dcp + r * H, g + 3 * k, cs + k,
                                                 dg + 3 * k, 1, H);
            } else {  // finished: h_t is h_{t-1}, so dL/dh passes through and the gates get nothing
              std::fill_n(dg + 3 * k, 3 * H, scalar_t(0));
            }
          }
        }
        dh_next.addmm_(grad_gates[t].narrow(0, b0, rows), weight_hh);  // += dg_t W_hh
      }
      grad_c0.narrow(0, b0, rows).copy_(dc);
    });
  });
}

const Recurrence kCpu{forward, backward};

}  // namespace
}  // namespace lltm

TORCH_LIBRARY_IMPL(lltm, CPU, m) { lltm::register_kernels<lltm::kCpu>(m); }
