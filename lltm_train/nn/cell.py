"""One LLTM step as a module, with ``torch.nn.LSTMCell``'s conventions."""

from __future__ import annotations

from torch import Tensor, nn

from .. import validation as v
from ..functional import lltm_cell
from ._params import BackendMixin, make_weights, reset_uniform


class LLTMCell(BackendMixin, nn.Module):
    """An LLTM cell: ``h', c' = LLTMCell(x, (h, c))``; see :mod:`lltm_train.ops.reference` for the math.

    Args:
        input_size: features of x. hidden_size: features of h and c.
        bias: learn ``bias`` (3 * hidden_size). backend: ``auto``, ``python``, ``cpp`` or ``cuda``.

    Parameters: ``weight_ih`` (3H, input_size), ``weight_hh`` (3H, H), ``bias`` (3H); gate order
    (input, output, candidate); initialised U(-1/sqrt(H), 1/sqrt(H)).

    Shapes: input (B, input_size) or (input_size,); hx ``(h, c)`` each (B, H) or (H,), default zeros.
    Returns ``(h_1, c_1)`` of the same batchedness.
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, backend: str = "auto",
                 device=None, dtype=None) -> None:
        super().__init__()
        v.positive_int("LLTMCell", "input_size", input_size)
        v.positive_int("LLTMCell", "hidden_size", hidden_size)
        v.flag("LLTMCell", "bias", bias)
        self.input_size, self.hidden_size, self.backend = input_size, hidden_size, backend
        make_weights(self, "", input_size, hidden_size, bias, {"device": device, "dtype": dtype})
        self.reset_parameters()

    def reset_parameters(self) -> None:
        reset_uniform(self, self.hidden_size)

    def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        if not isinstance(input, Tensor) or input.dim() not in (1, 2) or input.shape[-1] != self.input_size:
            got = tuple(input.shape) if isinstance(input, Tensor) else type(input).__name__
            raise ValueError(f"LLTMCell: expected input of shape (B, {self.input_size}) or ({self.input_size},), got {got}")
        if hx is not None and (not isinstance(hx, (tuple, list)) or len(hx) != 2 or not all(isinstance(t, Tensor) for t in hx)):
            raise ValueError("LLTMCell: hx must be a tuple (h, c) of two tensors")
        unbatched = input.dim() == 1
        if unbatched:
            input = input.unsqueeze(0)
            hx = None if hx is None else (hx[0].unsqueeze(0), hx[1].unsqueeze(0))
        h, c = lltm_cell(input, hx, self.weight_ih, self.weight_hh, self.bias, backend=self.backend)
        return (h.squeeze(0), c.squeeze(0)) if unbatched else (h, c)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, bias={self.bias is not None}, backend={self.backend!r}"
