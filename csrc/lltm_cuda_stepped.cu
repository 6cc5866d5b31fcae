// Stepped LLTM recurrence, for the shapes the persistent kernels do not take: per time step one cuBLAS
// GEMM (h_{t-1} W_hh^T forward, dgates_t W_hh backward) and one fused pointwise kernel.
//
// Launching 2T kernels from the host costs more than the GPU work at most sizes, so the steps are
// captured once per shape into CUDA graphs of up to kMaxChunk steps and replayed. The graphs never hold
// per-call pointers: the GEMMs work on scratch buffers owned by the cache entry (fixed addresses: the
// running h, its product with W_hh, a copy of W_hh), and the pointwise kernels find the call's tensors
// and the step number in a small argument block in device memory, written by one kernel before the
// replay. So no memory a graph owns is ever handed to autograd, and one graph serves every call of its
// shape. cuBLAS gets its own handle and a fixed workspace per stream, as capture requires. When the
// caller's stream is itself being captured (torch.compile's "reduce-overhead", CUDA graph trees), the
// steps are issued directly, into the caller's graph.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/Exceptions.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublas_v2.h>

#include <array>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "lltm_cuda.h"
#include "lltm_math.h"

namespace lltm {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxChunk = 64;            // time steps per captured graph
constexpr size_t kMaxEntries = 16;       // cached shapes
constexpr size_t kWorkspaceBytes = 8 << 20;

// Where a call's tensors are; the graphs read it from device memory.
template <typename scalar_t>
struct StepArgs {
  scalar_t* gates;              // (T, B, 3H): forward: x-projection in, activations out; backward: activations
  scalar_t* grad_gates;         // (T, B, 3H), backward
  scalar_t* output;             // (T, B, H), forward
  const scalar_t* cells;        // (T, B, H)
  scalar_t* cells_out;          // forward
  const scalar_t* grad_output;  // (T, B, H), backward; may be null
  const int64_t* lengths;       // (B,) or null
  int64_t t;                    // the step of a chunk's first node; each chunk advances it
};

template <typename scalar_t>
__global__ void set_args(StepArgs<scalar_t>* dst, const StepArgs<scalar_t> src) {
  *dst = src;
}

template <typename scalar_t>
__global__ void advance(StepArgs<scalar_t>* args, int64_t delta) {
  args->t += delta;
}

int blocks_for(int64_t n) {
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, sms * 8)));
}

// Step args->t + i: hw (B, 3H) = h_{t-1} W_hh^T from the GEMM; h, c: the running state.
template <typename scalar_t, typename acc_t>
__global__ void forward_step(const StepArgs<scalar_t>* __restrict__ args, const acc_t* __restrict__ hw,
                             scalar_t* __restrict__ h, acc_t* __restrict__ c, int64_t B, int64_t H, int i) {
  const int64_t t = args->t + i;
  const int64_t n = B * H;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = k / H, j = k - b * H, row = t * B + b;
    scalar_t* g = args->gates + row * 3 * H + j;
    if (!args->lengths || t < args->lengths[b]) {
      const acc_t* r = hw + b * 3 * H + j;
      acc_t i_, o, z, cn, hn;
      math::forward<acc_t, DeviceMath>(acc_t(g[0]) + r[0], acc_t(g[H]) + r[H], acc_t(g[2 * H]) + r[2 * H], c[k], i_,
                                       o, z, cn, hn);
      g[0] = scalar_t(i_);
      g[H] = scalar_t(o);
      g[2 * H] = scalar_t(z);
      args->cells_out[row * H + j] = scalar_t(cn);
      args->output[row * H + j] = scalar_t(hn);
      h[k] = scalar_t(hn);
      c[k] = cn;
    } else {  // a finished row keeps its state and outputs zeros
      args->cells_out[row * H + j] = scalar_t(c[k]);
      args->output[row * H + j] = scalar_t(0);
    }
  }
}

// Step args->t - i. dh (B, H): on entry what the later steps pass back to h_t, on return the part that
// passes through unchanged (finished rows), to which the GEMM then adds dgates_t W_hh. dg: scratch copy
// of the gate gradients, the GEMM's input.
template <typename scalar_t, typename acc_t>
__global__ void backward_step(const StepArgs<scalar_t>* __restrict__ args, acc_t* __restrict__ dh,
                              acc_t* __restrict__ dc, scalar_t* __restrict__ dg, int64_t B, int64_t H, int i) {
  const int64_t t = args->t - i;
  const int64_t n = B * H;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = k / H, j = k - b * H, row = t * B + b;
    const scalar_t* a = args->gates + row * 3 * H + j;
    scalar_t* ga = args->grad_gates + row * 3 * H + j;
    acc_t d_i = 0, d_o = 0, d_z = 0;
    if (!args->lengths || t < args->lengths[b]) {
      acc_t dhv = dh[k];
      if (args->grad_output) dhv += acc_t(args->grad_output[row * H + j]);
      acc_t dcv = dc[k];
      math::backward<acc_t, DeviceMath>(dhv, dcv, acc_t(a[0]), acc_t(a[H]), acc_t(a[2 * H]),
                                        acc_t(args->cells[row * H + j]), d_i, d_o, d_z);
      dc[k] = dcv;
      dh[k] = 0;
    }
    ga[0] = scalar_t(d_i);
    ga[H] = scalar_t(d_o);
    ga[2 * H] = scalar_t(d_z);
    scalar_t* d = dg + b * 3 * H + j;
    d[0] = scalar_t(d_i);
    d[H] = scalar_t(d_o);
    d[2 * H] = scalar_t(d_z);
  }
}

template <typename T>
constexpr cudaDataType_t cuda_type() {
  if constexpr (std::is_same_v<T, double>) return CUDA_R_64F;
  if constexpr (std::is_same_v<T, float>) return CUDA_R_32F;
  if constexpr (std::is_same_v<T, at::Half>) return CUDA_R_16F;
  return CUDA_R_16BF;
}

// Column-major C (m x n) = op(A) op(B) + beta C, A and B of scalar_t, C of the accumulate type.
template <typename scalar_t, typename acc_t>
void gemm(cublasHandle_t handle, cublasOperation_t ta, int64_t m, int64_t n, int64_t k, const scalar_t* A,
          int64_t lda, const scalar_t* Bm, int64_t ldb, acc_t beta, acc_t* Cm, int64_t ldc, bool tf32) {
  const acc_t alpha = 1;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  if constexpr (std::is_same_v<acc_t, double>) compute = CUBLAS_COMPUTE_64F;
  if (std::is_same_v<scalar_t, float> && tf32) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  TORCH_CUDABLAS_CHECK(cublasGemmEx(handle, ta, CUBLAS_OP_N, static_cast<int>(m), static_cast<int>(n),
                                    static_cast<int>(k), &alpha, A, cuda_type<scalar_t>(), static_cast<int>(lda), Bm,
                                    cuda_type<scalar_t>(), static_cast<int>(ldb), &beta, Cm, cuda_type<acc_t>(),
                                    static_cast<int>(ldc), compute, CUBLAS_GEMM_DEFAULT));
}

bool is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

// Device memory owned by the cache, from cudaMalloc rather than PyTorch's allocator: a cache entry outlives
// the call that made it, and PyTorch may be allocating into a CUDA graph's private pool at that moment
// (torch.compile's cudagraph trees warm up eagerly inside their pool), which must not keep our buffers.
struct DeviceBuffer {
  void* ptr = nullptr;
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) { C10_CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(bytes, 1))); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr) (void)cudaFree(ptr);
  }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr); }
};

// One shape's scratch buffers and graphs (per device, stream, dtype, B, H, direction, TF32 setting).
// Buffers: the StepArgs block; a copy of W_hh (3H, H), the GEMM's fixed operand; `vec` (scalar_t):
// the running h (B, H) forward or a copy of the gate gradients (B, 3H) backward; `acc1`, `acc2`
// (accumulate type): h W_hh^T (B, 3H) and the cell state (B, H) forward, dL/dh and dL/dc (B, H) backward.
struct Entry {
  DeviceBuffer args, w, vec, acc1, acc2;
  std::map<int, cudaGraphExec_t> graphs;  // by chunk length
  cudaStream_t stream = nullptr;
  ~Entry() {
    (void)cudaStreamSynchronize(stream);  // replays may still be in flight
    for (auto& kv : graphs) (void)cudaGraphExecDestroy(kv.second);
  }
};

// Per device: a cuBLAS handle and a capture stream; per (device, stream): a cuBLAS workspace.
struct DeviceResources {
  cublasHandle_t handle = nullptr;
  cudaStream_t capture = nullptr;
  std::map<cudaStream_t, std::unique_ptr<DeviceBuffer>> workspace;
};

using Key = std::tuple<int, cudaStream_t, int, int64_t, int64_t, bool, bool>;

struct Cache {
  std::mutex mutex;
  std::map<int, DeviceResources> devices;
  std::list<std::pair<Key, std::unique_ptr<Entry>>> entries;  // most recently used first

  DeviceResources& device(int index) {
    DeviceResources& d = devices[index];
    if (d.handle == nullptr) {
      TORCH_CUDABLAS_CHECK(cublasCreate(&d.handle));
      C10_CUDA_CHECK(cudaStreamCreateWithFlags(&d.capture, cudaStreamNonBlocking));
    }
    return d;
  }

  Entry& entry(const Key& key, const std::function<void(Entry&)>& make) {
    for (auto it = entries.begin(); it != entries.end(); ++it) {
      if (it->first == key) {
        entries.splice(entries.begin(), entries, it);
        return *entries.front().second;
      }
    }
    auto e = std::make_unique<Entry>();
    make(*e);
    entries.emplace_front(key, std::move(e));
    if (entries.size() > kMaxEntries) entries.pop_back();
    return *entries.front().second;
  }
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: CUDA may be gone at exit
  return *c;
}

// Replays `issue` (which enqueues `steps` steps on the stream it is given) as cached graphs of at most
// kMaxChunk steps, capturing each chunk length once.
void replay(Entry& e, DeviceResources& d, cudaStream_t stream, int64_t T,
            const std::function<void(cudaStream_t, int)>& issue) {
  std::unique_ptr<DeviceBuffer>& ws = d.workspace[stream];
  if (!ws) ws = std::make_unique<DeviceBuffer>(kWorkspaceBytes);
  for (int64_t done = 0; done < T;) {
    int chunk = kMaxChunk;
    while (chunk > T - done) chunk /= 2;
    auto it = e.graphs.find(chunk);
    if (it == e.graphs.end()) {
      TORCH_CUDABLAS_CHECK(cublasSetStream(d.handle, d.capture));
      TORCH_CUDABLAS_CHECK(cublasSetWorkspace(d.handle, ws->ptr, kWorkspaceBytes));
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      C10_CUDA_CHECK(cudaStreamBeginCapture(d.capture, cudaStreamCaptureModeThreadLocal));
      issue(d.capture, chunk);
      C10_CUDA_CHECK(cudaStreamEndCapture(d.capture, &graph));
      const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
      (void)cudaGraphDestroy(graph);
      C10_CUDA_CHECK(status);
      it = e.graphs.emplace(chunk, exec).first;
    }
    C10_CUDA_CHECK(cudaGraphLaunch(it->second, stream));
    done += chunk;
  }
}

// Where a call's scratch lives: a cache entry's buffers, or (inside a caller's CUDA graph capture)
// temporaries from PyTorch's allocator, which then belong to that graph's memory pool.
struct Scratch {
  void* args;
  void* w;
  void* vec;
  void* acc1;
  void* acc2;
};

// Byte sizes of the five scratch buffers of one direction.
std::array<size_t, 5> scratch_bytes(bool backward, int64_t B, int64_t H, size_t scalar, size_t acc, size_t args) {
  return backward ? std::array<size_t, 5>{args, size_t(3 * H * H) * scalar, size_t(3 * B * H) * scalar, size_t(B * H) * acc,
                                          size_t(B * H) * acc}
                  : std::array<size_t, 5>{args, size_t(3 * H * H) * scalar, size_t(B * H) * scalar, size_t(3 * B * H) * acc,
                                          size_t(B * H) * acc};
}

void make_entry(Entry& e, const std::array<size_t, 5>& bytes, cudaStream_t stream) {
  for (auto [buffer, n] : {std::pair{&e.args, bytes[0]}, {&e.w, bytes[1]}, {&e.vec, bytes[2]}, {&e.acc1, bytes[3]},
                           {&e.acc2, bytes[4]}}) {
    buffer->ptr = nullptr;
    C10_CUDA_CHECK(cudaMalloc(&buffer->ptr, std::max<size_t>(n, 1)));
  }
  e.stream = stream;
}

// Runs `body(scratch, handle, weights, graph_mode)` with the scratch of this call: a cached entry (and
// our handle; the caller then replays graphs), or temporaries and PyTorch's handle inside a capture.
template <typename F>
void with_scratch(const Key& key, const std::array<size_t, 5>& bytes, const at::Tensor& like, cudaStream_t stream,
                  F body) {
  if (is_capturing(stream)) {
    std::vector<at::Tensor> keep;
    std::array<void*, 5> ptrs;
    for (int i = 0; i < 5; ++i) {
      keep.push_back(at::empty({static_cast<int64_t>(std::max<size_t>(bytes[i], 1))}, like.options().dtype(at::kByte)));
      ptrs[i] = keep.back().data_ptr();
    }
    body(Scratch{ptrs[0], ptrs[1], ptrs[2], ptrs[3], ptrs[4]}, nullptr, nullptr, at::cuda::getCurrentCUDABlasHandle());
    return;
  }
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  DeviceResources& d = c.device(like.get_device());
  Entry& e = c.entry(key, [&](Entry& fresh) { make_entry(fresh, bytes, stream); });
  body(Scratch{e.args.ptr, e.w.ptr, e.vec.ptr, e.acc1.ptr, e.acc2.ptr}, &e, &d, d.handle);
}

}  // namespace

bool allow_tf32() { return at::globalContext().allowTF32CuBLAS(); }

void stepped_forward(const at::Tensor& gates, const at::Tensor& h0, const at::Tensor& c0,
                     const at::Tensor& weight_hh, const at::Tensor& lengths, const at::Tensor& output,
                     const at::Tensor& cells, const at::Tensor& h_n, const at::Tensor& c_n) {
  const int64_t T = gates.size(0), B = gates.size(1), H = h0.size(1);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const bool tf32 = allow_tf32();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, gates.scalar_type(), "lltm_stepped_forward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const StepArgs<scalar_t> host{gates.data_ptr<scalar_t>(), nullptr, output.data_ptr<scalar_t>(), nullptr,
                                  cells.data_ptr<scalar_t>(),  nullptr,
                                  lengths.defined() ? lengths.data_ptr<int64_t>() : nullptr, 0};
    const Key key{gates.get_device(), stream, static_cast<int>(gates.scalar_type()), B, H, false, tf32};
    const auto bytes = scratch_bytes(false, B, H, sizeof(scalar_t), sizeof(acc_t), sizeof(StepArgs<scalar_t>));
    with_scratch(key, bytes, gates, stream, [&](const Scratch& x, Entry* e, DeviceResources* d, cublasHandle_t handle) {
      auto* args = static_cast<StepArgs<scalar_t>*>(x.args);
      auto* h = static_cast<scalar_t*>(x.vec);
      auto* hw = static_cast<acc_t*>(x.acc1);
      auto* c = static_cast<acc_t*>(x.acc2);
      // A graph reads W_hh from the entry's copy; inside a caller's capture the GEMMs read it in place.
      const scalar_t* w = e ? static_cast<scalar_t*>(x.w) : weight_hh.data_ptr<scalar_t>();
      if (e) C10_CUDA_CHECK(cudaMemcpyAsync(x.w, weight_hh.data_ptr(), weight_hh.nbytes(), cudaMemcpyDeviceToDevice, stream));
      at::from_blob(h, {B, H}, gates.options()).copy_(h0);
      at::from_blob(c, {B, H}, gates.options().dtype(at::toOpMathType(gates.scalar_type()))).copy_(c0);
      set_args<scalar_t><<<1, 1, 0, stream>>>(args, host);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      auto issue = [&](cudaStream_t s, int steps, bool advance_t) {
        for (int i = 0; i < steps; ++i) {
          gemm<scalar_t, acc_t>(handle, CUBLAS_OP_T, 3 * H, B, H, w, H, h, H, acc_t(0), hw, 3 * H, tf32);
          forward_step<scalar_t, acc_t><<<blocks_for(B * H), kThreads, 0, s>>>(args, hw, h, c, B, H, i);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        }
        if (advance_t) {
          advance<scalar_t><<<1, 1, 0, s>>>(args, steps);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        }
      };
      if (e) {
        replay(*e, *d, stream, T, [&](cudaStream_t s, int steps) { issue(s, steps, true); });
      } else {
        issue(stream, static_cast<int>(T), false);
      }
      h_n.copy_(at::from_blob(h, {B, H}, gates.options()));
      c_n.copy_(at::from_blob(c, {B, H}, gates.options().dtype(at::toOpMathType(gates.scalar_type()))));
    });
  });
}

void stepped_backward(const at::Tensor& grad_output, const at::Tensor& grad_h_n, const at::Tensor& grad_c_n,
                      const at::Tensor& activations, const at::Tensor& cells, const at::Tensor& weight_hh,
                      const at::Tensor& lengths, const at::Tensor& grad_gates, const at::Tensor& grad_h0,
                      const at::Tensor& grad_c0) {
  const int64_t T = activations.size(0), B = activations.size(1), H = cells.size(2);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const bool tf32 = allow_tf32();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, activations.scalar_type(), "lltm_stepped_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto acc_opts = activations.options().dtype(at::toOpMathType(activations.scalar_type()));
    const StepArgs<scalar_t> host{activations.data_ptr<scalar_t>(),
                                  grad_gates.data_ptr<scalar_t>(),
                                  nullptr,
                                  cells.data_ptr<scalar_t>(),
                                  nullptr,
                                  grad_output.defined() ? grad_output.data_ptr<scalar_t>() : nullptr,
                                  lengths.defined() ? lengths.data_ptr<int64_t>() : nullptr,
                                  T - 1};
    const Key key{activations.get_device(), stream, static_cast<int>(activations.scalar_type()), B, H, true, tf32};
    const auto bytes = scratch_bytes(true, B, H, sizeof(scalar_t), sizeof(acc_t), sizeof(StepArgs<scalar_t>));
    with_scratch(key, bytes, activations, stream, [&](const Scratch& x, Entry* e, DeviceResources* d, cublasHandle_t handle) {
      auto* args = static_cast<StepArgs<scalar_t>*>(x.args);
      auto* dg = static_cast<scalar_t*>(x.vec);
      auto* dh = static_cast<acc_t*>(x.acc1);
      auto* dc = static_cast<acc_t*>(x.acc2);
      const scalar_t* w = e ? static_cast<scalar_t*>(x.w) : weight_hh.data_ptr<scalar_t>();
      if (e) C10_CUDA_CHECK(cudaMemcpyAsync(x.w, weight_hh.data_ptr(), weight_hh.nbytes(), cudaMemcpyDeviceToDevice, stream));
      at::Tensor dh_t = at::from_blob(dh, {B, H}, acc_opts), dc_t = at::from_blob(dc, {B, H}, acc_opts);
      if (grad_h_n.defined()) {
        dh_t.copy_(grad_h_n);
      } else {
        dh_t.zero_();
      }
      if (grad_c_n.defined()) {
        dc_t.copy_(grad_c_n);
      } else {
        dc_t.zero_();
      }
      set_args<scalar_t><<<1, 1, 0, stream>>>(args, host);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      auto issue = [&](cudaStream_t s, int steps, bool advance_t) {
        for (int i = 0; i < steps; ++i) {
          backward_step<scalar_t, acc_t><<<blocks_for(B * H), kThreads, 0, s>>>(args, dh, dc, dg, B, H, i);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
          // dh (H x B, column-major) += W (H x 3H) dg (3H x B)
          gemm<scalar_t, acc_t>(handle, CUBLAS_OP_N, H, B, 3 * H, w, H, dg, 3 * H, acc_t(1), dh, H, tf32);
        }
        if (advance_t) {
          advance<scalar_t><<<1, 1, 0, s>>>(args, -steps);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        }
      };
      if (e) {
        replay(*e, *d, stream, T, [&](cudaStream_t s, int steps) { issue(s, steps, true); });
      } else {
        issue(stream, static_cast<int>(T), false);
      }
      grad_h0.copy_(dh_t);
      grad_c0.copy_(dc_t);
    });
  });
}

}  // namespace cuda
}  // namespace lltm
