// The LLTM's per-element math, forward and backward, written once for every device.
//
// PyTorch's "Custom C++ and CUDA Extensions" tutorial, gates in the order (input, output, candidate):
//   i = sigmoid(g_i), o = sigmoid(g_o), z = elu(g_z)      (g: pre-activations, x W_ih^T + h W_hh^T + b)
//   c' = c + i * z                                       (no forget gate: the cell accumulates)
//   h' = tanh(c') * o
// `M` supplies exp, expm1 and tanh for the arithmetic type `acc_t`: the CPU passes vectorisable
// approximations for float and libm otherwise, CUDA its device functions.
#pragma once

// Always inlined: the CPU's loops vectorise only with the math inlined into each ISA clone of the caller.
#if defined(__CUDACC__)
#define LLTM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define LLTM_HOST_DEVICE inline __attribute__((always_inline))
#endif

namespace lltm {
namespace math {

// One (row, unit): pre-activations and c_prev in; activations (i, o, z), c' and h' out.
template <typename acc_t, typename M>
LLTM_HOST_DEVICE void forward(acc_t g_i, acc_t g_o, acc_t g_z, acc_t c_prev, acc_t& i, acc_t& o, acc_t& z,
                              acc_t& c, acc_t& h) {
  i = acc_t(1) / (acc_t(1) + M::exp(-g_i));
  o = acc_t(1) / (acc_t(1) + M::exp(-g_o));
  z = g_z > acc_t(0) ? g_z : M::expm1(g_z);
  c = c_prev + i * z;
  h = M::tanh(c) * o;
}

// One (row, unit) backward. dh: dL/dh' from every later use; dc: dL/dc' from the next step on entry,
// dL/dc_prev on return (c' = c_prev + i z passes it through unchanged). Returns dL/d(pre-activations).
template <typename acc_t, typename M>
LLTM_HOST_DEVICE void backward(acc_t dh, acc_t& dc, acc_t i, acc_t o, acc_t z, acc_t c, acc_t& d_i,
                               acc_t& d_o, acc_t& d_z) {
  const acc_t tc = M::tanh(c);
  dc = dc + dh * o * (acc_t(1) - tc * tc);
  d_i = dc * z * i * (acc_t(1) - i);
  d_o = dh * tc * o * (acc_t(1) - o);
  d_z = dc * i * (z > acc_t(0) ? acc_t(1) : z + acc_t(1));  // elu'(g) = elu(g) + 1 for g <= 0
}

}  // namespace math
}  // namespace lltm
