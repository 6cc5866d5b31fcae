// Shared declarations of the LLTM op library.
//
// The math (PyTorch's "Custom C++ and CUDA Extensions" tutorial, with the weight split as in nn.LSTM):
//   gates = x @ weight_ih^T + h @ weight_hh^T + bias        (B, 3H), chunks (input, output, candidate)
//   i = sigmoid(g0), o = sigmoid(g1), z = elu(g2)
//   c' = c + i * z,  h' = tanh(c') * o
//
// Every device implements two pointwise kernels, one time step each (the GEMMs are shared code in
// lltm.cpp and go through ATen, i.e. MKL/oneDNN or cuBLAS):
//   step_forward : gates (pre-activation, overwritten in place by the activations i, o, z), c_prev
//                  -> c_new, h_new
//   step_backward: grad_h, grad_c (accumulator dtype), activations, c_new
//                  -> grad_gates (pre-activation), grad_c_prev (accumulator dtype; may alias grad_c)
// The accumulator dtype is float for half/bfloat16 inputs and the input dtype otherwise, so the cell
// gradient that flows back through all T steps never rounds to 16 bits.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <tuple>

namespace lltm {

struct StepKernels {
  void (*forward)(const at::Tensor& gates, const at::Tensor& c_prev, const at::Tensor& c_new,
                  const at::Tensor& h_new);
  void (*backward)(const at::Tensor& grad_h, const at::Tensor& grad_c, const at::Tensor& gates,
                   const at::Tensor& c_new, const at::Tensor& grad_gates,
                   const at::Tensor& grad_c_prev);
};

using CellForwardResult = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using LayerForwardResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using BackwardResult =
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// (h_new, c_new, gates): gates holds the activations (i, o, z) that the backward needs.
CellForwardResult cell_forward(const at::Tensor& input, const at::Tensor& h, const at::Tensor& c,
                               const at::Tensor& weight_ih, const at::Tensor& weight_hh,
                               const std::optional<at::Tensor>& bias, const StepKernels& k);

// (grad_input, grad_h, grad_c, grad_weight_ih, grad_weight_hh, grad_bias)
BackwardResult cell_backward(const at::Tensor& grad_h_new, const at::Tensor& grad_c_new,
                             const at::Tensor& input, const at::Tensor& h,
                             const at::Tensor& weight_ih, const at::Tensor& weight_hh,
                             const at::Tensor& c_new, const at::Tensor& gates,
                             const StepKernels& k);

// (output, h_n, c_n, cells, gates): cells (T, B, H) are c_1..c_T, gates (T, B, 3H) the activations.
LayerForwardResult layer_forward(const at::Tensor& input, const at::Tensor& h0, const at::Tensor& c0,
                                 const at::Tensor& weight_ih, const at::Tensor& weight_hh,
                                 const std::optional<at::Tensor>& bias, const StepKernels& k);

// (grad_input, grad_h0, grad_c0, grad_weight_ih, grad_weight_hh, grad_bias)
BackwardResult layer_backward(const at::Tensor& grad_output, const at::Tensor& grad_h_n,
                              const at::Tensor& grad_c_n, const at::Tensor& input,
                              const at::Tensor& h0, const at::Tensor& weight_ih,
                              const at::Tensor& weight_hh, const at::Tensor& output,
                              const at::Tensor& cells, const at::Tensor& gates,
                              const StepKernels& k);

// dtype used for the cell-gradient accumulator: float for half types, the dtype itself otherwise.
at::ScalarType accumulate_type(at::ScalarType t);

// Registers the four ops for one dispatch key (inside TORCH_LIBRARY_IMPL) with a device's kernels.
template <const StepKernels& K>
void register_kernels(torch::Library& m) {
  using T = const at::Tensor&;
  m.impl("cell_forward", [](T input, T h, T c, T weight_ih, T weight_hh,
                            const std::optional<at::Tensor>& bias) {
    return cell_forward(input, h, c, weight_ih, weight_hh, bias, K);
  });
  m.impl("cell_backward", [](T grad_h_new, T grad_c_new, T input, T h, T weight_ih, T weight_hh,
                             T c_new, T gates) {
    return cell_backward(grad_h_new, grad_c_new, input, h, weight_ih, weight_hh, c_new, gates, K);
  });
  m.impl("layer_forward", [](T input, T h0, T c0, T weight_ih, T weight_hh,
                             const std::optional<at::Tensor>& bias) {
    return layer_forward(input, h0, c0, weight_ih, weight_hh, bias, K);
  });
  m.impl("layer_backward", [](T grad_output, T grad_h_n, T grad_c_n, T input, T h0, T weight_ih,
                              T weight_hh, T output, T cells, T gates) {
    return layer_backward(grad_output, grad_h_n, grad_c_n, input, h0, weight_ih, weight_hh, output,
                          cells, gates, K);
  });
}

}  // namespace lltm
