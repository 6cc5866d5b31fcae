"""Stacked one-direction layers as a wavefront on a GPU: the sequence in time pieces, layer l's piece k queued on
layer l's own CUDA stream after layer l - 1's piece k, so that layer l + 1 runs piece k while layer l runs piece
k + 1 (cuDNN overlaps a stack's layers the same way). Autograd runs each backward op on its forward op's stream, so
the backward pass is a wavefront too, from the last piece of the last layer. At a small width one layer's
persistent kernel fills a few SMs; with L layers and P pieces the stack takes (P + L - 1) / (P L) of the time of
one layer after another, plus a kernel start per piece. The results are the one-stream ones up to rounding: the
input projection runs a piece at a time (GEMMs of other sizes), and in 16-bit dtypes a cell state c, kept in
float32 within a kernel call, is rounded to the dtype between pieces (about 1e-3 relative in bfloat16)."""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

from ..functional import autocast_dtype, rnn_layer
from ._streams import kept_streams, streams_usable

PIECES = 4  # time pieces: at L = 3, (4 + 2) / 12 = half the one-stream time at best
# The widths (per head) where it runs. Up to 512 a layer's kernel leaves SMs free (the cluster kernels' range; the
# wide kernels are cooperative launches). From 256: at 128 a piece's kernels are short (about 0.14 ms forward at
# T 512) and the overlap was lost, likely to each piece's host time (H100, 3 layers, T 512, B 32, against layer by
# layer: GRU 0.87x-0.95x, LSTM 1.02x-1.14x; at 512 1.21x-1.69x; BENCHMARKS.md, "Stacks"). Inside a CUDA graph
# capture a piece costs no host time, and at 128 it won there (GRU, 3 layers, bf16: 1.58x layer by layer; H100,
# 2026-12-07; BENCHMARKS.md, "Stacks"): CAPTURED_MIN_WIDTH.
MIN_WIDTH, MAX_WIDTH = 256, 512
CAPTURED_MIN_WIDTH = 128


def fits(layers, T: int, captured: bool = False) -> bool:
    """Whether ``layers`` over T steps is a stack the wavefront serves (the sizes only; :func:`layer_streams` says
    whether it runs): one direction, several layers, at least 2 steps a piece, a width a head from
    :data:`MIN_WIDTH` (:data:`CAPTURED_MIN_WIDTH` when ``captured``: inside a CUDA graph capture) to
    :data:`MAX_WIDTH`."""
    return (not layers.bidirectional and layers.num_layers >= 2 and T >= 2 * PIECES
            and (CAPTURED_MIN_WIDTH if captured else MIN_WIDTH) <= layers.hidden_size // layers.num_heads <= MAX_WIDTH)


def layer_streams(layers, x: Tensor) -> list | None:
    """One CUDA stream per layer (the current one first) when ``layers`` (a one-direction stack of several layers
    over x (T, B, .) on a GPU) runs as a wavefront; None otherwise: where :func:`._streams.streams_usable` says no
    (tested first: no guard on the sizes while tracing) or the sizes do not :func:`fit <fits>`."""
    if not streams_usable(x) or not fits(layers, x.shape[0], torch.cuda.is_current_stream_capturing()):
        return None
    return [torch.cuda.current_stream(x.device), *kept_streams(x.device, layers.num_layers - 1)]


def _between_layers(layers, T: int, B: int, like: Tensor):
    """The dropout between two layers as the one-stream loop draws it (``F.dropout`` of a layer's output, of dtype
    and device ``like``'s): a function of a piece (out, t0, t1) -> out with the mask applied, bit for bit as
    ``F.dropout`` gives it. On CUDA F.dropout is ``native_dropout``: its keep mask, applied by its backward, which
    scales in float and rounds once; on a CPU it multiplies by (Bernoulli mask / (1 - p)) in the dtype, which
    ``F.dropout`` of ones is."""
    p = layers.dropout
    ones = torch.ones(T, B, layers.hidden_size, dtype=like.dtype, device=like.device)
    if like.device.type == "cuda":
        keep = torch.native_dropout(ones, p, True)[1]
        acc = torch.float64 if like.dtype == torch.float64 else torch.float32  # the kernel's accumulate type
        scale = 1.0 / float(torch.tensor(1 - p, dtype=acc))  # as the kernel computes it: 1 / (1 - p) in that type
        return lambda out, t0, t1: torch.ops.aten.native_dropout_backward(out, keep[t0:t1], scale), keep
    noise = torch.nn.functional.dropout(ones, p, True)
    return lambda out, t0, t1: out * noise[t0:t1], noise


def wavefront(layers, x: Tensor, state0: tuple[Tensor, ...], lengths: Tensor | None,
              streams: list) -> tuple[Tensor, list[list[Tensor]]]:
    """The stack's output (T, B, H) and each state's final values per layer, as the one-stream loop of
    :meth:`RecurrentLayers.forward` gives them. ``streams``: one per layer, the current stream first (None
    entries: no stream, the pieces in turn, as the tests run it on a CPU). Each layer's random draws (weight drop,
    zoneout, the dropout between layers) are made first, in the one-stream loop's order, shapes and dtypes (a
    layer's output is in autocast's dtype where autocast is on), so they are the same numbers."""
    T, B = x.shape[0], x.shape[1]
    device = x.device.type
    out_dtype = autocast_dtype(device, x.dtype)
    below = x.new_empty(T, B, 0, dtype=out_dtype)  # stands for a layer's output: its shape and dtype for the draws
    draws = []
    for layer in range(layers.num_layers):
        weights, zoneout = layers._draws(layer, 0, x if layer == 0 else below)
        between = layers.dropout > 0 and layers.training and layer < layers.num_layers - 1
        draws.append((weights, zoneout, _between_layers(layers, T, B, below) if between else None))
    main = streams[0]
    states = [tuple(s[layer] for s in state0) for layer in range(layers.num_layers)]
    for layer, stream in enumerate(streams[1:], 1):
        if stream is not None:
            stream.wait_stream(main)
            weights, zoneout, dropout = draws[layer]
            made_here = (*states[layer], *(w for w in weights if w is not None), *([] if zoneout is None else [zoneout]))
            for t in made_here:  # read by this layer's ops, forward and backward, on its stream
                t.record_stream(stream)
    for layer, stream in enumerate(streams[:-1]):
        if stream is not None and draws[layer][2] is not None:
            draws[layer][2][1].record_stream(stream)  # the mask, read on the stream of the layer it follows
    pieces = [(T * k // PIECES, T * (k + 1) // PIECES) for k in range(PIECES)]
    outputs = []
    try:
        for t0, t1 in pieces:
            n = None if lengths is None else (lengths - t0).clamp(0, t1 - t0)  # each row's steps in this piece
            inp = x[t0:t1]
            for layer, (weights, zoneout, dropout) in enumerate(draws):
                stream = streams[layer]
                if layer and stream is not None:
                    stream.wait_stream(streams[layer - 1])
                    inp.record_stream(stream)  # made on the layer below's stream: not reused before this one reads it
                with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                    out, states[layer] = rnn_layer(layers.cell, inp, states[layer], *weights, lengths=n,
                                                   backend=layers.backend, num_heads=layers.num_heads,
                                                   zoneout=None if zoneout is None else zoneout[t0:t1])
                    inp = out if dropout is None else dropout[0](out, t0, t1)
            outputs.append(inp)
    finally:  # joined even when a layer raises: nothing left unordered
        if main is not None:
            for stream in streams[1:]:
                main.wait_stream(stream)
    if main is not None:
        for t in (*outputs, *(s for state in states for s in state)):
            t.record_stream(main)
    return torch.cat(outputs), [[state[i] for state in states] for i in range(len(layers.cell.states))]
