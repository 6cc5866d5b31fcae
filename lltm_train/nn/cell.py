"""One step as a module, with ``torch.nn.LSTMCell``'s conventions: :class:`LLTMCell`, :class:`LSTMCell`,
:class:`GRUCell`, :class:`RNNCell` over one shared implementation (:class:`RecurrentCell`, which takes any cell)."""

from __future__ import annotations

from torch import Tensor, nn

from .. import checks as v
from ..functional import rnn_cell
from ..ops.cells import GRU, LLTM, LSTM, RNN_RELU, RNN_TANH, SLSTM, CellSpec
from ._params import BackendMixin, CellMixin, check_heads, explain_heads_mismatch, make_weights, reset_uniform


class RecurrentCell(CellMixin, BackendMixin, nn.Module):
    """One step of a cell: ``state' = Cell(x, state)``. The subclasses fix the cell; this class takes any.

    Args:
        input_size: features of x. hidden_size: features of h (and c).
        bias: learn the biases. backend: ``auto``, ``python``, ``cpp``, ``cuda`` (and ``torch`` for the
            cells PyTorch has); settable later.
        cell: the cell's name or :class:`~lltm_train.ops.cells.CellSpec` (only where the class fixes none).
        num_heads: independent heads of width H / num_heads (keyword only; as :class:`~lltm_train.nn.LSTM`'s):
            ``weight_hh`` is then (G H, H / num_heads), the heads' blocks
            (:func:`lltm_train.functional.dense_weight_hh`).

    Parameters: ``weight_ih`` (G H, input_size), ``weight_hh`` (G H, H) and the biases (``bias``, or
    ``bias_ih`` and ``bias_hh``, G H each), as ``torch.nn.LSTMCell``/``GRUCell`` name them; initialised
    U(-1/sqrt(H), 1/sqrt(H)).

    Shapes: input (B, input_size) or (input_size,); hx: ``(h, c)`` each (B, H) or (H,), h alone for the
    GRU and the RNN, ``(h, c, n, m)`` for the sLSTM; default zeros. Returns the new state, of the same batchedness.

    Raises:
        ValueError: bad sizes, an input or state of the wrong shape, or a backend the cell does not have.
    """

    drop_ins = {}

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, backend: str = "auto",
                 device=None, dtype=None, *, cell: str | CellSpec | None = None, num_heads: int = 1) -> None:
        super().__init__()
        owner = type(self).__name__
        self._take_cell(cell)
        v.positive_int(owner, "input_size", input_size)
        v.positive_int(owner, "hidden_size", hidden_size)
        v.flag(owner, "bias", bias)
        self.num_heads = check_heads(owner, hidden_size, num_heads)
        self.input_size, self.hidden_size, self.backend = input_size, hidden_size, backend
        make_weights(self, self.cell, "", input_size, hidden_size, bias, {"device": device, "dtype": dtype}, num_heads)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        reset_uniform(self, self.hidden_size)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        explain_heads_mismatch(self, state_dict, prefix, error_msgs)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def forward(self, input: Tensor, hx=None):
        owner = type(self).__name__
        if not isinstance(input, Tensor) or input.dim() not in (1, 2) or input.shape[-1] != self.input_size:
            got = tuple(input.shape) if isinstance(input, Tensor) else type(input).__name__
            raise ValueError(f"{owner}: expected input of shape (B, {self.input_size}) or ({self.input_size},), got {got}")
        names = self.cell.states
        tupled = self.cell.has_cell_state
        if hx is not None and (
                (tupled and (not isinstance(hx, (tuple, list)) or len(hx) != len(names)
                             or not all(isinstance(t, Tensor) for t in hx)))
                or (not tupled and not isinstance(hx, Tensor))):
            raise ValueError(f"{owner}: hx must be " + (f"a tuple ({', '.join(names)}) of {len(names)} tensors" if tupled
                                                        else "a tensor h"))
        unbatched = input.dim() == 1
        state = None if hx is None else (tuple(hx) if tupled else (hx,))
        for name, t in zip(names, state or ()):  # in the caller's terms, before the unbatched unsqueeze
            want = (self.hidden_size,) if unbatched else (input.shape[0], self.hidden_size)
            if tuple(t.shape) != want:
                raise ValueError(f"{owner}: expected {name} of shape {want} for input of shape {tuple(input.shape)}, "
                                 f"got {tuple(t.shape)}")
        if unbatched:
            input = input.unsqueeze(0)
            state = None if state is None else tuple(t.unsqueeze(0) for t in state)
        biases = [getattr(self, name) for name in self.cell.biases]
        new = rnn_cell(self.cell, input, state, self.weight_ih, self.weight_hh, *biases, backend=self.backend,
                       num_heads=self.num_heads)
        new = tuple(t.squeeze(0) for t in new) if unbatched else new
        return new if tupled else new[0]

    def extra_repr(self) -> str:
        has_bias = getattr(self, self.cell.biases[0]) is not None
        heads = f", num_heads={self.num_heads}" if self.num_heads != 1 else ""
        return f"{self.input_size}, {self.hidden_size}, bias={has_bias}{self._cell_repr()}{heads}, backend={self.backend!r}"


class LLTMCell(RecurrentCell):
    """An LLTM cell: ``h', c' = LLTMCell(x, (h, c))``; parameters ``weight_ih`` (3H, input_size),
    ``weight_hh`` (3H, H), ``bias`` (3H), gate order (input, output, candidate). See :class:`RecurrentCell`
    and :mod:`lltm_train.ops.reference` for the math."""

    cell = LLTM


class LSTMCell(RecurrentCell):
    """An LSTM cell with ``torch.nn.LSTMCell``'s math and parameters: ``h', c' = LSTMCell(x, (h, c))``.
    See :class:`RecurrentCell`."""

    cell = LSTM


class GRUCell(RecurrentCell):
    """A GRU cell with ``torch.nn.GRUCell``'s math and parameters: ``h' = GRUCell(x, h)``. See
    :class:`RecurrentCell`."""

    cell = GRU


class SLSTMCell(RecurrentCell):
    """An sLSTM cell (Beck et al. 2024, "xLSTM"; FlashRNN's ``slstm``): ``h', c', n', m' = SLSTMCell(x, (h, c, n,
    m))``; parameters ``weight_ih`` (4H, input_size), ``weight_hh`` (4H, H), ``bias`` (4H), gate order (input,
    forget, cell, output). The math: :mod:`lltm_train.ops.reference`; see :class:`RecurrentCell`."""

    cell = SLSTM


class RNNCell(RecurrentCell):
    """An Elman RNN cell with ``torch.nn.RNNCell``'s math, arguments and parameters: ``h' = RNNCell(x, h)``,
    ``h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh)`` (or ``relu``). See :class:`RecurrentCell`.

    Args:
        input_size, hidden_size, bias: as ``torch.nn.RNNCell``.
        nonlinearity: ``"tanh"`` (the ``rnn`` cell) or ``"relu"`` (``rnn_relu``).
        backend: as :class:`RecurrentCell`.

    Raises:
        ValueError: an unknown nonlinearity, and as :class:`RecurrentCell`.
    """

    cell = RNN_TANH

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh",
                 backend: str = "auto", device=None, dtype=None, *, num_heads: int = 1) -> None:
        self.cell = rnn_cell_spec(type(self).__name__, nonlinearity)
        super().__init__(input_size, hidden_size, bias, backend, device, dtype, num_heads=num_heads)
        self.nonlinearity = nonlinearity

    def extra_repr(self) -> str:
        extra = f", nonlinearity={self.nonlinearity!r}" if self.nonlinearity != "tanh" else ""
        return super().extra_repr().replace(", backend=", f"{extra}, backend=", 1)


def rnn_cell_spec(owner: str, nonlinearity: str) -> CellSpec:
    """The RNN cell of a nonlinearity (``torch.nn.RNN``'s argument): ``rnn`` for tanh, ``rnn_relu`` for relu."""
    if nonlinearity not in ("tanh", "relu"):
        raise ValueError(f"{owner}: unknown nonlinearity {nonlinearity!r}; select from 'tanh' or 'relu'")
    return RNN_TANH if nonlinearity == "tanh" else RNN_RELU


RecurrentCell.drop_ins["rnn_relu"] = lambda *args, **kwargs: RNNCell(*args, nonlinearity="relu", **kwargs)


def recurrent_cell(cell: str | CellSpec, input_size: int, hidden_size: int, **kwargs) -> RecurrentCell:
    """One step of a cell by name or spec: its drop-in class (:class:`LLTMCell`, :class:`LSTMCell`,
    :class:`GRUCell`, :class:`RNNCell`, :class:`SLSTMCell`) where it has one, else :class:`RecurrentCell` with ``cell=``. ``kwargs``
    as :class:`RecurrentCell`'s (by keyword). ValueError for an unknown cell."""
    return RecurrentCell.for_cell(cell, input_size, hidden_size, **kwargs)
