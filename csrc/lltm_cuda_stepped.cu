// Stepped recurrence of every cell, for the shapes the persistent kernels do not take: per time step one
// cuBLAS GEMM (h_{t-1} W_hh^T forward, dgates_t W_hh backward) and one fused pointwise kernel (cells.h).
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
#include "cell_list.h"
#include "lltm.h"

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
  scalar_t* gates;              // (T, B, G H): x-side pre-activations; forward only
  scalar_t* activations;        // (T, B, A H): written forward (may be `gates`), read backward
  scalar_t* grad_gates;         // (T, B, kGradBlocks H), backward
  scalar_t* output;             // (T, B, H): written forward, read backward (h_{t-1} of the GRU)
  scalar_t* cells;              // (T, B, C H): c_t; written forward, read backward (cells with a c state)
  const scalar_t* grad_output;  // (T, B, H), backward; may be null
  const scalar_t* bias_hn;      // (H,) the split gate's h-side bias, forward; may be null
  const scalar_t* h0;           // (B, H), backward (h_{t-1} at t = 0)
  const scalar_t* c0;           // (B, C H), backward (c_{t-1} at t = 0)
  const int64_t* lengths;       // (B,) or null
  const scalar_t* zoneout;      // (T, B, S H) zoneout factors (lltm.h), or null
  int64_t t;                    // the step of a chunk's first node; each chunk advances it
  int64_t act_step, cell_step;  // forward: elements between steps of activations, cells (0: one slot, lltm.h)
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

// The zoneout factors of (row, unit j), from (T B, S H) factors (h's block, then c's); off without them.
template <typename Cell, typename acc_t, typename scalar_t>
__device__ __forceinline__ Zoneout<acc_t> zoneout_at(const scalar_t* z, int64_t row, int64_t j, int64_t H) {
  if (!z) return {};
  constexpr int S = Cell::kHasCell ? 2 : 1;
  const scalar_t* r = z + row * S * H + j;
  return {true, acc_t(r[0]), Cell::kHasCell ? acc_t(r[H]) : acc_t(0)};
}

// Step args->t + i: hw (B, G H) = h_{t-1} W_hh^T from the GEMM; h (B, H), c (B, C H): the running state.
template <typename Cell, typename scalar_t, typename acc_t>
__global__ void forward_step_kernel(const StepArgs<scalar_t>* __restrict__ args, const acc_t* __restrict__ hw,
                                    scalar_t* __restrict__ h, acc_t* __restrict__ c, int64_t B, int64_t H, int i) {
  constexpr int G = Cell::kGates, C = Cell::kCellBlocks;
  const int64_t t = args->t + i;
  const int64_t n = B * H;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = k / H, j = k - b * H, row = t * B + b;
    acc_t gh[G];
    load_blocks(hw + b * G * H + j, H, gh);
    if (Cell::kSplit && args->bias_hn) gh[G - 1] += acc_t(args->bias_hn[j]);
    const int64_t kc = b * C * H + j;  // the unit's first state block
    CellState<Cell, acc_t> cv{};
    if (Cell::kHasCell) load_state(c + kc, H, cv);
    acc_t hv = acc_t(h[k]);
    forward_step<Cell, DeviceMath>(running(args->lengths, b, t), args->gates + row * G * H + j, gh, cv, hv,
                                   args->activations + t * args->act_step + b * Cell::kSaved * H + j,
                                   args->output + row * H + j,
                                   Cell::kHasCell ? args->cells + t * args->cell_step + kc : nullptr, H,
                                   zoneout_at<Cell, acc_t>(args->zoneout, row, j, H));
    h[k] = scalar_t(hv);
    if (Cell::kHasCell) store_state(c + kc, H, cv);
  }
}

// Step args->t - i. dh (B, H): on entry what the later steps pass back to h_t, on return the part of dL/dh_{t-1}
// that does not go through W_hh, to which the GEMM then adds dgates_t W_hh. dc (B, C H): dL/dc, as the cells'
// backward. dg: scratch copy of the h-side gate gradients (B, G H), the GEMM's input.
template <typename Cell, typename scalar_t, typename acc_t>
__global__ void backward_step_kernel(const StepArgs<scalar_t>* __restrict__ args, acc_t* __restrict__ dh,
                                     acc_t* __restrict__ dc, scalar_t* __restrict__ dg, int64_t B, int64_t H, int i) {
  constexpr int G = Cell::kGates, GB = Cell::kGradBlocks, C = Cell::kCellBlocks;
  const int64_t t = args->t - i;
  const int64_t n = B * H;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = k / H, j = k - b * H, row = t * B + b;
    const int64_t prev = (t - 1) * B * H + k;  // (t - 1, b, j)
    const int64_t kc = b * C * H + j, row_c = row * C * H + j, prev_c = (t - 1) * B * C * H + kc;  // c state
    CellState<Cell, acc_t> c{}, c_prev{}, dcv{};
    acc_t h_prev = 0, grads[GB];
    if (Cell::kHasCell) {
      load_state(dc + kc, H, dcv);
      load_state(args->cells + row_c, H, c);
    }
    if (Cell::kNeedsCPrev || (Cell::kHasCell && args->zoneout)) {
      load_state(t > 0 ? args->cells + prev_c : args->c0 + kc, H, c_prev);
    }
    if (Cell::kNeedsHPrev) h_prev = acc_t(t > 0 ? args->output[prev] : args->h0[k]);
    const acc_t d_out = args->grad_output ? acc_t(args->grad_output[row * H + j]) : acc_t(0);
    dh[k] = backward_step<Cell, DeviceMath>(running(args->lengths, b, t), dh[k], d_out, dcv,
                                            args->activations + row * Cell::kSaved * H + j, c, c_prev, h_prev, grads,
                                            args->grad_gates + row * GB * H + j, H,
                                            zoneout_at<Cell, acc_t>(args->zoneout, row, j, H));
    if (Cell::kHasCell) store_state(dc + kc, H, dcv);
    scalar_t* d = dg + b * G * H + j;
#pragma unroll
    for (int q = 0; q < G; ++q) d[q * H] = scalar_t(grads[q]);
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

// One shape's scratch buffers and graphs (per device, stream, cell, dtype, B, H, direction, TF32 setting).
// Buffers: the StepArgs block; a copy of W_hh (G H, H), the GEMM's fixed operand; `vec` (scalar_t):
// the running h (B, H) forward or a copy of the h-side gate gradients (B, G H) backward; `acc1`, `acc2`
// (accumulate type): h W_hh^T (B, G H) and the cell state (B, C H) forward, dL/dh (B, H) and dL/dc (B, C H)
// backward.
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

// (device, stream, cell, dtype, B, H, backward, TF32). The cell is named by its own identity (cell_id), never by
// its shape: two cells of one shape (the RNN's tanh and ReLU forms) must not replay each other's graphs.
using Key = std::tuple<int, cudaStream_t, const void*, int, int64_t, int64_t, bool, bool>;

// An address unique to each cell type.
template <typename Cell>
const void* cell_id() {
  static const char id = 0;
  return &id;
}

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

// Byte sizes of the five scratch buffers of one direction, for G gates and C blocks of c state.
std::array<size_t, 5> scratch_bytes(bool backward, int G, int C, int64_t B, int64_t H, size_t scalar, size_t acc,
                                    size_t args) {
  const size_t w = size_t(G * H * H) * scalar, gates = size_t(G * B * H), state = size_t(B * H);
  const size_t cell = std::max<size_t>(C, 1) * state;
  return backward ? std::array<size_t, 5>{args, w, gates * scalar, state * acc, cell * acc}
                  : std::array<size_t, 5>{args, w, state * scalar, gates * acc, cell * acc};
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

template <typename Cell>
void stepped_forward(const ForwardTensors& f) {
  constexpr int G = Cell::kGates;
  const int64_t T = f.gates.size(0), B = f.gates.size(1), H = f.h0.size(1);
  TORCH_INTERNAL_ASSERT(f.num_heads == 1, "lltm: the stepped path takes heads as their dense matrix");
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const bool tf32 = allow_tf32();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, f.gates.scalar_type(), "lltm_stepped_forward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto acc_opts = f.gates.options().dtype(at::toOpMathType(f.gates.scalar_type()));
    const StepArgs<scalar_t> host{f.gates.data_ptr<scalar_t>(),
                                  f.activations.data_ptr<scalar_t>(),
                                  nullptr,
                                  f.output.data_ptr<scalar_t>(),
                                  Cell::kHasCell ? f.cells.data_ptr<scalar_t>() : nullptr,
                                  nullptr,
                                  f.bias_hn.defined() ? f.bias_hn.data_ptr<scalar_t>() : nullptr,
                                  nullptr,
                                  nullptr,
                                  f.lengths.defined() ? f.lengths.data_ptr<int64_t>() : nullptr,
                                  f.zoneout.defined() ? f.zoneout.data_ptr<scalar_t>() : nullptr,
                                  0,
                                  step_stride(f.activations),
                                  step_stride(f.cells)};
    const Key key{f.gates.get_device(), stream, cell_id<Cell>(), static_cast<int>(f.gates.scalar_type()),
                  B, H, false, tf32};
    const auto bytes = scratch_bytes(false, G, Cell::kCellBlocks, B, H, sizeof(scalar_t), sizeof(acc_t), sizeof(StepArgs<scalar_t>));
    with_scratch(key, bytes, f.gates, stream, [&](const Scratch& x, Entry* e, DeviceResources* d, cublasHandle_t handle) {
      auto* args = static_cast<StepArgs<scalar_t>*>(x.args);
      auto* h = static_cast<scalar_t*>(x.vec);
      auto* hw = static_cast<acc_t*>(x.acc1);
      auto* c = static_cast<acc_t*>(x.acc2);
      // A graph reads W_hh from the entry's copy; inside a caller's capture the GEMMs read it in place.
      const scalar_t* w = e ? static_cast<scalar_t*>(x.w) : f.weight_hh.data_ptr<scalar_t>();
      if (e) {
        C10_CUDA_CHECK(
            cudaMemcpyAsync(x.w, f.weight_hh.data_ptr(), f.weight_hh.nbytes(), cudaMemcpyDeviceToDevice, stream));
      }
      at::from_blob(h, {B, H}, f.gates.options()).copy_(f.h0);
      if (Cell::kHasCell) at::from_blob(c, {B, Cell::kCellBlocks * H}, acc_opts).copy_(f.c0);
      set_args<scalar_t><<<1, 1, 0, stream>>>(args, host);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      auto issue = [&](cudaStream_t s, int steps, bool advance_t) {
        for (int i = 0; i < steps; ++i) {
          gemm<scalar_t, acc_t>(handle, CUBLAS_OP_T, G * H, B, H, w, H, h, H, acc_t(0), hw, G * H, tf32);
          forward_step_kernel<Cell, scalar_t, acc_t><<<blocks_for(B * H), kThreads, 0, s>>>(args, hw, h, c, B, H, i);
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
      f.h_n.copy_(at::from_blob(h, {B, H}, f.gates.options()));
      if (Cell::kHasCell) f.c_n.copy_(at::from_blob(c, {B, Cell::kCellBlocks * H}, acc_opts));
    });
  });
}

template <typename Cell>
void stepped_backward(const BackwardTensors& g) {
  constexpr int G = Cell::kGates;
  const int64_t T = g.activations.size(0), B = g.activations.size(1), H = g.h0.size(1);
  TORCH_INTERNAL_ASSERT(g.num_heads == 1, "lltm: the stepped path takes heads as their dense matrix");
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const bool tf32 = allow_tf32();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.activations.scalar_type(), "lltm_stepped_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto acc_opts = g.activations.options().dtype(at::toOpMathType(g.activations.scalar_type()));
    const StepArgs<scalar_t> host{nullptr,
                                  g.activations.data_ptr<scalar_t>(),
                                  g.grad_gates.data_ptr<scalar_t>(),
                                  g.output.data_ptr<scalar_t>(),
                                  Cell::kHasCell ? g.cells.data_ptr<scalar_t>() : nullptr,
                                  g.grad_output.defined() ? g.grad_output.data_ptr<scalar_t>() : nullptr,
                                  nullptr,
                                  g.h0.data_ptr<scalar_t>(),
                                  Cell::kHasCell ? g.c0.data_ptr<scalar_t>() : nullptr,
                                  g.lengths.defined() ? g.lengths.data_ptr<int64_t>() : nullptr,
                                  g.zoneout.defined() ? g.zoneout.data_ptr<scalar_t>() : nullptr,
                                  T - 1};
    const Key key{g.activations.get_device(), stream, cell_id<Cell>(),
                  static_cast<int>(g.activations.scalar_type()), B, H, true, tf32};
    const auto bytes = scratch_bytes(true, G, Cell::kCellBlocks, B, H, sizeof(scalar_t), sizeof(acc_t), sizeof(StepArgs<scalar_t>));
    with_scratch(key, bytes, g.activations, stream, [&](const Scratch& x, Entry* e, DeviceResources* d,
                                                        cublasHandle_t handle) {
      auto* args = static_cast<StepArgs<scalar_t>*>(x.args);
      auto* dg = static_cast<scalar_t*>(x.vec);
      auto* dh = static_cast<acc_t*>(x.acc1);
      auto* dc = static_cast<acc_t*>(x.acc2);
      const scalar_t* w = e ? static_cast<scalar_t*>(x.w) : g.weight_hh.data_ptr<scalar_t>();
      if (e) {
        C10_CUDA_CHECK(
            cudaMemcpyAsync(x.w, g.weight_hh.data_ptr(), g.weight_hh.nbytes(), cudaMemcpyDeviceToDevice, stream));
      }
      at::Tensor dh_t = at::from_blob(dh, {B, H}, acc_opts);
      at::Tensor dc_t = at::from_blob(dc, {B, std::max(Cell::kCellBlocks, 1) * H}, acc_opts);
      if (g.grad_h_n.defined()) {
        dh_t.copy_(g.grad_h_n);
      } else {
        dh_t.zero_();
      }
      if (Cell::kHasCell) {
        if (g.grad_c_n.defined()) {
          dc_t.copy_(g.grad_c_n);
        } else {
          dc_t.zero_();
        }
      }
      set_args<scalar_t><<<1, 1, 0, stream>>>(args, host);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      auto issue = [&](cudaStream_t s, int steps, bool advance_t) {
        for (int i = 0; i < steps; ++i) {
          backward_step_kernel<Cell, scalar_t, acc_t><<<blocks_for(B * H), kThreads, 0, s>>>(args, dh, dc, dg, B, H, i);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
          // dh (H x B, column-major) += W (H x G H) dg (G H x B)
          gemm<scalar_t, acc_t>(handle, CUBLAS_OP_N, H, B, G * H, w, H, dg, G * H, acc_t(1), dh, H, tf32);
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
      g.grad_h0.copy_(dh_t);
      if (Cell::kHasCell) g.grad_c0.copy_(dc_t);
    });
  });
}

#define LLTM_STEPPED(CELL)                                         \
  template void stepped_forward<CELL>(const ForwardTensors&); \
  template void stepped_backward<CELL>(const BackwardTensors&);
LLTM_FOR_EACH_CELL(LLTM_STEPPED)
#undef LLTM_STEPPED

}  // namespace cuda
}  // namespace lltm
