// The CPU recurrence of every cell, and the CPU registrations of the ops.
//
// Batch rows never interact, so each thread takes a block of rows through the whole time loop: per step a
// single-threaded GEMM (h_{t-1} W_hh^T for its rows) and the fused pointwise work, with no barrier between
// threads until the loop ends. (One multi-threaded GEMM per step instead would synchronise the threads
// twice per step, which costs more than the step itself at small sizes.)
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "cell_list.h"
#include "lltm.h"

namespace lltm {
namespace {

// libm's functions, for float64 and the 16-bit types (which compute in float).
struct LibmMath {
  template <typename T>
  static T exp(T x) { return std::exp(x); }
  template <typename T>
  static T expm1(T x) { return std::expm1(x); }
  template <typename T>
  static T tanh(T x) { return std::tanh(x); }
  template <typename T>
  static T log1p(T x) { return std::log1p(x); }
  template <typename T>
  static T reciprocal(T x) { return T(1) / x; }
};

// float32: branch-free approximations that the compiler vectorises (libm calls would keep the loop
// scalar and cost about ten times more than the GEMM of a step). exp: Cody-Waite range reduction to
// |r| <= ln2/2, then the degree-7 Taylor polynomial (truncation error < 6e-9, about one ulp overall).
// Like expf it gives inf above the float range and 0 below it (so sigmoid(-inf) * inf is NaN, as in
// PyTorch), and NaN stays NaN.
struct FastFloatMath {
  static float exp(float x) {
    const float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x / ln2)
    const float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;  // x - n ln2, ln2 split in two
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;  // 2^n
    const float e = p * __builtin_bit_cast(float, bits);
    return x > 88.0f ? std::numeric_limits<float>::infinity() : (x < -87.0f ? 0.0f : e);
  }
  static float expm1(float x) { return exp(x) - 1.0f; }
  static float tanh(float x) { return 1.0f - 2.0f / (exp(2.0f * x) + 1.0f); }
  static float reciprocal(float x) { return 1.0f / x; }
  // log of a positive normal x: x = 2^e u with u in [sqrt(1/2), sqrt(2)), log u = 2 atanh(s), s = (u - 1) / (u + 1),
  // |s| <= 0.172, by its series to s^9 (truncation < 2e-9).
  static float log(float x) {
    const uint32_t bits = __builtin_bit_cast(uint32_t, x);
    float e = static_cast<float>(static_cast<int32_t>(bits >> 23) - 127);
    float u = __builtin_bit_cast(float, (bits & 0x007fffffu) | 0x3f800000u);  // [1, 2)
    const bool high = u > 1.41421356f;
    u = high ? 0.5f * u : u;
    e = high ? e + 1.0f : e;
    const float s = (u - 1.0f) / (u + 1.0f), s2 = s * s;
    float p = 1.0f / 9.0f;
    p = p * s2 + 1.0f / 7.0f;
    p = p * s2 + 1.0f / 5.0f;
    p = p * s2 + 1.0f / 3.0f;
    p = p * s2 + 1.0f;
    return 2.0f * s * p + e * 0.693147180559945f;
  }
  // log1p of x in [0, 1] (the sLSTM's log_sigmoid asks no more): Goldberg's log(u) x / (u - 1), u = 1 + x
  // rounded, which cancels the rounding of u; x itself where u rounds to 1.
  static float log1p(float x) {
    const float u = 1.0f + x;
    return u == 1.0f ? x : log(u) * (x / (u - 1.0f));
  }
};

// Where one thread's rows are in a step. Rows of `gx` (the x-side pre-activations) hold G blocks of H,
// `gh` (h_{t-1} W_hh^T) G blocks, `saved` kSaved blocks (it may be `gx` itself), `grad` kGradBlocks blocks.
template <typename scalar_t>
struct RowsForward {
  const scalar_t* gx;
  const scalar_t* gh;
  const scalar_t* bias_hn;  // or null
  const scalar_t* c_prev;   // c_{t-1} (cells with a c state; rows of C H, C = Cell::kCellBlocks)
  const scalar_t* h_prev;   // h_{t-1}
  scalar_t* saved;
  scalar_t* output;
  scalar_t* cells;          // c_t (cells with a c state; rows of C H)
  const int64_t* lengths;   // of these rows, or null
  const scalar_t* zoneout;  // this step's factors of these rows, (rows, S H), or null
  int64_t t, rows, H;
};

// The zoneout factors of unit j of a row whose factors start at `z` (h's block, then c's).
template <typename Cell, typename acc_t, typename scalar_t>
LLTM_HOST_DEVICE Zoneout<acc_t> zoneout_at(const scalar_t* z, int64_t j, int64_t H) {
  return {true, acc_t(z[j]), Cell::kHasCell ? acc_t(z[H + j]) : acc_t(0)};
}

template <typename scalar_t, typename acc_t>
struct RowsBackward {
  const scalar_t* grad_output;  // or null
  scalar_t* dh;                 // (rows, H): dL/dh_t from the later steps in; the direct part of dL/dh_{t-1} out
  acc_t* dc;                    // (rows, C H): the running dL/dc (cells with a c state)
  const scalar_t* saved;
  const scalar_t* c;            // c_t (rows of C H)
  const scalar_t* c_prev;       // c_{t-1} (kNeedsCPrev; rows of C H)
  const scalar_t* h_prev;       // h_{t-1} (kNeedsHPrev)
  scalar_t* grad;
  const int64_t* lengths;
  const scalar_t* zoneout;      // as RowsForward's
  int64_t t, rows, H;
};

// One row's pointwise forward at one step; the branches of a row (does it run, is there a b_hn) are
// template arguments, so that the loop over units vectorises.
template <typename Cell, typename scalar_t, typename M, bool kRun, bool kBiasHN, bool kZone = false>
LLTM_HOST_DEVICE void forward_row(const RowsForward<scalar_t>& p, int64_t r) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int G = Cell::kGates, S = Cell::kHasCell ? 2 : 1, C = Cell::kCellBlocks;
  const int64_t H = p.H;
  const scalar_t* gx = p.gx + r * G * H;
  const scalar_t* gh = p.gh + r * G * H;
  scalar_t* saved = p.saved + r * Cell::kSaved * H;
#pragma GCC ivdep
  for (int64_t j = 0; j < H; ++j) {
    acc_t h_side[G];
    load_blocks(gh + j, H, h_side);
    if constexpr (kBiasHN) h_side[G - 1] += acc_t(p.bias_hn[j]);
    CellState<Cell, acc_t> c{};
    if constexpr (Cell::kHasCell) load_state(p.c_prev + r * C * H + j, H, c);
    acc_t h = Cell::kNeedsHPrev || kZone ? acc_t(p.h_prev[r * H + j]) : acc_t(0);
    Zoneout<acc_t> z;
    if constexpr (kZone) z = zoneout_at<Cell, acc_t>(p.zoneout + r * S * H, j, H);
    forward_step<Cell, M, kRun>(gx + j, h_side, c, h, saved + j, p.output + r * H + j,
                                Cell::kHasCell ? p.cells + r * C * H + j : nullptr, H, z);
  }
}

// One step's pointwise forward over a thread's rows.
template <typename Cell, typename scalar_t, typename M>
LLTM_HOST_DEVICE void forward_rows(const RowsForward<scalar_t>& p) {
  const bool bias_hn = Cell::kSplit && p.bias_hn;
  for (int64_t r = 0; r < p.rows; ++r) {
    if (!running(p.lengths, r, p.t)) {
      forward_row<Cell, scalar_t, M, false, false>(p, r);
    } else if (p.zoneout) {
      if (bias_hn) {
        forward_row<Cell, scalar_t, M, true, Cell::kSplit, true>(p, r);
      } else {
        forward_row<Cell, scalar_t, M, true, false, true>(p, r);
      }
    } else if (bias_hn) {
      forward_row<Cell, scalar_t, M, true, Cell::kSplit>(p, r);
    } else {
      forward_row<Cell, scalar_t, M, true, false>(p, r);
    }
  }
}

template <typename Cell, typename scalar_t, typename M, bool kRun, bool kGradOutput, bool kZone = false>
LLTM_HOST_DEVICE void backward_row(const RowsBackward<scalar_t, at::opmath_type<scalar_t>>& p, int64_t r) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int S = Cell::kHasCell ? 2 : 1, C = Cell::kCellBlocks;
  constexpr bool kCPrev = Cell::kNeedsCPrev || (kZone && Cell::kHasCell);
  const int64_t H = p.H;
  const scalar_t* saved = p.saved + r * Cell::kSaved * H;
  scalar_t* grad = p.grad + r * Cell::kGradBlocks * H;
#pragma GCC ivdep
  for (int64_t j = 0; j < H; ++j) {
    const int64_t k = r * H + j, kc = r * C * H + j;
    CellState<Cell, acc_t> dc{}, c{}, c_prev{};
    if constexpr (Cell::kHasCell) {
      load_state(p.dc + kc, H, dc);
      load_state(p.c + kc, H, c);
      if constexpr (kCPrev) load_state(p.c_prev + kc, H, c_prev);
    }
    acc_t dg[Cell::kGradBlocks];
    const acc_t d_out = kGradOutput ? acc_t(p.grad_output[k]) : acc_t(0);
    Zoneout<acc_t> z;
    if constexpr (kZone) z = zoneout_at<Cell, acc_t>(p.zoneout + r * S * H, j, H);
    const acc_t dh = backward_step<Cell, M, kRun>(
        acc_t(p.dh[k]), d_out, dc, saved + j, c, c_prev, Cell::kNeedsHPrev ? acc_t(p.h_prev[k]) : acc_t(0), dg,
        grad + j, H, z);
    if constexpr (Cell::kHasCell) store_state(p.dc + kc, H, dc);
    p.dh[k] = scalar_t(dh);
  }
}

// One step's pointwise backward over a thread's rows.
template <typename Cell, typename scalar_t, typename M>
LLTM_HOST_DEVICE void backward_rows(const RowsBackward<scalar_t, at::opmath_type<scalar_t>>& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    if (!running(p.lengths, r, p.t)) {
      backward_row<Cell, scalar_t, M, false, false>(p, r);
    } else if (p.zoneout) {
      if (p.grad_output) {
        backward_row<Cell, scalar_t, M, true, true, true>(p, r);
      } else {
        backward_row<Cell, scalar_t, M, true, false, true>(p, r);
      }
    } else if (p.grad_output) {
      backward_row<Cell, scalar_t, M, true, true>(p, r);
    } else {
      backward_row<Cell, scalar_t, M, true, false>(p, r);
    }
  }
}

// float32 rows compiled for AVX-512, AVX2+FMA and baseline x86-64, picked when the library loads (one
// overload per cell: GCC does not clone templates).
#if defined(__x86_64__) && defined(__GNUC__)
#define LLTM_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define LLTM_CPU_CLONES
#endif

#define LLTM_FLOAT_ROWS(CELL)                                                                  \
  LLTM_CPU_CLONES void forward_rows_f32(CELL, const RowsForward<float>& p) {                   \
    forward_rows<CELL, float, FastFloatMath>(p);                                               \
  }                                                                                            \
  LLTM_CPU_CLONES void backward_rows_f32(CELL, const RowsBackward<float, float>& p) {          \
    backward_rows<CELL, float, FastFloatMath>(p);                                              \
  }
LLTM_FOR_EACH_CELL(LLTM_FLOAT_ROWS)
#undef LLTM_FLOAT_ROWS

template <typename Cell, typename scalar_t>
void forward_rows_any(const RowsForward<scalar_t>& p) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    forward_rows_f32(Cell{}, p);
  } else {
    forward_rows<Cell, scalar_t, LibmMath>(p);
  }
}

template <typename Cell, typename scalar_t>
void backward_rows_any(const RowsBackward<scalar_t, at::opmath_type<scalar_t>>& p) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    backward_rows_f32(Cell{}, p);
  } else {
    backward_rows<Cell, scalar_t, LibmMath>(p);
  }
}

// C (M x N) = A (M x K) B (K x N) (+ C when accumulating), row-major with leading dimensions: one step's
// product over a thread's rows. float32 goes to oneDNN's brgemm micro-kernel through PyTorch
// (at::native::cpublas::brgemm; it falls back to PyTorch's own GEMM where oneDNN's kernels do not run):
// about 3x MKL's sgemm at these sizes on an AMD Zen 5 (216 against 73 GFLOP/s at 16 x 128 x 384, one
// core), where MKL runs its AVX2 code, and no dispatcher or tensor overhead. Other types take at::mm.
template <typename scalar_t>
void rows_gemm(int64_t M, int64_t N, int64_t K, const scalar_t* A, int64_t lda, const scalar_t* B, int64_t ldb,
               scalar_t* C, int64_t ldc, bool accumulate) {
#ifdef CPUBLAS_BRGEMM_F32F32F32
  if constexpr (std::is_same_v<scalar_t, float>) {
    at::native::cpublas::brgemm(M, N, K, lda, ldb, ldc, accumulate, A, B, C);
    return;
  }
#endif
  const auto opts = at::TensorOptions().dtype(c10::CppTypeToScalarType<scalar_t>::value);
  const at::Tensor a = at::from_blob(const_cast<scalar_t*>(A), {M, K}, {lda, 1}, opts);
  const at::Tensor b = at::from_blob(const_cast<scalar_t*>(B), {K, N}, {ldb, 1}, opts);
  at::Tensor c = at::from_blob(C, {M, N}, {ldc, 1}, opts);
  if (accumulate) {
    c.addmm_(a, b);
  } else {
    at::mm_out(c, a, b);
  }
}

// The right operands of the per-step products, W_hh^T (H, G H) in the forward and W_hh (G H, H) in the
// backward, stored as column panels: panel j (columns [j, j + w)) is a (K, w) row-major block at offset j K.
// brgemm then streams each panel contiguously. On a Zen 5, two blocks of 32 rows (a probe built without
// OpenMP: both blocks ran on one thread), 64 steps: forward
// (K 512, N 2,048) 391-398 GFLOP/s in panels of 64 against 326-361 for the plain matrix, whose rows lie
// 8 KiB apart, and 392-412 against 221-243 at N 1,536; backward (K 2,048, N 512) 394 against 232
// (benchmarks/log/2026-12-01_s03-cpu-lstm-profile.md, 2026-12-02).
constexpr int64_t kPanel = 64;

// m (K, N), any strides, in panels of `width` columns; the matrix itself when one panel holds it already.
template <typename scalar_t>
at::Tensor panels(const at::Tensor& m, int64_t width) {
  const int64_t K = m.size(0), N = m.size(1);
  if (width >= N) return m.contiguous();
  at::Tensor out = at::empty({K * N}, m.options());
  const scalar_t* src = m.data_ptr<scalar_t>();
  scalar_t* dst = out.data_ptr<scalar_t>();
  const int64_t sk = m.stride(0), sn = m.stride(1);
  for (int64_t j = 0; j < N; j += width) {
    const int64_t w = std::min(width, N - j);
    for (int64_t k = 0; k < K; ++k, dst += w)
      for (int64_t c = 0; c < w; ++c) dst[c] = src[k * sk + (j + c) * sn];
  }
  return out;
}

// C (M x N) = A (M x K) times `panels` B (+ C when accumulating), panel by panel.
template <typename scalar_t>
void rows_gemm_panels(int64_t M, int64_t N, int64_t K, const scalar_t* A, int64_t lda, const scalar_t* B, int64_t width,
                      scalar_t* C, int64_t ldc, bool accumulate) {
  for (int64_t j = 0; j < N; j += width) {
    const int64_t w = std::min(width, N - j);
    rows_gemm<scalar_t>(M, w, K, A, lda, B + j * K, w, C + j, ldc, accumulate);
  }
}

// Panels for brgemm's float32; one panel (the plain matrix, one product a step) for the other types. The
// packing pass costs nothing measurable even at T = 1 (B 16, H 128, forward + backward: 1.00x-1.04x).
template <typename scalar_t>
int64_t panel_width(int64_t N) {
#ifdef CPUBLAS_BRGEMM_F32F32F32
  if (std::is_same_v<scalar_t, float>) return kPanel;
#endif
  return N;
}

// One step's block of rows (rows, n), stored by rows, into columns [col, col + rows) of a (n, ld) matrix,
// with zeros for the rows that have finished (their gradients are zero; 0 * inf would not be).
template <typename scalar_t>
void put_transposed(const scalar_t* src, int64_t rows, int64_t n, scalar_t* dst, int64_t ld, int64_t col,
                    const int64_t* lens, int64_t t) {
  for (int64_t j = 0; j < n; ++j) {
    scalar_t* d = dst + j * ld + col;
    for (int64_t r = 0; r < rows; ++r) d[r] = running(lens, r, t) ? src[r * n + j] : scalar_t(0);
  }
}

// With heads (lltm.h), one step's product per gate and head, over the DH units of the head: h_{t-1}'s
// columns [a DH, a DH + DH) times the (DH, DH) block of gate g and head a, into gh's columns g H + a DH ...
// (forward), and the gate gradients' columns g H + a DH ... times the block into dh's columns a DH ...
// (backward, accumulating over the gates). `blocks` holds each block as the product's right operand, (K, N)
// row-major: in the forward W_ga^T (block (g, a) at (g NH + a) DH DH), in the backward W_ga itself.
template <typename scalar_t>
void heads_forward_gemm(int64_t rows, int64_t G, int64_t NH, int64_t DH, const scalar_t* h_prev, const scalar_t* blocks,
                        scalar_t* gh) {
  const int64_t H = NH * DH;
  for (int64_t g = 0; g < G; ++g)
    for (int64_t a = 0; a < NH; ++a)
      rows_gemm<scalar_t>(rows, DH, DH, h_prev + a * DH, H, blocks + (g * NH + a) * DH * DH, DH, gh + g * H + a * DH,
                          G * H, false);
}

template <typename scalar_t>
void heads_backward_gemm(int64_t rows, int64_t G, int64_t NH, int64_t DH, const scalar_t* dg, int64_t ldg,
                         const scalar_t* blocks, scalar_t* dh) {
  const int64_t H = NH * DH;
  for (int64_t a = 0; a < NH; ++a)
    for (int64_t g = 0; g < G; ++g)
      rows_gemm<scalar_t>(rows, DH, DH, dg + g * H + a * DH, ldg, blocks + (g * NH + a) * DH * DH, DH, dh + a * DH, H,
                          true);
}

// Rows per thread: one block per thread, but at least 4 rows (thinner blocks are all call overhead).
int64_t grain_rows(int64_t B) {
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  return std::max<int64_t>((B + threads - 1) / threads, std::min<int64_t>(B, 4));
}

template <typename T>
T* ptr(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

template <typename Cell>
void forward(const ForwardTensors& f) {
  constexpr int G = Cell::kGates, A = Cell::kSaved, S = Cell::kHasCell ? 2 : 1;
  const int64_t T = f.gates.size(0), B = f.gates.size(1), H = f.h0.size(1), CH = Cell::kCellBlocks * H;
  const int64_t* lens = ptr<int64_t>(f.lengths);
  const int64_t NH = f.num_heads, DH = H / NH;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, f.gates.scalar_type(), "lltm_forward_cpu", [&] {
    const scalar_t* zone = ptr<scalar_t>(f.zoneout);
    const int64_t width = panel_width<scalar_t>(G * H);
    // h W_hh^T's right operand: (H, G H) in panels, or each head's block transposed
    const at::Tensor w_t = NH > 1 ? f.weight_hh.view({G, NH, DH, DH}).transpose(2, 3).contiguous()
                                  : panels<scalar_t>(f.weight_hh.t(), width);
    at::parallel_for(0, B, grain_rows(B), [&](int64_t b0, int64_t b1) {
      const int64_t rows = b1 - b0;
      scalar_t* out = f.output.data_ptr<scalar_t>();
      scalar_t* cs = ptr<scalar_t>(f.cells);
      // (c_t and saved activations of step t: slot t, or one slot for every step when nothing is saved)
      const int64_t cell_step = step_stride(f.cells), act_step = step_stride(f.activations);
      at::Tensor gh = at::empty({rows, G * H}, f.gates.options());
      for (int64_t t = 0; t < T; ++t) {
        const int64_t off = (t * B + b0) * H, c_off = t * cell_step + b0 * CH;
        const scalar_t* h_prev = t == 0 ? ptr<scalar_t>(f.h0) + b0 * H : out + off - B * H;
        // single-threaded inside this parallel region
        if (NH > 1) {
          heads_forward_gemm<scalar_t>(rows, G, NH, DH, h_prev, w_t.data_ptr<scalar_t>(), gh.data_ptr<scalar_t>());
        } else {
          rows_gemm_panels<scalar_t>(rows, G * H, H, h_prev, H, w_t.data_ptr<scalar_t>(), width,
                                     gh.data_ptr<scalar_t>(), G * H, false);
        }
        const RowsForward<scalar_t> p{f.gates.data_ptr<scalar_t>() + G * off,
                                      gh.data_ptr<scalar_t>(),
                                      ptr<scalar_t>(f.bias_hn),
                                      Cell::kHasCell ? (t == 0 ? ptr<scalar_t>(f.c0) + b0 * CH : cs + c_off - cell_step) : nullptr,
                                      h_prev,
                                      f.activations.data_ptr<scalar_t>() + t * act_step + A * b0 * H,
                                      out + off,
                                      Cell::kHasCell ? cs + c_off : nullptr,
                                      lens ? lens + b0 : nullptr,
                                      zone ? zone + (t * B + b0) * S * H : nullptr,
                                      t,
                                      rows,
                                      H};
        forward_rows_any<Cell, scalar_t>(p);
      }
      // Each row's final state is the one after its own last step.
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t last = lens ? lens[b] : T;
        const int64_t at_last = ((last - 1) * B + b) * H;
        std::copy_n(last == 0 ? ptr<scalar_t>(f.h0) + b * H : out + at_last, H, ptr<scalar_t>(f.h_n) + b * H);
        if (Cell::kHasCell) {
          const scalar_t* c_last = last == 0 ? ptr<scalar_t>(f.c0) + b * CH : cs + (last - 1) * cell_step + b * CH;
          std::copy_n(c_last, CH, ptr<scalar_t>(f.c_n) + b * CH);
        }
      }
    });
  });
}

template <typename Cell>
void backward(const BackwardTensors& g) {
  constexpr int G = Cell::kGates, A = Cell::kSaved, GB = Cell::kGradBlocks, S = Cell::kHasCell ? 2 : 1;
  const int64_t T = g.activations.size(0), B = g.activations.size(1), H = g.h0.size(1), CH = Cell::kCellBlocks * H;
  const int64_t* lens = ptr<int64_t>(g.lengths);
  const int64_t NH = g.num_heads, DH = H / NH;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.activations.scalar_type(), "lltm_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* zone = ptr<scalar_t>(g.zoneout);
    const bool c_prev = Cell::kHasCell && (Cell::kNeedsCPrev || zone);  // the backward reads c_{t-1}
    const int64_t width = panel_width<scalar_t>(H);
    // dg_h W_hh's right operand: (G H, H) in panels, or the heads' blocks as they are
    const at::Tensor w = NH > 1 ? g.weight_hh.contiguous() : panels<scalar_t>(g.weight_hh, width);
    at::parallel_for(0, B, grain_rows(B), [&](int64_t b0, int64_t b1) {
      const int64_t rows = b1 - b0;
      scalar_t* out = g.output.data_ptr<scalar_t>();
      scalar_t* cs = ptr<scalar_t>(g.cells);
      // dh: what the steps after t pass back to h_t; after step 0 it is dL/dh_0. Plain loops, no ATen ops on
      // the op's tensors: this runs on OpenMP's threads, which do not carry the caller's thread-local state
      // (an in-place op on an output made under inference mode raises there).
      scalar_t* dh = g.grad_h0.data_ptr<scalar_t>() + b0 * H;
      const scalar_t* dh_n = ptr<scalar_t>(g.grad_h_n);
      if (dh_n) {
        std::copy_n(dh_n + b0 * H, rows * H, dh);
      } else {
        std::fill_n(dh, rows * H, scalar_t(0));
      }
      std::vector<acc_t> dc(rows * CH, acc_t(0));  // dL/dc_t, in opmath
      const scalar_t* dc_n = ptr<scalar_t>(g.grad_c_n);
      if (Cell::kHasCell && dc_n) std::copy_n(dc_n + b0 * CH, rows * CH, dc.begin());
      const int64_t I = g.input.defined() ? g.input.size(2) : 0;
      for (int64_t t = T - 1; t >= 0; --t) {
        const int64_t off = (t * B + b0) * H, c_off = (t * B + b0) * CH;
        const scalar_t* h_prev = t == 0 ? ptr<scalar_t>(g.h0) + b0 * H : out + off - B * H;
        const RowsBackward<scalar_t, acc_t> p{
            g.grad_output.defined() ? g.grad_output.data_ptr<scalar_t>() + off : nullptr,
            dh,
            Cell::kHasCell ? dc.data() : nullptr,
            g.activations.data_ptr<scalar_t>() + A * off,
            Cell::kHasCell ? cs + c_off : nullptr,
            c_prev ? (t == 0 ? ptr<scalar_t>(g.c0) + b0 * CH : cs + c_off - B * CH) : nullptr,
            Cell::kNeedsHPrev ? h_prev : nullptr,
            g.grad_gates.data_ptr<scalar_t>() + GB * off,
            lens ? lens + b0 : nullptr,
            zone ? zone + (t * B + b0) * S * H : nullptr,
            t,
            rows,
            H};
        backward_rows_any<Cell, scalar_t>(p);
        // The weight gradients' operands, while the rows are in cache: against oneDNN's own transposing copy
        // after the loop, backward 1.05x-1.3x at cpu-S, no change at cpu-M
        // (benchmarks/log/2026-12-02_s06-cpu-openmp.md).
        if (g.h_prev_t.defined()) {
          const int64_t col = t * B + b0;
          put_transposed(h_prev, rows, H, ptr<scalar_t>(g.h_prev_t), T * B, col, p.lengths, t);
          put_transposed(ptr<scalar_t>(g.input) + col * I, rows, I, ptr<scalar_t>(g.input_t), T * B, col, p.lengths, t);
        }
        // dh += dg_h W_hh (the h-side gate gradients: the first G blocks of each row)
        if (NH > 1) {
          heads_backward_gemm<scalar_t>(rows, G, NH, DH, g.grad_gates.data_ptr<scalar_t>() + GB * off, GB * H,
                                        w.data_ptr<scalar_t>(), dh);
        } else {
          rows_gemm_panels<scalar_t>(rows, H, G * H, g.grad_gates.data_ptr<scalar_t>() + GB * off, GB * H,
                                     w.data_ptr<scalar_t>(), width, dh, H, true);
        }
      }
      if (Cell::kHasCell) std::copy_n(dc.begin(), rows * CH, g.grad_c0.data_ptr<scalar_t>() + b0 * CH);
    });
  });
}

template <typename Cell>
const Recurrence kCpu{forward<Cell>, backward<Cell>};

}  // namespace
}  // namespace lltm

TORCH_LIBRARY_IMPL(lltm, CPU, m) {
#define LLTM_REGISTER(CELL) lltm::register_kernels<CELL, lltm::kCpu<CELL>>(m);
  LLTM_FOR_EACH_CELL(LLTM_REGISTER)
#undef LLTM_REGISTER
}
