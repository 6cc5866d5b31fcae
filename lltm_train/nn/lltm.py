"""Multi-layer, optionally bidirectional LLTM with ``torch.nn.LSTM``'s API."""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from ..functional import lltm_layer
from ._params import BackendMixin, check_flags, check_probability, check_sizes, make_weights, reset_uniform


class LLTM(BackendMixin, nn.Module):
    """Stacked LLTM layers over sequences, a drop-in for ``torch.nn.LSTM`` (without ``proj_size``).

    Args:
        input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional: as ``torch.nn.LSTM``
            (dropout applies to the outputs of every layer but the last, in training mode).
        backend: ``auto``, ``python``, ``cpp`` or ``cuda`` (:mod:`lltm_train.backends`); settable later.

    Parameters, for layer k and each direction (``_reverse`` suffix for the backward one):
    ``weight_ih_l{k}`` (3H, input_size or D * H), ``weight_hh_l{k}`` (3H, H), ``bias_l{k}`` (3H), gate order
    (input, output, candidate). One layout for every backend, so a state dict moves between backends and
    devices unchanged.

    Shapes (D = 2 if bidirectional else 1, L = num_layers):
        input: (T, B, input_size), (B, T, input_size) with ``batch_first``, (T, input_size) unbatched, or a
            :class:`~torch.nn.utils.rnn.PackedSequence`.
        hx: ``(h_0, c_0)``, each (D * L, B, H) ((D * L, H) unbatched); default zeros.
        Returns ``(output, (h_n, c_n))``: output (T, B, D * H) (or packed), h_n and c_n (D * L, B, H).
        For packed input, h_n and c_n hold each sequence's state at its own last step.

    Raises:
        ValueError: bad sizes or arguments, an input or state of the wrong shape.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 backend: str = "auto", device=None, dtype=None) -> None:
        super().__init__()
        check_sizes("LLTM", input_size=input_size, hidden_size=hidden_size, num_layers=num_layers)
        check_flags("LLTM", bias=bias, batch_first=batch_first, bidirectional=bidirectional)
        dropout = check_probability("LLTM", "dropout", dropout)
        if dropout > 0 and num_layers == 1:
            warnings.warn("LLTM: dropout acts between layers, so it does nothing with num_layers=1", stacklevel=2)
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional, self.backend = bidirectional, backend
        factory = {"device": device, "dtype": dtype}
        for layer in range(num_layers):
            layer_input = input_size if layer == 0 else hidden_size * self.num_directions
            for suffix in self._suffixes(layer):
                make_weights(self, suffix, layer_input, hidden_size, bias, factory)
        self.reset_parameters()

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    def _suffixes(self, layer: int) -> list[str]:
        return [f"_l{layer}", f"_l{layer}_reverse"][: self.num_directions]

    def _weights(self, suffix: str) -> tuple[Tensor, Tensor, Tensor | None]:
        return getattr(self, f"weight_ih{suffix}"), getattr(self, f"weight_hh{suffix}"), getattr(self, f"bias{suffix}")

    def reset_parameters(self) -> None:
        reset_uniform(self, self.hidden_size)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}"
        for name, default in (("bias", True), ("batch_first", False), ("dropout", 0.0), ("bidirectional", False)):
            if getattr(self, name) != default:
                s += f", {name}={getattr(self, name)}"
        return s + f", backend={self.backend!r}"

    def forward(self, input: Tensor | PackedSequence, hx: tuple[Tensor, Tensor] | None = None):
        packed = isinstance(input, PackedSequence)
        unbatched = False
        if packed:
            data, batch_sizes, sorted_indices, unsorted_indices = input
            self._check_features(data, "packed data (N, input_size)", 2)
            _check_batch_sizes(batch_sizes, data.shape[0])
            segments = _packed_segments(data, batch_sizes)
            batch = int(batch_sizes[0])
        else:
            self._check_features(input, "(T, B, input_size), (B, T, input_size) if batch_first, or (T, input_size)", 3)
            unbatched = input.dim() == 2
            x = input.unsqueeze(1) if unbatched else (input.transpose(0, 1) if self.batch_first else input)
            segments, batch = [x], x.shape[1]
        h0, c0 = self._initial_state(hx, segments[0], batch, unbatched)
        if packed and sorted_indices is not None:
            h0, c0 = h0.index_select(1, sorted_indices), c0.index_select(1, sorted_indices)

        h_n, c_n = [], []
        for layer in range(self.num_layers):
            directions = []
            for d, suffix in enumerate(self._suffixes(layer)):
                k = layer * self.num_directions + d
                outs, h, c = _run_direction(segments, h0[k], c0[k], self._weights(suffix), self.backend, reverse=d == 1)
                directions.append(outs)
                h_n.append(h)
                c_n.append(c)
            segments = [torch.cat(parts, -1) for parts in zip(*directions)] if self.bidirectional else directions[0]
            if self.dropout > 0 and self.training and layer < self.num_layers - 1:
                segments = [F.dropout(s, self.dropout, training=True) for s in segments]
        h_n, c_n = torch.stack(h_n), torch.stack(c_n)

        if packed:
            out = torch.cat([s.reshape(-1, s.shape[-1]) for s in segments])
            if unsorted_indices is not None:
                h_n, c_n = h_n.index_select(1, unsorted_indices), c_n.index_select(1, unsorted_indices)
            return PackedSequence(out, batch_sizes, sorted_indices, unsorted_indices), (h_n, c_n)
        out = segments[0]
        if unbatched:
            return out.squeeze(1), (h_n.squeeze(1), c_n.squeeze(1))
        return (out.transpose(0, 1) if self.batch_first else out), (h_n, c_n)

    def _check_features(self, x: Tensor, layout: str, max_dim: int) -> None:
        if not isinstance(x, Tensor) or x.dim() not in (max_dim - 1, max_dim) or x.shape[-1] != self.input_size:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"LLTM: expected input of shape {layout} with input_size={self.input_size}, got {shape}")

    def _initial_state(self, hx, x: Tensor, batch: int, unbatched: bool) -> tuple[Tensor, Tensor]:
        shape = (self.num_layers * self.num_directions, batch, self.hidden_size)
        if hx is None:
            zeros = x.new_zeros(shape)
            return zeros, zeros
        if not isinstance(hx, (tuple, list)) or len(hx) != 2 or not all(isinstance(t, Tensor) for t in hx):
            raise ValueError("LLTM: hx must be a tuple (h_0, c_0) of two tensors")
        h0, c0 = (t.unsqueeze(1) for t in hx) if unbatched else hx
        for name, t in (("h_0", h0), ("c_0", c0)):
            if tuple(t.shape) != shape:
                want = shape[::2] if unbatched else shape
                got = tuple(t.shape[::2]) if unbatched else tuple(t.shape)
                raise ValueError(f"LLTM: expected {name} of shape {want} (num_layers * num_directions, batch, hidden_size), got {got}")
        return h0, c0


def _check_batch_sizes(batch_sizes: Tensor, rows: int) -> None:
    sizes = batch_sizes.tolist()
    if not sizes or min(sizes) < 1 or any(b > a for a, b in zip(sizes, sizes[1:])) or sum(sizes) != rows:
        raise ValueError(
            "LLTM: the PackedSequence is malformed: batch_sizes must be positive, non-increasing and sum to the "
            f"number of rows ({rows}), got {sizes[:10]}; build it with torch.nn.utils.rnn.pack_padded_sequence"
        )


def _packed_segments(data: Tensor, batch_sizes: Tensor) -> list[Tensor]:
    """Views of packed data, one (T_s, b_s, features) block per run of steps with the same batch size.

    Packed rows are time-major with sequences sorted by decreasing length, so every such run is one
    contiguous block of the data and b_s never grows.
    """
    sizes = batch_sizes.tolist()
    segments, t, row = [], 0, 0
    while t < len(sizes):
        end = t
        while end < len(sizes) and sizes[end] == sizes[t]:
            end += 1
        rows = (end - t) * sizes[t]
        segments.append(data[row : row + rows].view(end - t, sizes[t], data.shape[-1]))
        t, row = end, row + rows
    return segments


def _run_direction(segments: list[Tensor], h0: Tensor, c0: Tensor, weights, backend: str, reverse: bool):
    """One layer, one direction, over segments of non-increasing batch size.

    Forward: sequences that end at a segment boundary keep their state, which is then their final one.
    Reverse: time runs from the end, and sequences join from their own last step with their h_0, c_0.
    Returns (per-segment outputs, h_n, c_n) with h_n and c_n over the whole batch.
    """
    outs: list[Tensor | None] = [None] * len(segments)
    order = range(len(segments) - 1, -1, -1) if reverse else range(len(segments))
    h, c = (h0[:0], c0[:0]) if reverse else (h0, c0)
    for k in order:
        x = segments[k]
        b = x.shape[1]
        if reverse and b > h.shape[0]:  # sequences starting (from their end) here
            h, c = torch.cat([h, h0[h.shape[0] : b]]), torch.cat([c, c0[c.shape[0] : b]])
        out, (hb, cb) = lltm_layer(x.flip(0) if reverse else x, (h[:b], c[:b]), *weights, backend=backend)
        outs[k] = out.flip(0) if reverse else out
        if b == h.shape[0]:
            h, c = hb, cb
        else:  # forward only: sequences b.. ended before this segment
            h, c = torch.cat([hb, h[b:]]), torch.cat([cb, c[b:]])
    return outs, h, c
