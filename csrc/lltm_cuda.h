// The two CUDA recurrences (lltm_cuda.cu picks one per call), each a template over the cells of cells.h:
// - persistent (lltm_cuda_persistent.cu): one kernel launch runs every time step, for the cells and hidden
//   sizes whose recurrent weights fit on chip (persistent_supports says which), heads each as its own recurrence;
// - stepped (lltm_cuda_stepped.cu): per step one cuBLAS GEMM and one fused pointwise kernel, replayed
//   from cached CUDA graphs, for everything else (larger H, float64, any H), heads as their dense matrix.
// Arguments as in lltm.h's Recurrence; every tensor is on the current device and contiguous, `lengths`
// (B,) int64 is on the device or undefined.
#pragma once

#include <ATen/core/Tensor.h>

#include <cmath>

#include "lltm.h"

namespace lltm {
namespace cuda {

// The math functions of cells.h on the device, in float or double.
struct DeviceMath {
  static __device__ __forceinline__ float exp(float x) { return expf(x); }
  static __device__ __forceinline__ double exp(double x) { return ::exp(x); }
  static __device__ __forceinline__ float expm1(float x) { return expm1f(x); }
  static __device__ __forceinline__ double expm1(double x) { return ::expm1(x); }
  static __device__ __forceinline__ float tanh(float x) { return tanhf(x); }
  static __device__ __forceinline__ double tanh(double x) { return ::tanh(x); }
  static __device__ __forceinline__ float log(float x) { return logf(x); }
  static __device__ __forceinline__ double log(double x) { return ::log(x); }
  static __device__ __forceinline__ float log1p(float x) { return log1pf(x); }
  static __device__ __forceinline__ double log1p(double x) { return ::log1p(x); }
  static __device__ __forceinline__ float reciprocal(float x) { return 1.0f / x; }
  static __device__ __forceinline__ double reciprocal(double x) { return 1.0 / x; }
};

// The 16-bit persistent kernels' math (16-bit storage, float arithmetic): the special function unit's exp2, log2
// and reciprocal (MUFU.EX2, LG2, RCP; a few float ulps, an absolute error near 1e-7 where a value is near 0),
// tanh from exp as the CPU's FastFloatMath takes it. Each stays far below the half ulp of the 16-bit values the
// kernels store (2^-9 bfloat16, 2^-12 float16, relative). Limits: exp gives inf above 88.7 and 0 below -87.3;
// reciprocal gives 0 for x beyond 2^126 (sigmoid's 1 + exp(-x) there: the sigmoid is 0 to float precision
// anyway); NaN stays NaN.
struct FastDeviceMath {
  static __device__ __forceinline__ float exp(float x) { return __expf(x); }
  static __device__ __forceinline__ float expm1(float x) { return __expf(x) - 1.0f; }
  static __device__ __forceinline__ float tanh(float x) { return 1.0f - __fdividef(2.0f, __expf(2.0f * x) + 1.0f); }
  static __device__ __forceinline__ float log(float x) { return __logf(x); }
  static __device__ __forceinline__ float log1p(float x) { return __logf(1.0f + x); }
  static __device__ __forceinline__ float reciprocal(float x) { return __fdividef(1.0f, x); }
};

// True when a persistent kernel of this cell takes this dtype, hidden size, batch and heads (each head its own
// recurrence of H / num_heads units; any batch: as long as a kernel exists for the cell, dtype and head width,
// however many waves of clusters the batch needs).
template <typename Cell>
bool persistent_supports(at::ScalarType dtype, int64_t H, int64_t B, int64_t num_heads, bool any_batch);

template <typename Cell>
void persistent_forward(const ForwardTensors& f);
template <typename Cell>
void persistent_backward(const BackwardTensors& g);

template <typename Cell>
void stepped_forward(const ForwardTensors& f);
template <typename Cell>
void stepped_backward(const BackwardTensors& g);

// float32 products on tensor cores in TF32 (torch.backends.cuda.matmul.allow_tf32, or
// torch.set_float32_matmul_precision("high")); otherwise in full float32 precision.
bool allow_tf32();

}  // namespace cuda
}  // namespace lltm
