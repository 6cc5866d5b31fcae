// CUDA pointwise kernels of one LLTM time step, and the CUDA registrations of the ops.
// The GEMMs of every step go through ATen (cuBLAS) in lltm.cpp, on the current stream like these.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "lltm.h"

namespace lltm {
namespace {

// Overloads rather than one template so float math stays in float and double math in double.
__device__ __forceinline__ float dexp(float x) { return expf(x); }
__device__ __forceinline__ double dexp(double x) { return exp(x); }
__device__ __forceinline__ float dexpm1(float x) { return expm1f(x); }
__device__ __forceinline__ double dexpm1(double x) { return expm1(x); }
__device__ __forceinline__ float dtanh(float x) { return tanhf(x); }
__device__ __forceinline__ double dtanh(double x) { return tanh(x); }

constexpr int kThreads = 256;

// A 1-D grid-stride launch over B * H elements: any batch size fits (no batch on grid-y).
int blocks_for(int64_t n) {
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, sms * 8));
}

template <typename scalar_t>
__global__ void step_forward_kernel(scalar_t* __restrict__ gates, const scalar_t* __restrict__ c_prev,
                                    scalar_t* __restrict__ c_new, scalar_t* __restrict__ h_new,
                                    int64_t B, int64_t H) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t n = B * H;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = k / H, j = k - b * H;
    scalar_t* g = gates + b * 3 * H + j;
    const acc_t gi = g[0], go = g[H], gz = g[2 * H];
    const acc_t i = acc_t(1) / (acc_t(1) + dexp(-gi));
    const acc_t o = acc_t(1) / (acc_t(1) + dexp(-go));
    const acc_t z = gz > acc_t(0) ? gz : dexpm1(gz);
    const acc_t c = static_cast<acc_t>(c_prev[k]) + i * z;
    g[0] = i;
    g[H] = o;
    g[2 * H] = z;
    c_new[k] = c;
    h_new[k] = dtanh(c) * o;
  }
}

// grad_c and grad_c_prev may alias (the layer's running cell gradient): each thread reads its element
// before writing it, and no other thread touches it.
template <typename scalar_t, typename acc_t>
__global__ void step_backward_kernel(const scalar_t* __restrict__ grad_h, const acc_t* grad_c,
                                     const scalar_t* __restrict__ gates,
                                     const scalar_t* __restrict__ c_new,
                                     scalar_t* __restrict__ grad_gates, acc_t* grad_c_prev, int64_t B,
                                     int64_t H) {
  const int64_t n = B * H;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = k / H, j = k - b * H;
    const scalar_t* g = gates + b * 3 * H + j;
    scalar_t* dg = grad_gates + b * 3 * H + j;
    const acc_t i = g[0], o = g[H], z = g[2 * H];
    const acc_t tc = dtanh(static_cast<acc_t>(c_new[k]));
    const acc_t dh = grad_h[k];
    const acc_t dc = grad_c[k] + dh * o * (acc_t(1) - tc * tc);
    dg[0] = dc * z * i * (acc_t(1) - i);
    dg[H] = dh * tc * o * (acc_t(1) - o);
    dg[2 * H] = dc * i * (z > acc_t(0) ? acc_t(1) : z + acc_t(1));  // elu'(x) = z + 1 for x <= 0
    grad_c_prev[k] = dc;
  }
}

void step_forward(const at::Tensor& gates, const at::Tensor& c_prev, const at::Tensor& c_new,
                  const at::Tensor& h_new) {
  const int64_t B = c_new.size(0), H = c_new.size(1);
  if (B * H == 0) return;
  const c10::cuda::CUDAGuard guard(c_new.device());
  const auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, gates.scalar_type(), "lltm_step_forward_cuda", [&] {
    step_forward_kernel<scalar_t><<<blocks_for(B * H), kThreads, 0, stream>>>(
        gates.data_ptr<scalar_t>(), c_prev.data_ptr<scalar_t>(), c_new.data_ptr<scalar_t>(),
        h_new.data_ptr<scalar_t>(), B, H);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void step_backward(const at::Tensor& grad_h, const at::Tensor& grad_c, const at::Tensor& gates,
                   const at::Tensor& c_new, const at::Tensor& grad_gates,
                   const at::Tensor& grad_c_prev) {
  const int64_t B = c_new.size(0), H = c_new.size(1);
  if (B * H == 0) return;
  const c10::cuda::CUDAGuard guard(c_new.device());
  const auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, gates.scalar_type(), "lltm_step_backward_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    step_backward_kernel<scalar_t, acc_t><<<blocks_for(B * H), kThreads, 0, stream>>>(
        grad_h.data_ptr<scalar_t>(), grad_c.data_ptr<acc_t>(), gates.data_ptr<scalar_t>(),
        c_new.data_ptr<scalar_t>(), grad_gates.data_ptr<scalar_t>(), grad_c_prev.data_ptr<acc_t>(),
        B, H);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

const StepKernels kCuda{step_forward, step_backward};

}  // namespace
}  // namespace lltm

TORCH_LIBRARY_IMPL(lltm, CUDA, m) { lltm::register_kernels<lltm::kCuda>(m); }
