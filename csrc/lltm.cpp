// Op schemas, argument checks, and the device-independent part of every op: the GEMMs and the time
// loop. The per-step pointwise work comes from the device files (lltm_cpu.cpp, lltm_cuda.cu).
#include "lltm.h"

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <Python.h>
#include <torch/library.h>

#include <string>

namespace lltm {

at::ScalarType accumulate_type(at::ScalarType t) { return at::toOpMathType(t); }

namespace {

struct Sizes {
  int64_t T, B, I, H;
};

// Messages are assembled as strings: streaming integers into the error message crashed (SIGSEGV in
// std::ostream::_M_insert<long>) in a build with the H200 machine's g++ 13.3 and torch 2.11.
std::string shape_str(at::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

void check_like(const char* op, const char* name, const at::Tensor& t, const at::Tensor& ref) {
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(),
              std::string(op) + ": " + name + " has dtype " + c10::toString(t.scalar_type()) +
                  " but input has dtype " + c10::toString(ref.scalar_type()) +
                  "; all tensors must share one dtype");
  TORCH_CHECK(t.device() == ref.device(), std::string(op) + ": " + name + " is on " + t.device().str() +
                                               " but input is on " + ref.device().str() +
                                               "; all tensors must be on one device");
}

void check_shape(const char* op, const char* name, const at::Tensor& t, at::IntArrayRef expected,
                 const char* layout) {
  TORCH_CHECK(t.sizes() == expected, std::string(op) + ": expected " + name + " of shape " + layout +
                                         " = " + shape_str(expected) + ", got " + shape_str(t.sizes()));
}

// Checks the forward arguments and returns the sizes. `sequence` selects input (T, B, I) over (B, I).
Sizes check_forward(const char* op, bool sequence, const at::Tensor& input, const at::Tensor& h,
                    const at::Tensor& c, const at::Tensor& weight_ih, const at::Tensor& weight_hh,
                    const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(at::isFloatingType(input.scalar_type()),
              std::string(op) + ": expected a floating-point input (float16, bfloat16, float32 or float64), got " +
                  c10::toString(input.scalar_type()));
  TORCH_CHECK(input.dim() == (sequence ? 3 : 2), std::string(op) + ": expected input of shape " +
                                                     (sequence ? "(T, B, input_size)" : "(B, input_size)") +
                                                     ", got " + shape_str(input.sizes()));
  TORCH_CHECK(weight_hh.dim() == 2 && weight_hh.size(0) % 3 == 0,
              std::string(op) + ": expected weight_hh of shape (3 * hidden_size, hidden_size), got " +
                  shape_str(weight_hh.sizes()));
  Sizes s;
  s.T = sequence ? input.size(0) : 1;
  s.B = input.size(sequence ? 1 : 0);
  s.I = input.size(sequence ? 2 : 1);
  s.H = weight_hh.size(1);
  TORCH_CHECK(s.T >= 1, std::string(op) + ": expected a sequence of length T >= 1, got T = 0");
  check_shape(op, "weight_hh", weight_hh, {3 * s.H, s.H}, "(3 * hidden_size, hidden_size)");
  check_shape(op, "weight_ih", weight_ih, {3 * s.H, s.I}, "(3 * hidden_size, input_size)");
  check_shape(op, sequence ? "h0" : "h", h, {s.B, s.H}, "(B, hidden_size)");
  check_shape(op, sequence ? "c0" : "c", c, {s.B, s.H}, "(B, hidden_size)");
  check_like(op, "weight_ih", weight_ih, input);
  check_like(op, "weight_hh", weight_hh, input);
  check_like(op, sequence ? "h0" : "h", h, input);
  check_like(op, sequence ? "c0" : "c", c, input);
  if (bias.has_value()) {
    check_shape(op, "bias", *bias, {3 * s.H}, "(3 * hidden_size)");
    check_like(op, "bias", *bias, input);
  }
  return s;
}

// Contiguous activations (or cell states) of the forward, as the backward kernels read them.
at::Tensor saved(const char* op, const char* name, const at::Tensor& t, at::IntArrayRef expected,
                 const at::Tensor& ref) {
  check_shape(op, name, t, expected, "(as returned by the forward)");
  check_like(op, name, t, ref);
  return t.contiguous();
}

at::Tensor grad(const char* op, const char* name, const at::Tensor& t, at::IntArrayRef expected,
                const at::Tensor& ref) {
  check_shape(op, name, t, expected, "(the shape of the forward's output)");
  check_like(op, name, t, ref);
  return t.contiguous();  // expanded (stride 0) incoming gradients are materialised here
}

at::Tensor project_input(const at::Tensor& x2d, const at::Tensor& weight_ih,
                         const std::optional<at::Tensor>& bias) {
  return bias.has_value() ? at::addmm(*bias, x2d, weight_ih.t()) : at::mm(x2d, weight_ih.t());
}

}  // namespace

CellForwardResult cell_forward(const at::Tensor& input, const at::Tensor& h, const at::Tensor& c,
                               const at::Tensor& weight_ih, const at::Tensor& weight_hh,
                               const std::optional<at::Tensor>& bias, const StepKernels& k) {
  const Sizes s = check_forward("lltm.cell_forward", false, input, h, c, weight_ih, weight_hh, bias);
  at::Tensor gates = project_input(input, weight_ih, bias);  // fresh, contiguous (B, 3H)
  gates.addmm_(h, weight_hh.t());
  at::Tensor c_new = at::empty({s.B, s.H}, input.options());
  at::Tensor h_new = at::empty({s.B, s.H}, input.options());
  k.forward(gates, c.contiguous(), c_new, h_new);
  return {h_new, c_new, gates};
}

BackwardResult cell_backward(const at::Tensor& grad_h_new, const at::Tensor& grad_c_new,
                             const at::Tensor& input, const at::Tensor& h,
                             const at::Tensor& weight_ih, const at::Tensor& weight_hh,
                             const at::Tensor& c_new, const at::Tensor& gates,
                             const StepKernels& k) {
  const char* op = "lltm.cell_backward";
  const Sizes s = check_forward(op, false, input, h, c_new, weight_ih, weight_hh, std::nullopt);
  const auto acc = accumulate_type(input.scalar_type());
  at::Tensor dh = grad(op, "grad_h", grad_h_new, {s.B, s.H}, input);
  at::Tensor dc = grad(op, "grad_c", grad_c_new, {s.B, s.H}, input).to(acc);
  at::Tensor grad_gates = at::empty({s.B, 3 * s.H}, input.options());
  at::Tensor grad_c = at::empty({s.B, s.H}, input.options().dtype(acc));
  k.backward(dh, dc, saved(op, "gates", gates, {s.B, 3 * s.H}, input), c_new.contiguous(),
             grad_gates, grad_c);
  return {grad_gates.mm(weight_ih),
          grad_gates.mm(weight_hh),
          grad_c.to(input.scalar_type()),
          grad_gates.t().mm(input),
          grad_gates.t().mm(h),
          grad_gates.sum(0)};
}

LayerForwardResult layer_forward(const at::Tensor& input, const at::Tensor& h0, const at::Tensor& c0,
                                 const at::Tensor& weight_ih, const at::Tensor& weight_hh,
                                 const std::optional<at::Tensor>& bias, const StepKernels& k) {
  const Sizes s = check_forward("lltm.layer_forward", true, input, h0, c0, weight_ih, weight_hh, bias);
  // One GEMM projects the input of every time step; the loop then adds h_{t-1} @ W_hh^T in place and
  // the pointwise kernel overwrites the pre-activations with the activations the backward reuses.
  at::Tensor gates =
      project_input(input.reshape({s.T * s.B, s.I}), weight_ih, bias).view({s.T, s.B, 3 * s.H});
  at::Tensor output = at::empty({s.T, s.B, s.H}, input.options());
  at::Tensor cells = at::empty({s.T, s.B, s.H}, input.options());
  const at::Tensor w_hh_t = weight_hh.t();
  at::Tensor h_prev = h0.contiguous();
  at::Tensor c_prev = c0.contiguous();
  for (int64_t t = 0; t < s.T; ++t) {
    at::Tensor g = gates[t];
    g.addmm_(h_prev, w_hh_t);
    at::Tensor h_t = output[t];
    at::Tensor c_t = cells[t];
    k.forward(g, c_prev, c_t, h_t);
    h_prev = h_t;
    c_prev = c_t;
  }
  return {output, h_prev.clone(), c_prev.clone(), cells, gates};
}

BackwardResult layer_backward(const at::Tensor& grad_output, const at::Tensor& grad_h_n,
                              const at::Tensor& grad_c_n, const at::Tensor& input,
                              const at::Tensor& h0, const at::Tensor& weight_ih,
                              const at::Tensor& weight_hh, const at::Tensor& output,
                              const at::Tensor& cells, const at::Tensor& gates,
                              const StepKernels& k) {
  const char* op = "lltm.layer_backward";
  const Sizes s = check_forward(op, true, input, h0, h0, weight_ih, weight_hh, std::nullopt);
  const int64_t T = s.T, B = s.B, H = s.H;
  const auto acc = accumulate_type(input.scalar_type());
  const at::Tensor go = grad(op, "grad_output", grad_output, {T, B, H}, input);
  const at::Tensor out = saved(op, "output", output, {T, B, H}, input);
  const at::Tensor cs = saved(op, "cells", cells, {T, B, H}, input);
  const at::Tensor gs = saved(op, "gates", gates, {T, B, 3 * H}, input);
  const at::Tensor x = input.contiguous();
  at::Tensor dgates = at::empty({T, B, 3 * H}, input.options());
  at::Tensor dh = at::empty({B, H}, input.options());
  at::Tensor dc = grad(op, "grad_c_n", grad_c_n, {B, H}, input).to(acc, /*non_blocking=*/false,
                                                                     /*copy=*/true);
  at::add_out(dh, go[T - 1], grad(op, "grad_h_n", grad_h_n, {B, H}, input));
  for (int64_t t = T - 1; t >= 0; --t) {
    if (t < T - 1) at::addmm_out(dh, go[t], dgates[t + 1], weight_hh);  // dh = go[t] + dg[t+1] @ W_hh
    k.backward(dh, dc, gs[t], cs[t], dgates[t], dc);
  }
  // Weight gradients: a few large GEMMs over all T * B rows, after the sequential loop.
  const at::Tensor dg2 = dgates.view({T * B, 3 * H});
  at::Tensor grad_weight_hh = dgates[0].t().mm(h0);
  if (T > 1) {
    grad_weight_hh.addmm_(dgates.slice(0, 1).reshape({(T - 1) * B, 3 * H}).t(),
                          out.slice(0, 0, T - 1).reshape({(T - 1) * B, H}));
  }
  return {dg2.mm(weight_ih).view({T, B, s.I}),
          dgates[0].mm(weight_hh),
          dc.to(input.scalar_type()),
          dg2.t().mm(x.view({T * B, s.I})),
          grad_weight_hh,
          dg2.sum(0)};
}

}  // namespace lltm

TORCH_LIBRARY(lltm, m) {
  m.def(
      "cell_forward(Tensor input, Tensor h, Tensor c, Tensor weight_ih, Tensor weight_hh, "
      "Tensor? bias) -> (Tensor h_new, Tensor c_new, Tensor gates)");
  m.def(
      "cell_backward(Tensor grad_h_new, Tensor grad_c_new, Tensor input, Tensor h, "
      "Tensor weight_ih, Tensor weight_hh, Tensor c_new, Tensor gates) -> (Tensor grad_input, "
      "Tensor grad_h, Tensor grad_c, Tensor grad_weight_ih, Tensor grad_weight_hh, "
      "Tensor grad_bias)");
  m.def(
      "layer_forward(Tensor input, Tensor h0, Tensor c0, Tensor weight_ih, Tensor weight_hh, "
      "Tensor? bias) -> (Tensor output, Tensor h_n, Tensor c_n, Tensor cells, Tensor gates)");
  m.def(
      "layer_backward(Tensor grad_output, Tensor grad_h_n, Tensor grad_c_n, Tensor input, "
      "Tensor h0, Tensor weight_ih, Tensor weight_hh, Tensor output, Tensor cells, Tensor gates) "
      "-> (Tensor grad_input, Tensor grad_h0, Tensor grad_c0, Tensor grad_weight_ih, "
      "Tensor grad_weight_hh, Tensor grad_bias)");
}

// Importing lltm_train._C runs the static registrations above; the module itself is empty.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
