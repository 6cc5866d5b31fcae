// Autograd of the compiled ops, in C++: nothing runs in Python between the forward op and the backward
// op (a Python autograd.Function costs tens of microseconds a call, as much as a small layer's kernels).
// Registered for the Autograd key, so every device and torch.compile's tracing go through it.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "lltm.h"

namespace lltm {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptTensor = std::optional<at::Tensor>;

const auto& forward_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("lltm::layer_forward", "")
                             .typed<ForwardResult(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                  const at::Tensor&, const at::Tensor&, const OptTensor&,
                                                  const OptTensor&)>();
  return op;
}

const auto& backward_op() {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("lltm::layer_backward", "")
          .typed<BackwardResult(const OptTensor&, const OptTensor&, const OptTensor&, const at::Tensor&,
                                const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                const at::Tensor&, const at::Tensor&, const OptTensor&)>();
  return op;
}

OptTensor defined_or_none(const at::Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

// The backward op under autograd: first derivatives only. Its outputs carry a node that refuses a second
// derivative, so create_graph=True works until someone differentiates the gradients themselves.
struct LayerBackward : public torch::autograd::Function<LayerBackward> {
  static variable_list forward(AutogradContext*, const OptTensor& grad_output, const OptTensor& grad_h_n,
                               const OptTensor& grad_c_n, const at::Tensor& input, const at::Tensor& h0,
                               const at::Tensor& weight_ih, const at::Tensor& weight_hh, const at::Tensor& output,
                               const at::Tensor& cells, const at::Tensor& activations, const OptTensor& lengths) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [gx, gh0, gc0, gwih, gwhh, gb] = backward_op().call(grad_output, grad_h_n, grad_c_n, input, h0, weight_ih,
                                                             weight_hh, output, cells, activations, lengths);
    return {gx, gh0, gc0, gwih, gwhh, gb};
  }

  static variable_list backward(AutogradContext*, variable_list) {
    TORCH_CHECK_NOT_IMPLEMENTED(false,
                                "the cpp and cuda LLTM backends have no second derivative (double backward, "
                                "create_graph=True, Hessians); use backend='python' for those");
  }
};

struct LayerForward : public torch::autograd::Function<LayerForward> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& h0,
                               const at::Tensor& c0, const at::Tensor& weight_ih, const at::Tensor& weight_hh,
                               const OptTensor& bias, const OptTensor& lengths) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [output, h_n, c_n, cells, activations] =
        forward_op().call(input, h0, c0, weight_ih, weight_hh, bias, lengths);
    ctx->save_for_backward({input, h0, weight_ih, weight_hh, output, cells, activations});
    ctx->saved_data["has_bias"] = bias.has_value();
    ctx->saved_data["lengths"] = lengths.has_value() ? c10::IValue(*lengths) : c10::IValue();
    ctx->mark_non_differentiable({cells, activations});
    ctx->set_materialize_grads(false);  // unused outputs get no gradient work (and no zero-filled buffers)
    return {output, h_n, c_n, cells, activations};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor &input = s[0], &h0 = s[1], &weight_ih = s[2], &weight_hh = s[3], &output = s[4], &cells = s[5],
                     &activations = s[6];
    const c10::IValue& saved_lengths = ctx->saved_data["lengths"];
    const OptTensor lengths = saved_lengths.isTensor() ? OptTensor(saved_lengths.toTensor()) : std::nullopt;
    variable_list g = LayerBackward::apply(defined_or_none(grads[0]), defined_or_none(grads[1]),
                                           defined_or_none(grads[2]), input, h0, weight_ih, weight_hh, output,
                                           cells, activations, lengths);
    return {g[0], g[1], g[2], g[3], g[4], ctx->saved_data["has_bias"].toBool() ? g[5] : at::Tensor(), at::Tensor()};
  }
};

ForwardResult layer_forward_autograd(const at::Tensor& input, const at::Tensor& h0, const at::Tensor& c0,
                                     const at::Tensor& weight_ih, const at::Tensor& weight_hh,
                                     const OptTensor& bias, const OptTensor& lengths) {
  variable_list r = LayerForward::apply(input, h0, c0, weight_ih, weight_hh, bias, lengths);
  return {r[0], r[1], r[2], r[3], r[4]};
}

BackwardResult layer_backward_autograd(const OptTensor& grad_output, const OptTensor& grad_h_n,
                                       const OptTensor& grad_c_n, const at::Tensor& input, const at::Tensor& h0,
                                       const at::Tensor& weight_ih, const at::Tensor& weight_hh,
                                       const at::Tensor& output, const at::Tensor& cells,
                                       const at::Tensor& activations, const OptTensor& lengths) {
  variable_list r = LayerBackward::apply(grad_output, grad_h_n, grad_c_n, input, h0, weight_ih, weight_hh, output,
                                         cells, activations, lengths);
  return {r[0], r[1], r[2], r[3], r[4], r[5]};
}

}  // namespace
}  // namespace lltm

TORCH_LIBRARY_IMPL(lltm, Autograd, m) {
  m.impl("layer_forward", &lltm::layer_forward_autograd);
  m.impl("layer_backward", &lltm::layer_backward_autograd);
}
