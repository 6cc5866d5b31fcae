// The CUDA recurrence of every cell: the persistent kernels where they apply, the stepped one elsewhere
// (lltm_cuda.h), and the CUDA registrations of the ops.
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

// Whether LLTM_CUDA_PATH forces the stepped path; any_batch: whether it forces the persistent kernels at any
// batch. ([[maybe_unused]]: nvcc does not count uses from templates instantiated below.)
[[maybe_unused]] bool path_forced(bool& any_batch) {
  const Path path = path_override();
  any_batch = path == Path::kPersistent;
  return path == Path::kStepped;
}

[[maybe_unused]] at::Tensor on_device(const at::Tensor& lengths, const at::Tensor& like) {
  return lengths.defined() ? lengths.to(like.device(), /*non_blocking=*/true) : lengths;
}

template <typename Cell>
bool use_persistent(const at::Tensor& t, int64_t H, int64_t num_heads) {
  bool any_batch = false;
  return !path_forced(any_batch) && persistent_supports<Cell>(t.scalar_type(), H, t.size(1), num_heads, any_batch);
}

// Which path runs, in one lookup where heads run natively. Heads (lltm.h) run natively where a persistent kernel
// takes their width; elsewhere `on` gets the dense block-diagonal matrix for whichever path takes the whole width
// (the stepped GEMM, or a persistent kernel of width H). Returns whether the persistent kernels run.
template <typename Cell, typename Tensors>
bool plan(Tensors& on, const at::Tensor& t, int64_t H) {
  if (use_persistent<Cell>(t, H, on.num_heads)) {
    return true;
  }
  if (on.num_heads == 1) {
    return false;
  }
  on.weight_hh = dense_heads(on.weight_hh, Cell::kGates, on.num_heads);
  on.num_heads = 1;
  return use_persistent<Cell>(t, H, 1);
}

template <typename Cell>
void forward(const ForwardTensors& f) {
  const c10::cuda::CUDAGuard guard(f.gates.device());
  ForwardTensors on = f;
  on.lengths = on_device(f.lengths, f.gates);
  if (plan<Cell>(on, f.gates, f.h0.size(1))) {
    persistent_forward<Cell>(on);
  } else {
    stepped_forward<Cell>(on);
  }
}

template <typename Cell>
void backward(const BackwardTensors& g) {
  const c10::cuda::CUDAGuard guard(g.activations.device());
  BackwardTensors on = g;
  on.lengths = on_device(g.lengths, g.activations);
  if (plan<Cell>(on, g.activations, g.h0.size(1))) {
    persistent_backward<Cell>(on);
  } else {
    stepped_backward<Cell>(on);
  }
}

template <typename Cell>
const Recurrence kCuda{forward<Cell>, backward<Cell>};

}  // namespace
}  // namespace cuda
}  // namespace lltm

TORCH_LIBRARY_IMPL(lltm, CUDA, m) {
#define LLTM_REGISTER(CELL) lltm::register_kernels<CELL, lltm::cuda::kCuda<CELL>>(m);
  LLTM_FOR_EACH_CELL(LLTM_REGISTER)
#undef LLTM_REGISTER
}
