// Shared declarations of the LLTM op library: two ops, `layer_forward` and `layer_backward`, over a
// whole sequence (a single step is a layer with T = 1). The math is in lltm_math.h.
//
// Sizes: T time steps, B batch rows, I input features, H hidden units; tensors are time-major.
// The input projection of every step and the weight gradients are a few large GEMMs (lltm.cpp, shared by
// every device); what runs step by step is a device's `Recurrence` (lltm_cpu.cpp, lltm_cuda.cu).
//
// Variable lengths: `lengths` (B,) int64 on the CPU, each in [0, T], or undefined for "all T". Row b
// stops at step lengths[b]: later steps leave its h and c unchanged, write zeros to its output, and get
// no gradient; h_n and c_n hold its state after its own last step.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

namespace lltm {

struct Recurrence {
  // gates (T, B, 3H), contiguous: x_t W_ih^T + b on entry, the activations (i, o, z) on return.
  // h0, c0 (B, H) and weight_hh (3H, H): contiguous. Fills output (T, B, H) with h_1..h_T, cells
  // (T, B, H) with c_1..c_T, and h_n, c_n (B, H).
  void (*forward)(const at::Tensor& gates, const at::Tensor& h0, const at::Tensor& c0,
                  const at::Tensor& weight_hh, const at::Tensor& lengths, const at::Tensor& output,
                  const at::Tensor& cells, const at::Tensor& h_n, const at::Tensor& c_n);
  // grad_output (T, B, H), grad_h_n, grad_c_n (B, H): contiguous, or undefined for zeros.
  // activations (T, B, 3H) and cells (T, B, H) as the forward left them. Fills grad_gates (T, B, 3H)
  // with dL/d(pre-activations) (zero at the steps of finished rows), grad_h0 (B, H) with dL/dh_0, and
  // grad_c0 (B, H).
  void (*backward)(const at::Tensor& grad_output, const at::Tensor& grad_h_n, const at::Tensor& grad_c_n,
                   const at::Tensor& activations, const at::Tensor& cells, const at::Tensor& weight_hh,
                   const at::Tensor& lengths, const at::Tensor& grad_gates, const at::Tensor& grad_h0,
                   const at::Tensor& grad_c0);
};

// (output, h_n, c_n, cells, activations)
using ForwardResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
// (grad_input, grad_h0, grad_c0, grad_weight_ih, grad_weight_hh, grad_bias)
using BackwardResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// input (T, B, I); h0, c0 (B, H); weight_ih (3H, I); weight_hh (3H, H); bias (3H) or none.
ForwardResult layer_forward(const at::Tensor& input, const at::Tensor& h0, const at::Tensor& c0,
                            const at::Tensor& weight_ih, const at::Tensor& weight_hh,
                            const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& lengths,
                            const Recurrence& r);

// The saved forward tensors and the incoming gradients (each optional: none means zeros).
BackwardResult layer_backward(const std::optional<at::Tensor>& grad_output,
                              const std::optional<at::Tensor>& grad_h_n,
                              const std::optional<at::Tensor>& grad_c_n, const at::Tensor& input,
                              const at::Tensor& h0, const at::Tensor& weight_ih, const at::Tensor& weight_hh,
                              const at::Tensor& output, const at::Tensor& cells, const at::Tensor& activations,
                              const std::optional<at::Tensor>& lengths, const Recurrence& r);

// Registers both ops for one dispatch key (inside TORCH_LIBRARY_IMPL) with a device's recurrence.
template <const Recurrence& R>
void register_kernels(torch::Library& m) {
  using T = const at::Tensor&;
  using O = const std::optional<at::Tensor>&;
  m.impl("layer_forward", [](T input, T h0, T c0, T weight_ih, T weight_hh, O bias, O lengths) {
    return layer_forward(input, h0, c0, weight_ih, weight_hh, bias, lengths, R);
  });
  m.impl("layer_backward", [](O grad_output, O grad_h_n, O grad_c_n, T input, T h0, T weight_ih, T weight_hh,
                              T output, T cells, T activations, O lengths) {
    return layer_backward(grad_output, grad_h_n, grad_c_n, input, h0, weight_ih, weight_hh, output, cells,
                          activations, lengths, R);
  });
}

}  // namespace lltm
