"""Functional cells: a whole sequence and one step (a layer with T = 1) of any cell of :mod:`lltm_train.ops.cells`
(:func:`rnn_layer`, :func:`rnn_cell`, which take the cell's name or spec), and each with the conventions of its
PyTorch counterpart for the LLTM, LSTM and GRU (:func:`lltm_layer`, :func:`lstm_layer`, :func:`gru_layer`,
:func:`lltm_cell`, :func:`lstm_cell`, :func:`gru_cell`).

This module is the authority on the arguments of the Python API: TypeError or ValueError with the
argument's name. For the compiled backends the op's own C++ checks run first, and the Python ones only
when the op refuses its arguments, so a valid call pays for one set of checks.

Parameters follow ``torch.nn``'s layout: ``weight_ih`` (G * H, I), ``weight_hh`` (G * H, H), with G gates
in the order of ``CellSpec.gates``; the LSTM and GRU take ``bias_ih`` and ``bias_hh`` (G * H each) as
``torch.nn.LSTM``/``GRU`` do, the LLTM one ``bias`` (3H; gate order input, output, candidate; the
tutorial's single weight (3H, H + I) over ``cat([h, x])`` equals ``cat([weight_hh, weight_ih], 1)``).
See :mod:`lltm_train.ops.reference` for the formulas and :mod:`lltm_train.backends` for ``backend``.

Under ``torch.autocast`` every floating tensor is cast to the autocast dtype of the input's device, so
``bf16-mixed`` training runs the kernels in bfloat16 (with float32 arithmetic inside).
"""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .backends import resolve_backend
from .checks import positive_int
from .ops import reference
from .ops.cells import GRU, LLTM, LSTM, CellSpec, cell_spec

__all__ = ["dense_weight_hh", "gru_cell", "gru_layer", "lltm_cell", "lltm_layer", "lstm_cell", "lstm_layer", "rnn_cell",
           "rnn_layer"]


_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps", "hpu")  # asked by name: older dynamo cannot trace the check


def autocast_dtype(device_type: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype a floating-point tensor of ``dtype`` runs in: autocast's where it is on, but float64, which
    autocast leaves alone for its lower-precision ops (torch.nn.LSTM's among them)."""
    if device_type not in _AUTOCAST_DEVICES or not torch.is_autocast_enabled(device_type) or dtype == torch.float64:
        return dtype
    return torch.get_autocast_dtype(device_type)


def _autocast(device_type: str, tensors: tuple) -> tuple:
    """The floating-point tensors in :func:`autocast_dtype`."""
    if device_type not in _AUTOCAST_DEVICES or not torch.is_autocast_enabled(device_type):
        return tensors  # (the common case: one check a call)
    return tuple(t.to(autocast_dtype(device_type, t.dtype)) if isinstance(t, Tensor) and t.is_floating_point() else t
                 for t in tensors)


def _state_or_zeros(op: str, spec: CellSpec, hx, input, weight_hh, biases: tuple, batch_dim: int,
                    num_heads: int = 1) -> tuple[Tensor, ...]:
    """The initial state (h_0, c_0) or (h_0,) from ``hx`` (a tuple of them), or zeros when it is None; checks
    first that ``biases`` has the cell's number of bias arguments. ``weight_hh``: (G H, H / num_heads)."""
    if len(biases) != len(spec.biases):
        raise TypeError(f"{op}: takes {len(spec.biases)} bias argument(s) ({', '.join(spec.biases)}), got {len(biases)}")
    for name, t in (("input", input), ("weight_hh", weight_hh)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if hx is None:
        if weight_hh.dim() != 2:
            raise ValueError(f"{op}: expected weight_hh of shape ({spec.num_gates} * hidden_size, hidden_size), got "
                             f"{tuple(weight_hh.shape)}")
        if input.dim() <= batch_dim:
            raise ValueError(f"{op}: expected input with a batch dimension at {batch_dim}, got {tuple(input.shape)}")
        zeros = input.new_zeros(input.shape[batch_dim], weight_hh.shape[-1] * num_heads)
        return (zeros,) * len(spec.states)
    if not isinstance(hx, (tuple, list)) or len(hx) != len(spec.states):
        want = f"a tuple ({', '.join(spec.states)}) of {len(spec.states)} tensors" if spec.has_cell_state else "a tensor h"
        got = f"{type(hx).__name__} of {len(hx)}" if isinstance(hx, (tuple, list)) else type(hx).__name__
        raise TypeError(f"{op}: hx must be {want} or None, got {got}")
    return tuple(hx)


def _gru_hx(op: str, hx) -> tuple | None:
    if hx is not None and not isinstance(hx, Tensor):
        raise TypeError(f"{op}: hx must be a tensor h or None, got {type(hx).__name__}")
    return None if hx is None else (hx,)


def _check(op: str, spec: CellSpec, layout: str, input, states, weight_ih, weight_hh, biases) -> None:
    named = {"input": input, **dict(zip(spec.states, states)), "weight_ih": weight_ih, "weight_hh": weight_hh,
             **dict(zip(spec.biases, biases))}
    for name, t in named.items():
        if not isinstance(t, Tensor) and not (name in spec.biases and t is None):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if input.dtype not in _DTYPES:
        raise TypeError(f"{op}: expected a floating-point input (float16, bfloat16, float32, float64), got {input.dtype}")
    for name, t in named.items():
        if t is None:
            continue
        if t.dtype != input.dtype:
            raise TypeError(f"{op}: {name} has dtype {t.dtype} but input has {input.dtype}; all tensors must share one dtype")
        if t.device != input.device:
            raise ValueError(f"{op}: {name} is on {t.device} but input is on {input.device}; all tensors must be on one device")
    if input.dim() != 3:
        raise ValueError(f"{op}: expected input of shape {layout}, got {tuple(input.shape)}")
    G = spec.num_gates
    if weight_hh.dim() != 2 or weight_hh.shape[0] != G * weight_hh.shape[1]:
        raise ValueError(f"{op}: expected weight_hh of shape ({G} * hidden_size, hidden_size), got {tuple(weight_hh.shape)}")
    if input.shape[0] == 0:
        raise ValueError(f"{op}: expected a sequence of length T >= 1, got input of shape {tuple(input.shape)}")
    H, I, B = weight_hh.shape[1], input.shape[-1], input.shape[1]
    shapes = {"weight_ih": (G * H, I), **{s: (B, H) for s in spec.states}, **{b: (G * H,) for b in spec.biases}}
    for name, shape in shapes.items():
        if named[name] is not None and named[name].shape != shape:
            raise ValueError(f"{op}: expected {name} of shape {shape} for input {tuple(input.shape)} and hidden_size "
                             f"{H}, got {tuple(named[name].shape)}")


def _check_lengths(op: str, lengths, T: int, B: int) -> None:
    if not isinstance(lengths, Tensor) or lengths.dtype != torch.int64 or lengths.device.type != "cpu" \
            or lengths.shape != (B,):
        got = f"{lengths.dtype} {tuple(lengths.shape)} on {lengths.device}" if isinstance(lengths, Tensor) else type(lengths).__name__
        raise ValueError(f"{op}: lengths must be an int64 CPU tensor of shape ({B},), got {got}")
    if not B:
        return
    if torch.compiler.is_compiling():  # the values are data there: checked when the compiled code runs
        torch._assert_async(((lengths >= 0) & (lengths <= T)).all(),
                            f"{op}: every length must be in [0, T], T the input's number of time steps")
    elif not (0 <= int(lengths.min()) and int(lengths.max()) <= T):
        raise ValueError(f"{op}: every length must be in [0, T = {T}], got {lengths.min()} to {lengths.max()}")


def _uses_compiled(op: str, backend: str, tensors: tuple) -> bool:
    """True when ``backend`` (resolved) means a compiled op for these tensors."""
    if backend not in ("cpp", "cuda"):
        return False
    # The compiled ops have no forward-mode derivative. Tangents exist only inside a dual level
    # (torch.func.jvp, torch.autograd.forward_ad), so the common case costs one comparison.
    if fwAD._current_level >= 0 and not torch.compiler.is_compiling():
        if any(isinstance(t, Tensor) and fwAD.unpack_dual(t).tangent is not None for t in tensors):
            raise NotImplementedError(f"{op}: forward-mode AD (torch.func.jvp, torch.autograd.forward_ad) is not "
                                      "supported by the cpp and cuda backends; use backend='python'")
    return True


@torch.compiler.disable  # torch.compile runs PyTorch's RNN kernels eagerly, as it runs torch.nn.LSTM (Inductor
def _torch_layer(spec: CellSpec, input: Tensor, states: tuple, weight_ih: Tensor, weight_hh: Tensor, biases: tuple,
                 lengths: Tensor | None) -> tuple[Tensor, tuple]:  # failed on mkldnn_rnn_layer, CPU, torch 2.13)
    """One layer through PyTorch's own kernels for the cell (cuDNN, oneDNN: ``CellSpec.torch_function``), the
    ``torch`` backend."""
    if input.shape[1] == 0:  # an empty batch (torch's kernels cannot pack one): empty results in the autograd graph
        # of every argument (as torch.nn.LSTM's: a backward gives zero gradients), through sums of empty slices (0)
        anchor = sum(t[:0].sum() for t in (input, *states, weight_ih, weight_hh, *biases) if t is not None)
        return input.new_zeros(input.shape[0], 0, weight_hh.shape[-1]) + anchor, tuple(s + anchor for s in states)
    b_ih, b_hh = biases
    has_biases = b_ih is not None or b_hh is not None
    params = [weight_ih, weight_hh]
    if has_biases:  # torch's kernels take both biases or none
        params += [b if b is not None else weight_hh.new_zeros(weight_hh.shape[0]) for b in (b_ih, b_hh)]
    run = spec.torch_run()
    hx = tuple(s.unsqueeze(0) for s in states)
    hx = hx if spec.has_cell_state else hx[0]
    train = torch.is_grad_enabled()  # no dropout either way; cuDNN's backward needs the training mode
    if lengths is None:
        output, *state = run(input, hx, params, has_biases, 1, 0.0, train, False, False)
    else:  # packed: every row stops at its own length (a length of 0 keeps the initial state)
        empty = (lengths == 0).to(input.device)
        if bool(empty.any()):
            # torch's kernels take at least one step a row: a row of length 0 takes it on zeros, whose
            # result is dropped below (padding there could be NaN, and 0 * NaN would reach the gradients)
            input = input.masked_fill(empty[None, :, None], 0)
        packed = pack_padded_sequence(input, lengths.clamp_min(1), enforce_sorted=False)
        order, back = packed.sorted_indices, packed.unsorted_indices
        hx = tuple(h.index_select(1, order.to(h.device)) for h in hx) if spec.has_cell_state else hx.index_select(1, order.to(hx.device))
        data, *state = run(packed.data, packed.batch_sizes, hx, params, has_biases, 1, 0.0, train, False)
        state = [s.index_select(1, back.to(s.device)) for s in state]
        output, _ = pad_packed_sequence(type(packed)(data, packed.batch_sizes, order, back), total_length=input.shape[0])
        if bool(empty.any()):
            output = output.masked_fill(empty[None, :, None], 0)
            state = [torch.where(empty[None, :, None], s0.unsqueeze(0), s) for s, s0 in zip(state, states)]
    return output, tuple(s.squeeze(0) for s in state)


def _needs_backward(tensors: tuple) -> bool:
    """Whether autograd will want this forward's activations: under ``torch.no_grad()``, inference mode, or with
    nothing that requires grad, the compiled ops keep none (``save=False``: less memory, fewer writes). A
    program traced or exported with ``save=False`` still trains: the op saves wherever autograd needs it. So a
    ``torch.jit.trace`` always records False: one constant, whatever grad mode its check run has."""
    if not torch.is_grad_enabled() or torch.jit.is_tracing():
        return False
    # (inference mode with enable_grad inside records nothing; Dynamo cannot trace the question, so not there)
    if not torch.compiler.is_compiling() and torch.is_inference_mode_enabled():
        return False
    return any(isinstance(t, Tensor) and t.requires_grad for t in tensors)


def _check_zoneout(op: str, spec: CellSpec, zoneout, input: Tensor, weight_hh: Tensor, backend: str) -> None:
    if not spec.zoneout:
        raise ValueError(f"{op}: the {spec.title} takes no zoneout (its states {', '.join(spec.states)} are not kept "
                         "in part); pass zoneout=None")
    if backend == "torch":
        raise ValueError(f"{op}: zoneout runs in the fused backends (python, cpp, cuda); PyTorch's own "
                         f"{spec.title} (backend='torch') has none")
    if not isinstance(zoneout, Tensor):
        raise TypeError(f"{op}: zoneout must be a torch.Tensor or None, got {type(zoneout).__name__}")
    S = len(spec.states)
    want = (*input.shape[:2], S * weight_hh.shape[-1])
    if tuple(zoneout.shape) != want:
        raise ValueError(f"{op}: expected zoneout of shape (T, B, {S} * hidden_size) = {want}, got {tuple(zoneout.shape)}")
    if zoneout.dtype != input.dtype or zoneout.device != input.device:
        raise TypeError(f"{op}: zoneout must have input's dtype and device ({input.dtype} on {input.device}), got "
                        f"{zoneout.dtype} on {zoneout.device}")


def _op_states(spec: CellSpec, states: tuple) -> tuple:
    """The ops' state arguments: h, and the c state with the sLSTM's n and m packed behind it (B, C H). States
    not 2-D, or of other shapes or dtypes than h's, raise RuntimeError, so that the Python checks name them (the
    op sees only the packed sum: c and n of widths 5 and 7 would pass as two of 6)."""
    if spec.cell_blocks <= 1:
        return states
    h = states[0]
    if not isinstance(h, Tensor) or h.dim() != 2 or not all(
            isinstance(s, Tensor) and s.shape == h.shape and s.dtype == h.dtype for s in states[1:]):
        raise RuntimeError(f"the {spec.title}'s states differ from h in shape or dtype")
    return h, torch.cat(states[1:], 1)


def _layer(spec: CellSpec, op: str, layout: str, input, states, weight_ih, weight_hh, biases, lengths, backend,
           zoneout=None, num_heads=1):
    tensors = _autocast(input.device.type, (input, *states, weight_ih, weight_hh, *biases))
    input, states, (weight_ih, weight_hh), biases = tensors[0], tensors[1:1 + len(states)], \
        tensors[1 + len(states):3 + len(states)], tensors[3 + len(states):]
    if zoneout is not None and isinstance(zoneout, Tensor) and zoneout.is_floating_point():
        zoneout = zoneout.to(input.dtype)  # (autocast's dtype, as the other tensors)
    if lengths is not None:
        _check_lengths(op, lengths, input.shape[0], input.shape[1] if input.dim() > 1 else 0)
    chosen = resolve_backend(backend, input.device.type, spec.name)
    # (zoneout and num_heads absent from the call at their defaults: exported programs unchanged)
    extra = () if zoneout is None and num_heads == 1 else (zoneout,) + (() if num_heads == 1 else (num_heads,))
    if _uses_compiled(op, chosen, tensors):  # the kernels take the heads' blocks (csrc/lltm.h)
        # The op checks every argument itself (in C++, for nothing on the common path); when it refuses
        # them, the Python checks say what is wrong in this API's terms (TypeError, ValueError, names).
        try:
            op_args = (input, *_op_states(spec, states), weight_ih, weight_hh, *biases)
            result = getattr(torch.ops.lltm, spec.forward_op)(*op_args, lengths, _needs_backward(tensors), *extra)
        except (RuntimeError, TypeError) as exc:
            weight_hh = _dense_weight_hh(op, spec, weight_hh, num_heads)
            _check(op, spec, layout, input, states, weight_ih, weight_hh, biases)
            if zoneout is not None:
                _check_zoneout(op, spec, zoneout, input, weight_hh, chosen)
            if "autograd::Function with functorch transforms" in str(exc):  # PyTorch's words name neither us nor a fix
                raise NotImplementedError(f"{op}: torch.func's grad, vjp and jacrev cannot enter the {chosen} backend's "
                                          "backward (a C++ autograd function); use backend='python' "
                                          "(torch.vmap works)") from exc
            raise
        if spec.cell_blocks > 1:  # h_n, then the packed c_n
            return result[0], (result[1], *result[2].chunk(spec.cell_blocks, 1))
        return result[0], tuple(result[1:1 + len(states)])
    weight_hh = _dense_weight_hh(op, spec, weight_hh, num_heads)  # python and torch: the dense matrix
    _check(op, spec, layout, input, states, weight_ih, weight_hh, biases)
    if zoneout is not None:
        _check_zoneout(op, spec, zoneout, input, weight_hh, chosen)
    if chosen == "python" and layout.startswith("(T,") and torch.jit.is_tracing():  # its loop, unrolled
        raise RuntimeError(f"{op}: torch.jit.trace of the python backend records its loop over time step by step, so "
                           f"the trace would run sequences of {input.shape[0]} steps only; trace with backend='cpp' or "
                           "'cuda' (one op per layer), or use torch.export or torch.compile")
    if chosen == "torch" and weight_hh.shape[-1] > 0:  # torch's kernels refuse hidden_size 0: the reference gives
        return _torch_layer(spec, input, states, weight_ih, weight_hh, biases, lengths)  # the empty result
    return reference.layer_forward(spec.step, spec.split, input, states, weight_ih, weight_hh, *biases,
                                   lengths=lengths, zoneout=None if zoneout is None else zoneout.detach())


def dense_weight_hh(cell: str | CellSpec, weight_hh: Tensor, num_heads: int) -> Tensor:
    """The recurrent weight of ``num_heads`` heads as one dense, block-diagonal matrix (G * H, H).

    With NH heads of width DH (H = NH * DH) each head is a recurrence of its own: unit ``a * DH + j`` of head
    ``a`` reads only the DH units of its head at the step before (the multi-head LSTM of FlashRNN and
    xLSTM; Beck et al. 2024, "xLSTM: Extended Long Short-Term Memory"). ``weight_hh`` holds only those blocks:
    (G * H, DH), row ``g * H + a * DH + j`` (gate g, unit a * DH + j, the row order of ``torch.nn``'s
    weights), column k the unit ``a * DH + k`` it reads. ``num_heads=1`` is ``torch.nn``'s (G * H, H), returned
    as it is. The result is differentiable (the gradient of ``weight_hh`` is the dense one's diagonal blocks).

    Raises:
        TypeError: ``weight_hh`` not a floating-point tensor.
        ValueError: num_heads not a positive integer, hidden_size (weight_hh's rows / G) not a multiple of it, or
            ``weight_hh`` not of shape (G * H, H / num_heads).
    """
    spec = cell_spec(cell)
    return _dense_weight_hh("dense_weight_hh", spec, weight_hh, num_heads)


def _check_num_heads(op: str, num_heads) -> None:
    if isinstance(num_heads, torch.SymInt):  # made dynamic by torch.compile: checked as the graph runs
        torch._check(num_heads >= 1, lambda: f"{op}: num_heads must be a positive integer")
    else:
        positive_int(op, "num_heads", num_heads)


def _check_heads_weight(op: str, spec: CellSpec, weight_hh, num_heads) -> None:
    """weight_hh of the heads' shape (G H, H / num_heads), H a multiple of num_heads (num_heads checked first)."""
    _check_num_heads(op, num_heads)
    if not isinstance(weight_hh, Tensor) or not weight_hh.is_floating_point():
        got = weight_hh.dtype if isinstance(weight_hh, Tensor) else type(weight_hh).__name__
        raise TypeError(f"{op}: weight_hh must be a floating-point torch.Tensor, got {got}")
    G = spec.num_gates

    def expected() -> str:  # (built only to raise: an f-string of a dynamic num_heads breaks a fullgraph compile)
        return "hidden_size" if num_heads == 1 else f"hidden_size / {int(num_heads)}"

    if weight_hh.dim() != 2 or weight_hh.shape[0] % G:
        raise ValueError(f"{op}: expected weight_hh of shape ({G} * hidden_size, {expected()}), "
                         f"got {tuple(weight_hh.shape)}")
    H = weight_hh.shape[0] // G
    if H % num_heads:
        raise ValueError(f"{op}: hidden_size ({H}, weight_hh's {weight_hh.shape[0]} rows / {G} gates) must be a "
                         f"multiple of num_heads ({int(num_heads)}): each head is hidden_size / num_heads units wide")
    if weight_hh.shape[1] * num_heads != H:
        raise ValueError(f"{op}: expected weight_hh of shape ({G} * hidden_size, {expected()}) = ({G * H}, "
                         f"{int(H // num_heads)}), got {tuple(weight_hh.shape)}")


def _dense_weight_hh(op: str, spec: CellSpec, weight_hh: Tensor, num_heads: int) -> Tensor:
    _check_heads_weight(op, spec, weight_hh, num_heads)
    if num_heads == 1:
        return weight_hh
    G = spec.num_gates
    DH = weight_hh.shape[1]
    eye = torch.eye(num_heads, dtype=weight_hh.dtype, device=weight_hh.device)
    blocks = weight_hh.reshape(G, num_heads, DH, DH)
    return torch.einsum("gajk,ab->gajbk", blocks, eye).reshape(G * num_heads * DH, num_heads * DH)


def rnn_layer(cell: str | CellSpec, input: Tensor, hx: tuple[Tensor, ...] | None, weight_ih: Tensor,
              weight_hh: Tensor, *biases: Tensor | None, lengths: Tensor | None = None,
              backend: str = "auto", zoneout: Tensor | None = None,
              num_heads: int = 1) -> tuple[Tensor, tuple[Tensor, ...]]:
    """One layer of any cell (its name, e.g. ``"rnn_relu"``, or its spec) over a sequence, its state as a
    tuple: ``hx`` and the result's state are ``(h, c)`` or ``(h,)``, and ``biases`` the cell's
    (``CellSpec.biases``). :func:`lltm_layer`, :func:`lstm_layer` and :func:`gru_layer` are this with their
    cell's conventions, and document it; ValueError for an unknown cell.

    ``zoneout``: None, or the zoneout factors (T, B, S * hidden_size) of the S states (h, then c), input's
    dtype and device: after every step each state is ``torch.lerp(new, previous, factor)``
    (:mod:`lltm_train.ops.reference`; Krueger et al. 2017), so 1 keeps the unit's previous value and 0 takes the
    new one (Bernoulli draws in training; the keep probability for the expectation). The values are not checked
    (that would cost a GPU a host sync a call): outside [0, 1] the lerp extrapolates. The factors get no
    gradient. Not with ``backend="torch"`` (ValueError).

    ``num_heads``: the recurrence in NH independent heads, ``weight_hh`` (G * hidden_size, hidden_size / NH) in
    the layout of :func:`dense_weight_hh`; every backend runs it, ``torch`` included. The ``cpp`` kernels and
    ``cuda``'s persistent kernels run each head's (DH, DH) blocks as a recurrence of its own; ``python``, ``torch``
    and ``cuda``'s stepped path (widths or batches no persistent kernel takes) the dense block-diagonal matrix,
    where a head costs what the whole width costs and a non-finite value in one head's state or weights reaches
    every head (its zeros times NaN or inf are NaN); finite values agree across backends."""
    cell = cell_spec(cell)
    name = f"{cell.name}_layer"
    _check_num_heads(name, num_heads)
    if num_heads != 1:  # (the op checks a dense weight_hh itself)
        _check_heads_weight(name, cell, weight_hh, num_heads)
    states = _state_or_zeros(name, cell, hx, input, weight_hh, biases, 1, num_heads)
    return _layer(cell, name, "(T, B, input_size)", input, states, weight_ih, weight_hh, biases, lengths, backend,
                  zoneout, num_heads)


def rnn_cell(cell: str | CellSpec, input: Tensor, hx: tuple[Tensor, ...] | None, weight_ih: Tensor,
             weight_hh: Tensor, *biases: Tensor | None, backend: str = "auto", num_heads: int = 1) -> tuple[Tensor, ...]:
    """One step of any cell (input (B, input_size)), its state as a tuple and ``num_heads`` as in
    :func:`rnn_layer`."""
    cell = cell_spec(cell)
    name = f"{cell.name}_cell"
    _check_num_heads(name, num_heads)
    if num_heads != 1:
        _check_heads_weight(name, cell, weight_hh, num_heads)
    states = _state_or_zeros(name, cell, hx, input, weight_hh, biases, 0, num_heads)
    if not isinstance(input, Tensor) or input.dim() != 2:
        got = tuple(input.shape) if isinstance(input, Tensor) else type(input).__name__
        raise ValueError(f"{name}: expected input of shape (B, input_size), got {got}")
    _, state = _layer(cell, name, "(B, input_size)", input.unsqueeze(0), states, weight_ih, weight_hh, biases, None,
                      backend, num_heads=num_heads)
    return state


_LAYER_DOC = """
    Args:
        input: (T, B, input_size), time-major, T >= 1; B may be 0 (empty outputs). Floating point
            (float16, bfloat16, float32, float64).
        hx: {hx}, each (B, hidden_size), or None for zeros.
        weight_ih: ({G} * hidden_size, input_size). weight_hh: ({G} * hidden_size, hidden_size).
        {bias}
        lengths: None, or (B,) int64 on the CPU with values in [0, T]: row b runs lengths[b] steps, then
            keeps its state and outputs zeros (padded batches; one kernel call whatever the lengths). What
            the padding holds never reaches an output or a gradient.
        backend: {backends} (see :mod:`lltm_train.backends`).
        num_heads: independent heads of hidden_size / num_heads units; weight_hh then holds the heads' blocks,
            ({G} * hidden_size, hidden_size / num_heads) (:func:`dense_weight_hh`, :func:`rnn_layer`).

    Returns:
        {returns} output (T, B, hidden_size) holds h_1..h_T; the final state (B, hidden_size) holds each
        row's state after its last step. Dtype and device of ``input``. Under ``torch.no_grad()``, inference
        mode, or with no argument that requires grad, the cpp and cuda backends keep no activations for a
        backward (sampling and evaluation use less memory).

    Raises:
        TypeError: a non-tensor argument, an integer input, or mixed dtypes.
        ValueError: wrong shapes, T = 0, bad lengths, mixed devices, an unknown backend or one for
            another device.
        RuntimeError: the backend asked for is not built or usable here.
        NotImplementedError: forward-mode AD or a second derivative with the cpp or cuda backend.
    """


def lltm_layer(input: Tensor, hx: tuple[Tensor, Tensor] | None, weight_ih: Tensor, weight_hh: Tensor,
               bias: Tensor | None = None, *, lengths: Tensor | None = None,
               backend: str = "auto", num_heads: int = 1) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    output, (h_n, c_n) = rnn_layer(LLTM, input, hx, weight_ih, weight_hh, bias, lengths=lengths, backend=backend,
                                   num_heads=num_heads)
    return output, (h_n, c_n)


def lstm_layer(input: Tensor, hx: tuple[Tensor, Tensor] | None, weight_ih: Tensor, weight_hh: Tensor,
               bias_ih: Tensor | None = None, bias_hh: Tensor | None = None, *, lengths: Tensor | None = None,
               backend: str = "auto", num_heads: int = 1) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    output, (h_n, c_n) = rnn_layer(LSTM, input, hx, weight_ih, weight_hh, bias_ih, bias_hh, lengths=lengths,
                                   backend=backend, num_heads=num_heads)
    return output, (h_n, c_n)


def gru_layer(input: Tensor, hx: Tensor | None, weight_ih: Tensor, weight_hh: Tensor, bias_ih: Tensor | None = None,
              bias_hh: Tensor | None = None, *, lengths: Tensor | None = None,
              backend: str = "auto", num_heads: int = 1) -> tuple[Tensor, Tensor]:
    output, (h_n,) = rnn_layer(GRU, input, _gru_hx("gru_layer", hx), weight_ih, weight_hh, bias_ih, bias_hh,
                               lengths=lengths, backend=backend, num_heads=num_heads)
    return output, h_n


_FUSED = '``"auto"``, ``"python"``, ``"cpp"`` or ``"cuda"``'
_ALL = '``"auto"``, ``"python"``, ``"cpp"``, ``"cuda"`` or ``"torch"``'
lltm_layer.__doc__ = "One LLTM layer, one direction, over a whole sequence (the time loop runs inside the backend).\n" + \
    _LAYER_DOC.format(hx="``(h_0, c_0)``", G=3, bias="bias: (3 * hidden_size,) or None.", backends=_FUSED,
                      returns="``(output, (h_n, c_n))``:")
lstm_layer.__doc__ = "One LSTM layer (``torch.nn.LSTM``'s math), one direction, over a whole sequence.\n" + \
    _LAYER_DOC.format(hx="``(h_0, c_0)``", G=4, bias="bias_ih, bias_hh: (4 * hidden_size,) each, or None.",
                      backends=_ALL,
                      returns="``(output, (h_n, c_n))``:")
gru_layer.__doc__ = "One GRU layer (``torch.nn.GRU``'s math), one direction, over a whole sequence.\n" + \
    _LAYER_DOC.format(hx="``h_0``", G=3, bias="bias_ih, bias_hh: (3 * hidden_size,) each, or None.",
                      backends=_ALL,
                      returns="``(output, h_n)``:")


def lltm_cell(input: Tensor, hx: tuple[Tensor, Tensor] | None, weight_ih: Tensor, weight_hh: Tensor,
              bias: Tensor | None = None, *, backend: str = "auto", num_heads: int = 1) -> tuple[Tensor, Tensor]:
    """One LLTM step: :func:`lltm_layer` over a sequence of length 1.

    Args:
        input: (B, input_size). hx: ``(h_0, c_0)``, each (B, hidden_size), or None for zeros.
        weight_ih, weight_hh, bias, backend, num_heads: as in :func:`lltm_layer`.

    Returns:
        ``(h_1, c_1)``, each (B, hidden_size), dtype and device of ``input``.

    Raises:
        As :func:`lltm_layer`.
    """
    h_1, c_1 = rnn_cell(LLTM, input, hx, weight_ih, weight_hh, bias, backend=backend, num_heads=num_heads)
    return h_1, c_1


def lstm_cell(input: Tensor, hx: tuple[Tensor, Tensor] | None, weight_ih: Tensor, weight_hh: Tensor,
              bias_ih: Tensor | None = None, bias_hh: Tensor | None = None, *,
              backend: str = "auto", num_heads: int = 1) -> tuple[Tensor, Tensor]:
    """One LSTM step (``torch.nn.LSTMCell``'s math): :func:`lstm_layer` over a sequence of length 1.

    Returns ``(h_1, c_1)``, each (B, hidden_size). Arguments and errors as :func:`lltm_cell`'s, with the
    biases of :func:`lstm_layer`.
    """
    h_1, c_1 = rnn_cell(LSTM, input, hx, weight_ih, weight_hh, bias_ih, bias_hh, backend=backend, num_heads=num_heads)
    return h_1, c_1


def gru_cell(input: Tensor, hx: Tensor | None, weight_ih: Tensor, weight_hh: Tensor, bias_ih: Tensor | None = None,
             bias_hh: Tensor | None = None, *, backend: str = "auto", num_heads: int = 1) -> Tensor:
    """One GRU step (``torch.nn.GRUCell``'s math): :func:`gru_layer` over a sequence of length 1.

    Returns h_1 (B, hidden_size). hx: h_0 (B, hidden_size) or None. Errors as :func:`lltm_cell`'s.
    """
    (h_1,) = rnn_cell(GRU, input, _gru_hx("gru_cell", hx), weight_ih, weight_hh, bias_ih, bias_hh, backend=backend,
                      num_heads=num_heads)
    return h_1
