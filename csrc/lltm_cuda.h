// The two CUDA recurrences (lltm_cuda.cu picks one per call):
// - persistent (lltm_cuda_persistent.cu): one kernel launch runs every time step, for the hidden sizes
//   whose recurrent weights fit on chip (H = 64, 128, 256 in float32, bfloat16, float16; H = 512 in
//   bfloat16 and float16);
// - stepped (lltm_cuda_stepped.cu): per step one cuBLAS GEMM and one fused pointwise kernel, replayed
//   from cached CUDA graphs, for everything else (larger H, float64, any H).
// Arguments as in lltm.h's Recurrence; every tensor is on the current device and contiguous,
// `lengths` (B,) int64 is on the device or undefined.
#pragma once

#include <ATen/core/Tensor.h>

#include <cmath>

namespace lltm {
namespace cuda {

// The math functions of lltm_math.h on the device, in float or double.
struct DeviceMath {
  static __device__ __forceinline__ float exp(float x) { return expf(x); }
  static __device__ __forceinline__ double exp(double x) { return ::exp(x); }
  static __device__ __forceinline__ float expm1(float x) { return expm1f(x); }
  static __device__ __forceinline__ double expm1(double x) { return ::expm1(x); }
  static __device__ __forceinline__ float tanh(float x) { return tanhf(x); }
  static __device__ __forceinline__ double tanh(double x) { return ::tanh(x); }
};

// True when the persistent kernels take this dtype, hidden size and batch (any batch: as long as a kernel
// exists for the dtype and hidden size, however many waves of clusters the batch needs).
bool persistent_supports(at::ScalarType dtype, int64_t H, int64_t B, bool any_batch = false);

void persistent_forward(const at::Tensor& gates, const at::Tensor& h0, const at::Tensor& c0,
                        const at::Tensor& weight_hh, const at::Tensor& lengths, const at::Tensor& output,
                        const at::Tensor& cells, const at::Tensor& h_n, const at::Tensor& c_n);

void persistent_backward(const at::Tensor& grad_output, const at::Tensor& grad_h_n, const at::Tensor& grad_c_n,
                         const at::Tensor& activations, const at::Tensor& cells, const at::Tensor& weight_hh,
                         const at::Tensor& lengths, const at::Tensor& grad_gates, const at::Tensor& grad_h0,
                         const at::Tensor& grad_c0);

void stepped_forward(const at::Tensor& gates, const at::Tensor& h0, const at::Tensor& c0,
                     const at::Tensor& weight_hh, const at::Tensor& lengths, const at::Tensor& output,
                     const at::Tensor& cells, const at::Tensor& h_n, const at::Tensor& c_n);

void stepped_backward(const at::Tensor& grad_output, const at::Tensor& grad_h_n, const at::Tensor& grad_c_n,
                      const at::Tensor& activations, const at::Tensor& cells, const at::Tensor& weight_hh,
                      const at::Tensor& lengths, const at::Tensor& grad_gates, const at::Tensor& grad_h0,
                      const at::Tensor& grad_c0);

// float32 products on tensor cores in TF32 (torch.backends.cuda.matmul.allow_tf32, or
// torch.set_float32_matmul_precision("high")); otherwise in full float32 precision.
bool allow_tf32();

}  // namespace cuda
}  // namespace lltm
