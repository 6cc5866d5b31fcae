"""The cells of the op library, each described once: :class:`CellSpec`.

The compiled side describes the same cells in ``csrc/cells.h``. Adding a cell means its description there
and here, its reference step (:mod:`.reference`) and its tests; the fake kernels, the functional API, the
modules' parameters and ``lltm-bench`` read the spec.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import reference


@dataclass(frozen=True)
class CellSpec:
    """One cell.

    Attributes:
        name: ``lltm``, ``lstm`` or ``gru`` (``model.cell``).
        gates: the gate blocks of ``weight_ih`` and ``weight_hh``, in row order (G = len(gates)).
        states: the state tensors, h first: ``("h", "c")`` or ``("h",)``.
        biases: the bias parameters: ``("bias",)`` (the LLTM's one, G * H) or ``("bias_ih", "bias_hh")``
            (``torch.nn``'s two, G * H each).
        saved: activation blocks of H that the forward op saves for its backward.
        split: whether the last gate's h-side pre-activation stays apart from its x-side one (the GRU's
            candidate); its gradient then has G + 1 blocks.
        needs_c_prev: whether the backward reads c at t - 1 (the LSTM's forget gate), so its op takes c_0.
        forward_op, backward_op: the ops' names in ``torch.ops.lltm``.
        step: the reference step (:mod:`.reference`).
        title: the cell's name in messages and reports.
    """

    name: str
    gates: tuple[str, ...]
    states: tuple[str, ...]
    biases: tuple[str, ...]
    saved: int
    split: bool
    needs_c_prev: bool
    forward_op: str
    backward_op: str
    step: Callable
    title: str

    @property
    def num_gates(self) -> int:
        return len(self.gates)

    @property
    def has_cell_state(self) -> bool:
        return len(self.states) == 2

    @property
    def grad_blocks(self) -> int:
        return self.num_gates + self.split


LLTM = CellSpec("lltm", ("input", "output", "candidate"), ("h", "c"), ("bias",), 3, False, False, "layer_forward",
                "layer_backward", reference.lltm_step, "LLTM")
LSTM = CellSpec("lstm", ("input", "forget", "cell", "output"), ("h", "c"), ("bias_ih", "bias_hh"), 4, False, True,
                "lstm_layer_forward", "lstm_layer_backward", reference.lstm_step, "LSTM")
GRU = CellSpec("gru", ("reset", "update", "new"), ("h",), ("bias_ih", "bias_hh"), 4, True, False, "gru_layer_forward",
               "gru_layer_backward", reference.gru_step, "GRU")

CELLS: dict[str, CellSpec] = {spec.name: spec for spec in (LLTM, LSTM, GRU)}


def cell_spec(name: str | CellSpec) -> CellSpec:
    """The spec of a cell name. ValueError for an unknown one."""
    if isinstance(name, CellSpec):
        return name
    if name not in CELLS:
        raise ValueError(f"unknown cell {name!r}; choose one of {', '.join(CELLS)}")
    return CELLS[name]
