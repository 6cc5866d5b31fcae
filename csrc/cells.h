// The cells of the op library, each described once for every device: its sizes, and its math for one
// (batch row, hidden unit) forward and backward. The CPU loops (lltm_cpu.cpp), the CUDA stepped path and
// the persistent kernels are templates over these descriptions; so are the checks and GEMMs (lltm.cpp).
//
// A cell `Cell` has:
//   kName            its name (Python's CellSpec.name, model.cell); kOpPrefix: its ops are
//                    lltm::<kOpPrefix>layer_forward and lltm::<kOpPrefix>layer_backward (lltm.h).
//   kBiases          1: one bias of G H (the LLTM's `bias`); 2: bias_ih and bias_hh (torch.nn's).
//   kGates (G)       blocks of H rows in weight_ih and weight_hh: a step's pre-activations are G x H.
//   kSaved (A)       blocks of H activations that the forward saves for the backward.
//   kHasCell         a cell state c beside h (LLTM, LSTM); the GRU's state is h alone.
//   kSplit           the last gate's h-side pre-activation is kept apart from its x-side one (the GRU's
//                    candidate n = tanh(W_in x + b_in + r * (W_hn h + b_hn))), so its gradient differs
//                    between the two sides.
//   kGradBlocks      G + kSplit blocks of gate gradients: dL/d(h-side pre-activation) of each gate (also
//                    the x-side one of every gate that is not split), then the split gate's x-side one.
//   kNeedsCPrev, kNeedsHPrev   whether the backward reads c or h of the step before (LSTM: the forget
//                    gate's gradient; GRU: h' = (1 - z) n + z h).
//   kCellBlocks (C)  blocks of H in the ops' c state: 1 with a c state, 0 without, 3 for the sLSTM, whose
//                    c0, c_n, `cells` and grad_c0 pack its states (c, n, m) as [c | n | m], C H a row.
//   State<acc_t>     one unit's c state in registers: acc_t itself, or SLSTMState; the step functions
//                    below take it (load_state, store_state move it to and from memory).
//   kZoneout         whether the ops take zoneout factors for the cell (not the sLSTM: its n and m are not
//                    states to keep half of).
//   forward(gx, gh, c_prev, h_prev, saved, c, h)
//       gx[G]: x-side pre-activations (x W_ih^T + b_ih, plus b_hh for the gates that are not split);
//       gh[G]: h-side ones (h W_hh^T, plus b_hn for the split gate); c_prev, h_prev: the state before.
//       Writes saved[A], c (cells with a c state) and h.
//   cell_update(saved, c_prev)   (cells with a c state) c from the saved activations and c_prev: what
//                    forward writes to c, recomputed by a backward under zoneout (which keeps only the
//                    state after zoneout).
//   backward(dh, dc, saved, c, c_prev, h_prev, dg, dh_prev)
//       dh: dL/dh after the step (from every use); dc: dL/dc after the step on entry, before it on return.
//       Writes dg[kGradBlocks] and dh_prev, the part of dL/dh_prev that does not go through W_hh (the GRU's
//       z * dh; zero for the others).
// `M` supplies exp, expm1 and tanh for the arithmetic type `acc_t`: the CPU passes vectorisable
// approximations for float and libm otherwise, CUDA its device functions.
// The cells are listed once, in cell_list.h; every device instantiates and registers what that list names.
#pragma once

#include <cstdint>
#include <type_traits>

// Always inlined: the CPU's loops vectorise only with the math inlined into each ISA clone of the caller.
#if defined(__CUDACC__)
#define LLTM_HOST_DEVICE __host__ __device__ __forceinline__
#define LLTM_UNROLL _Pragma("unroll")
#else
#define LLTM_HOST_DEVICE inline __attribute__((always_inline))
#define LLTM_UNROLL _Pragma("GCC unroll 8")
#endif

namespace lltm {

template <typename acc_t, typename M>
LLTM_HOST_DEVICE acc_t sigmoid(acc_t x) {
  return M::reciprocal(acc_t(1) + M::exp(-x));
}

// log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)), exact in both tails (no log of a rounded 1 or 0).
template <typename acc_t, typename M>
LLTM_HOST_DEVICE acc_t log_sigmoid(acc_t x) {
  const acc_t neg = x < acc_t(0) ? x : -x;  // -|x| (NaN stays NaN through exp and log1p)
  return (x < acc_t(0) ? x : acc_t(0)) - M::log1p(M::exp(neg));
}

// The LLTM, from PyTorch's "Custom C++ and CUDA Extensions" tutorial: gates (input, output, candidate),
//   i = sigmoid(g_i), o = sigmoid(g_o), z = elu(g_z); c' = c + i z (no forget gate); h' = tanh(c') o.
struct LLTMCell {
  static constexpr const char* kName = "lltm";
  static constexpr const char* kOpPrefix = "";  // the first ops' names, which saved programs call
  static constexpr int kBiases = 1;
  static constexpr int kGates = 3, kSaved = 3, kGradBlocks = 3;
  static constexpr bool kHasCell = true, kSplit = false, kNeedsCPrev = false, kNeedsHPrev = false;
  static constexpr int kCellBlocks = 1;
  static constexpr bool kZoneout = true;
  template <typename T>
  using State = T;

  template <typename acc_t, typename M>
  LLTM_HOST_DEVICE static void forward(const acc_t (&gx)[3], const acc_t (&gh)[3], acc_t c_prev, acc_t,
                                       acc_t (&s)[3], acc_t& c, acc_t& h) {
    s[0] = sigmoid<acc_t, M>(gx[0] + gh[0]);
    s[1] = sigmoid<acc_t, M>(gx[1] + gh[1]);
    const acc_t g = gx[2] + gh[2];
    s[2] = g > acc_t(0) ? g : M::expm1(g);
    c = cell_update(s, c_prev);
    h = M::tanh(c) * s[1];
  }

  template <typename acc_t>
  LLTM_HOST_DEVICE static acc_t cell_update(const acc_t (&s)[3], acc_t c_prev) {
    return c_prev + s[0] * s[2];
  }

  template <typename acc_t, typename M>
  LLTM_HOST_DEVICE static void backward(acc_t dh, acc_t& dc, const acc_t (&s)[3], acc_t c, acc_t, acc_t,
                                        acc_t (&dg)[3], acc_t& dh_prev) {
    const acc_t i = s[0], o = s[1], z = s[2], tc = M::tanh(c);
    dc = dc + dh * o * (acc_t(1) - tc * tc);  // c' = c + i z passes dc back unchanged
    dg[0] = dc * z * i * (acc_t(1) - i);
    dg[1] = dh * tc * o * (acc_t(1) - o);
    dg[2] = dc * i * (z > acc_t(0) ? acc_t(1) : z + acc_t(1));  // elu'(g) = elu(g) + 1 for g <= 0
    dh_prev = acc_t(0);
  }
};

// torch.nn.LSTM's cell: gates (input, forget, cell, output),
//   i, f, o = sigmoid(.), g = tanh(.); c' = f c + i g; h' = o tanh(c').
struct LSTMCell {
  static constexpr const char* kName = "lstm";
  static constexpr const char* kOpPrefix = "lstm_";
  static constexpr int kBiases = 2;
  static constexpr int kGates = 4, kSaved = 4, kGradBlocks = 4;
  static constexpr bool kHasCell = true, kSplit = false, kNeedsCPrev = true, kNeedsHPrev = false;
  static constexpr int kCellBlocks = 1;
  static constexpr bool kZoneout = true;
  template <typename T>
  using State = T;

  template <typename acc_t, typename M>
  LLTM_HOST_DEVICE static void forward(const acc_t (&gx)[4], const acc_t (&gh)[4], acc_t c_prev, acc_t,
                                       acc_t (&s)[4], acc_t& c, acc_t& h) {
    s[0] = sigmoid<acc_t, M>(gx[0] + gh[0]);
    s[1] = sigmoid<acc_t, M>(gx[1] + gh[1]);
    s[2] = M::tanh(gx[2] + gh[2]);
    s[3] = sigmoid<acc_t, M>(gx[3] + gh[3]);
    c = cell_update(s, c_prev);
    h = s[3] * M::tanh(c);
  }

  template <typename acc_t>
  LLTM_HOST_DEVICE static acc_t cell_update(const acc_t (&s)[4], acc_t c_prev) {
    return s[1] * c_prev + s[0] * s[2];
  }

  template <typename acc_t, typename M>
  LLTM_HOST_DEVICE static void backward(acc_t dh, acc_t& dc, const acc_t (&s)[4], acc_t c, acc_t c_prev, acc_t,
                                        acc_t (&dg)[4], acc_t& dh_prev) {
    const acc_t i = s[0], f = s[1], g = s[2], o = s[3], tc = M::tanh(c);
    dc = dc + dh * o * (acc_t(1) - tc * tc);
    dg[0] = dc * g * i * (acc_t(1) - i);
    dg[1] = dc * c_prev * f * (acc_t(1) - f);
    dg[2] = dc * i * (acc_t(1) - g * g);
    dg[3] = dh * tc * o * (acc_t(1) - o);
    dc = dc * f;
    dh_prev = acc_t(0);
  }
};

// torch.nn.GRU's cell: gates (reset, update, new),
//   r, z = sigmoid(.), n = tanh(W_in x + b_in + r (W_hn h + b_hn)); h' = (1 - z) n + z h.
// Saved: r, z, n and W_hn h + b_hn (the backward's dL/dr needs it).
struct GRUCell {
  static constexpr const char* kName = "gru";
  static constexpr const char* kOpPrefix = "gru_";
  static constexpr int kBiases = 2;
  static constexpr int kGates = 3, kSaved = 4, kGradBlocks = 4;
  static constexpr bool kHasCell = false, kSplit = true, kNeedsCPrev = false, kNeedsHPrev = true;
  static constexpr int kCellBlocks = 0;
  static constexpr bool kZoneout = true;
  template <typename T>
  using State = T;

  template <typename acc_t, typename M>
  LLTM_HOST_DEVICE static void forward(const acc_t (&gx)[3], const acc_t (&gh)[3], acc_t, acc_t h_prev,
                                       acc_t (&s)[4], acc_t&, acc_t& h) {
    s[0] = sigmoid<acc_t, M>(gx[0] + gh[0]);
    s[1] = sigmoid<acc_t, M>(gx[1] + gh[1]);
    s[3] = gh[2];
    s[2] = M::tanh(gx[2] + s[0] * s[3]);
    h = s[2] + s[1] * (h_prev - s[2]);
  }

  template <typename acc_t, typename M>
  LLTM_HOST_DEVICE static void backward(acc_t dh, acc_t&, const acc_t (&s)[4], acc_t, acc_t, acc_t h_prev,
                                        acc_t (&dg)[4], acc_t& dh_prev) {
    const acc_t r = s[0], z = s[1], n = s[2], hn = s[3];
    const acc_t dn = dh * (acc_t(1) - z) * (acc_t(1) - n * n);  // dL/d(pre-activation of n), x side
    dg[0] = dn * hn * r * (acc_t(1) - r);
    dg[1] = dh * (h_prev - n) * z * (acc_t(1) - z);
    dg[2] = dn * r;  // h side: W_hn h + b_hn is scaled by r
    dg[3] = dn;
    dh_prev = dh * z;
  }
};

// torch.nn.RNN's cell (Elman, "Finding Structure in Time", 1990), one gate: h' = tanh(g) with
// nonlinearity="tanh", relu(g) with "relu". The saved activation is h' itself (its derivative needs no more).
struct RNNShape {
  static constexpr int kBiases = 2;
  static constexpr int kGates = 1, kSaved = 1, kGradBlocks = 1;
  static constexpr bool kHasCell = false, kSplit = false, kNeedsCPrev = false, kNeedsHPrev = false;
  static constexpr int kCellBlocks = 0;
  static constexpr bool kZoneout = true;
  template <typename T>
  using State = T;
};

struct RNNTanhCell : RNNShape {
  static constexpr const char* kName = "rnn";
  static constexpr const char* kOpPrefix = "rnn_";

  template <typename acc_t, typename M>
  LLTM_HOST_DEVICE static void forward(const acc_t (&gx)[1], const acc_t (&gh)[1], acc_t, acc_t, acc_t (&s)[1],
                                       acc_t&, acc_t& h) {
    s[0] = M::tanh(gx[0] + gh[0]);
    h = s[0];
  }

  template <typename acc_t, typename M>
  LLTM_HOST_DEVICE static void backward(acc_t dh, acc_t&, const acc_t (&s)[1], acc_t, acc_t, acc_t, acc_t (&dg)[1],
                                        acc_t& dh_prev) {
    dg[0] = dh * (acc_t(1) - s[0] * s[0]);
    dh_prev = acc_t(0);
  }
};

struct RNNReLUCell : RNNShape {
  static constexpr const char* kName = "rnn_relu";
  static constexpr const char* kOpPrefix = "rnn_relu_";

  template <typename acc_t, typename M>
  LLTM_HOST_DEVICE static void forward(const acc_t (&gx)[1], const acc_t (&gh)[1], acc_t, acc_t, acc_t (&s)[1],
                                       acc_t&, acc_t& h) {
    const acc_t g = gx[0] + gh[0];
    s[0] = g <= acc_t(0) ? acc_t(0) : g;  // NaN stays NaN, as torch.relu's
    h = s[0];
  }

  template <typename acc_t, typename M>
  LLTM_HOST_DEVICE static void backward(acc_t dh, acc_t&, const acc_t (&s)[1], acc_t, acc_t, acc_t, acc_t (&dg)[1],
                                        acc_t& dh_prev) {
    dg[0] = s[0] <= acc_t(0) ? acc_t(0) : dh;  // torch's relu backward: 0 where the output is <= 0 (NaN passes dh)
    dh_prev = acc_t(0);
  }
};

// The sLSTM's states of one unit: the cell c, the normalizer n and the stabilizer m (log space).
template <typename acc_t>
struct SLSTMState {
  acc_t c = acc_t(0), n = acc_t(0), m = acc_t(0);
};

// The sLSTM (Beck et al. 2024, "xLSTM: Extended Long Short-Term Memory", eqs. 8-17 with the stabilizer of
// eqs. 15-17; FlashRNN's `slstm` function with a sigmoid forget gate): gates (input, forget, cell, output)
// of pre-activations i~, f~, z~, o~ (one bias, as the LLTM's):
//   L = m + log_sigmoid(f~);  m' = i~ where n == 0 (a unit's first step), else max(i~, L) (a tie to i~)
//   i = exp(i~ - m'), f = exp(L - m') (0 where n == 0: no history), c' = f c + i tanh(z~), n' = f n + i,
//   h' = sigmoid(o~) c' / n'.
// Saved: the four pre-activations (the `gates` buffer itself); the backward recomputes the gates from the
// state before (kNeedsCPrev) and takes m' from the state after. It is exact, the max included: m' = i~
// (alpha = 1) or L (alpha = 0) passes its gradient to that side.
// i~, f~ and L are taken as stored (M::stored: rounded to a 16-bit state's type), so that m' is a value memory
// holds exactly and the backward, which reads i~, f~ and m back from memory, finds the forward's m', i and f
// (<= 1). With m' rounded alone, apart from c and n, a bfloat16 backward's exp(i~ - m') ran to inf where |m| is
// large (at 4e4 a bfloat16 step is 256): NaN gradients where the python backend's were finite.
struct SLSTMCell {
  static constexpr const char* kName = "slstm";
  static constexpr const char* kOpPrefix = "slstm_";
  static constexpr int kBiases = 1;
  static constexpr int kGates = 4, kSaved = 4, kGradBlocks = 4;
  static constexpr bool kHasCell = true, kSplit = false, kNeedsCPrev = true, kNeedsHPrev = false;
  static constexpr int kCellBlocks = 3;
  static constexpr bool kZoneout = false;
  template <typename T>
  using State = SLSTMState<T>;

  template <typename acc_t, typename M>
  LLTM_HOST_DEVICE static void forward(const acc_t (&gx)[4], const acc_t (&gh)[4], SLSTMState<acc_t> prev, acc_t,
                                       acc_t (&s)[4], SLSTMState<acc_t>& next, acc_t& h) {
LLTM_UNROLL
    for (int q = 0; q < 4; ++q) s[q] = gx[q] + gh[q];
    const acc_t s0 = M::stored(s[0]), L = M::stored(prev.m + log_sigmoid<acc_t, M>(M::stored(s[1])));
    const bool first = prev.n == acc_t(0);  // no history: f = 0 (exp(L - i~) may overflow, and 0 * inf is NaN)
    const acc_t m = first || !(s0 < L) ? s0 : L;
    const acc_t i = M::exp(s0 - m), f = first ? acc_t(0) : M::exp(L - m);
    next.c = f * prev.c + i * M::tanh(s[2]);
    next.n = f * prev.n + i;
    next.m = m;
    h = sigmoid<acc_t, M>(s[3]) * next.c / next.n;
  }

  // dc: dL/d(c', n', m') on entry, dL/d(c, n, m) on return.
  template <typename acc_t, typename M>
  LLTM_HOST_DEVICE static void backward(acc_t dh, SLSTMState<acc_t>& dc, const acc_t (&s)[4], SLSTMState<acc_t> next,
                                        SLSTMState<acc_t> prev, acc_t, acc_t (&dg)[4], acc_t& dh_prev) {
    const acc_t L = M::stored(prev.m + log_sigmoid<acc_t, M>(s[1]));
    const bool first = prev.n == acc_t(0), to_i = first || !(s[0] < L);  // alpha: m' = i~
    // exponents <= 0, as the forward's (m' is the larger of i~ and L), should a compiler round L otherwise here
    const acc_t di_m = s[0] - next.m, dl_m = L - next.m;
    const acc_t i = M::exp(di_m > acc_t(0) ? acc_t(0) : di_m), z = M::tanh(s[2]);
    const acc_t f = first ? acc_t(0) : M::exp(dl_m > acc_t(0) ? acc_t(0) : dl_m);
    const acc_t o = sigmoid<acc_t, M>(s[3]), inv_n = acc_t(1) / next.n;
    const acc_t d_c = dc.c + dh * o * inv_n;                      // dL/dc'
    const acc_t d_n = dc.n - dh * o * next.c * inv_n * inv_n;     // dL/dn'
    const acc_t di = d_c * z + d_n, df = d_c * prev.c + d_n * prev.n;  // dL/di, dL/df
    // i = exp(i~ - m'), f = exp(L - m'), m' = alpha i~ + (1 - alpha) L
    const acc_t d_i_raw = to_i ? -df * f + dc.m : di * i;
    const acc_t d_L = to_i ? df * f : -di * i + dc.m;
    dg[0] = d_i_raw;
    dg[1] = d_L * sigmoid<acc_t, M>(-s[1]);  // d log_sigmoid(x) / dx = sigmoid(-x)
    dg[2] = d_c * i * (acc_t(1) - z * z);
    dg[3] = dh * next.c * inv_n * o * (acc_t(1) - o);
    dc.c = d_c * f;
    dc.n = d_n * f;
    dc.m = d_L;
    dh_prev = acc_t(0);
  }
};

// One unit's c state to and from memory: blocks `stride` apart (c, then n and m for the sLSTM).
template <typename acc_t, typename scalar_t>
LLTM_HOST_DEVICE void load_state(const scalar_t* p, int64_t, acc_t& v) {
  v = acc_t(p[0]);
}

template <typename acc_t, typename scalar_t>
LLTM_HOST_DEVICE void load_state(const scalar_t* p, int64_t stride, SLSTMState<acc_t>& v) {
  v.c = acc_t(p[0]);
  v.n = acc_t(p[stride]);
  v.m = acc_t(p[2 * stride]);
}

template <typename acc_t, typename scalar_t>
LLTM_HOST_DEVICE void store_state(scalar_t* p, int64_t, acc_t v) {
  p[0] = scalar_t(v);
}

template <typename acc_t, typename scalar_t>
LLTM_HOST_DEVICE void store_state(scalar_t* p, int64_t stride, const SLSTMState<acc_t>& v) {
  p[0] = scalar_t(v.c);
  p[stride] = scalar_t(v.n);
  p[2 * stride] = scalar_t(v.m);
}

// Reads (writes) the N blocks of one unit from (to) memory laid out as N blocks of H.
template <int N, typename acc_t, typename scalar_t>
LLTM_HOST_DEVICE void load_blocks(const scalar_t* p, int64_t H, acc_t (&v)[N]) {
LLTM_UNROLL
  for (int q = 0; q < N; ++q) v[q] = acc_t(p[q * H]);
}

template <int N, typename acc_t, typename scalar_t>
LLTM_HOST_DEVICE void store_blocks(scalar_t* p, int64_t H, const acc_t (&v)[N]) {
LLTM_UNROLL
  for (int q = 0; q < N; ++q) p[q * H] = scalar_t(v[q]);
}

// Variable lengths, the rule every device follows: row b runs the steps t < lengths[b] (all of them when
// there are no lengths). At a later step it keeps h and c, writes a zero output (and its carried c to
// `cells`), and its gates get no gradient; dL/dh and dL/dc pass through it unchanged.
LLTM_HOST_DEVICE bool running(const int64_t* lengths, int64_t b, int64_t t) { return lengths == nullptr || t < lengths[b]; }

// Zoneout (Krueger et al. 2017, "Zoneout: Regularizing RNNs by Randomly Preserving Hidden Activations"): after
// a running step each state is lerp(new, previous, z) = (1 - z) new + z previous, with z the op's `zoneout`
// factor of that state, row, unit and step (1 keeps the previous value: a zoned-out unit; 0 takes the new one;
// the expectation p in evaluation). lerp is torch.lerp's formula, exact at both ends.
template <typename acc_t>
struct Zoneout {
  bool on = false;
  acc_t h = acc_t(0), c = acc_t(0);  // the factors of h and c (c: cells with a c state)
};

template <typename acc_t>
LLTM_HOST_DEVICE acc_t lerp(acc_t from, acc_t to, acc_t w) {
  return w < acc_t(0.5) ? from + w * (to - from) : to - (to - from) * (acc_t(1) - w);
}

// The math M of a recurrence that stores its values as scalar_t: stored(x) is x rounded as memory holds it (x
// itself for float and double). The sLSTM takes its stabilizer from stored values (SLSTMCell says why).
template <typename M, typename scalar_t>
struct StoredAs : M {
  template <typename acc_t>
  LLTM_HOST_DEVICE static acc_t stored(acc_t x) { return static_cast<acc_t>(static_cast<scalar_t>(x)); }
};

// The cell's c state of one unit in registers (Cell::State: acc_t, or the sLSTM's three).
template <typename Cell, typename acc_t>
using CellState = typename Cell::template State<acc_t>;

// One (row, unit) forward step under that rule, on values: gx, gh the x- and h-side pre-activations; c, h
// the running state, updated (kept by a finished row; h must hold h_{t-1} under zoneout, whatever the cell);
// s: the activations to save (zeros for a finished row, so that every output of the op is defined); z: the
// step's zoneout. Returns the step's output (zero for a finished row).
template <typename Cell, typename M, bool kRun, typename acc_t>
LLTM_HOST_DEVICE acc_t forward_values(const acc_t (&gx)[Cell::kGates], const acc_t (&gh)[Cell::kGates],
                                      CellState<Cell, acc_t>& c, acc_t& h, acc_t (&s)[Cell::kSaved],
                                      const Zoneout<acc_t>& z = {}) {
  if constexpr (kRun) {
    CellState<Cell, acc_t> c_new = c;
    acc_t h_new;
    Cell::template forward<acc_t, M>(gx, gh, c, h, s, c_new, h_new);
    if constexpr (Cell::kZoneout) {
      if (z.on) {  // h (and c) hold the state before the step
        if constexpr (Cell::kHasCell) c_new = lerp(c_new, c, z.c);
        h_new = lerp(h_new, h, z.h);
      }
    }
    c = c_new;
    h = h_new;
    return h;
  } else {
LLTM_UNROLL
    for (int q = 0; q < Cell::kSaved; ++q) s[q] = acc_t(0);
    return acc_t(0);
  }
}

// The same step on memory (kRun a template argument, so that the CPU's loops over units stay branch-free;
// the overload after it takes it at run time). gx: G blocks of stride H; saved: kSaved blocks of stride H
// (may be gx itself: read before written); output, cell_out: this step's slots (cell_out: cells with c, its
// blocks H apart).
template <typename Cell, typename M, bool kRun, typename acc_t, typename scalar_t>
LLTM_HOST_DEVICE void forward_step(const scalar_t* gx, const acc_t (&gh)[Cell::kGates], CellState<Cell, acc_t>& c, acc_t& h,
                                   scalar_t* saved, scalar_t* output, scalar_t* cell_out, int64_t H,
                                   const Zoneout<acc_t>& z = {}) {
  acc_t x[Cell::kGates], s[Cell::kSaved];
  if constexpr (kRun) load_blocks(gx, H, x);
  *output = scalar_t(forward_values<Cell, StoredAs<M, scalar_t>, kRun>(x, gh, c, h, s, z));
  store_blocks(saved, H, s);
  if constexpr (Cell::kHasCell) store_state(cell_out, H, c);
}

template <typename Cell, typename M, typename acc_t, typename scalar_t>
LLTM_HOST_DEVICE void forward_step(bool run, const scalar_t* gx, const acc_t (&gh)[Cell::kGates], CellState<Cell, acc_t>& c,
                                   acc_t& h,
                                   scalar_t* saved, scalar_t* output, scalar_t* cell_out, int64_t H,
                                   const Zoneout<acc_t>& z = {}) {
  if (run) {
    forward_step<Cell, M, true>(gx, gh, c, h, saved, output, cell_out, H, z);
  } else {
    forward_step<Cell, M, false>(gx, gh, c, h, saved, output, cell_out, H);
  }
}

// One (row, unit) backward step under that rule, on values. dh_later: dL/dh_t from the steps after t;
// d_out: dL/dh_t through this step's output (it counts only while the row runs: a finished row outputs a
// constant zero); dc: as in the cells' backward; s: the step's saved activations; c, c_prev, h_prev: as
// the cell needs them (kNeedsCPrev, kNeedsHPrev; c_prev also for a cell with a c state under zoneout, whose c
// is then the state after zoneout: the cell's own c is recomputed). Writes the gate gradients dg (zero for a
// finished row) and returns the part of dL/dh_{t-1} that does not go through W_hh.
template <typename Cell, typename M, bool kRun, typename acc_t>
LLTM_HOST_DEVICE acc_t backward_values(acc_t dh_later, acc_t d_out, CellState<Cell, acc_t>& dc,
                                       const acc_t (&s)[Cell::kSaved], CellState<Cell, acc_t> c,
                                       CellState<Cell, acc_t> c_prev, acc_t h_prev, acc_t (&dg)[Cell::kGradBlocks],
                                       const Zoneout<acc_t>& z = {}) {
  acc_t dh_prev = dh_later;  // a finished row: h_t is h_{t-1}
  if constexpr (kRun) {
    if constexpr (Cell::kZoneout) {
      if (z.on) {  // lerp(new, previous, z): (1 - z) of each gradient to the step, z straight to the state before
        const acc_t dh = dh_later + d_out;
        const CellState<Cell, acc_t> dc_t = dc;
        if constexpr (Cell::kHasCell) {
          c = Cell::cell_update(s, c_prev);
          dc = (acc_t(1) - z.c) * dc_t;
        }
        Cell::template backward<acc_t, M>((acc_t(1) - z.h) * dh, dc, s, c, c_prev, h_prev, dg, dh_prev);
        dh_prev += z.h * dh;
        if constexpr (Cell::kHasCell) dc += z.c * dc_t;
        return dh_prev;
      }
    }
    Cell::template backward<acc_t, M>(dh_later + d_out, dc, s, c, c_prev, h_prev, dg, dh_prev);
  } else {
LLTM_UNROLL
    for (int q = 0; q < Cell::kGradBlocks; ++q) dg[q] = acc_t(0);
  }
  return dh_prev;
}

template <typename Cell, typename M, typename acc_t>
LLTM_HOST_DEVICE acc_t backward_values(bool run, acc_t dh_later, acc_t d_out, CellState<Cell, acc_t>& dc,
                                       const acc_t (&s)[Cell::kSaved], CellState<Cell, acc_t> c,
                                       CellState<Cell, acc_t> c_prev, acc_t h_prev, acc_t (&dg)[Cell::kGradBlocks],
                                       const Zoneout<acc_t>& z = {}) {
  return run ? backward_values<Cell, M, true>(dh_later, d_out, dc, s, c, c_prev, h_prev, dg, z)
             : backward_values<Cell, M, false>(dh_later, d_out, dc, s, c, c_prev, h_prev, dg);
}

// The same step on memory: saved (kSaved blocks of stride H) read, the gate gradients stored to `grad`
// (kGradBlocks blocks of stride H) and left in dg.
template <typename Cell, typename M, bool kRun, typename acc_t, typename scalar_t>
LLTM_HOST_DEVICE acc_t backward_step(acc_t dh_later, acc_t d_out, CellState<Cell, acc_t>& dc, const scalar_t* saved,
                                     CellState<Cell, acc_t> c, CellState<Cell, acc_t> c_prev, acc_t h_prev, acc_t (&dg)[Cell::kGradBlocks], scalar_t* grad,
                                     int64_t H, const Zoneout<acc_t>& z = {}) {
  acc_t s[Cell::kSaved];
  if constexpr (kRun) load_blocks(saved, H, s);
  const acc_t dh_prev = backward_values<Cell, StoredAs<M, scalar_t>, kRun>(dh_later, d_out, dc, s, c, c_prev, h_prev, dg, z);
  store_blocks(grad, H, dg);
  return dh_prev;
}

template <typename Cell, typename M, typename acc_t, typename scalar_t>
LLTM_HOST_DEVICE acc_t backward_step(bool run, acc_t dh_later, acc_t d_out, CellState<Cell, acc_t>& dc,
                                     const scalar_t* saved, CellState<Cell, acc_t> c, CellState<Cell, acc_t> c_prev,
                                     acc_t h_prev, acc_t (&dg)[Cell::kGradBlocks], scalar_t* grad,
                                     int64_t H, const Zoneout<acc_t>& z = {}) {
  return run ? backward_step<Cell, M, true>(dh_later, d_out, dc, saved, c, c_prev, h_prev, dg, grad, H, z)
             : backward_step<Cell, M, false>(dh_later, d_out, dc, saved, c, c_prev, h_prev, dg, grad, H);
}

}  // namespace lltm
