// Op schemas, argument checks (the authority for the compiled ops), and the device-independent part of
// every cell's two ops: the input projection before the time loop and the weight gradients after it, as
// large GEMMs. The time loop itself is a device's Recurrence (lltm_cpu.cpp, lltm_cuda.cu).
#include "lltm.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

namespace lltm {
namespace {

struct Sizes {
  int64_t T, B, I, H;
};

// Large float32 GEMMs on the CPU go through oneDNN's matmul (ATen's mkldnn::_linear_pointwise, the op that Inductor's
// CPU code calls), which runs AVX-512 kernels where MKL's sgemm takes its AVX2 path on AMD CPUs: 1.7x-1.9x on cpu-M's
// projection and gradient GEMMs on a Zen 5 (benchmarks/log/2026-12-01_every-cell.md). MKL (at::mm) for the rest, for
// small products (the op's set-up) and where a torch build lacks the op.
const c10::OperatorHandle* onednn_linear_op() {
  static const std::optional<c10::OperatorHandle> op =
      c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""});
  return op.has_value() ? &*op : nullptr;
}

// A matrix stored densely, by rows or by columns: oneDNN falls back to a reference kernel, hundreds of
// times slower, for other strides (a narrowed block of the GRU's gate gradients).
bool dense(const Tensor& t) { return t.is_contiguous() || t.t().is_contiguous(); }

// Whether a (M, K) times an operand with n columns goes to oneDNN (that operand dense too: use_onednn).
bool onednn_fits(const Tensor& a, int64_t n) {
  return a.is_cpu() && a.scalar_type() == at::kFloat && a.size(0) * a.size(1) * n >= (int64_t{1} << 21) &&
         dense(a) && onednn_linear_op() != nullptr;
}

bool use_onednn(const Tensor& a, const Tensor& b) { return onednn_fits(a, b.size(0)) && dense(b); }

// x w^T (+ bias): x (M, K), w (N, K), either may be a transposed view.
Tensor onednn_or_mkl_linear(const Tensor& x, const Tensor& w, const OptTensor& bias = std::nullopt) {
  if (!use_onednn(x, w)) return bias.has_value() ? at::addmm(*bias, x, w.t()) : at::mm(x, w.t());
  // oneDNN reads a bias by its storage: a strided or expanded one is made contiguous (a no-op for the usual one)
  const c10::IValue b = bias.has_value() ? c10::IValue(bias->contiguous()) : c10::IValue();
  torch::jit::Stack stack{x, w, b, c10::IValue(std::string("none")), c10::IValue(c10::List<std::optional<at::Scalar>>()),
                          c10::IValue(std::string(""))};
  onednn_linear_op()->callBoxed(&stack);
  return stack[0].toTensor();
}

// dg^T m (a weight gradient: dg (M, N), m (M, K) -> (N, K)), as (m^T dg)^T: oneDNN takes its right operand
// in any layout, but copies a left one (m^T) that is not stored by rows, as a slow transposing copy; the
// CPU loop writes m^T by rows for it (BackwardTensors::h_prev_t, input_t).
Tensor weight_grad(const Tensor& dg, const Tensor& m) {
  if (!use_onednn(m.t(), dg.t())) return dg.t().mm(m);
  return onednn_or_mkl_linear(m.t(), dg.t()).t().contiguous();
}

// Messages are assembled as strings: streaming integers into the error message crashed (SIGSEGV in
// std::ostream::_M_insert<long>) in a build with the H200 machine's g++ 13.3 and torch 2.11.
std::string shape_str(at::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

void check_like(const std::string& op, const char* name, const Tensor& t, const Tensor& ref) {
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(),
              op + ": " + name + " has dtype " + c10::toString(t.scalar_type()) + " but input has dtype " +
                  c10::toString(ref.scalar_type()) + "; all tensors must share one dtype");
  TORCH_CHECK(t.device() == ref.device(), op + ": " + name + " is on " + t.device().str() + " but input is on " +
                                              ref.device().str() + "; all tensors must be on one device");
}

void check_shape(const std::string& op, const char* name, const Tensor& t, at::IntArrayRef expected,
                 const std::string& layout) {
  TORCH_CHECK(t.sizes() == expected, op + ": expected " + name + " of shape " + layout + " = " + shape_str(expected) +
                                         ", got " + shape_str(t.sizes()));
}

template <typename Cell>
std::string op_name(bool backward) {
  return "lltm." + (backward ? Schema<Cell>::backward_name() : Schema<Cell>::forward_name());
}

// The inputs every op takes (the forward's, or the backward's copies of them): dtype, shapes, devices.
// weight_hh: (G H, H), or with num_heads > 1 the heads' blocks (G H, H / num_heads) (lltm.h).
template <typename Cell>
Sizes check_inputs(const std::string& op, const Tensor& input, const Tensor& h0, const Tensor& weight_ih,
                   const Tensor& weight_hh, int64_t num_heads) {
  constexpr int G = Cell::kGates;
  const std::string gates = std::to_string(G) + " * hidden_size";
  // bounds num_heads by the rows' hidden size before H = columns * num_heads is formed; with no columns H is 0
  // whatever num_heads is (0 % n == 0: accepted, as by the reference)
  TORCH_CHECK(num_heads >= 1 && (weight_hh.dim() != 2 || weight_hh.size(1) == 0 ||
                                 num_heads <= std::max<int64_t>(weight_hh.size(0) / G, 1)),
              op + ": num_heads must be at least 1 and at most hidden_size, got " + std::to_string(num_heads));
  const std::string columns = num_heads == 1 ? "hidden_size" : "hidden_size / " + std::to_string(num_heads);
  const auto dtype = input.scalar_type();
  TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kFloat || dtype == at::kDouble,
              op + ": expected a floating-point input (float16, bfloat16, float32 or float64), got " +
                  c10::toString(input.scalar_type()));
  TORCH_CHECK(input.dim() == 3, op + ": expected input of shape (T, B, input_size), got " + shape_str(input.sizes()));
  TORCH_CHECK(weight_hh.dim() == 2 && weight_hh.size(0) % G == 0,
              op + ": expected weight_hh of shape (" + gates + ", " + columns + "), got " + shape_str(weight_hh.sizes()));
  const Sizes s{input.size(0), input.size(1), input.size(2), weight_hh.size(1) * num_heads};
  TORCH_CHECK(s.T >= 1, op + ": expected a sequence of length T >= 1, got T = 0");
  check_shape(op, "weight_hh", weight_hh, {G * s.H, s.H / num_heads}, "(" + gates + ", " + columns + ")");
  check_shape(op, "weight_ih", weight_ih, {G * s.H, s.I}, "(" + gates + ", input_size)");
  check_shape(op, "h0", h0, {s.B, s.H}, "(B, hidden_size)");
  check_like(op, "weight_ih", weight_ih, input);
  check_like(op, "weight_hh", weight_hh, input);
  check_like(op, "h0", h0, input);
  return s;
}

// The layout of a cell's c state: (B, hidden_size), or the sLSTM's (B, 3 * hidden_size) of [c | n | m].
template <typename Cell>
std::string cell_layout() {
  return Cell::kCellBlocks == 1 ? "(B, hidden_size)" : "(B, " + std::to_string(Cell::kCellBlocks) + " * hidden_size)";
}

template <typename Cell>
void check_c0(const std::string& op, const Tensor& c0, const Sizes& s, const Tensor& input) {
  check_shape(op, "c0", c0, {s.B, Cell::kCellBlocks * s.H}, cell_layout<Cell>());
  check_like(op, "c0", c0, input);
}

void check_bias(const std::string& op, const char* name, const OptTensor& bias, int64_t rows, int G,
                const Tensor& input) {
  if (!bias.has_value()) return;
  check_shape(op, name, *bias, {rows}, "(" + std::to_string(G) + " * hidden_size)");
  check_like(op, name, *bias, input);
}

// Undefined when absent; otherwise checked: int64 (B,) on the CPU, every value in [0, T].
Tensor check_lengths(const std::string& op, const OptTensor& lengths, const Sizes& s) {
  if (!lengths.has_value()) return Tensor();
  const Tensor& l = *lengths;
  TORCH_CHECK(l.scalar_type() == at::kLong && l.device().is_cpu(),
              op + ": expected lengths as an int64 tensor on the CPU, got " + c10::toString(l.scalar_type()) +
                  " on " + l.device().str());
  check_shape(op, "lengths", l, {s.B}, "(B,)");
  const Tensor c = l.contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  for (int64_t b = 0; b < s.B; ++b) {
    TORCH_CHECK(p[b] >= 0 && p[b] <= s.T, op + ": lengths[" + std::to_string(b) + "] = " + std::to_string(p[b]) +
                                              " is outside [0, T = " + std::to_string(s.T) + "]");
  }
  return c;
}

// Undefined when absent; otherwise (T, B, S H) of the input's dtype and device, S the cell's states, made
// contiguous (an expanded constant of evaluation's expectation is materialised here).
template <typename Cell>
Tensor check_zoneout(const std::string& op, const OptTensor& zoneout, const Sizes& s, const Tensor& input) {
  if (!zoneout.has_value()) return Tensor();
  TORCH_CHECK(Cell::kZoneout, op + ": the " + Cell::kName + " cell takes no zoneout (its states are not "
                              "kept in part); pass zoneout=None");
  constexpr int S = Cell::kHasCell ? 2 : 1;
  check_shape(op, "zoneout", *zoneout, {s.T, s.B, S * s.H},
              std::string("(T, B, ") + (S == 2 ? "2 * " : "") + "hidden_size)");
  check_like(op, "zoneout", *zoneout, input);
  return zoneout->contiguous();
}

// A saved tensor of the forward, or an incoming gradient: the expected shape, dtype and device.
Tensor checked(const std::string& op, const char* name, const Tensor& t, at::IntArrayRef expected, const Tensor& ref) {
  check_shape(op, name, t, expected, "(as the forward made it)");
  check_like(op, name, t, ref);
  return t.contiguous();  // expanded (stride 0) incoming gradients are materialised here
}

// A forward with save=False returns its saved tensors empty: say so, rather than only their shape.
void check_saved(const std::string& op, const Tensor& activations, const Tensor& cells, bool has_cell) {
  const bool empty = (activations.defined() && activations.dim() == 1 && activations.numel() == 0) ||
                     (has_cell && cells.defined() && cells.dim() == 1 && cells.numel() == 0);
  TORCH_CHECK(!empty, op + ": the saved tensors are empty: they come from a forward run with save=False, which "
                           "keeps nothing for a backward; run the forward with save=True");
}

Tensor optional_grad(const std::string& op, const char* name, const OptTensor& t, at::IntArrayRef expected,
                     const Tensor& ref) {
  return t.has_value() && t->defined() ? checked(op, name, *t, expected, ref) : Tensor();
}

// The heads' blocks (G H, DH) of a dense (G H, H) matrix: its diagonal blocks (a weight gradient's).
Tensor diagonal_blocks(const Tensor& dense, int64_t G, int64_t num_heads) {
  const int64_t H = dense.size(1), DH = H / num_heads;
  return dense.reshape({G, num_heads, DH, num_heads, DH}).diagonal(0, 1, 3).permute({0, 3, 1, 2}).reshape({G * H, DH});
}

// The bias of the input projection: b_ih, plus b_hh where its sum with b_ih is plain (every gate but a
// split one, whose h-side bias b_hn goes to the recurrence).
template <typename Cell>
OptTensor projection_bias(const OptTensor& bias_ih, const OptTensor& bias_hh, int64_t H) {
  if (!bias_hh.has_value()) return bias_ih;
  Tensor folded = bias_hh->narrow(0, 0, (Cell::kGates - Cell::kSplit) * H);
  if (Cell::kSplit) folded = at::cat({folded, at::zeros({H}, bias_hh->options())});
  return bias_ih.has_value() ? *bias_ih + folded : folded;
}

}  // namespace

Tensor dense_heads(const Tensor& blocks, int64_t G, int64_t num_heads) {
  const int64_t DH = blocks.size(1), H = DH * num_heads;
  Tensor dense = at::zeros({G, num_heads, DH, num_heads, DH}, blocks.options());
  dense.diagonal(0, 1, 3).copy_(blocks.view({G, num_heads, DH, DH}).permute({0, 2, 3, 1}));
  return dense.view({G * H, H});
}

template <typename Cell>
LayerOutputs layer_forward(const LayerInputs& a, const Recurrence& r) {
  constexpr int G = Cell::kGates;
  const std::string op = op_name<Cell>(false);
  const Sizes s = check_inputs<Cell>(op, a.input, a.h0, a.weight_ih, a.weight_hh, a.num_heads);
  if (Cell::kHasCell) check_c0<Cell>(op, a.c0, s, a.input);
  check_bias(op, Schema<Cell>::bias_name(), a.bias_ih, G * s.H, G, a.input);
  check_bias(op, "bias_hh", a.bias_hh, G * s.H, G, a.input);
  const Tensor lens = check_lengths(op, a.lengths, s);
  const Tensor zoneout = check_zoneout<Cell>(op, a.zoneout, s, a.input);
  const auto opts = a.input.options();
  // One GEMM projects the input of every time step; the recurrence adds h_{t-1} W_hh^T step by step.
  const Tensor x2d = a.input.reshape({s.T * s.B, s.I});
  const OptTensor bias = projection_bias<Cell>(a.bias_ih, a.bias_hh, s.H);
  Tensor gates = onednn_or_mkl_linear(x2d, a.weight_ih, bias);
  gates = gates.view({s.T, s.B, G * s.H});
  ForwardTensors f;
  f.gates = gates;
  if (Cell::kSplit && a.bias_hh.has_value()) f.bias_hn = a.bias_hh->narrow(0, (G - 1) * s.H, s.H).contiguous();
  f.h0 = a.h0.contiguous();
  f.weight_hh = a.weight_hh.contiguous();
  f.num_heads = a.num_heads;
  f.lengths = lens;
  f.zoneout = zoneout;
  f.output = at::empty({s.T, s.B, s.H}, opts);
  const int64_t kept = a.save ? s.T : 1;  // steps of `cells` and separate activations (lltm.h: save=False)
  f.activations = Cell::kSaved == G ? gates : at::empty({kept, s.B, Cell::kSaved * s.H}, opts);
  f.h_n = at::empty({s.B, s.H}, opts);
  if constexpr (Cell::kHasCell) {
    f.c0 = a.c0.contiguous();
    f.cells = at::empty({kept, s.B, Cell::kCellBlocks * s.H}, opts);
    f.c_n = at::empty({s.B, Cell::kCellBlocks * s.H}, opts);
  }
  if (s.B > 0 && s.H > 0) r.forward(f);
  if (!a.save) return {f.output, f.h_n, f.c_n, Cell::kHasCell ? at::empty({0}, opts) : Tensor(), at::empty({0}, opts)};
  return {f.output, f.h_n, f.c_n, f.cells, f.activations};
}

template <typename Cell>
LayerGrads layer_backward(const LayerGradInputs& a, const Recurrence& r) {
  constexpr int G = Cell::kGates, GB = Cell::kGradBlocks;
  const std::string op = op_name<Cell>(true);
  const Sizes s = check_inputs<Cell>(op, a.input, a.h0, a.weight_ih, a.weight_hh, a.num_heads);
  if (Cell::kHasCell) check_c0<Cell>(op, a.c0, s, a.input);
  const int64_t T = s.T, B = s.B, H = s.H, I = s.I;
  const auto opts = a.input.options();
  BackwardTensors b;
  b.lengths = check_lengths(op, a.lengths, s);
  b.zoneout = check_zoneout<Cell>(op, a.zoneout, s, a.input);
  b.grad_output = optional_grad(op, "grad_output", a.grad_output, {T, B, H}, a.input);
  b.grad_h_n = optional_grad(op, "grad_h_n", a.grad_h_n, {B, H}, a.input);
  b.output = checked(op, "output", a.output, {T, B, H}, a.input);
  check_saved(op, a.activations, a.cells, Cell::kHasCell);
  b.activations = checked(op, "activations", a.activations, {T, B, Cell::kSaved * H}, a.input);
  b.h0 = a.h0.contiguous();
  b.weight_hh = a.weight_hh.contiguous();
  b.num_heads = a.num_heads;
  b.grad_gates = at::empty({T, B, GB * H}, opts);
  b.grad_h0 = at::empty({B, H}, opts);
  if constexpr (Cell::kHasCell) {
    constexpr int C = Cell::kCellBlocks;
    b.grad_c_n = optional_grad(op, "grad_c_n", a.grad_c_n, {B, C * H}, a.input);
    b.cells = checked(op, "cells", a.cells, {T, B, C * H}, a.input);
    b.c0 = a.c0.contiguous();
    b.grad_c0 = at::empty({B, C * H}, opts);
  }
  // The weight gradients' left operands, transposed by the CPU loop for oneDNN (see weight_grad).
  const Tensor dg = b.grad_gates.view({T * B, GB * H});
  if (onednn_fits(dg.t(), H)) {
    b.input = a.input.contiguous();
    b.h_prev_t = at::empty({H, T * B}, opts);
    b.input_t = at::empty({I, T * B}, opts);
  }
  if (B > 0 && H > 0) {
    r.backward(b);
  } else {
    b.grad_h0.zero_();
    if (b.grad_c0.defined()) b.grad_c0.zero_();
  }
  // The weight gradients: a few large GEMMs over all T * B rows, after the sequential loop. The h side
  // is the first G blocks of the gate gradients; the x side is the same but for a split gate's block.
  const Tensor dgh = dg.narrow(1, 0, G * H);
  Tensor x2d = b.input_t.defined() ? b.input_t.t() : a.input.reshape({T * B, I});
  if (b.lengths.defined() && !b.input_t.defined()) {  // padding never reaches a gradient, even where not finite
    const Tensor padding = at::arange(T, b.lengths.options()).unsqueeze(1) >= b.lengths.unsqueeze(0);
    // (non_blocking: a blocking copy to the GPU would make the host wait for the recurrence queued before it)
    x2d = x2d.masked_fill(padding.reshape({T * B, 1}).to(x2d.device(), /*non_blocking=*/true), 0);
  }
  // A GEMV on CUDA for many rows: sum(0) over T * B rows allocates a staging buffer twice the size of dg.
  const auto column_sums = [&](const Tensor& m) {
    return m.is_cuda() && T * B > 4096 ? at::mv(m.t(), at::ones({T * B}, m.options())) : m.sum(0);
  };
  LayerGrads g;
  if (b.h_prev_t.defined()) {  // one GEMM over h_{t-1} of every step, on all of dg (dense; the GRU's split
    g.weight_hh = weight_grad(dg, b.h_prev_t.t()).narrow(0, 0, G * H);  // x-side block gives rows dropped)
  } else {
    Tensor grad_weight_hh = b.grad_gates[0].narrow(1, 0, G * H).t().mm(a.h0);
    if (T > 1) {
      grad_weight_hh.addmm_(b.grad_gates.slice(0, 1).reshape({(T - 1) * B, GB * H}).narrow(1, 0, G * H).t(),
                            b.output.slice(0, 0, T - 1).reshape({(T - 1) * B, H}));
    }
    g.weight_hh = grad_weight_hh;
  }
  // With heads, the dense gradient's diagonal blocks (its off-diagonal blocks are of weights that do not exist).
  if (a.num_heads > 1) g.weight_hh = diagonal_blocks(g.weight_hh, G, a.num_heads);
  g.h0 = b.grad_h0;
  g.c0 = b.grad_c0;
  if constexpr (Cell::kSplit) {
    // dgx = [the h-side blocks of the unsplit gates, the split gate's x-side block]
    const int64_t U = (G - 1) * H;
    const Tensor dgx_split = dg.narrow(1, G * H, H);
    if (onednn_fits(dg, I)) {
      // All of dg (dense) at once: against W_ih with zeros for the split gate's h-side block, and the weight
      // gradient's rows of that block dropped. A third more arithmetic at oneDNN's speed.
      if (a.input_grad) {
        const Tensor w = at::cat({a.weight_ih.narrow(0, 0, U), at::zeros({H, I}, opts), a.weight_ih.narrow(0, U, H)});
        g.input = onednn_or_mkl_linear(dg, w.t()).view({T, B, I});
      }
      const Tensor all = weight_grad(dg, x2d);
      g.weight_ih = at::cat({all.narrow(0, 0, U), all.narrow(0, G * H, H)});
    } else {
      if (a.input_grad) {
        g.input = dgh.narrow(1, 0, U).mm(a.weight_ih.narrow(0, 0, U));
        g.input.addmm_(dgx_split, a.weight_ih.narrow(0, U, H));
        g.input = g.input.view({T, B, I});
      }
      g.weight_ih = at::empty_like(a.weight_ih);
      Tensor unsplit = g.weight_ih.narrow(0, 0, U), split = g.weight_ih.narrow(0, U, H);
      at::mm_out(unsplit, dgh.narrow(1, 0, U).t(), x2d);
      at::mm_out(split, dgx_split.t(), x2d);
    }
    const Tensor sums = column_sums(dg);  // h-side blocks, then the split x side
    g.bias_hh = sums.narrow(0, 0, G * H);
    g.bias_ih = at::cat({sums.narrow(0, 0, U), sums.narrow(0, G * H, H)});
  } else {
    if (a.input_grad) g.input = onednn_or_mkl_linear(dgh, a.weight_ih.t()).view({T, B, I});
    g.weight_ih = weight_grad(dgh, x2d);
    g.bias_ih = column_sums(dgh);
    g.bias_hh = g.bias_ih.clone();  // the same gradient, but outputs of an op must not alias
  }
  if (!a.input_grad) g.input = at::empty({0}, opts);  // not wanted: its GEMM left out (lltm.h)
  return g;
}

#define LLTM_INSTANTIATE(CELL)                                                      \
  template LayerOutputs layer_forward<CELL>(const LayerInputs&, const Recurrence&); \
  template LayerGrads layer_backward<CELL>(const LayerGradInputs&, const Recurrence&);
LLTM_FOR_EACH_CELL(LLTM_INSTANTIATE)
#undef LLTM_INSTANTIATE

// The state an exported model (lltm_train/export.py) is given, checked and copied. AOTInductor's compiled code takes
// its inputs at the shapes and strides it was compiled for without checking them (unless AOTI_RUNTIME_CHECK_INPUTS
// is set), so a state of another shape would be read out of bounds; an op sees the tensor as given. Returning a
// copy (the state is small) keeps the op in the graph.
Tensor check_state(const Tensor& state, const Tensor& tokens, int64_t num_layers, int64_t hidden_size,
                   c10::string_view name) {
  TORCH_CHECK(tokens.dim() == 2, "the exported model's tokens: expected (T, B), got " + shape_str(tokens.sizes()));
  const std::vector<int64_t> expected{num_layers, tokens.size(1), hidden_size};
  TORCH_CHECK(state.sizes() == at::IntArrayRef(expected),
              "the exported model's state " + std::string(name) + ": expected shape (num_layers, B, hidden_size) = " +
                  shape_str(expected) + " (B from the tokens (T, B)), got " + shape_str(state.sizes()));
  return state.clone(at::MemoryFormat::Contiguous);
}

}  // namespace lltm

// Each cell's two schemas (lltm.h's Schema). save=False: the forward keeps nothing for a backward and returns
// `cells` and `activations` empty (lltm.h).
TORCH_LIBRARY(lltm, m) {
#define LLTM_DEFINE(CELL)                               \
  m.def(lltm::Schema<CELL>::forward().c_str());         \
  m.def(lltm::Schema<CELL>::backward().c_str());
  LLTM_FOR_EACH_CELL(LLTM_DEFINE)
#undef LLTM_DEFINE
  m.def("check_state(Tensor state, Tensor tokens, int num_layers, int hidden_size, str name) -> Tensor");
}

TORCH_LIBRARY_IMPL(lltm, CompositeExplicitAutograd, m) {
  m.impl("check_state", &lltm::check_state);
}
