// The CUDA recurrence: the persistent kernels where they apply, the stepped one elsewhere (lltm_cuda.h),
// and the CUDA registrations of the ops.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdlib>
#include <cstring>

#include "lltm.h"
#include "lltm_cuda.h"

namespace lltm {
namespace cuda {
namespace {

// LLTM_CUDA_PATH=stepped forces the stepped recurrence, LLTM_CUDA_PATH=persistent the persistent kernels
// wherever one exists, at any batch size (for tests and benchmarks of one path).
enum class Path { kAuto, kStepped, kPersistent };

Path path_override() {
  static const Path path = [] {
    const char* value = std::getenv("LLTM_CUDA_PATH");
    if (value == nullptr) return Path::kAuto;
    if (std::strcmp(value, "stepped") == 0) return Path::kStepped;
    if (std::strcmp(value, "persistent") == 0) return Path::kPersistent;
    TORCH_WARN("lltm: LLTM_CUDA_PATH=", value, " is neither 'stepped' nor 'persistent'; the path is chosen per call");
    return Path::kAuto;
  }();
  return path;
}

bool use_persistent(const at::Tensor& t, int64_t H) {
  const Path path = path_override();
  return path != Path::kStepped && persistent_supports(t.scalar_type(), H, t.size(1), path == Path::kPersistent);
}

at::Tensor on_device(const at::Tensor& lengths, const at::Tensor& like) {
  return lengths.defined() ? lengths.to(like.device(), /*non_blocking=*/true) : lengths;
}

void forward(const at::Tensor& gates, const at::Tensor& h0, const at::Tensor& c0, const at::Tensor& weight_hh,
             const at::Tensor& lengths, const at::Tensor& output, const at::Tensor& cells, const at::Tensor& h_n,
             const at::Tensor& c_n) {
  const c10::cuda::CUDAGuard guard(gates.device());
  const at::Tensor lens = on_device(lengths, gates);
  if (use_persistent(gates, h0.size(1))) {
    persistent_forward(gates, h0, c0, weight_hh, lens, output, cells, h_n, c_n);
  } else {
    stepped_forward(gates, h0, c0, weight_hh, lens, output, cells, h_n, c_n);
  }
}

void backward(const at::Tensor& grad_output, const at::Tensor& grad_h_n, const at::Tensor& grad_c_n,
              const at::Tensor& activations, const at::Tensor& cells, const at::Tensor& weight_hh,
              const at::Tensor& lengths, const at::Tensor& grad_gates, const at::Tensor& grad_h0,
              const at::Tensor& grad_c0) {
  const c10::cuda::CUDAGuard guard(activations.device());
  const at::Tensor lens = on_device(lengths, activations);
  if (use_persistent(activations, cells.size(2))) {
    persistent_backward(grad_output, grad_h_n, grad_c_n, activations, cells, weight_hh, lens, grad_gates, grad_h0,
                        grad_c0);
  } else {
    stepped_backward(grad_output, grad_h_n, grad_c_n, activations, cells, weight_hh, lens, grad_gates, grad_h0,
                     grad_c0);
  }
}

const Recurrence kCuda{forward, backward};

}  // namespace
}  // namespace cuda
}  // namespace lltm

TORCH_LIBRARY_IMPL(lltm, CUDA, m) { lltm::register_kernels<lltm::cuda::kCuda>(m); }
