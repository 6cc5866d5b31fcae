// Autograd of the compiled ops, in C++: nothing runs in Python between a forward op and its backward op
// (a Python autograd.Function costs tens of microseconds a call, as much as a small layer's kernels).
// Registered for the Autograd key, so every device and torch.compile's tracing go through it. One
// template serves every cell (cell_list.h); lltm.h's boxed binding maps it onto each cell's op schema.
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "lltm.h"

namespace lltm {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

OptTensor defined_or_none(const Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

// A Function's outputs must all be defined: the tensors a cell has, in a fixed order.
template <typename Cell>
variable_list pack(const LayerOutputs& r) {
  if constexpr (Cell::kHasCell) return {r.output, r.h_n, r.c_n, r.cells, r.activations};
  return {r.output, r.h_n, r.activations};
}

template <typename Cell>
LayerOutputs unpack_outputs(const variable_list& v) {
  if constexpr (Cell::kHasCell) return {v[0], v[1], v[2], v[3], v[4]};
  return {v[0], v[1], Tensor(), Tensor(), v[2]};
}

template <typename Cell>
variable_list pack(const LayerGrads& g) {
  variable_list v{g.input, g.h0};
  if (Cell::kHasCell) v.push_back(g.c0);
  v.insert(v.end(), {g.weight_ih, g.weight_hh, g.bias_ih});
  if (Cell::kBiases == 2) v.push_back(g.bias_hh);
  return v;
}

template <typename Cell>
LayerGrads unpack_grads(const variable_list& v) {
  size_t i = 0;
  LayerGrads g;
  g.input = v[i++];
  g.h0 = v[i++];
  if (Cell::kHasCell) g.c0 = v[i++];
  g.weight_ih = v[i++];
  g.weight_hh = v[i++];
  g.bias_ih = v[i++];
  if (Cell::kBiases == 2) g.bias_hh = v[i++];
  return g;
}

// The backward op under autograd: first derivatives only. Its outputs carry a node that refuses a second
// derivative, so create_graph=True works until someone differentiates the gradients themselves.
template <typename Cell>
struct LayerBackward : public torch::autograd::Function<LayerBackward<Cell>> {
  static variable_list forward(AutogradContext*, const OptTensor& grad_output, const OptTensor& grad_h_n,
                               const OptTensor& grad_c_n, const Tensor& input, const Tensor& h0, const OptTensor& c0,
                               const Tensor& weight_ih, const Tensor& weight_hh, const Tensor& output,
                               const OptTensor& cells, const Tensor& activations, const OptTensor& lengths,
                               const OptTensor& zoneout, int64_t num_heads, bool input_grad) {
    at::AutoDispatchBelowADInplaceOrView guard;
    const LayerGrads g = call_backward<Cell>({grad_output, grad_h_n, grad_c_n, input, h0, c0.value_or(Tensor()),
                                                   weight_ih, weight_hh, output, cells.value_or(Tensor()), activations,
                                                   lengths, zoneout, num_heads, input_grad});
    return pack<Cell>(g);
  }

  static variable_list backward(AutogradContext*, variable_list) {
    TORCH_CHECK_NOT_IMPLEMENTED(false,
                                "the cpp and cuda backends have no second derivative (double backward, "
                                "create_graph=True, Hessians); use backend='python' for those");
  }
};

template <typename Cell>
struct LayerForward : public torch::autograd::Function<LayerForward<Cell>> {
  static variable_list forward(AutogradContext* ctx, const Tensor& input, const Tensor& h0, const OptTensor& c0,
                               const Tensor& weight_ih, const Tensor& weight_hh, const OptTensor& bias_ih,
                               const OptTensor& bias_hh, const OptTensor& lengths, const OptTensor& zoneout,
                               int64_t num_heads) {
    at::AutoDispatchBelowADInplaceOrView guard;
    const LayerOutputs r = call_forward<Cell>(
        {input, h0, c0.value_or(Tensor()), weight_ih, weight_hh, bias_ih, bias_hh, lengths, true, zoneout, num_heads});
    // lengths too as a saved variable: an in-place change before the backward is then refused (as for any input)
    // instead of giving the gradients of other lengths
    ctx->save_for_backward({input, h0, Cell::kHasCell ? *c0 : Tensor(), weight_ih, weight_hh, r.output, r.cells,
                            r.activations, zoneout.value_or(Tensor()), lengths.value_or(Tensor())});
    ctx->saved_data["has_bias_ih"] = bias_ih.has_value();
    ctx->saved_data["has_bias_hh"] = bias_hh.has_value();
    ctx->saved_data["num_heads"] = num_heads;
    ctx->mark_non_differentiable(Cell::kHasCell ? variable_list{r.cells, r.activations} : variable_list{r.activations});
    ctx->set_materialize_grads(false);  // unused outputs get no gradient work (and no zero-filled buffers)
    return pack<Cell>(r);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const OptTensor lengths = defined_or_none(s[9]);
    const OptTensor grad_c_n = Cell::kHasCell ? defined_or_none(grads[2]) : std::nullopt;
    const LayerGrads g = unpack_grads<Cell>(
        LayerBackward<Cell>::apply(defined_or_none(grads[0]), defined_or_none(grads[1]), grad_c_n, s[0], s[1],
                                   defined_or_none(s[2]), s[3], s[4], s[5], defined_or_none(s[6]), s[7], lengths,
                                   defined_or_none(s[8]), ctx->saved_data["num_heads"].toInt(),
                                   ctx->needs_input_grad(0)));  // no grad_input GEMM for an input from data
    return {ctx->needs_input_grad(0) ? g.input : Tensor(),  // else the op's empty (0,) placeholder
            g.h0,
            g.c0,
            g.weight_ih,
            g.weight_hh,
            ctx->saved_data["has_bias_ih"].toBool() ? g.bias_ih : Tensor(),
            ctx->saved_data["has_bias_hh"].toBool() ? g.bias_hh : Tensor(),
            Tensor(),    // lengths
            Tensor(),    // zoneout: the factors get no gradient
            Tensor()};   // num_heads
  }
};

bool requires_grad(const Tensor& t) { return t.defined() && t.requires_grad(); }
bool requires_grad(const OptTensor& t) { return t.has_value() && requires_grad(*t); }

// Whether autograd will want a backward of this forward: grad mode, and an input that requires grad.
bool gradient_wanted(const LayerInputs& a) {
  return at::GradMode::is_enabled() &&
         (requires_grad(a.input) || requires_grad(a.h0) || requires_grad(a.c0) || requires_grad(a.weight_ih) ||
          requires_grad(a.weight_hh) || requires_grad(a.bias_ih) || requires_grad(a.bias_hh));
}

// save=False is the caller's word that no backward will follow. Where autograd wants one all the same (a
// program traced or exported under no_grad, then trained), the forward saves: the gradients stay right.
template <typename Cell>
LayerOutputs autograd_forward(const LayerInputs& a) {
  if (!a.save && !gradient_wanted(a)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return call_forward<Cell>(a);
  }
  return unpack_outputs<Cell>(LayerForward<Cell>::apply(a.input, a.h0, defined_or_none(a.c0), a.weight_ih,
                                                         a.weight_hh, a.bias_ih, a.bias_hh, a.lengths, a.zoneout,
                                                         a.num_heads));
}

template <typename Cell>
LayerGrads autograd_backward(const LayerGradInputs& a) {
  return unpack_grads<Cell>(LayerBackward<Cell>::apply(a.grad_output, a.grad_h_n, a.grad_c_n, a.input, a.h0,
                                                        defined_or_none(a.c0), a.weight_ih, a.weight_hh, a.output,
                                                        defined_or_none(a.cells), a.activations, a.lengths,
                                                        a.zoneout, a.num_heads, a.input_grad));
}

template <typename Cell>
void register_autograd(torch::Library& m) {
  m.impl(Schema<Cell>::forward_name().c_str(),
         torch::CppFunction::makeFromBoxedFunction<&boxed_forward<Cell, &autograd_forward<Cell>>>());
  m.impl(Schema<Cell>::backward_name().c_str(),
         torch::CppFunction::makeFromBoxedFunction<&boxed_backward<Cell, &autograd_backward<Cell>>>());
}

}  // namespace
}  // namespace lltm

TORCH_LIBRARY_IMPL(lltm, Autograd, m) {
#define LLTM_REGISTER(CELL) lltm::register_autograd<CELL>(m);
  LLTM_FOR_EACH_CELL(LLTM_REGISTER)
#undef LLTM_REGISTER
}
