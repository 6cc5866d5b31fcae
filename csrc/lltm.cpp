// Op schemas, argument checks (the authority for the compiled ops), and the device-independent part of
// both ops: the input projection before the time loop and the weight gradients after it, as large GEMMs.
// The time loop itself is a device's Recurrence (lltm_cpu.cpp, lltm_cuda.cu).
#include "lltm.h"

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <string>

namespace lltm {
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

Sizes check_forward(const char* op, const at::Tensor& input, const at::Tensor& h0, const at::Tensor& c0,
                    const at::Tensor& weight_ih, const at::Tensor& weight_hh,
                    const std::optional<at::Tensor>& bias) {
  const auto dtype = input.scalar_type();
  TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kFloat || dtype == at::kDouble,
              std::string(op) + ": expected a floating-point input (float16, bfloat16, float32 or float64), got " +
                  c10::toString(input.scalar_type()));
  TORCH_CHECK(input.dim() == 3,
              std::string(op) + ": expected input of shape (T, B, input_size), got " + shape_str(input.sizes()));
  TORCH_CHECK(weight_hh.dim() == 2 && weight_hh.size(0) % 3 == 0,
              std::string(op) + ": expected weight_hh of shape (3 * hidden_size, hidden_size), got " +
                  shape_str(weight_hh.sizes()));
  const Sizes s{input.size(0), input.size(1), input.size(2), weight_hh.size(1)};
  TORCH_CHECK(s.T >= 1, std::string(op) + ": expected a sequence of length T >= 1, got T = 0");
  check_shape(op, "weight_hh", weight_hh, {3 * s.H, s.H}, "(3 * hidden_size, hidden_size)");
  check_shape(op, "weight_ih", weight_ih, {3 * s.H, s.I}, "(3 * hidden_size, input_size)");
  check_shape(op, "h0", h0, {s.B, s.H}, "(B, hidden_size)");
  check_shape(op, "c0", c0, {s.B, s.H}, "(B, hidden_size)");
  check_like(op, "weight_ih", weight_ih, input);
  check_like(op, "weight_hh", weight_hh, input);
  check_like(op, "h0", h0, input);
  check_like(op, "c0", c0, input);
  if (bias.has_value()) {
    check_shape(op, "bias", *bias, {3 * s.H}, "(3 * hidden_size)");
    check_like(op, "bias", *bias, input);
  }
  return s;
}

// Undefined when absent; otherwise checked: int64 (B,) on the CPU, every value in [0, T].
at::Tensor check_lengths(const char* op, const std::optional<at::Tensor>& lengths, const Sizes& s) {
  if (!lengths.has_value()) return at::Tensor();
  const at::Tensor& l = *lengths;
  TORCH_CHECK(l.scalar_type() == at::kLong && l.device().is_cpu(),
              std::string(op) + ": expected lengths as an int64 tensor on the CPU, got " +
                  c10::toString(l.scalar_type()) + " on " + l.device().str());
  check_shape(op, "lengths", l, {s.B}, "(B,)");
  const at::Tensor c = l.contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  for (int64_t b = 0; b < s.B; ++b) {
    TORCH_CHECK(p[b] >= 0 && p[b] <= s.T, std::string(op) + ": lengths[" + std::to_string(b) + "] = " +
                                               std::to_string(p[b]) + " is outside [0, T = " +
                                               std::to_string(s.T) + "]");
  }
  return c;
}

// A saved tensor of the forward, or an incoming gradient: the expected shape, dtype and device.
at::Tensor checked(const char* op, const char* name, const at::Tensor& t, at::IntArrayRef expected,
                   const at::Tensor& ref) {
  check_shape(op, name, t, expected, "(as the forward made it)");
  check_like(op, name, t, ref);
  return t.contiguous();  // expanded (stride 0) incoming gradients are materialised here
}

at::Tensor optional_grad(const char* op, const char* name, const std::optional<at::Tensor>& t,
                         at::IntArrayRef expected, const at::Tensor& ref) {
  return t.has_value() && t->defined() ? checked(op, name, *t, expected, ref) : at::Tensor();
}

}  // namespace

ForwardResult layer_forward(const at::Tensor& input, const at::Tensor& h0, const at::Tensor& c0,
                            const at::Tensor& weight_ih, const at::Tensor& weight_hh,
                            const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& lengths,
                            const Recurrence& r) {
  const char* op = "lltm.layer_forward";
  const Sizes s = check_forward(op, input, h0, c0, weight_ih, weight_hh, bias);
  const at::Tensor lens = check_lengths(op, lengths, s);
  // One GEMM projects the input of every time step; the recurrence adds h_{t-1} W_hh^T step by step.
  const at::Tensor x2d = input.reshape({s.T * s.B, s.I});
  at::Tensor gates = bias.has_value() ? at::addmm(*bias, x2d, weight_ih.t()) : at::mm(x2d, weight_ih.t());
  gates = gates.view({s.T, s.B, 3 * s.H});
  at::Tensor output = at::empty({s.T, s.B, s.H}, input.options());
  at::Tensor cells = at::empty({s.T, s.B, s.H}, input.options());
  at::Tensor h_n = at::empty({s.B, s.H}, input.options());
  at::Tensor c_n = at::empty({s.B, s.H}, input.options());
  if (s.B > 0 && s.H > 0) {
    r.forward(gates, h0.contiguous(), c0.contiguous(), weight_hh.contiguous(), lens, output, cells, h_n, c_n);
  }
  return {output, h_n, c_n, cells, gates};
}

BackwardResult layer_backward(const std::optional<at::Tensor>& grad_output,
                              const std::optional<at::Tensor>& grad_h_n,
                              const std::optional<at::Tensor>& grad_c_n, const at::Tensor& input,
                              const at::Tensor& h0, const at::Tensor& weight_ih, const at::Tensor& weight_hh,
                              const at::Tensor& output, const at::Tensor& cells, const at::Tensor& activations,
                              const std::optional<at::Tensor>& lengths, const Recurrence& r) {
  const char* op = "lltm.layer_backward";
  const Sizes s = check_forward(op, input, h0, h0, weight_ih, weight_hh, std::nullopt);
  const int64_t T = s.T, B = s.B, H = s.H;
  const at::Tensor lens = check_lengths(op, lengths, s);
  const at::Tensor go = optional_grad(op, "grad_output", grad_output, {T, B, H}, input);
  const at::Tensor ghn = optional_grad(op, "grad_h_n", grad_h_n, {B, H}, input);
  const at::Tensor gcn = optional_grad(op, "grad_c_n", grad_c_n, {B, H}, input);
  const at::Tensor out = checked(op, "output", output, {T, B, H}, input);
  const at::Tensor cs = checked(op, "cells", cells, {T, B, H}, input);
  const at::Tensor act = checked(op, "activations", activations, {T, B, 3 * H}, input);
  at::Tensor grad_gates = at::empty({T, B, 3 * H}, input.options());
  at::Tensor grad_h0 = at::empty({B, H}, input.options());
  at::Tensor grad_c0 = at::empty({B, H}, input.options());
  if (B > 0 && H > 0) {
    r.backward(go, ghn, gcn, act, cs, weight_hh.contiguous(), lens, grad_gates, grad_h0, grad_c0);
  } else {
    grad_h0.zero_();
    grad_c0.zero_();
  }
  // The weight gradients: a few large GEMMs over all T * B rows, after the sequential loop.
  const at::Tensor dg = grad_gates.view({T * B, 3 * H});
  at::Tensor grad_weight_hh = grad_gates[0].t().mm(h0);
  if (T > 1) {
    grad_weight_hh.addmm_(grad_gates.slice(0, 1).reshape({(T - 1) * B, 3 * H}).t(),
                          out.slice(0, 0, T - 1).reshape({(T - 1) * B, H}));
  }
  return {dg.mm(weight_ih).view({T, B, s.I}),
          grad_h0,
          grad_c0,
          dg.t().mm(input.reshape({T * B, s.I})),
          grad_weight_hh,
          // A GEMV on CUDA for many rows: sum(0) over T * B rows allocates a staging buffer twice the size
          // of dg there.
          dg.is_cuda() && T * B > 4096 ? at::mv(dg.t(), at::ones({T * B}, dg.options())) : dg.sum(0)};
}

}  // namespace lltm

TORCH_LIBRARY(lltm, m) {
  m.def(
      "layer_forward(Tensor input, Tensor h0, Tensor c0, Tensor weight_ih, Tensor weight_hh, "
      "Tensor? bias, Tensor? lengths) -> (Tensor output, Tensor h_n, Tensor c_n, Tensor cells, "
      "Tensor activations)");
  m.def(
      "layer_backward(Tensor? grad_output, Tensor? grad_h_n, Tensor? grad_c_n, Tensor input, Tensor h0, "
      "Tensor weight_ih, Tensor weight_hh, Tensor output, Tensor cells, Tensor activations, "
      "Tensor? lengths) -> (Tensor grad_input, Tensor grad_h0, Tensor grad_c0, Tensor grad_weight_ih, "
      "Tensor grad_weight_hh, Tensor grad_bias)");
}
