// Shared declarations of the op library. For each cell of cells.h (listed in cell_list.h), two ops run a
// whole sequence, forward and backward (a single step is a sequence with In = 1):
//   lltm::<prefix>layer_forward, lltm::<prefix>layer_backward   (prefix: the cell's kOpPrefix)
// Their schemas are made from the cell's trait (Schema<Cell> below), and every kernel of them is a boxed
// function over the cell-independent form of the arguments (LayerInputs, LayerOutputs, LayerGradInputs,
// LayerGrads), so no cell has a binding of its own.
//
// Sizes: In time steps, B batch rows, I input features, H hidden units, G = Cell::kGates; tensors are
// time-major. The input projection of every step and the weight gradients are a few large GEMMs
// (lltm.cpp, shared by every device); what runs step by step is a device's `Recurrence` (lltm_cpu.cpp,
// lltm_cuda.cu), one per cell.
//
// Variable lengths: `lengths` (B,) int64 on the CPU, each in [0, T], or undefined for "all T". Row b
// stops at step lengths[b] (cells.h gives the rule); h_n and c_n hold its state after its own last step.
//
// Zoneout: `zoneout` (In, B, S H) of the input's dtype and device, S the cell's states (h, then c), or undefined
// for none: after each running step, state = lerp(new, previous, factor) (cells.h). The factors get no gradient.
// Under zoneout `cells` holds the c state after zoneout, and the backward recomputes the cell's own c from the
// saved activations and c_{t-1} (so every cell with a c state passes c0 to its backward).
//
// Heads: `num_heads` NH >= 1 splits the recurrence into NH independent heads of DH = H / NH units, a
// block-diagonal recurrent matrix of which `weight_hh` (G H, DH) holds the blocks: row g H + a DH + j (gate g,
// unit a DH + j), column k (unit a DH + k of the step before). NH = 1 is torch.nn's (G H, H). Every recurrence
// gets the blocks: a path that has no kernel for heads runs the dense matrix they stand for (dense_heads). The
// weight gradient is the dense one's diagonal blocks either way.
//
// save=False (the forward under torch.no_grad or inference mode, for sampling and evaluation, as haste's
// `Training` flag): nothing is kept for a backward. `cells` and the activations that are not the `gates`
// buffer itself hold one step, (1, B, .), which every step overwrites (see step_stride), and the op returns
// them as empty (0,) tensors. Where autograd wants a backward all the same (an input requires grad in grad
// mode), the autograd kernel saves whatever `save` says: a program traced under no_grad still trains.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <optional>
#include <string>

#include "cell_list.h"

namespace lltm {

using Tensor = at::Tensor;
using OptTensor = std::optional<at::Tensor>;

// One layer's forward recurrence. Every defined tensor is contiguous and on the device of `gates`.
struct ForwardTensors {
  Tensor gates;        // (In, B, G H): the x-side pre-activations (all biases folded in but b_hn)
  Tensor bias_hn;      // (H,): the split gate's h-side bias, or undefined
  Tensor h0, c0;       // (B, H); c0 undefined for a cell without a c state
  Tensor weight_hh;    // (G H, H), or the heads' blocks (G H, H / num_heads) when num_heads > 1
  int64_t num_heads = 1;
  Tensor lengths;      // (B,) int64 (on the CPU; a CUDA recurrence moves it), or undefined
  Tensor zoneout;      // (In, B, S H), or undefined
  Tensor output;       // written (In, B, H): h_1..h_T, zero past a row's length
  Tensor activations;  // written (In or 1, B, kSaved H); the same tensor as `gates` when kSaved == G
  Tensor cells;        // written (In or 1, B, H): c_1..c_T; undefined without a c state
  Tensor h_n, c_n;     // written (B, H); c_n undefined without a c state
};

// One layer's backward recurrence.
struct BackwardTensors {
  Tensor grad_output, grad_h_n, grad_c_n;  // (In, B, H), (B, H), (B, H), or undefined for zeros
  Tensor activations, cells, output;       // as the forward wrote them
  Tensor h0, c0, weight_hh, lengths;       // as the forward had them (c0: cells with a c state)
  Tensor zoneout;                          // as the forward had it
  int64_t num_heads = 1;                   // as the forward's (weight_hh: its blocks when > 1)
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

// The dense (G H, H) recurrent matrix of the heads' blocks (G H, H / num_heads): zero off the diagonal blocks.
Tensor dense_heads(const Tensor& blocks, int64_t G, int64_t num_heads);

// The ops' arguments and results in one form for every cell; what a cell lacks (c0, bias_hh, ...) is
// undefined or absent.
struct LayerInputs {
  Tensor input, h0, c0, weight_ih, weight_hh;
  OptTensor bias_ih, bias_hh, lengths;
  bool save = true;  // keep what the backward needs (see save=False above)
  OptTensor zoneout;
  int64_t num_heads = 1;
};
struct LayerOutputs {
  Tensor output, h_n, c_n, cells, activations;
};
struct LayerGradInputs {
  OptTensor grad_output, grad_h_n, grad_c_n;
  Tensor input, h0, c0, weight_ih, weight_hh, output, cells, activations;
  OptTensor lengths, zoneout;
  int64_t num_heads = 1;
  bool input_grad = true;  // false: grad_input is not wanted, and comes back empty, (0,)
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

// A cell's two op schemas, from its trait (the ops' arguments in this order):
//   forward  (input, h0, [c0], weight_ih, weight_hh, biases, lengths, save=True, zoneout=None, num_heads=1)
//            -> (output, h_n, [c_n, cells], activations)
//   backward (grad_output, grad_h_n, [grad_c_n], input, h0, [c0], weight_ih, weight_hh, output, [cells],
//             activations, lengths, zoneout=None, num_heads=1, input_grad=True)
//            -> (grad_input, grad_h0, [grad_c0], grad_weight_ih, grad_weight_hh, grad_biases)
// input_grad=False: grad_input comes back empty, (0,), and its GEMM is left out (the autograd kernel passes
// whether the input requires grad: a first layer's input from data does not, aten's output_mask).
// [c0, c_n, cells, grad_c_n, grad_c0]: cells with a c state; biases: `bias` (kBiases = 1) or `bias_ih, bias_hh`.
template <typename Cell>
struct Schema {
  static std::string forward_name() { return std::string(Cell::kOpPrefix) + "layer_forward"; }
  static std::string backward_name() { return std::string(Cell::kOpPrefix) + "layer_backward"; }
  static const char* bias_name() { return Cell::kBiases == 1 ? "bias" : "bias_ih"; }
  static std::string forward() {
    const std::string c = Cell::kHasCell ? "Tensor c0, " : "";
    return forward_name() + "(Tensor input, Tensor h0, " + c + "Tensor weight_ih, Tensor weight_hh, " +
           biases_list("Tensor? ", "") +
           ", Tensor? lengths, bool save=True, Tensor? zoneout=None, int num_heads=1) -> (Tensor output, Tensor h_n, " +
           (Cell::kHasCell ? "Tensor c_n, Tensor cells, " : "") + "Tensor activations)";
  }
  static std::string backward() {
    return backward_name() + "(Tensor? grad_output, Tensor? grad_h_n, " + (Cell::kHasCell ? "Tensor? grad_c_n, " : "") +
           "Tensor input, Tensor h0, " + (Cell::kHasCell ? "Tensor c0, " : "") +
           "Tensor weight_ih, Tensor weight_hh, Tensor output, " + (Cell::kHasCell ? "Tensor cells, " : "") +
           "Tensor activations, Tensor? lengths, Tensor? zoneout=None, int num_heads=1, bool input_grad=True) -> "
           "(Tensor grad_input, "
           "Tensor grad_h0, " +
           (Cell::kHasCell ? "Tensor grad_c0, " : "") + "Tensor grad_weight_ih, Tensor grad_weight_hh, " +
           biases_list("Tensor ", "grad_") + ")";
  }

 private:
  static std::string biases_list(const std::string& type, const std::string& prefix) {
    return Cell::kBiases == 1 ? type + prefix + "bias" : type + prefix + "bias_ih, " + type + prefix + "bias_hh";
  }
};

// The fields of each of a cell's op argument lists and result lists, in Schema<Cell>'s order: visit(value, f)
// calls f on every field the cell has. Reading from and writing to a boxed stack both follow these orders.
template <typename Cell>
struct ForwardArgs {
  template <typename A, typename F>
  void operator()(A& a, F&& f) const {
    f(a.input), f(a.h0);
    if constexpr (Cell::kHasCell) f(a.c0);
    f(a.weight_ih), f(a.weight_hh), f(a.bias_ih);
    if constexpr (Cell::kBiases == 2) f(a.bias_hh);
    f(a.lengths), f(a.save), f(a.zoneout), f(a.num_heads);
  }
};

template <typename Cell>
struct ForwardResults {
  template <typename R, typename F>
  void operator()(R& r, F&& f) const {
    f(r.output), f(r.h_n);
    if constexpr (Cell::kHasCell) f(r.c_n), f(r.cells);
    f(r.activations);
  }
};

template <typename Cell>
struct BackwardArgs {
  template <typename A, typename F>
  void operator()(A& a, F&& f) const {
    f(a.grad_output), f(a.grad_h_n);
    if constexpr (Cell::kHasCell) f(a.grad_c_n);
    f(a.input), f(a.h0);
    if constexpr (Cell::kHasCell) f(a.c0);
    f(a.weight_ih), f(a.weight_hh), f(a.output);
    if constexpr (Cell::kHasCell) f(a.cells);
    f(a.activations), f(a.lengths), f(a.zoneout), f(a.num_heads), f(a.input_grad);
  }
};

template <typename Cell>
struct BackwardResults {
  template <typename G, typename F>
  void operator()(G& g, F&& f) const {
    f(g.input), f(g.h0);
    if constexpr (Cell::kHasCell) f(g.c0);
    f(g.weight_ih), f(g.weight_hh), f(g.bias_ih);
    if constexpr (Cell::kBiases == 2) f(g.bias_hh);
  }
};

inline void assign(Tensor& field, const c10::IValue& v) { field = v.toTensor(); }
inline void assign(OptTensor& field, const c10::IValue& v) { field = v.toOptional<Tensor>(); }
inline void assign(bool& field, const c10::IValue& v) { field = v.toBool(); }
inline void assign(int64_t& field, const c10::IValue& v) { field = v.toInt(); }

// Pushes the fields of `value` that `visit` names onto a boxed stack.
template <typename T, typename Visit>
void push(torch::jit::Stack& stack, const T& value, Visit visit) {
  visit(value, [&](const auto& field) { stack.emplace_back(field); });
}

// Takes the fields that `visit` names off the top of a boxed stack.
template <typename T, typename Visit>
T pop(torch::jit::Stack& stack, Visit visit) {
  T value;
  size_t n = 0;
  visit(value, [&](auto&) { ++n; });
  size_t i = stack.size() - n;
  visit(value, [&](auto& field) { assign(field, stack[i++]); });
  torch::jit::drop(stack, n);
  return value;
}

// Calls a cell's op through the dispatcher (below autograd, from the autograd kernels).
template <typename Cell>
LayerOutputs call_forward(const LayerInputs& a) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow(("lltm::" + Schema<Cell>::forward_name()).c_str(), "");
  torch::jit::Stack stack;
  push(stack, a, ForwardArgs<Cell>{});
  op.callBoxed(stack);
  return pop<LayerOutputs>(stack, ForwardResults<Cell>{});
}

template <typename Cell>
LayerGrads call_backward(const LayerGradInputs& a) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow(("lltm::" + Schema<Cell>::backward_name()).c_str(), "");
  torch::jit::Stack stack;
  push(stack, a, BackwardArgs<Cell>{});
  op.callBoxed(stack);
  return pop<LayerGrads>(stack, BackwardResults<Cell>{});
}

// A kernel of a cell's forward (backward) op, from a function of the cell-independent arguments.
template <typename Cell, LayerOutputs (*F)(const LayerInputs&)>
void boxed_forward(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  push(*stack, F(pop<LayerInputs>(*stack, ForwardArgs<Cell>{})), ForwardResults<Cell>{});
}

template <typename Cell, LayerGrads (*F)(const LayerGradInputs&)>
void boxed_backward(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  push(*stack, F(pop<LayerGradInputs>(*stack, BackwardArgs<Cell>{})), BackwardResults<Cell>{});
}

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
  m.impl(Schema<Cell>::forward_name().c_str(),
         torch::CppFunction::makeFromBoxedFunction<&boxed_forward<Cell, &device_forward<Cell, R>>>());
  m.impl(Schema<Cell>::backward_name().c_str(),
         torch::CppFunction::makeFromBoxedFunction<&boxed_backward<Cell, &device_backward<Cell, R>>>());
}

}  // namespace lltm
