"""Multi-layer, optionally bidirectional recurrent layers with ``torch.nn.LSTM``'s API: one drop-in class per
cell that PyTorch users know (:class:`LLTM`, :class:`LSTM`, :class:`GRU`, :class:`RNN`) over one shared
implementation (:class:`RecurrentLayers`, which takes any cell), and :func:`recurrent_layers` for a cell by name."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from .. import checks as v
from ..functional import rnn_layer
from ..ops.cells import GRU as GRU_CELL
from ..ops.cells import LLTM as LLTM_CELL
from ..ops.cells import LSTM as LSTM_CELL
from ..ops.cells import RNN_TANH, CellSpec
from ..ops.cells import SLSTM as SLSTM_CELL
from ._params import BackendMixin, CellMixin, check_heads, explain_heads_mismatch, make_weights, reset_uniform
from ._streams import kept_streams, streams_usable
from ._wavefront import layer_streams, wavefront
from .cell import rnn_cell_spec


class RecurrentLayers(CellMixin, BackendMixin, nn.Module):
    """Stacked layers of one cell over sequences; the layering, directions and packing of every cell.

    The subclasses fix the cell (``cell``, a :class:`~lltm_train.ops.cells.CellSpec`); this class takes any
    as ``cell=`` (its name or spec), e.g. ``RecurrentLayers(32, 64, cell="rnn_relu")``. See :class:`LSTM`
    for the other arguments, the shapes and the errors.
    """

    drop_ins = {}

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 backend: str = "auto", device=None, dtype=None, proj_size: int = 0, *,
                 cell: str | CellSpec | None = None, weight_drop: float = 0.0,
                 zoneout: float | Sequence[float] = 0.0, num_heads: int = 1) -> None:
        super().__init__()
        owner = type(self).__name__
        self._take_cell(cell)
        if proj_size != 0:  # torch.nn's default is 0, so configs written for torch.nn pass it
            raise ValueError(f"{owner}: proj_size={proj_size!r} is not supported (only 0, no projection)"
                             if self.cell.has_cell_state else f"{owner}: proj_size is only for LSTMs (got {proj_size!r})")
        self.proj_size = 0
        for name, value in (("input_size", input_size), ("hidden_size", hidden_size), ("num_layers", num_layers)):
            v.positive_int(owner, name, value)
        for name, value in (("bias", bias), ("batch_first", batch_first), ("bidirectional", bidirectional)):
            v.flag(owner, name, value)
        dropout = v.probability(owner, "dropout", dropout)
        self.weight_drop, self.zoneout = weight_drop, zoneout  # (checked properties)
        self.num_heads = check_heads(owner, hidden_size, num_heads)
        if dropout > 0 and num_layers == 1:
            warnings.warn(f"{owner}: dropout acts between layers, so it does nothing with num_layers=1", stacklevel=2)
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional, self.backend = bidirectional, backend
        factory = {"device": device, "dtype": dtype}
        for layer in range(num_layers):
            layer_input = input_size if layer == 0 else hidden_size * self.num_directions
            for suffix in self._suffixes(layer):
                make_weights(self, self.cell, suffix, layer_input, hidden_size, bias, factory, num_heads)
        self.reset_parameters()

    @property
    def weight_drop(self) -> float:
        """DropConnect's probability on the recurrent weights in training, in [0, 1) (checked when set)."""
        return self._weight_drop

    @weight_drop.setter
    def weight_drop(self, value: float) -> None:
        p = v.probability(type(self).__name__, "weight_drop", value)
        if p == 1:
            raise ValueError(f"{type(self).__name__}: weight_drop must be below 1 (1 would drop every recurrent weight)")
        self._weight_drop = p

    @property
    def zoneout(self) -> tuple[float, float]:
        """The (cell, hidden) zoneout probabilities, each in [0, 1); set from one number for both or a pair
        (checked when set)."""
        return self._zoneout

    @zoneout.setter
    def zoneout(self, value: float | Sequence[float]) -> None:
        pair = _zoneout_pair(type(self).__name__, value)
        if any(pair) and not self.cell.zoneout:
            raise ValueError(f"{type(self).__name__}: the {self.cell.title} takes no zoneout (its states "
                             f"{', '.join(self.cell.states)} are not kept in part); got zoneout={value!r}")
        if pair[0] != pair[1] and not self.cell.has_cell_state:  # a pair's cell part would be dropped unused
            raise ValueError(f"{type(self).__name__}: the {self.cell.title} has no cell state, only h: give zoneout "
                             f"one probability (the hidden state's), got zoneout={value!r}")
        self._zoneout = pair

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    def _suffixes(self, layer: int) -> list[str]:
        return [f"_l{layer}", f"_l{layer}_reverse"][: self.num_directions]

    def _names(self, suffix: str) -> list[str]:
        return [f"{name}{suffix}" for name in ("weight_ih", "weight_hh", *self.cell.biases)]

    def _weights(self, suffix: str) -> list[Tensor | None]:
        return [getattr(self, name) for name in self._names(suffix)]

    def reset_parameters(self) -> None:
        reset_uniform(self, self.hidden_size)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        explain_heads_mismatch(self, state_dict, prefix, error_msgs)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    # torch.nn.RNNBase's introspection, for code written against it.
    @property
    def _all_weights(self) -> list[list[str]]:
        """Parameter names per layer and direction, ``torch.nn.LSTM``'s order (biases left out with bias=False)."""
        return [[name for name in self._names(suffix) if getattr(self, name) is not None]
                for layer in range(self.num_layers) for suffix in self._suffixes(layer)]

    @property
    def _flat_weights_names(self) -> list[str]:
        return [name for names in self._all_weights for name in names]

    @property
    def _flat_weights(self) -> list[Tensor]:
        return [getattr(self, name) for name in self._flat_weights_names]

    @property
    def all_weights(self) -> list[list[nn.Parameter]]:
        """The parameters per layer and direction, as ``torch.nn.LSTM.all_weights``."""
        return [[getattr(self, name) for name in names] for names in self._all_weights]

    def flatten_parameters(self) -> None:
        """Does nothing: no backend here needs one flat weight buffer (``torch.nn``'s is for cuDNN). Code that
        calls it on ``torch.nn.LSTM`` runs unchanged."""

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}{self._cell_repr()}"
        for name, default in (("bias", True), ("batch_first", False), ("dropout", 0.0), ("bidirectional", False),
                              ("weight_drop", 0.0), ("zoneout", (0.0, 0.0)), ("num_heads", 1)):
            if getattr(self, name) != default:
                s += f", {name}={getattr(self, name)}"
        return s + f", backend={self.backend!r}"

    def forward(self, input: Tensor | PackedSequence, hx=None):
        owner = type(self).__name__
        packed = isinstance(input, PackedSequence)
        unbatched, lengths = False, None
        if packed:
            data, batch_sizes, sorted_indices, unsorted_indices = input
            if not isinstance(data, Tensor) or data.dim() != 2 or data.shape[-1] != self.input_size:
                shape = tuple(data.shape) if isinstance(data, Tensor) else type(data).__name__
                raise ValueError(f"{owner}: expected packed data of shape (N, input_size) with input_size={self.input_size}, "
                                 f"got {shape}")
            _check_batch_sizes(owner, batch_sizes, data.shape[0])
            for name, index in (("sorted_indices", sorted_indices), ("unsorted_indices", unsorted_indices)):
                if index is not None and (index.dim() != 1 or index.numel() != int(batch_sizes[0])):
                    raise ValueError(f"{owner}: the PackedSequence's {name} must hold one index per sequence "
                                     f"({int(batch_sizes[0])}), got shape {tuple(index.shape)}")
            x, lengths = pad_packed_sequence(PackedSequence(data, batch_sizes))  # sorted order, time-major
        else:
            self._check_features(input, "(T, B, input_size), (B, T, input_size) if batch_first, or (T, input_size)", 3)
            unbatched = input.dim() == 2
            x = input.unsqueeze(1) if unbatched else (input.transpose(0, 1) if self.batch_first else input)
        state0 = self._initial_state(hx, x, x.shape[1], unbatched)
        if packed and sorted_indices is not None:
            state0 = tuple(s.index_select(1, sorted_indices) for s in state0)
        reverse = _reverse_index(lengths, x.shape[0], x.device) if self.bidirectional else None

        streams = layer_streams(self, x)
        x, finals = (wavefront(self, x, state0, lengths, streams) if streams is not None
                     else self._layer_by_layer(x, state0, lengths, reverse))
        state_n = tuple(torch.stack(f) for f in finals)

        if packed:
            out = pack_padded_sequence(x, lengths).data
            if unsorted_indices is not None:
                state_n = tuple(s.index_select(1, unsorted_indices) for s in state_n)
            return PackedSequence(out, batch_sizes, sorted_indices, unsorted_indices), _as_hx(self.cell, state_n)
        if unbatched:
            return x.squeeze(1), _as_hx(self.cell, tuple(s.squeeze(1) for s in state_n))
        return (x.transpose(0, 1) if self.batch_first else x), _as_hx(self.cell, state_n)

    def _layer_by_layer(self, x: Tensor, state0: tuple[Tensor, ...], lengths: Tensor | None,
                        reverse: Tensor | None) -> tuple[Tensor, list[list[Tensor]]]:
        """The stack's output (T, B, D * H) over x (T, B, .) and each state's final values per layer and direction;
        a layer's two directions on two CUDA streams on a GPU (:func:`_overlapped`)."""
        finals: list[list[Tensor]] = [[] for _ in self.cell.states]
        side = _side_stream(x) if self.bidirectional else None
        if side is not None:  # made here and read by backward ops on the side stream: not reused before they ran
            for t in (*state0, *([] if reverse is None else [reverse])):
                t.record_stream(side)
        for layer in range(self.num_layers):
            runs = [partial(self._direction, layer, d, x, state0, lengths, reverse) for d in range(self.num_directions)]
            directions = [run() for run in runs] if side is None else _overlapped(side, *runs)
            for out, state in directions:
                for final, s in zip(finals, state):
                    final.append(s)
            x = torch.cat([out for out, _ in directions], -1) if self.bidirectional else directions[0][0]
            if self.dropout > 0 and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, training=True)
        return x, finals

    def _direction(self, layer: int, d: int, x: Tensor, state0: tuple[Tensor, ...], lengths: Tensor | None,
                   reverse: Tensor | None) -> tuple[Tensor, tuple[Tensor, ...]]:
        """One direction of one layer over x (T, B, .): its output (T, B, H) in x's time order and final states."""
        k = layer * self.num_directions + d
        x_d = x if d == 0 else _reversed(x, reverse)
        weights, zoneout = self._draws(layer, d, x_d)
        out, state = rnn_layer(self.cell, x_d, tuple(s[k] for s in state0), *weights, lengths=lengths,
                               backend=self.backend, zoneout=zoneout, num_heads=self.num_heads)
        return (out if d == 0 else _reversed(out, reverse)), state

    def _draws(self, layer: int, d: int, x: Tensor) -> tuple[list[Tensor | None], Tensor | None]:
        """A layer direction's weights (``weight_hh`` with its DropConnect mask in training) and its zoneout
        factors for input x (T, B, .): its random draws, in this order."""
        weights = self._weights(self._suffixes(layer)[d])
        if self.weight_drop > 0 and self.training:  # DropConnect: one mask of W_hh for the whole sequence
            weights[1] = F.dropout(weights[1], self.weight_drop, training=True)
        return weights, self._zoneout_factors(x)

    def _zoneout_factors(self, x: Tensor) -> Tensor | None:
        """A layer's zoneout factors (T, B, S * H) for input x (T, B, .): Bernoulli draws in training mode (one per
        step, row, unit and state, from the default generator), their expectation in evaluation; None without
        zoneout."""
        c, h = self.zoneout
        probabilities = (h, c)[: len(self.cell.states)]  # the states' order: h, then c
        if not any(probabilities):
            return None
        # (fills, not a copy from the host: this runs inside captured CUDA graphs too)
        p = torch.cat([x.new_full((self.hidden_size,), q) for q in probabilities])
        p = p.expand(x.shape[0], x.shape[1], -1)
        return torch.bernoulli(p) if self.training else p

    def _check_features(self, x: Tensor, layout: str, max_dim: int) -> None:
        if not isinstance(x, Tensor) or x.dim() not in (max_dim - 1, max_dim) or x.shape[-1] != self.input_size:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"{type(self).__name__}: expected input of shape {layout} with input_size={self.input_size}, "
                             f"got {shape}")

    def _initial_state(self, hx, x: Tensor, batch: int, unbatched: bool) -> tuple[Tensor, ...]:
        owner, names = type(self).__name__, [f"{s}_0" for s in self.cell.states]
        shape = (self.num_layers * self.num_directions, batch, self.hidden_size)
        if hx is None:
            zeros = x.new_zeros(shape)
            return (zeros,) * len(names)
        if self.cell.has_cell_state:
            if not isinstance(hx, (tuple, list)) or len(hx) != len(names) or not all(isinstance(t, Tensor) for t in hx):
                raise ValueError(f"{owner}: hx must be a tuple ({', '.join(names)}) of {len(names)} tensors")
            state = tuple(hx)
        else:
            if not isinstance(hx, Tensor):
                raise ValueError(f"{owner}: hx must be a tensor h_0, got {type(hx).__name__}")
            state = (hx,)
        for name, t in zip(names, state):
            if t.dim() != (2 if unbatched else 3):
                raise ValueError(f"{owner}: {name} must be {'2-D for unbatched 2-D' if unbatched else '3-D for batched'} "
                                 f"input, (num_layers * num_directions, {'' if unbatched else 'batch, '}hidden_size) = "
                                 f"{shape[::2] if unbatched else shape}; got {t.dim()}-D {tuple(t.shape)}")
        state = tuple(t.unsqueeze(1) for t in state) if unbatched else state
        for name, t in zip(names, state):
            if tuple(t.shape) != shape:
                want = shape[::2] if unbatched else shape
                got = tuple(t.shape[::2]) if unbatched else tuple(t.shape)
                raise ValueError(f"{owner}: expected {name} of shape {want} (num_layers * num_directions, batch, "
                                 f"hidden_size), got {got}")
        return state


def _zoneout_pair(owner: str, zoneout) -> tuple[float, float]:
    """(cell, hidden) zoneout probabilities from one number for both or a pair [cell, hidden]."""
    pair = tuple(zoneout) if isinstance(zoneout, Sequence) and not isinstance(zoneout, str) else (zoneout, zoneout)
    if len(pair) != 2:
        raise ValueError(f"{owner}: zoneout must be a probability or a pair [cell, hidden], got {zoneout!r}")
    c, h = (v.probability(owner, f"zoneout's {name} probability", p) for name, p in zip(("cell", "hidden"), pair))
    if max(c, h) == 1:  # (as weight_drop: the layer would never leave its initial state)
        raise ValueError(f"{owner}: zoneout's probabilities must be below 1 (1 keeps a state at its initial value at "
                         f"every step), got {zoneout!r}")
    return c, h


def _as_hx(cell: CellSpec, state: tuple[Tensor, ...]):
    """A state tuple in the cell's public form: (h, c), (h, c, n, m), or h alone."""
    return state if cell.has_cell_state else state[0]


def _check_batch_sizes(owner: str, batch_sizes: Tensor, rows: int) -> None:
    sizes = batch_sizes.tolist() if batch_sizes.dim() == 1 and batch_sizes.dtype == torch.int64 else [0]
    if not sizes or min(sizes) < 1 or any(b > a for a, b in zip(sizes, sizes[1:])) or sum(sizes) != rows:
        raise ValueError(
            f"{owner}: the PackedSequence is malformed: batch_sizes must be positive, non-increasing and sum to the "
            f"number of rows ({rows}), got {sizes[:10]}; build it with torch.nn.utils.rnn.pack_padded_sequence"
        )


def _side_stream(x: Tensor) -> torch.cuda.Stream | None:
    """The CUDA stream of x's device for a layer's backward direction, so that its kernels run beside the forward
    direction's (at small widths a layer's recurrence fills a few SMs); None where :func:`._streams.streams_usable`
    says no."""
    return kept_streams(x.device, 1)[0] if streams_usable(x) else None


def _overlapped(side: torch.cuda.Stream, first, second) -> list:
    """[first(), second()], second's kernels queued on ``side`` (after all the current stream's work so far) and
    joined back: the current stream waits for them, and their outputs are recorded as used on it, so that the
    caching allocator does not hand their memory to ``side`` while the current stream may still read it. Autograd
    runs each backward op on its forward op's stream, so the backward passes overlap as well. Called in this order,
    the random draws (zoneout, weight drop) are the same as without a side stream."""
    main = torch.cuda.current_stream(side.device)
    result = [first()]
    side.wait_stream(main)
    try:
        with torch.cuda.stream(side):
            out, state = second()
    finally:  # joined even when second() raises (an out-of-memory error a caller skips): nothing left unordered
        main.wait_stream(side)
    for t in (out, *state):
        t.record_stream(main)
    return result + [(out, state)]


def _reverse_index(lengths: Tensor | None, T: int, device) -> Tensor | None:
    """(T, B) time indices that reverse each sequence within its own length (padding stays in place);
    None when every sequence has length T (then a flip reverses them)."""
    if lengths is None:
        return None
    t = torch.arange(T)[:, None]
    index = torch.where(t < lengths[None, :], lengths[None, :] - 1 - t, t)
    return index.to(device)


def _reversed(x: Tensor, index: Tensor | None) -> Tensor:
    """x (T, B, F) with each sequence reversed in time (its own inverse)."""
    if index is None:
        return x.flip(0)
    return x.gather(0, index[:, :, None].expand(-1, -1, x.shape[-1]))


_SHAPES = """
    Shapes (D = 2 if bidirectional else 1, L = num_layers):
        input: (T, B, input_size), (B, T, input_size) with ``batch_first``, (T, input_size) unbatched, or a
            :class:`~torch.nn.utils.rnn.PackedSequence`.
        hx: {hx}, each (D * L, B, H) ((D * L, H) unbatched); default zeros.
        Returns ``(output, {ret})``: output (T, B, D * H) (or packed), {ret} (D * L, B, H).
        For packed input the final state holds each sequence's state at its own last step; each layer and
        direction is one kernel call over the padded batch, with per-sequence lengths inside the kernel.

    Raises:
        ValueError: bad sizes or arguments, an input or state of the wrong shape, or a backend the cell
            does not have.
    """


class LLTM(RecurrentLayers):
    """Stacked LLTM layers over sequences, a drop-in for ``torch.nn.LSTM`` (without ``proj_size``).

    Args:
        input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional: as ``torch.nn.LSTM``
            (dropout applies to the outputs of every layer but the last, in training mode).
        backend: ``auto``, ``python``, ``cpp`` or ``cuda`` (:mod:`lltm_train.backends`); settable later.
        weight_drop: DropConnect on the recurrent weights (Wan et al. 2013; the weight drop of AWD-LSTM,
            Merity, Keskar & Socher 2018), in [0, 1): in training mode each forward call multiplies every
            ``weight_hh`` by one Bernoulli mask (kept with probability 1 - weight_drop, scaled by its inverse,
            as ``torch.nn.functional.dropout``) for the whole sequence and batch; evaluation uses the weights
            as they are. The masks come from PyTorch's default generator (saved in checkpoints).
        zoneout: zoneout of the states (Krueger et al. 2017, "Zoneout: Regularizing RNNs by Randomly Preserving
            Hidden Activations"), one probability for h and c or a pair ``(cell, hidden)`` (a cell without c uses
            the hidden one), each in [0, 1) (ValueError otherwise, also when set after construction): in
            training each unit of each state keeps its previous value at each step with that
            probability (Bernoulli draws from the default generator); evaluation blends by the expectation,
            ``(1 - p) * new + p * previous``. Inside the fused kernels (:func:`lltm_train.functional.rnn_layer`'s
            ``zoneout``); not with ``backend="torch"``.
        num_heads: the recurrence in that many independent heads of width hidden_size / num_heads (FlashRNN's and
            xLSTM's multi-head layers; Beck et al. 2024): ``weight_hh_l{k}`` holds the heads' blocks of the
            block-diagonal recurrent matrix, (3H, H / num_heads), in the layout of
            :func:`lltm_train.functional.dense_weight_hh`; the input weights and the biases are as with one head.
            1 (the default) is ``torch.nn``'s layout. Every backend runs it (``cpp`` multiplies by the blocks
            alone; ``cuda`` by the dense block-diagonal matrix for now: :func:`lltm_train.functional.rnn_layer`).

    Parameters, for layer k and each direction (``_reverse`` suffix for the backward one):
    ``weight_ih_l{k}`` (3H, input_size or D * H), ``weight_hh_l{k}`` (3H, H), ``bias_l{k}`` (3H), gate order
    (input, output, candidate). One layout for every backend, so a state dict moves between backends and
    devices unchanged.
    """

    cell = LLTM_CELL


class LSTM(RecurrentLayers):
    """Stacked LSTM layers, with ``torch.nn.LSTM``'s math, arguments, parameters and results (no ``proj_size``).

    Args:
        input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional: as ``torch.nn.LSTM``
            (dropout applies to the outputs of every layer but the last, in training mode).
        backend: ``auto`` (the fused kernels of the device), ``python``, ``cpp``, ``cuda`` or ``torch``
            (PyTorch's own LSTM, cuDNN or oneDNN; :mod:`lltm_train.backends`); settable later.
        proj_size: only 0, ``torch.nn.LSTM``'s default (no projection); another value raises ValueError.
        weight_drop, zoneout, num_heads: as :class:`LLTM`'s (keyword only; with num_heads > 1 the state dict is no
            longer ``torch.nn.LSTM``'s).

    ``flatten_parameters()``, ``all_weights`` and ``_flat_weights_names`` behave as ``torch.nn.LSTM``'s
    (``flatten_parameters`` has nothing to do here).

    Parameters: ``torch.nn.LSTM``'s names and shapes (``weight_ih_l{k}`` (4H, input_size or D * H),
    ``weight_hh_l{k}`` (4H, H), ``bias_ih_l{k}``, ``bias_hh_l{k}`` (4H), ``_reverse`` for the backward
    direction; gates i, f, g, o), so ``load_state_dict`` works both ways with ``torch.nn.LSTM``.
    """

    cell = LSTM_CELL


class GRU(RecurrentLayers):
    """Stacked GRU layers, with ``torch.nn.GRU``'s math, arguments, parameters and results.

    Args:
        As :class:`LSTM`.

    Parameters: ``torch.nn.GRU``'s names and shapes (``weight_ih_l{k}`` (3H, input_size or D * H),
    ``weight_hh_l{k}`` (3H, H), ``bias_ih_l{k}``, ``bias_hh_l{k}`` (3H); gates r, z, n), so
    ``load_state_dict`` works both ways with ``torch.nn.GRU``.
    """

    cell = GRU_CELL


class RNN(RecurrentLayers):
    """Stacked Elman RNN layers, with ``torch.nn.RNN``'s math, arguments, parameters and results:
    ``h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)``, or ``relu`` (Elman, "Finding Structure in
    Time", 1990).

    Args:
        input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional: as ``torch.nn.RNN``
            (in its order: ``nonlinearity`` is the fourth).
        nonlinearity: ``"tanh"`` (the ``rnn`` cell, ``model.cell=rnn``) or ``"relu"`` (``rnn_relu``).
        backend: as :class:`LSTM` (``torch`` is ``torch.nn.RNN``).
        proj_size: only 0 (torch.nn's default; torch.nn.RNN refuses others too).
        weight_drop, zoneout, num_heads: as :class:`LLTM`'s (keyword only).

    Parameters: ``torch.nn.RNN``'s names and shapes (``weight_ih_l{k}`` (H, input_size or D * H),
    ``weight_hh_l{k}`` (H, H), ``bias_ih_l{k}``, ``bias_hh_l{k}`` (H)), so ``load_state_dict`` works both
    ways with ``torch.nn.RNN``.
    """

    cell = RNN_TANH

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh",
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 backend: str = "auto", device=None, dtype=None, proj_size: int = 0, *,
                 weight_drop: float = 0.0, zoneout: float | Sequence[float] = 0.0, num_heads: int = 1) -> None:
        self.cell = rnn_cell_spec(type(self).__name__, nonlinearity)
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, backend,
                         device, dtype, proj_size, weight_drop=weight_drop, zoneout=zoneout, num_heads=num_heads)
        self.nonlinearity = nonlinearity

    @property
    def mode(self) -> str:
        """``"RNN_TANH"`` or ``"RNN_RELU"``, as ``torch.nn.RNN.mode``."""
        return f"RNN_{self.nonlinearity.upper()}"

    def extra_repr(self) -> str:
        extra = f", nonlinearity={self.nonlinearity!r}" if self.nonlinearity != "tanh" else ""
        return super().extra_repr().replace(", backend=", f"{extra}, backend=", 1)


class SLSTM(RecurrentLayers):
    """Stacked sLSTM layers (Beck et al. 2024, "xLSTM: Extended Long Short-Term Memory"; FlashRNN's ``slstm``
    with a sigmoid forget gate), with ``torch.nn.LSTM``'s arguments and conventions; four states (h, c, n, m):
    the normalizer n and the stabilizer m (log space) beside h and c. The math:
    :mod:`lltm_train.ops.reference`.

    Args:
        As :class:`LSTM`, without ``zoneout`` (the sLSTM takes none: ValueError) and without ``torch`` among the
        backends (PyTorch has no sLSTM).

    Parameters: ``weight_ih_l{k}`` (4H, input_size or D * H), ``weight_hh_l{k}`` (4H, H), ``bias_l{k}`` (4H), gate
    order (input, forget, cell, output); ``_reverse`` for the backward direction.
    """

    cell = SLSTM_CELL


RecurrentLayers.drop_ins["rnn_relu"] = lambda *args, **kwargs: RNN(*args, nonlinearity="relu", **kwargs)


def recurrent_layers(cell: str | CellSpec, input_size: int, hidden_size: int, **kwargs) -> RecurrentLayers:
    """Layers of a cell by name or spec: its drop-in class (:class:`LLTM`, :class:`LSTM`, :class:`GRU`,
    :class:`RNN`, :class:`SLSTM`) where it has one, else :class:`RecurrentLayers` with ``cell=``. ``kwargs`` as :class:`LSTM`'s
    (by keyword). ValueError for an unknown cell."""
    return RecurrentLayers.for_cell(cell, input_size, hidden_size, **kwargs)


LLTM.__doc__ += _SHAPES.format(hx="``(h_0, c_0)``", ret="(h_n, c_n)")
LSTM.__doc__ += _SHAPES.format(hx="``(h_0, c_0)``", ret="(h_n, c_n)")
GRU.__doc__ += _SHAPES.format(hx="``h_0``", ret="h_n")
RNN.__doc__ += _SHAPES.format(hx="``h_0``", ret="h_n")
SLSTM.__doc__ += _SHAPES.format(hx="``(h_0, c_0, n_0, m_0)``", ret="(h_n, c_n, n_n, m_n)")
