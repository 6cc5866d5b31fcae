// Shared declarations of the op library. For each cell of cells.h, two ops run a whole sequence, forward
// and backward (a single step is a sequence with In = 1):
//   lltm  layer_forward, layer_backward            (one bias, as PyTorch's C++/CUDA extension tutorial)
//   lstm  lstm_layer_forward, lstm_layer_backward  (bias_ih and bias_hh, as torch.nn.LSTM)
//   gru   gru_layer_forward, gru_layer_backward    (bias_ih and bias_hh, as torch.nn.GRU; no c state)
// Their schemas are in lltm.cpp; `Ops<Cell>` below binds each to the cell-independent form of the
// arguments (LayerInputs, LayerOutputs, LayerGradInputs, LayerGrads), which the implementation takes.
//
// Sizes: In time steps, B batch rows, I input features, H hidden units, G = Cell::kGates; tensors are
// time-major. The input projection of every step and the weight gradients are a few large GEMMs
// (lltm.cpp, shared by every device); what runs step by step is a device's `Recurrence` (lltm_cpu.cpp,
// lltm_cuda.cu), one per cell.
//
// Variable lengths: `lengths` (B,) int64 on the CPU, each in [0, T], or undefined for "all T". Row b
// stops at step lengths[b] (cells.h gives the rule); h_n and c_n hold its state after its own last step.
//
// save=False (the forward under torch.no_grad or inference mode, for sampling and evaluation, as haste's
// `Training` flag): nothing is kept for a backward. `cells` and the activations that are not the `gates`
// buffer itself hold one step, (1, B, .), which every step overwrites (see step_stride), and the op returns
// them as empty (0,) tensors. Where autograd wants a backward all the same (an input requires grad in grad
// mode), the autograd kernel saves whatever `save` says: a program traced under no_grad still trains.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "cells.h"

namespace lltm {

using Tensor = at::Tensor;
using OptTensor = std::optional<at::Tensor>;

// One layer's forward recurrence. Every defined tensor is contiguous and on the device of `gates`.
struct ForwardTensors {
  Tensor gates;        // (In, B, G H): the x-side pre-activations (all biases folded in but b_hn)
  Tensor bias_hn;      // (H,): the split gate's h-side bias, or undefined
  Tensor h0, c0;       // (B, H); c0 undefined for a cell without a c state
  Tensor weight_hh;    // (G H, H)
  Tensor lengths;      // (B,) int64 (on the CPU; a CUDA recurrence moves it), or undefined
  Tensor output;       // written (In, B, H): h_1..h_T, zero past a row's length
  Tensor activations;  // written (In or 1, B, kSaved H); the same tensor as `gates` when kSaved == G
  Tensor cells;        // written (In or 1, B, H): c_1..c_T; undefined without a c state
  Tensor h_n, c_n;     // written (B, H); c_n undefined without a c state
};

// One layer's backward recurrence.
struct BackwardTensors {
  Tensor grad_output, grad_h_n, grad_c_n;  // (In, B, H), (B, H), (B, H), or undefined for zeros
  Tensor activations, cells, output;       // as the forward wrote them
  Tensor h0, c0, weight_hh, lengths;       // as the forward had them
  Tensor grad_gates;                       // written (In, B, kGradBlocks H): zero at finished rows' steps
  Tensor grad_h0, grad_c0;                 // written (B, H); grad_c0 undefined without a c state
  // Optional (a CPU loop writes them where defined): the weight gradients' left operands transposed,
  // h_{t-1} as (H, In B) and the input (contiguous, (In, B, I)) as (I, In B), zero at finished rows' steps.
  Tensor input, h_prev_t, input_t;
};

// Elements between two steps' slots of a forward's `activations` or `cells`: 0 where the tensor holds a
// single step that every step overwrites (save=False). A step reads its c_{t-1} slot before it writes c_t.
inline int64_t step_stride(const Tensor& t) { return t.defined() && t.size(0) > 1 ? t.stride(0) : 0; }

struct Recurrence {
  void (*forward)(const ForwardTensors&);
  void (*backward)(const BackwardTensors&);
};

// The ops' arguments and results in one form for every cell; what a cell lacks (c0, bias_hh, ...) is
// undefined or absent.
struct LayerInputs {
  Tensor input, h0, c0, weight_ih, weight_hh;
  OptTensor bias_ih, bias_hh, lengths;
  bool save = true;  // keep what the backward needs (see save=False above)
};
struct LayerOutputs {
  Tensor output, h_n, c_n, cells, activations;
};
struct LayerGradInputs {
  OptTensor grad_output, grad_h_n, grad_c_n;
  Tensor input, h0, c0, weight_ih, weight_hh, output, cells, activations;
  OptTensor lengths;
};
struct LayerGrads {
  Tensor input, h0, c0, weight_ih, weight_hh, bias_ih, bias_hh;
};

// Checks the arguments (the authority for the compiled ops), then runs the input projection, the
// device's recurrence and the weight gradients. Explicitly instantiated for the cells in lltm.cpp.
template <typename Cell>
LayerOutputs layer_forward(const LayerInputs& in, const Recurrence& r);
template <typename Cell>
LayerGrads layer_backward(const LayerGradInputs& in, const Recurrence& r);

template <typename Cell>
struct Ops;  // the schema binding of a cell's two ops

using In = const Tensor&;
using Opt = const OptTensor&;
using Forward5 = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>;

// An op of this library, to call through the dispatcher (below autograd, from the autograd kernels).
template <typename Signature>
c10::TypedOperatorHandle<Signature> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

template <>
struct Ops<LLTMCell> {
  static constexpr const char* kForward = "layer_forward";
  static constexpr const char* kBackward = "layer_backward";
  static constexpr const char* kBias = "bias";
  static constexpr bool kBiasHH = false;
  using Backward = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;
  template <LayerOutputs (*F)(const LayerInputs&)>
  static Forward5 forward(In input, In h0, In c0, In w_ih, In w_hh, Opt bias, Opt lengths, bool save) {
    const LayerOutputs r = F({input, h0, c0, w_ih, w_hh, bias, std::nullopt, lengths, save});
    return {r.output, r.h_n, r.c_n, r.cells, r.activations};
  }
  template <LayerGrads (*F)(const LayerGradInputs&)>
  static Backward backward(Opt grad_output, Opt grad_h_n, Opt grad_c_n, In input, In h0, In w_ih, In w_hh, In output, In cells,
                           In activations, Opt lengths) {
    const LayerGrads g =
        F({grad_output, grad_h_n, grad_c_n, input, h0, Tensor(), w_ih, w_hh, output, cells, activations, lengths});
    return {g.input, g.h0, g.c0, g.weight_ih, g.weight_hh, g.bias_ih};
  }
  static LayerOutputs call_forward(const LayerInputs& a) {
    static const auto op = find_op<Forward5(In, In, In, In, In, Opt, Opt, bool)>("lltm::layer_forward");
    auto [output, h_n, c_n, cells, act] =
        op.call(a.input, a.h0, a.c0, a.weight_ih, a.weight_hh, a.bias_ih, a.lengths, a.save);
    return {output, h_n, c_n, cells, act};
  }
  static LayerGrads call_backward(const LayerGradInputs& a) {
    static const auto op = find_op<Backward(Opt, Opt, Opt, In, In, In, In, In, In, In, Opt)>("lltm::layer_backward");
    auto [gx, gh0, gc0, gwih, gwhh, gb] = op.call(a.grad_output, a.grad_h_n, a.grad_c_n, a.input, a.h0, a.weight_ih, a.weight_hh,
        a.output, a.cells, a.activations, a.lengths);
    return {gx, gh0, gc0, gwih, gwhh, gb, Tensor()};
  }
};

template <>
struct Ops<LSTMCell> {
  static constexpr const char* kForward = "lstm_layer_forward";
  static constexpr const char* kBackward = "lstm_layer_backward";
  static constexpr const char* kBias = "bias_ih";
  static constexpr bool kBiasHH = true;
  using Backward = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;
  template <LayerOutputs (*F)(const LayerInputs&)>
  static Forward5 forward(In input, In h0, In c0, In w_ih, In w_hh, Opt bias_ih, Opt bias_hh, Opt lengths, bool save) {
    const LayerOutputs r = F({input, h0, c0, w_ih, w_hh, bias_ih, bias_hh, lengths, save});
    return {r.output, r.h_n, r.c_n, r.cells, r.activations};
  }
  template <LayerGrads (*F)(const LayerGradInputs&)>
  static Backward backward(Opt grad_output, Opt grad_h_n, Opt grad_c_n, In input, In h0, In c0, In w_ih, In w_hh, In output,
                           In cells, In activations, Opt lengths) {
    const LayerGrads g =
        F({grad_output, grad_h_n, grad_c_n, input, h0, c0, w_ih, w_hh, output, cells, activations, lengths});
    return {g.input, g.h0, g.c0, g.weight_ih, g.weight_hh, g.bias_ih, g.bias_hh};
  }
  static LayerOutputs call_forward(const LayerInputs& a) {
    static const auto op = find_op<Forward5(In, In, In, In, In, Opt, Opt, Opt, bool)>("lltm::lstm_layer_forward");
    auto [output, h_n, c_n, cells, act] =
        op.call(a.input, a.h0, a.c0, a.weight_ih, a.weight_hh, a.bias_ih, a.bias_hh, a.lengths, a.save);
    return {output, h_n, c_n, cells, act};
  }
  static LayerGrads call_backward(const LayerGradInputs& a) {
    static const auto op = find_op<Backward(Opt, Opt, Opt, In, In, In, In, In, In, In, In, Opt)>("lltm::lstm_layer_backward");
    auto [gx, gh0, gc0, gwih, gwhh, gbih, gbhh] = op.call(a.grad_output, a.grad_h_n, a.grad_c_n, a.input, a.h0, a.c0, a.weight_ih,
        a.weight_hh, a.output, a.cells, a.activations, a.lengths);
    return {gx, gh0, gc0, gwih, gwhh, gbih, gbhh};
  }
};

template <>
struct Ops<GRUCell> {
  static constexpr const char* kForward = "gru_layer_forward";
  static constexpr const char* kBackward = "gru_layer_backward";
  static constexpr const char* kBias = "bias_ih";
  static constexpr bool kBiasHH = true;
  using Forward = std::tuple<Tensor, Tensor, Tensor>;
  using Backward = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;
  template <LayerOutputs (*F)(const LayerInputs&)>
  static Forward forward(In input, In h0, In w_ih, In w_hh, Opt bias_ih, Opt bias_hh, Opt lengths, bool save) {
    const LayerOutputs r = F({input, h0, Tensor(), w_ih, w_hh, bias_ih, bias_hh, lengths, save});
    return {r.output, r.h_n, r.activations};
  }
  template <LayerGrads (*F)(const LayerGradInputs&)>
  static Backward backward(Opt grad_output, Opt grad_h_n, In input, In h0, In w_ih, In w_hh, In output, In activations,
                           Opt lengths) {
    const LayerGrads g = F({grad_output, grad_h_n, std::nullopt, input, h0, Tensor(), w_ih, w_hh, output, Tensor(),
                            activations, lengths});
    return {g.input, g.h0, g.weight_ih, g.weight_hh, g.bias_ih, g.bias_hh};
  }
  static LayerOutputs call_forward(const LayerInputs& a) {
    static const auto op = find_op<Forward(In, In, In, In, Opt, Opt, Opt, bool)>("lltm::gru_layer_forward");
    auto [output, h_n, act] = op.call(a.input, a.h0, a.weight_ih, a.weight_hh, a.bias_ih, a.bias_hh, a.lengths, a.save);
    return {output, h_n, Tensor(), Tensor(), act};
  }
  static LayerGrads call_backward(const LayerGradInputs& a) {
    static const auto op = find_op<Backward(Opt, Opt, In, In, In, In, In, In, Opt)>("lltm::gru_layer_backward");
    auto [gx, gh0, gwih, gwhh, gbih, gbhh] = op.call(a.grad_output, a.grad_h_n, a.input, a.h0, a.weight_ih, a.weight_hh, a.output,
        a.activations, a.lengths);
    return {gx, gh0, Tensor(), gwih, gwhh, gbih, gbhh};
  }
};

template <typename Cell, const Recurrence& R>
LayerOutputs device_forward(const LayerInputs& in) {
  return layer_forward<Cell>(in, R);
}

template <typename Cell, const Recurrence& R>
LayerGrads device_backward(const LayerGradInputs& in) {
  return layer_backward<Cell>(in, R);
}

// Registers a cell's two ops for one dispatch key (inside TORCH_LIBRARY_IMPL) with a device's recurrence.
template <typename Cell, const Recurrence& R>
void register_kernels(torch::Library& m) {
  m.impl(Ops<Cell>::kForward, &Ops<Cell>::template forward<&device_forward<Cell, R>>);
  m.impl(Ops<Cell>::kBackward, &Ops<Cell>::template backward<&device_backward<Cell, R>>);
}

}  // namespace lltm
