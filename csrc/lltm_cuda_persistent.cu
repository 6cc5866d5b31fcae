// Persistent recurrence: one launch runs all T steps, forward or backward, with W_hh on chip. A template over the
// cells of cells.h; which cells, dtypes and hidden sizes have a kernel: `with_hidden_size`.
//
// Batch rows never interact, so each thread-block cluster owns 8 batch rows (the N of one tensor-core product) and
// splits the H hidden units over its C blocks. Block r keeps, in registers, the slice of W_hh that its U = H / C
// units need, and the cell state of its (unit, row) pairs stays in registers for the whole sequence. Per step the
// blocks exchange only h (forward) or the partial dL/dh (backward) through distributed shared memory: asynchronous
// stores that each receiver counts on an mbarrier, with no cluster-wide barrier (clusters of 16 keep one:
// async_exchange); nothing goes through global memory except the inputs and outputs each step must read and write
// anyway. The wide kernels (H 768 and 1024, is_wide) are the exception: their blocks are in no cluster, and h and
// the partial dL/dh go through L2 (put_flagged). (Design and measurements: benchmarks/log/, 2026-11-30 to
// 2026-12-02, and benchmarks/2026-12-06_h100_wide/; the layout follows the Persistent RNN idea of Diamos et al.,
// 2016, with the grid-wide barrier replaced by thread-block clusters and their distributed shared memory, available
// from compute capability 9.0.)
//
// Forward step, block r, 8 rows: gates_own^T (G U x 8) = W_own (G U x H) . h_{t-1}^T (H x 8) on tensor
// cores (the K dimension split over warps, partial sums reduced in shared memory), plus the x-projection
// of the step; then the pointwise math (cells.h), the outputs, and h_t pushed to every block.
// Backward step: pointwise backward of the block's own units, then the partial
// dL/dh_{t-1} (H x 8) = W_own^T (H x G U) . dgates_own^T (G U x 8), scattered to the owners of the units,
// which add the C partial sums in a fixed order (deterministic).
// float32 runs here only with its products in TF32 (allow_tf32); float32 precision takes the stepped path.
// Heads (lltm.h): the grid has a row of clusters per head, each an independent recurrence whose width is the
// kernel's H (the head's DH), on its units of the layer's `width` and its blocks of W_hh.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <map>
#include <type_traits>
#include <utility>

#include "lltm_cuda.h"
#include "cell_list.h"

namespace lltm {
namespace cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kRows = 8;  // batch rows per cluster: the N of mma.m16n8k*
// Waves of clusters up to which the persistent kernels beat one GEMM per step over the whole batch (the stepped
// path), measured on an H200 for every cell (scripts/persistent_waves.py,
// benchmarks/log/2026-12-01_lstm-gru-persistent-kernels.md), T = 128: about 4 for H <= 128 (bfloat16, B = 1024 runs
// at 1.11x-1.45x the stepped path) and for float32 at H = 256 (B = 512 at 1.19x-1.27x); 2 for 16-bit H = 256 (B = 256
// at 1.07x-1.12x, B = 512 at 0.76x-0.79x) and for H = 512, where 7 clusters of 16 blocks fit at once (B = 96 at
// 1.28x-1.31x, B = 128 at 0.95x).
template <typename scalar_t>
constexpr int max_waves(int H) { return H <= 128 || (H <= 256 && sizeof(scalar_t) == 4) ? 4 : 2; }

__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <typename scalar_t>
__device__ __forceinline__ void mma_16bit(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

// The per-step exchange: each block's stores into the other blocks' shared memory are `st.async`s that count their
// bytes on the receiver's mbarrier (one per buffer parity), and the receiver waits only for its own barrier's phase.
// No cluster-wide barrier, and no release fence that waits for the sender's stores to land (a cluster barrier cost
// about 1,200 of the 2,600 cycles of a forward step at H = 128: benchmarks/log/2026-12-02_s07-st-async-exchange.md).
// Reuse of a buffer two steps later is safe without more: a block writes buffer b at step t only after it has
// received every block's output of step t - 1, which each block sends after its last read of b.
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ uint32_t cluster_addr(uint32_t local, int rank) {  // the same offset in block `rank`
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}

__device__ __forceinline__ void mbarrier_init(uint32_t bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
}

// Arms the barrier's current phase: it completes once `bytes` have arrived (the one arrival is this call).
__device__ __forceinline__ void mbarrier_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

// Acquire at cluster scope: the bytes come from other blocks' st.async, whose completion is a release at
// cluster scope (the default, .cta, would not synchronise with it).
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// 4 bytes into another block's shared memory (cluster addresses), counted on its barrier.
__device__ __forceinline__ void store_remote(uint32_t addr, uint32_t value, uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(addr), "r"(value), "r"(bar)
               : "memory");
}

__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }

// Clusters of up to 8 blocks exchange through mbarriers. Clusters of 16 (H = 512) keep one cluster barrier a step:
// there compute-sanitizer's racecheck also reported the mbarriers' set-up (init, then the first arrive, one thread)
// as hazards, which it did not for 4 and 8 blocks (H200, 2026-12-02). Until that is understood, the barrier, which
// racecheck passes, stays there (the mbarriers ran 1.09x-1.11x faster at gpu-M:
// benchmarks/log/2026-12-02_s07-st-async-exchange.md).
constexpr bool async_exchange(int cluster) { return cluster <= 8; }

// A step's exchange between the blocks of a cluster: put() sends 4 bytes into another block's shared memory,
// end_step(s, prefetch) waits until this block has received everything for step s (the prefetch overlaps the
// wait), finish() before the kernel's exit. With kAsync, the two mbarriers: buffer b is filled for steps s with
// s % 2 == b, s >= 1, in the phases (s - 1) / 2 of its barrier; otherwise one cluster barrier a step.
template <bool kAsync>
struct Exchange {
  uint32_t base;  // the shared address of the barrier of buffer 0; buffer 1's follows
  uint32_t bytes;
  __device__ uint32_t bar(int b) const { return base + 8 * b; }
  // Block-local set-up, before the cluster.sync that precedes any remote store.
  __device__ void init(uint64_t (&bars)[2], uint32_t bytes_per_step) {
    if constexpr (kAsync) {
      bytes = bytes_per_step;
      base = smem_addr(&bars[0]);
      if (threadIdx.x == 0) {
        mbarrier_init(bar(0));
        mbarrier_init(bar(1));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        mbarrier_expect(bar(0), bytes);
        mbarrier_expect(bar(1), bytes);
      }
    }
  }
  // `local`: the address in this block's shared memory; the value lands at the same offset in block `rank`,
  // in the buffer of step s (s % 2).
  __device__ void put(const void* local, uint32_t value, int rank, int s) const {
    const uint32_t addr = cluster_addr(smem_addr(local), rank);
    if constexpr (kAsync) {
      store_remote(addr, value, cluster_addr(bar(s & 1), rank));
    } else {
      asm volatile("st.shared::cluster.u32 [%0], %1;" ::"r"(addr), "r"(value) : "memory");
    }
  }
  template <typename F>
  __device__ void end_step(int s, F prefetch) {
    if constexpr (kAsync) {
      prefetch();
      const uint32_t b = bar(s & 1);
      mbarrier_wait(b, ((s - 1) >> 1) & 1);
      if (threadIdx.x == 0) mbarrier_expect(b, bytes);  // armed again for step s + 2
    } else {
      cluster_arrive();
      prefetch();
      cluster_wait();
    }
  }
  __device__ void finish() {
    if constexpr (kAsync) cg::this_cluster().sync();  // no block exits while another may still write into it
  }
};

// The wide kernels keep the values loaded for the next step in their storage type until the step uses them:
// converting them at the load (16-bit to float) made each pointwise thread wait there for its loads, about 1,400
// cycles a step (clock64 probes), before it took its part in the exchange. The wide LSTM (H 768, B 16, fp16,
// H100): forward 2.93 -> 2.63 us a step, backward 3.36 -> 3.28 (benchmarks/2026-12-06_h100_wide/README.md). The
// cluster kernels wait for their cluster's barrier there anyway; they keep float (in their backward the 16-bit
// copies cost registers: spills grew at H 512), unmeasured either way.
template <typename acc_t, typename scalar_t, int N>
__device__ __forceinline__ void widen(const scalar_t (&from)[N], acc_t (&to)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) to[i] = acc_t(from[i]);
}
template <typename acc_t, typename scalar_t>
__device__ __forceinline__ acc_t widen(scalar_t x) {
  return acc_t(x);
}
template <typename acc_t, typename scalar_t>
__device__ __forceinline__ SLSTMState<acc_t> widen(const SLSTMState<scalar_t>& x) {
  return {acc_t(x.c), acc_t(x.n), acc_t(x.m)};
}

// The wide kernels' exchange, as NCCL's LL protocol: each 4-byte value travels with the step that sent it in one
// aligned 8-byte word, which a store writes and a load reads whole (single-copy atomic), so a receiver that sees
// the step sees the value, with no fence and no barrier. Against a counter barrier (fence, atomic add, spin, then
// the loads) it took a step of the LSTM at H 768 (B 16, float16, H100) from 3.65 to 2.90 us forward and 3.86 to
// 3.36 us backward; at H 1024 the backward, which sends twice the bytes of the partial sums, went 4.19 to 5.24 us
// (forward 3.65 to 3.28; 1.77 to 1.65 M tokens/s in all). One exchange serves both widths for the gain at 768, the
// width measured against cuDNN and FlashRNN; H 1024's backward is open work (issue 38). A buffer of one parity
// is written again two steps later, by a block that has received the step between, which every block sent only
// after receiving this one. Steps count from 1 in a zeroed buffer, so no word of an earlier launch passes for one
// of this launch.
__device__ __forceinline__ void put_flagged(uint64_t* to, uint32_t bits, unsigned step) {
  const uint64_t word = (static_cast<uint64_t>(step) << 32) | bits;
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(to), "l"(word) : "memory");
}

// The backward's partial sums travel two to a word: each rounded to its 24 high bits (float32 with 15 mantissa bits,
// a relative error of at most 2^-16, far below the 16-bit dL/dgates they are products of), with the step's 16 low
// bits as the flag, which tells a step from the one two steps before (the word's last) and from a zeroed word (step
// 65536 finds the word of step 65534). Half the bytes of one value to a word: the LSTM's backward at H 768 spent
// about 1,600 cycles a step storing its 48 KB of words (clock64 probes, benchmarks/2026-12-06_h100_wide/).
__device__ __forceinline__ uint64_t to_float24(float v) {
  const uint32_t x = __float_as_uint(v);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fc000u;  // NaN stays NaN (rounding could make it inf)
  return (x + 0x7fu + ((x >> 8) & 1u)) >> 8;                // to nearest, ties to even; past the largest: inf
}
__device__ __forceinline__ float from_float24(uint64_t bits) { return __uint_as_float(static_cast<uint32_t>(bits & 0xffffffu) << 8); }
__device__ __forceinline__ void put_flagged_pair(uint64_t* to, float first, float second, unsigned step) {
  const uint64_t word = (static_cast<uint64_t>(step & 0xffffu) << 48) | (to_float24(first) << 24) | to_float24(second);
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(to), "l"(word) : "memory");
}

// Waits for words first + i * stride (i < R) of `from`, counted in pairs of words, to carry `step` in their top
// kFlagBits bits (32: put_flagged, 16: put_flagged_pair), and passes each pair of words to use(pair, low, high).
// Every round reloads all that are not there yet, at once.
template <int R, int kFlagBits = 32, typename F>
__device__ __forceinline__ void receive_flagged(const uint64_t* from, int first, int stride, unsigned step, F&& use) {
  unsigned flag = step;
  if constexpr (kFlagBits < 32) flag &= (1u << kFlagBits) - 1;
  uint64_t lo[R], hi[R];
  bool ready[R];
#pragma unroll
  for (int i = 0; i < R; ++i) ready[i] = false;
  bool all;
  do {
#pragma unroll
    for (int i = 0; i < R; ++i) {
      if (!ready[i]) {
        asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];"
                     : "=l"(lo[i]), "=l"(hi[i])
                     : "l"(from + 2 * static_cast<int64_t>(first + i * stride))
                     : "memory");
      }
    }
    all = true;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      ready[i] = static_cast<unsigned>(lo[i] >> (64 - kFlagBits)) == flag &&
                 static_cast<unsigned>(hi[i] >> (64 - kFlagBits)) == flag;
      all = all && ready[i];
    }
  } while (!all);
#pragma unroll
  for (int i = 0; i < R; ++i) use(first + i * stride, lo[i], hi[i]);
}

// Tensor-core operands of one element type. A: a 16 x KS tile of the weights, B: a KS x 8 tile of the
// exchanged vectors, stored in shared memory as [n][k] rows (`smem_t`). Fragment layouts are those of
// the PTX ISA for mma.m16n8k8 (tf32) and mma.m16n8k16 (bf16, f16).
template <typename scalar_t>
struct Operand;

template <>
struct Operand<float> {
  static constexpr int KS = 8;
  using smem_t = float;
  struct A {
    uint32_t r[4];
  };
  struct B {
    uint32_t r[2];
  };
  template <typename F>
  static __device__ __forceinline__ A load_a(F at, int gid, int tig) {
    return {{to_tf32(float(at(gid, tig))), to_tf32(float(at(gid + 8, tig))), to_tf32(float(at(gid, tig + 4))),
             to_tf32(float(at(gid + 8, tig + 4)))}};
  }
  static __device__ __forceinline__ B load_b(const float* s, int stride, int k0, int gid, int tig) {
    return {{to_tf32(s[gid * stride + k0 + tig]), to_tf32(s[gid * stride + k0 + tig + 4])}};
  }
  static __device__ __forceinline__ void mma(float (&d)[4], const A& a, const B& b) { mma_tf32(d, a.r, b.r); }
  static __device__ __forceinline__ float to_smem(float x) { return x; }
};

template <typename scalar_t>
struct Operand16 {
  static constexpr int KS = 16;
  using smem_t = scalar_t;
  struct A {
    uint32_t r[4];
  };
  struct B {
    uint32_t r[2];
  };
  static __device__ __forceinline__ uint32_t pack(scalar_t lo, scalar_t hi) {
    return static_cast<uint32_t>(lo.x) | (static_cast<uint32_t>(hi.x) << 16);
  }
  template <typename F>
  static __device__ __forceinline__ A load_a(F at, int gid, int tig) {
    A a;
    a.r[0] = pack(at(gid, 2 * tig), at(gid, 2 * tig + 1));
    a.r[1] = pack(at(gid + 8, 2 * tig), at(gid + 8, 2 * tig + 1));
    a.r[2] = pack(at(gid, 2 * tig + 8), at(gid, 2 * tig + 9));
    a.r[3] = pack(at(gid + 8, 2 * tig + 8), at(gid + 8, 2 * tig + 9));
    return a;
  }
  static __device__ __forceinline__ B load_b(const scalar_t* s, int stride, int k0, int gid, int tig) {
    B b;
    b.r[0] = *reinterpret_cast<const uint32_t*>(s + gid * stride + k0 + 2 * tig);
    b.r[1] = *reinterpret_cast<const uint32_t*>(s + gid * stride + k0 + 2 * tig + 8);
    return b;
  }
  static __device__ __forceinline__ void mma(float (&d)[4], const A& a, const B& b) { mma_16bit<scalar_t>(d, a.r, b.r); }
  static __device__ __forceinline__ scalar_t to_smem(float x) { return scalar_t(x); }
};

template <>
struct Operand<c10::BFloat16> : Operand16<c10::BFloat16> {};
template <>
struct Operand<c10::Half> : Operand16<c10::Half> {};

// Blocks per cluster for a hidden size: 16 or 32 units per block. Clusters of 16 (H = 512) are beyond the
// portable limit of 8; Hopper allows them once the kernel opts in (allow_cluster below).
constexpr int cluster_size(int H) { return H <= 128 ? 4 : H <= 256 ? 8 : 16; }

// Wider recurrences (16-bit, H = 768 and 1024) need more blocks than a cluster has: at 16 units a block, the
// weights of a block fit in registers as at H = 512, and the H / 16 blocks of a row group, in no cluster, exchange
// h (forward) and the partial dL/dh (backward) through global memory (L2) in flagged 8-byte words: two 16-bit h
// values with the step (put_flagged), two float24 partial sums with its 16 low bits (put_flagged_pair). The grid
// must be resident at once: a cooperative launch, one wave only.
constexpr bool is_wide(int H) { return H > 512; }
constexpr int blocks_per_group(int H) { return is_wide(H) ? H / 16 : cluster_size(H); }

// Padded row stride of an [8][n] shared tile so that the B-fragment loads of a warp hit 32 banks:
// the stride in 32-bit words must be 4 mod 8.
template <typename smem_t>
constexpr int padded(int n) {
  return sizeof(smem_t) == 4 ? n + 4 : n + 8;
}

template <typename Cell, typename scalar_t, int H>
struct ForwardConfig {
  using Op = Operand<scalar_t>;
  static constexpr int NG = Cell::kGates;     // gates
  static constexpr bool kWide = is_wide(H);
  static constexpr int C = blocks_per_group(H);  // blocks of a row group: a cluster's, or (wide) H / 16
  static constexpr int U = H / C;            // units per block
  static constexpr int G = U / 16;           // 16-unit groups (one m16 tile per gate)
  static constexpr int NK = H / Op::KS;      // k-steps of the product
  static constexpr int kWarpTarget = H >= 256 ? 16 : 8;
  static constexpr int S = kWarpTarget / G < NK ? kWarpTarget / G : NK;  // K split over warps
  static constexpr int WARPS = G * S;
  static constexpr int NT = WARPS * 32;
  static constexpr int NKW = NK / S;         // k-steps per warp
  static constexpr int HS = padded<typename Op::smem_t>(H);
  static constexpr int RS = U + 4;           // partial-sum rows: conflict-free stores from fragments
  static constexpr int PAIRS = U * kRows;
  static constexpr int NP = (PAIRS + NT - 1) / NT;
  // Dynamic shared memory: h_{t-1} of the cluster's rows, then the partial gate sums of the K split, each
  // double-buffered (the LSTM's 4 gates at H = 512 need 90 KB, beyond the 48 KB a kernel may declare statically).
  static constexpr int kHbufBytes = 2 * kRows * HS * static_cast<int>(sizeof(typename Op::smem_t));
  static constexpr int kSmemBytes = kHbufBytes + 2 * S * NG * kRows * RS * static_cast<int>(sizeof(float));
  static_assert(H % (16 * C) == 0 && NK % S == 0, "unsupported hidden size");
  static_assert(kHbufBytes % 16 == 0 && kSmemBytes <= 227 * 1024, "shared memory");
};

template <typename Cell, typename scalar_t, int H>
struct BackwardConfig {
  using Op = Operand<scalar_t>;
  static constexpr bool kWide = is_wide(H);
  static constexpr int C = blocks_per_group(H);
  static constexpr int U = H / C;
  static constexpr int WARPS = kWide ? 16 : H / 16;  // m16 tiles of dL/dh: one per warp, MT per warp when wide
  static constexpr int MT = H / 16 / WARPS;
  static constexpr int NT = WARPS * 32;
  static constexpr int KG = Cell::kGates * U;  // the block's own h-side gate rows: the K of the product
  static constexpr int NKB = KG / Op::KS;
  static constexpr int DS = padded<typename Op::smem_t>(KG);
  static constexpr int RS = U + 4;
  static constexpr int PAIRS = U * kRows;
  static constexpr int NP = (PAIRS + NT - 1) / NT;
  static_assert(KG % Op::KS == 0 && H % (16 * WARPS) == 0, "unsupported hidden size");
};

template <typename scalar_t>
struct ForwardParams {
  const scalar_t* gates;  // (T, B, G H): the x-side pre-activations
  scalar_t* act;          // (T, B, A H): the saved activations (may be `gates`: read before written)
  scalar_t* output;
  scalar_t* cells;        // (T, B, C H) c_t (C = Cell::kCellBlocks); null without a c state, as c0, c_n
  scalar_t* h_n;
  scalar_t* c_n;
  const scalar_t* h0;
  const scalar_t* c0;
  const scalar_t* w_hh;
  const scalar_t* bias_hn;  // (H,) or null
  const int64_t* lengths;   // (B,) or null
  const scalar_t* zoneout;  // (T, B, S H) zoneout factors (lltm.h), or null
  int T;
  int64_t B;
  int64_t width;                // the layer's hidden size: its heads (grid rows) of the kernel's H units each
  int64_t act_step, cell_step;  // elements between steps of act, cells (0: one slot that every step overwrites)
  uint64_t* exchange;           // wide kernels: h_t, [2][heads][groups][kRows][H / pack] flagged words; else null
};

template <typename scalar_t>
struct BackwardParams {
  const scalar_t* act;     // (T, B, A H): the saved activations
  scalar_t* dgates;        // (T, B, kGradBlocks H): gate gradients out
  const scalar_t* cells;   // c_t (cells with a c state; rows of C H, as c0, grad_c_n, grad_c0)
  const scalar_t* output;  // h_t (h_{t-1} of the GRU)
  const scalar_t* h0;
  const scalar_t* c0;
  const scalar_t* grad_output;  // each of these three may be null (zeros)
  const scalar_t* grad_h_n;
  const scalar_t* grad_c_n;
  const scalar_t* w_hh;
  const int64_t* lengths;
  const scalar_t* zoneout;  // as the forward's
  scalar_t* grad_h0;
  scalar_t* grad_c0;
  int T;
  int64_t B;
  int64_t width;  // as the forward's
  uint64_t* exchange;  // wide kernels: partial dL/dh, [2][heads][groups][owner][sender][kRows / 2][16] words; else null
};

template <typename Cell, typename scalar_t, int H>
__global__ void __launch_bounds__(ForwardConfig<Cell, scalar_t, H>::NT, 1)
    forward_kernel(const ForwardParams<scalar_t> p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // thread-block clusters need compute capability 9.0; persistent_supports() says so first
#else
  using Cfg = ForwardConfig<Cell, scalar_t, H>;
  using Op = typename Cfg::Op;
  using smem_t = typename Op::smem_t;
  constexpr int NG = Cfg::NG, A = Cell::kSaved, CB = Cell::kCellBlocks;
  constexpr int C = Cfg::C, U = Cfg::U, G = Cfg::G, S = Cfg::S, NKW = Cfg::NKW, HS = Cfg::HS, RS = Cfg::RS;
  constexpr int NT = Cfg::NT, NP = Cfg::NP, KS = Op::KS;
  extern __shared__ __align__(16) unsigned char smem[];
  auto& hbuf = *reinterpret_cast<smem_t(*)[2][kRows][HS]>(smem);             // h_{t-1}, double-buffered
  // The partial gate sums, double-buffered: step t + 1 writes the other buffer, so that __syncthreads (which
  // compute-sanitizer's racecheck follows) orders those writes after step t's reads. (Without it they are
  // ordered too: every thread that reads them sends its h into its own block afterwards, and the writers wait
  // for those bytes; racecheck does not follow that chain and flagged it.)
  auto& red = *reinterpret_cast<float(*)[2][S][NG][kRows][RS]>(smem + Cfg::kHbufBytes);

  constexpr bool kWide = Cfg::kWide;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = kWide ? static_cast<int>(blockIdx.x % C) : static_cast<int>(cluster.block_rank());
  const int64_t group = blockIdx.x / C, b_base = group * kRows;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gid = lane / 4, tig = lane % 4;
  const int ug = warp % G, ks = warp / G;
  const int T = p.T;
  const int64_t B = p.B;
  // Heads (lltm.h): grid row blockIdx.y runs head blockIdx.y, an independent recurrence of H units: the layer's
  // units [head, head + H) of its HW, with the rows q HW + head + ... of W_hh's blocks (H columns each).
  const int64_t HW = p.width, head = static_cast<int64_t>(blockIdx.y) * H, own = head + rank * U;

  typename Op::A wf[NG][NKW];
#pragma unroll
  for (int q = 0; q < NG; ++q) {
#pragma unroll
    for (int kk = 0; kk < NKW; ++kk) {
      const scalar_t* w = p.w_hh + (q * HW + own + ug * 16) * H + (ks * NKW + kk) * KS;
      wf[q][kk] = Op::load_a([&](int m, int k) { return w[m * H + k]; }, gid, tig);
    }
  }
  for (int idx = tid; idx < kRows * H; idx += NT) {
    const int n = idx / H, k = idx % H;
    const int64_t b = b_base + n;
    hbuf[0][n][k] = b < B ? Op::to_smem(float(p.h0[b * HW + head + k])) : Op::to_smem(0.f);
  }
  CellState<Cell, float> c[NP];  // the c state of the thread's (unit, row) pairs: the state blocks CB HW apart
  float h[NP], bhn[NP];
  // The next step's inputs: x, the zoneout factors zh, zc (wide kernels: in their storage type until used, widen()).
  using load_t = std::conditional_t<kWide, scalar_t, float>;
  load_t x[NP][NG], zh[NP], zc[NP];
  using Math = std::conditional_t<sizeof(scalar_t) == 2, FastDeviceMath, DeviceMath>;  // 16-bit: the SFU (lltm_cuda.h)
  int len[NP];
  constexpr int NS = Cell::kHasCell ? 2 : 1;  // states (zoneout's factor blocks)
#pragma unroll
  for (int j = 0; j < NP; ++j) {
    const int pair = tid + j * NT, u = pair % U, n = pair / U;
    const int64_t b = b_base + n;
    const bool valid = pair < Cfg::PAIRS && b < B;
    c[j] = {};
    if (valid && Cell::kHasCell) load_state(p.c0 + b * CB * HW + own + u, HW, c[j]);
    h[j] = valid ? float(p.h0[b * HW + own + u]) : 0.f;
    bhn[j] = Cell::kSplit && p.bias_hn ? float(p.bias_hn[own + u]) : 0.f;
    len[j] = valid ? (p.lengths ? static_cast<int>(p.lengths[b]) : T) : 0;
    zh[j] = zc[j] = load_t(0.f);
  }
  __shared__ uint64_t bars[2];
  Exchange<async_exchange(C)> exchange;
  exchange.init(bars, kRows * H * sizeof(smem_t));
  // 16-bit h travels in pairs of units (put() stores 4 bytes, as st.async does at least): even lanes send their
  // own and their odd neighbour's. Own units u and u + 1 sit in lanes tid and tid ^ 1 (U is even).
  constexpr int kPack = sizeof(smem_t) == 4 ? 1 : 2;
  constexpr int kWords = kRows * H / kPack;  // h of a row group, in 4-byte words
  // Wide kernels: this row group's h_t in the exchange buffer of parity t % 2.
  const int64_t slot = static_cast<int64_t>(blockIdx.y) * (gridDim.x / C) + group;
  auto exchanged = [&](int t) { return p.exchange + ((t & 1) * int64_t{gridDim.y} * (gridDim.x / C) + slot) * kWords; };

  auto load_x = [&](int t) {
#pragma unroll
    for (int j = 0; j < NP; ++j) {
      const int pair = tid + j * NT, u = pair % U;
      const int64_t b = b_base + pair / U;
      if (t < len[j]) {
        load_blocks(p.gates + (static_cast<int64_t>(t) * B + b) * NG * HW + own + u, HW, x[j]);
        if (p.zoneout) {
          const scalar_t* z = p.zoneout + (static_cast<int64_t>(t) * B + b) * NS * HW + own + u;
          zh[j] = load_t(z[0]);
          zc[j] = Cell::kHasCell ? load_t(z[HW]) : load_t(0.f);
        }
      }
    }
  };
  load_x(0);
  if constexpr (kWide) {
    __syncthreads();  // the block's h buffer filled before any warp reads it
  } else {
    cluster.sync();  // every block has started and filled its h buffer before any remote write
  }

  for (int t = 0; t < T; ++t) {
    const int cur = t & 1;
    float acc[NG][4] = {};
#pragma unroll
    for (int kk = 0; kk < NKW; ++kk) {
      const typename Op::B bf = Op::load_b(&hbuf[cur][0][0], HS, (ks * NKW + kk) * KS, gid, tig);
#pragma unroll
      for (int q = 0; q < NG; ++q) Op::mma(acc[q], wf[q][kk], bf);
    }
#pragma unroll
    for (int q = 0; q < NG; ++q) {  // fragment (row m = unit, column n = batch row)
      float* r = &red[cur][ks][q][0][0];
      const int u0 = ug * 16 + gid;
      r[(2 * tig) * RS + u0] = acc[q][0];
      r[(2 * tig + 1) * RS + u0] = acc[q][1];
      r[(2 * tig) * RS + u0 + 8] = acc[q][2];
      r[(2 * tig + 1) * RS + u0 + 8] = acc[q][3];
    }
    __syncthreads();
    // Wide kernels: every thread sums one gate of one (unit, row) pair over the K split, in place into split 0,
    // so that the pointwise threads (a quarter of the block) read NG sums instead of NG x S partial sums.
    constexpr bool kSpreadSums = kWide && NG * Cfg::PAIRS <= NT;
    if constexpr (kSpreadSums) {
      if (tid < NG * Cfg::PAIRS) {
        const int q = tid / Cfg::PAIRS, pair = tid % Cfg::PAIRS, u = pair % U, n = pair / U;
        float sum = 0.f;
#pragma unroll
        for (int s2 = 0; s2 < S; ++s2) sum += red[cur][s2][q][n][u];  // the order of the sums below: same bits
        red[cur][0][q][n][u] = sum;
      }
      __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < NP; ++j) {
      const int pair = tid + j * NT, u = pair % U, n = pair / U;
      if (pair >= Cfg::PAIRS) continue;
      const int64_t b = b_base + n;
      if (b < B) {
        const int64_t row = static_cast<int64_t>(t) * B + b;
        const int64_t k = row * HW + own + u;
        float gh[NG], s[A];
#pragma unroll
        for (int q = 0; q < NG; ++q) {
          float sum = 0.f;
          if constexpr (kSpreadSums) {
            sum = red[cur][0][q][n][u];
          } else {
#pragma unroll
            for (int s2 = 0; s2 < S; ++s2) sum += red[cur][s2][q][n][u];
          }
          gh[q] = sum;
        }
        if (Cell::kSplit) gh[NG - 1] += bhn[j];
        const bool run = t < len[j];
        const Zoneout<float> z{p.zoneout != nullptr, float(zh[j]), float(zc[j])};
        float gx[NG];
        widen(x[j], gx);
        const float out = run ? forward_values<Cell, StoredAs<Math, scalar_t>, true>(gx, gh, c[j], h[j], s, z)
                              : forward_values<Cell, StoredAs<Math, scalar_t>, false>(gx, gh, c[j], h[j], s);
        store_blocks(p.act + t * p.act_step + b * A * HW + own + u, HW, s);
        p.output[k] = scalar_t(out);
        if (Cell::kHasCell) store_state(p.cells + t * p.cell_step + b * CB * HW + own + u, HW, c[j]);
      }
      uint32_t bits;
      if constexpr (kPack == 1) {
        bits = __float_as_uint(h[j]);
      } else {
        const float other = __shfl_xor_sync(0xffffffffu, h[j], 1);
        bits = Op::pack(Op::to_smem(h[j]), Op::to_smem(other));
      }
      if (u % kPack == 0) {
        if constexpr (kWide) {
          if (t + 1 < T) put_flagged(exchanged(t + 1) + n * (H / kPack) + (rank * U + u) / kPack, bits, t + 1);
        } else {
#pragma unroll
          for (int rr = 0; rr < C; ++rr) exchange.put(&hbuf[cur ^ 1][n][rank * U + u], bits, rr, t + 1);
        }
      }
    }
    if constexpr (kWide) {
      if (t + 1 < T) {  // no one reads the last h_t back
        load_x(t + 1);
        static_assert(kWords % (2 * NT) == 0, "pairs of words per thread");
        receive_flagged<kWords / (2 * NT)>(exchanged(t + 1), tid, NT, t + 1, [&](int pair, uint64_t a, uint64_t b) {
          const int n = 2 * pair / (H / kPack), k = 2 * pair % (H / kPack);  // H / kPack is even
          *reinterpret_cast<uint2*>(reinterpret_cast<uint32_t*>(&hbuf[cur ^ 1][n][0]) + k) =
              make_uint2(static_cast<uint32_t>(a), static_cast<uint32_t>(b));
        });
        __syncthreads();
      }
    } else {
      exchange.end_step(t + 1, [&] {
        if (t + 1 < T) load_x(t + 1);
      });
    }
  }
  exchange.finish();
#pragma unroll
  for (int j = 0; j < NP; ++j) {
    const int pair = tid + j * NT, u = pair % U;
    const int64_t b = b_base + pair / U;
    if (pair < Cfg::PAIRS && b < B) {
      p.h_n[b * HW + own + u] = scalar_t(h[j]);
      if (Cell::kHasCell) store_state(p.c_n + b * CB * HW + own + u, HW, c[j]);
    }
  }
#endif
}

template <typename Cell, typename scalar_t, int H>
__global__ void __launch_bounds__(BackwardConfig<Cell, scalar_t, H>::NT, 1)
    backward_kernel(const BackwardParams<scalar_t> p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();
#else
  using Cfg = BackwardConfig<Cell, scalar_t, H>;
  using Op = typename Cfg::Op;
  using smem_t = typename Op::smem_t;
  constexpr int NG = Cell::kGates, A = Cell::kSaved, GB = Cell::kGradBlocks, CB = Cell::kCellBlocks;
  constexpr int C = Cfg::C, U = Cfg::U, NKB = Cfg::NKB, DS = Cfg::DS, RS = Cfg::RS, NT = Cfg::NT;
  constexpr int NP = Cfg::NP, KS = Op::KS, MT = Cfg::MT;
  constexpr bool kWide = Cfg::kWide;
  constexpr int SC = kWide ? 1 : C;  // slots: the cluster's partial sums (wide kernels stage theirs in `staged`)
  // This block's h-side gate gradients, [row][gate row], double-buffered: a warp that has received its step's
  // partial sums may write the next step's while a warp that sends to another block still reads this one.
  __shared__ __align__(16) smem_t dgbuf[2][kRows][DS];
  __shared__ float slots[2][SC][kRows][RS];                 // partial dL/dh of our units, from each block
  __shared__ __align__(16) float staged[kWide ? C : 1][kWide ? kRows * 16 : 4];  // wide: the same, from the exchange

  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t group = blockIdx.x / C, b_base = group * kRows;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gid = lane / 4, tig = lane % 4;
  const int T = p.T;
  const int64_t B = p.B;
  const int64_t HW = p.width, head = static_cast<int64_t>(blockIdx.y) * H;  // as the forward's
  const int me = kWide ? static_cast<int>(blockIdx.x % C) : rank;
  const int64_t own = head + me * U;
  // Wide kernels: the partial sums of parity s % 2 that block `sender` sends to block `owner` (C x C tiles of
  // kRows / 2 x 16 words a row group: word (r, u) holds rows 2r and 2r + 1 of unit u, put_flagged_pair).
  const int64_t slot = static_cast<int64_t>(blockIdx.y) * (gridDim.x / C) + group;
  auto exchanged = [&](int s, int owner, int sender) {
    return p.exchange + ((((s & 1) * int64_t{gridDim.y} * (gridDim.x / C) + slot) * C + owner) * C + sender) * (kRows * 8);
  };

  // A = W_own^T: A[m][k] = W_hh[gate row of own row k][unit m]; own rows are the gates x U units. The warp's
  // m16 tiles of dL/dh (units): warp * MT + i.
  typename Op::A wf[MT][NKB];
#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int kk = 0; kk < NKB; ++kk) {
      wf[i][kk] = Op::load_a(
          [&](int m, int k) {
            const int kg = kk * KS + k;
            return p.w_hh[((kg / U) * HW + own + kg % U) * H + (warp * MT + i) * 16 + m];
          },
          gid, tig);
    }
  }
  for (int idx = tid; idx < 2 * SC * kRows * RS; idx += NT) (&slots[0][0][0][0])[idx] = 0.f;
  CellState<Cell, float> dc[NP];  // dL/dc (the state blocks CB HW apart)
  float carry[NP];
  // The next step's inputs: c_t, c_{t-1}, the saved activations, h_{t-1}, dL/dh_t from the output, the zoneout
  // factors (wide kernels: in their storage type until used, widen(); elsewhere it cost registers, and spills at H 512).
  using load_t = std::conditional_t<kWide, scalar_t, float>;
  using Math = std::conditional_t<sizeof(scalar_t) == 2, FastDeviceMath, DeviceMath>;  // 16-bit: the SFU (lltm_cuda.h)
  CellState<Cell, load_t> cc[NP], cp[NP];
  load_t sv[NP][A], hp[NP], go[NP], zh[NP], zc[NP];
  int len[NP];
  constexpr int NS = Cell::kHasCell ? 2 : 1;  // states (zoneout's factor blocks)
  const bool c_prev = Cell::kNeedsCPrev || (Cell::kHasCell && p.zoneout);  // zoneout recomputes the cell's c
#pragma unroll
  for (int j = 0; j < NP; ++j) {
    const int pair = tid + j * NT, u = pair % U;
    const int64_t b = b_base + pair / U;
    const bool valid = pair < Cfg::PAIRS && b < B;
    const int64_t k = b * HW + own + u;
    dc[j] = {};
    cc[j] = cp[j] = {};
    if (valid && p.grad_c_n) load_state(p.grad_c_n + b * CB * HW + own + u, HW, dc[j]);
    carry[j] = valid && p.grad_h_n ? float(p.grad_h_n[k]) : 0.f;  // enters step T-1 like a carried gradient
    len[j] = valid ? (p.lengths ? static_cast<int>(p.lengths[b]) : T) : 0;
    zh[j] = zc[j] = hp[j] = go[j] = load_t(0.f);
  }
  __shared__ uint64_t bars[2];
  Exchange<async_exchange(C)> exchange;
  exchange.init(bars, kRows * H * sizeof(float));
  // This warp's 16 rows of dL/dh (units warp*16 ...) belong to one block: 16 divides U.
  const int owner = warp * 16 / U;
  // Wide kernels: this block's partial sums of step s (its units, from every block), staged in shared memory.
  auto stage = [&](int s) {
    constexpr int kPairs = kWide ? C * kRows * 4 : NT;  // pairs of words a block receives
    static_assert(kPairs % NT == 0, "pairs of words per thread");
    receive_flagged<kPairs / NT, 16>(exchanged(s, me, 0), tid, NT, s, [&](int pair, uint64_t a, uint64_t b) {
      // words 2q and 2q + 1 of a sender's tile: rows 2r and 2r + 1 (r = q / 8) of units 2 (q % 8) and that + 1
      const int sender = pair / (kRows * 4), q = pair % (kRows * 4), r = q / 8, u = 2 * (q % 8);
      float* to = &staged[sender][2 * r * 16 + u];
      *reinterpret_cast<float2*>(to) = make_float2(from_float24(a >> 24), from_float24(b >> 24));
      *reinterpret_cast<float2*>(to + 16) = make_float2(from_float24(a), from_float24(b));
    });
    __syncthreads();
  };

  auto load = [&](int t) {
#pragma unroll
    for (int j = 0; j < NP; ++j) {
      const int pair = tid + j * NT, u = pair % U;
      const int64_t b = b_base + pair / U;
      if (t < len[j]) {
        const int64_t row = static_cast<int64_t>(t) * B + b;
        const int64_t k = row * HW + own + u, k_prev = k - B * HW, k0 = b * HW + own + u;
        const int64_t kc = row * CB * HW + own + u;  // the c state's first block
        load_blocks(p.act + row * A * HW + own + u, HW, sv[j]);
        if (Cell::kHasCell) load_state(p.cells + kc, HW, cc[j]);
        if (c_prev) load_state(t > 0 ? p.cells + kc - B * CB * HW : p.c0 + b * CB * HW + own + u, HW, cp[j]);
        if (Cell::kNeedsHPrev) hp[j] = load_t(t > 0 ? p.output[k_prev] : p.h0[k0]);
        go[j] = p.grad_output ? load_t(p.grad_output[k]) : load_t(0.f);
        if (p.zoneout) {
          const scalar_t* z = p.zoneout + row * NS * HW + own + u;
          zh[j] = load_t(z[0]);
          zc[j] = Cell::kHasCell ? load_t(z[HW]) : load_t(0.f);
        }
      }
    }
  };
  load(T - 1);
  if constexpr (!kWide) cluster.sync();

  for (int it = 0; it < T; ++it) {
    const int t = T - 1 - it, cur = it & 1;
    if constexpr (kWide) {
      if (it > 0) stage(it);
    }
#pragma unroll
    for (int j = 0; j < NP; ++j) {
      const int pair = tid + j * NT, u = pair % U, n = pair / U;
      if (pair >= Cfg::PAIRS) continue;
      const int64_t b = b_base + n;
      float dg[GB] = {};
      if (b < B) {
        float dh = carry[j];
        if constexpr (kWide) {
          if (it > 0) {
#pragma unroll 8
            for (int rr = 0; rr < C; ++rr) dh += staged[rr][n * 16 + u];  // fixed order: deterministic
          }
        } else {
#pragma unroll
          for (int rr = 0; rr < C; ++rr) dh += slots[cur][rr][n][u];  // fixed order: deterministic
        }
        const Zoneout<float> z{p.zoneout != nullptr, float(zh[j]), float(zc[j])};
        float saved[A];
        widen(sv[j], saved);
        const CellState<Cell, float> c_t = widen<float>(cc[j]), c_before = widen<float>(cp[j]);
        const float h_prev = float(hp[j]), d_out = float(go[j]);
        carry[j] = t < len[j] ? backward_values<Cell, StoredAs<Math, scalar_t>, true>(dh, d_out, dc[j], saved, c_t, c_before, h_prev, dg, z)
                              : backward_values<Cell, StoredAs<Math, scalar_t>, false>(dh, d_out, dc[j], saved, c_t, c_before, h_prev, dg);
        store_blocks(p.dgates + (static_cast<int64_t>(t) * B + b) * GB * HW + own + u, HW, dg);
      }
#pragma unroll
      for (int q = 0; q < NG; ++q) dgbuf[cur][n][q * U + u] = Op::to_smem(dg[q]);
    }
    __syncthreads();
    typename Op::B bf[NKB];
#pragma unroll
    for (int kk = 0; kk < NKB; ++kk) bf[kk] = Op::load_b(&dgbuf[cur][0][0], DS, kk * KS, gid, tig);
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int kk = 0; kk < NKB; ++kk) Op::mma(acc, wf[i][kk], bf[kk]);
      if constexpr (kWide) {  // tile warp * MT + i: the 16 units of block warp * MT + i (U = 16), [row pair][unit]
        uint64_t* d = exchanged(it + 1, warp * MT + i, me);
        put_flagged_pair(d + tig * 16 + gid, acc[0], acc[1], it + 1);  // rows 2 tig, 2 tig + 1
        put_flagged_pair(d + tig * 16 + gid + 8, acc[2], acc[3], it + 1);
      } else {  // rows m (units of the whole layer) go to the block that owns them, into its slot for this block
        const float* d = &slots[cur ^ 1][rank][2 * tig][(warp * 16) % U + gid];
        exchange.put(d, __float_as_uint(acc[0]), owner, it + 1);
        exchange.put(d + RS, __float_as_uint(acc[1]), owner, it + 1);
        exchange.put(d + 8, __float_as_uint(acc[2]), owner, it + 1);
        exchange.put(d + RS + 8, __float_as_uint(acc[3]), owner, it + 1);
      }
    }
    if constexpr (kWide) {
      if (t > 0) load(t - 1);  // the next step's stage() waits for its partial sums
    } else {
      exchange.end_step(it + 1, [&] {
        if (t > 0) load(t - 1);
      });
    }
  }
  exchange.finish();
  if constexpr (kWide) stage(T);
  const int last = T & 1;  // the slot parity written by the last step
#pragma unroll
  for (int j = 0; j < NP; ++j) {
    const int pair = tid + j * NT, u = pair % U, n = pair / U;
    const int64_t b = b_base + n;
    if (pair < Cfg::PAIRS && b < B) {
      float dh = carry[j];
      if constexpr (kWide) {
        for (int rr = 0; rr < C; ++rr) dh += staged[rr][n * 16 + u];
      } else {
#pragma unroll
        for (int rr = 0; rr < C; ++rr) dh += slots[last][rr][n][u];
      }
      p.grad_h0[b * HW + own + u] = scalar_t(dh);
      if (Cell::kHasCell) store_state(p.grad_c0 + b * CB * HW + own + u, HW, dc[j]);
    }
  }
#endif
}

// The largest cluster this process may use: LLTM_CUDA_MAX_CLUSTER (e.g. 8, the portable limit) lowers the 16
// that Hopper allows, as a GPU or driver that refuses larger clusters would (the kernels that need more take
// the stepped path).
int max_cluster() {
  static const int limit = [] {
    const char* value = std::getenv("LLTM_CUDA_MAX_CLUSTER");
    return value ? std::max(1, std::atoi(value)) : 16;
  }();
  return limit;
}

// Clusters of more than 8 blocks need the kernel's opt-in (per device; a cheap call), which a GPU may refuse.
// Also the kernel's dynamic shared memory beyond the default 48 KB (the same kind of opt-in).
template <typename Kernel>
cudaError_t allow_cluster(Kernel kernel, int cluster, int smem) {
  if (cluster > max_cluster()) return cudaErrorNotSupported;
  if (smem > 48 * 1024) {
    const cudaError_t error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (error != cudaSuccess) return error;
  }
  return cluster > 8 ? cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) : cudaSuccess;
}

// One grid row of clusters per head (wide kernels: of row groups of `blocks` blocks, launched cooperatively, which
// fails rather than run a grid that is not resident at once).
template <typename Kernel, typename Params>
void launch(Kernel kernel, int threads, int blocks, bool wide, int smem, int64_t B, int64_t heads, const Params& params) {
  C10_CUDA_CHECK(allow_cluster(kernel, wide ? 1 : blocks, smem));
  const int64_t groups = (B + kRows - 1) / kRows;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(groups * blocks), static_cast<unsigned>(heads));
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = at::cuda::getCurrentCUDAStream();
  cudaLaunchAttribute attribute[1];
  if (wide) {
    attribute[0].id = cudaLaunchAttributeCooperative;
    attribute[0].val.cooperative = 1;
  } else {
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = blocks;
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = 1;
  }
  config.attrs = attribute;
  config.numAttrs = 1;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, params));
}

// Blocks of a wide kernel that are resident at once on the device (asked once per kernel and device).
template <typename Kernel>
int64_t max_resident_blocks(Kernel kernel, int threads, int smem) {
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, int64_t> known;
  const std::pair<int, const void*> key{at::cuda::current_device(), reinterpret_cast<const void*>(kernel)};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = known.find(key);
  if (it != known.end()) return it->second;
  int per_sm = 0;
  if (allow_cluster(kernel, 1, smem) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess) {
    (void)cudaGetLastError();
    per_sm = 0;
  }
  const int64_t n = int64_t{per_sm} * at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  known[key] = n;
  return n;
}

// Clusters of this kernel that fit on the device at once (asked once per kernel and device; kernels of one
// element type share a function type, so the kernel's address is part of the key).
template <typename Kernel>
int max_active_clusters(Kernel kernel, int threads, int cluster, int smem) {
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, int> known;
  const std::pair<int, const void*> key{at::cuda::current_device(), reinterpret_cast<const void*>(kernel)};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = known.find(key);
  if (it != known.end()) return it->second;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(cluster);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = cluster;
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  int n = 0;  // a device that refuses clusters of this size: 0, and the stepped path runs
  if (allow_cluster(kernel, cluster, smem) != cudaSuccess || cudaOccupancyMaxActiveClusters(&n, kernel, &config) != cudaSuccess) {
    (void)cudaGetLastError();
    n = 0;
  }
  known[key] = n;
  return n;
}

// Calls f(std::integral_constant<int, H>{}) for the hidden sizes with a kernel for this cell and element
// type. From H = 512 only 16-bit weights fit in registers (48 a thread for the LLTM, 64 for the LSTM; float32
// would need twice as many); 768 and 1024 are the wide kernels (is_wide).
template <typename Cell, typename scalar_t, typename F>
bool with_hidden_size(int64_t H, F f) {
  switch (H) {
    case 64: f(std::integral_constant<int, 64>{}); return true;
    case 128: f(std::integral_constant<int, 128>{}); return true;
    case 256: f(std::integral_constant<int, 256>{}); return true;
    case 512:
    case 768:
    case 1024:
      if constexpr (sizeof(scalar_t) == 2) {
        if (H == 512) f(std::integral_constant<int, 512>{});
        if (H == 768) f(std::integral_constant<int, 768>{});
        if (H == 1024) f(std::integral_constant<int, 1024>{});
        return true;
      }
      return false;
    default: return false;
  }
}

// Calls f(scalar_t{}) for the element types with kernels; returns false for the others. float32 only with its
// products in TF32 (allow_tf32): a user who asks for float32 precision ("highest") gets cuBLAS's float32 GEMMs
// on the stepped path, whose error stays within the python backend's (a 3xTF32 split in these kernels left 2x to
// 20x of it over 2,048 steps, H200, 2026-12-01).
template <typename F>
bool with_scalar_type(at::ScalarType dtype, F f) {
  switch (dtype) {
    case at::kFloat:
      if (!allow_tf32()) return false;
      f(float{});
      return true;
    case at::kBFloat16: f(c10::BFloat16{}); return true;
    case at::kHalf: f(c10::Half{}); return true;
    default: return false;
  }
}

template <typename T>
T* ptr(const at::Tensor& t) {
  return t.defined() ? reinterpret_cast<T*>(t.data_ptr()) : nullptr;
}

}  // namespace

template <typename Cell>
bool persistent_supports(at::ScalarType dtype, int64_t H, int64_t B, int64_t num_heads, bool any_batch) {
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf) return false;
  if (at::cuda::getCurrentDeviceProperties()->major < 9) return false;  // thread-block clusters
  if (B < 1 || B > (int64_t{1} << 28) || num_heads < 1 || num_heads > 65535 || H % num_heads != 0) return false;
  static const bool cooperative = [] {  // the wide kernels' launch (a GPU or MPS client may refuse it)
    int value = 0;
    return cudaDeviceGetAttribute(&value, cudaDevAttrCooperativeLaunch, at::cuda::current_device()) == cudaSuccess &&
           value == 1;
  }();
  const int64_t DH = H / num_heads;  // a kernel's width: one head's
  bool ok = false;
  with_scalar_type(dtype, [&](auto zero) {
    using scalar_t = decltype(zero);
    with_hidden_size<Cell, scalar_t>(DH, [&](auto h) {
      constexpr int kH = decltype(h)::value;
      using Cfg = ForwardConfig<Cell, scalar_t, kH>;
      const int64_t clusters = (B + kRows - 1) / kRows * num_heads;
      if constexpr (Cfg::kWide) {  // one wave, whatever any_batch says: the row group's blocks wait for each other
        using Bwd = BackwardConfig<Cell, scalar_t, kH>;
        const int64_t blocks = clusters * Cfg::C;
        ok = cooperative && blocks <= max_resident_blocks(forward_kernel<Cell, scalar_t, kH>, Cfg::NT, Cfg::kSmemBytes) &&
             blocks <= max_resident_blocks(backward_kernel<Cell, scalar_t, kH>, Bwd::NT, 0);
        return;
      }
      const int active = max_active_clusters(forward_kernel<Cell, scalar_t, kH>, Cfg::NT, Cfg::C, Cfg::kSmemBytes);
      ok = active > 0 && (any_batch || clusters <= max_waves<scalar_t>(kH) * static_cast<int64_t>(active));
    });
  });
  return ok;
}

template <typename Cell>
void persistent_forward(const ForwardTensors& f) {
  const int64_t T = f.gates.size(0), B = f.gates.size(1), H = f.h0.size(1), NH = f.num_heads;
  TORCH_CHECK(T < (int64_t{1} << 31), "lltm: sequences longer than 2^31 - 1 steps are not supported");
  const bool typed = with_scalar_type(f.gates.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    const ForwardParams<scalar_t> params{ptr<scalar_t>(f.gates), ptr<scalar_t>(f.activations),
                                         ptr<scalar_t>(f.output), ptr<scalar_t>(f.cells),
                                         ptr<scalar_t>(f.h_n),   ptr<scalar_t>(f.c_n),
                                         ptr<scalar_t>(f.h0),    ptr<scalar_t>(f.c0),
                                         ptr<scalar_t>(f.weight_hh), ptr<scalar_t>(f.bias_hn),
                                         ptr<int64_t>(f.lengths), ptr<scalar_t>(f.zoneout), static_cast<int>(T), B,
                                         H, step_stride(f.activations), step_stride(f.cells), nullptr};
    const bool ok = with_hidden_size<Cell, scalar_t>(H / NH, [&](auto h) {
      constexpr int kH = decltype(h)::value;
      using Cfg = ForwardConfig<Cell, scalar_t, kH>;
      ForwardParams<scalar_t> with = params;
      at::Tensor exchange;
      if constexpr (Cfg::kWide) {  // h_t of every row group, two parities, zeroed (put_flagged says why)
        const int64_t slots = (B + kRows - 1) / kRows * NH;
        exchange = at::zeros({2 * slots * kRows * kH / 2}, f.gates.options().dtype(at::kLong));
        with.exchange = reinterpret_cast<uint64_t*>(exchange.data_ptr());
      }
      launch(forward_kernel<Cell, scalar_t, kH>, Cfg::NT, Cfg::C, Cfg::kWide, Cfg::kSmemBytes, B, NH, with);
    });
    TORCH_CHECK(ok, "lltm: no persistent kernel for heads of " + std::to_string(H / NH) + " units");
  });
  TORCH_CHECK(typed, "lltm: the persistent kernels take float32 with TF32, bfloat16 and float16");
}

template <typename Cell>
void persistent_backward(const BackwardTensors& g) {
  const int64_t T = g.activations.size(0), B = g.activations.size(1), H = g.h0.size(1), NH = g.num_heads;
  TORCH_CHECK(T < (int64_t{1} << 31), "lltm: sequences longer than 2^31 - 1 steps are not supported");
  const bool typed = with_scalar_type(g.activations.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    const BackwardParams<scalar_t> params{ptr<scalar_t>(g.activations), ptr<scalar_t>(g.grad_gates),
                                          ptr<scalar_t>(g.cells),       ptr<scalar_t>(g.output),
                                          ptr<scalar_t>(g.h0),          ptr<scalar_t>(g.c0),
                                          ptr<scalar_t>(g.grad_output), ptr<scalar_t>(g.grad_h_n),
                                          ptr<scalar_t>(g.grad_c_n),    ptr<scalar_t>(g.weight_hh),
                                          ptr<int64_t>(g.lengths),      ptr<scalar_t>(g.zoneout),
                                          ptr<scalar_t>(g.grad_h0),
                                          ptr<scalar_t>(g.grad_c0),     static_cast<int>(T), B, H, nullptr};
    const bool ok = with_hidden_size<Cell, scalar_t>(H / NH, [&](auto h) {
      constexpr int kH = decltype(h)::value;
      using Cfg = BackwardConfig<Cell, scalar_t, kH>;
      BackwardParams<scalar_t> with = params;
      at::Tensor exchange;
      if constexpr (Cfg::kWide) {  // partial dL/dh: C x C tiles of kRows / 2 x 16 words a row group, two parities, zeroed
        const int64_t slots = (B + kRows - 1) / kRows * NH;
        exchange = at::zeros({2 * slots * Cfg::C * Cfg::C * kRows * 8}, g.activations.options().dtype(at::kLong));
        with.exchange = reinterpret_cast<uint64_t*>(exchange.data_ptr());
      }
      launch(backward_kernel<Cell, scalar_t, kH>, Cfg::NT, Cfg::C, Cfg::kWide, 0, B, NH, with);
    });
    TORCH_CHECK(ok, "lltm: no persistent kernel for heads of " + std::to_string(H / NH) + " units");
  });
  TORCH_CHECK(typed, "lltm: the persistent kernels take float32 with TF32, bfloat16 and float16");
}

#define LLTM_PERSISTENT(CELL)                                                          \
  template bool persistent_supports<CELL>(at::ScalarType, int64_t, int64_t, int64_t, bool); \
  template void persistent_forward<CELL>(const ForwardTensors&);                       \
  template void persistent_backward<CELL>(const BackwardTensors&);
LLTM_FOR_EACH_CELL(LLTM_PERSISTENT)
#undef LLTM_PERSISTENT

}  // namespace cuda
}  // namespace lltm
