"""The cells are listed once on each side: csrc/cell_list.h (the compiled ops) and lltm_train.ops.cells.CELLS.
Both must name the same cells, with op schemas that follow each spec; every other list of cells (configs,
modules, the bench) is made from the registry."""

from __future__ import annotations

import pytest
import torch

import lltm_train
from conftest import CUDA_READY
from lltm_train.config import cell_backends
from lltm_train.nn import RecurrentCell, RecurrentLayers, recurrent_layers
from lltm_train.ops.cells import CELLS, cell_spec, default_lr


def compiled_ops() -> set[str]:
    assert lltm_train.ops.load(), lltm_train.ops.load_error()
    return {name.split("::", 1)[1] for name in torch._C._dispatch_get_all_op_names() if name.startswith("lltm::")}


def test_cpp_and_python_list_the_same_cells():
    # check_state: no cell's, the exported models' state check (lltm_train/export.py)
    assert compiled_ops() == {op for spec in CELLS.values() for op in (spec.forward_op, spec.backward_op)} | {"check_state"}


def test_every_cell_has_kernels_on_every_device_the_library_was_built_for():
    keys = ["CPU", "Autograd"] + (["CUDA"] if CUDA_READY else [])
    for spec in CELLS.values():
        for op in (spec.forward_op, spec.backward_op):
            for key in keys:
                assert torch._C._dispatch_has_kernel_for_dispatch_key(f"lltm::{op}", key), (op, key)


def _names(schema_args) -> list[str]:
    return [a.name for a in schema_args]


@pytest.mark.parametrize("name", list(CELLS))
def test_op_schemas_follow_the_spec(name):
    spec = CELLS[name]
    states, c = spec.states[:spec.op_states], spec.has_cell_state  # the sLSTM's c0 packs its c, n and m
    forward = getattr(torch.ops.lltm, spec.forward_op).default._schema
    assert _names(forward.arguments) == ["input", *(f"{s}0" for s in states), "weight_ih", "weight_hh", *spec.biases,
                                         "lengths", "save", "zoneout", "num_heads"]
    assert _names(forward.returns) == ["output", *(f"{s}_n" for s in states), *(["cells"] if c else []), "activations"]
    backward = getattr(torch.ops.lltm, spec.backward_op).default._schema
    assert _names(backward.arguments) == ["grad_output", *(f"grad_{s}_n" for s in states), "input", "h0",
                                          *(["c0"] if c else []), "weight_ih", "weight_hh", "output",
                                          *(["cells"] if c else []), "activations", "lengths", "zoneout",
                                          "num_heads", "input_grad"]
    assert _names(backward.returns) == ["grad_input", *(f"grad_{s}0" for s in states), "grad_weight_ih",
                                        "grad_weight_hh", *(f"grad_{b}" for b in spec.biases)]


@pytest.mark.parametrize("name", list(CELLS))
def test_the_op_saves_what_the_spec_says(name):
    """The activations the forward op keeps: spec.saved blocks of H per row and step."""
    spec = CELLS[name]
    T, B, I, H = 3, 2, 4, 5
    G, states = spec.num_gates, spec.states[:spec.op_states]
    args = [torch.randn(T, B, I), torch.zeros(B, H), *(torch.zeros(B, spec.cell_blocks * H) for _ in states[1:]),
            torch.randn(G * H, I),
            torch.randn(G * H, H), *(torch.zeros(G * H) for _ in spec.biases), None]
    result = getattr(torch.ops.lltm, spec.forward_op)(*args)
    assert result[-1].shape == (T, B, spec.saved * H)
    if spec.has_cell_state:  # c_n and the cells: the cell_blocks of the c state
        assert result[2].shape == (B, spec.cell_blocks * H) and result[3].shape == (T, B, spec.cell_blocks * H)


@pytest.mark.parametrize("name", list(CELLS))
def test_every_cell_has_its_modules_configs_and_learning_rate(name):
    spec = CELLS[name]
    layers = recurrent_layers(name, 3, 4)
    assert isinstance(layers, RecurrentLayers) and layers.cell is spec
    assert isinstance(RecurrentCell(3, 4, cell=name), RecurrentCell)
    from hydra.core.config_store import ConfigStore

    options = ConfigStore.instance().list("cell_backend")
    assert {f"{name}_{b}.yaml" for b in cell_backends(spec)} <= set(options)
    assert (f"{name}_torch.yaml" in options) == spec.has_torch
    assert default_lr(name, 256) == spec.lr_at_256 and default_lr(name, 1024) == pytest.approx(spec.lr_at_256 / 4, 1e-2)
    if spec.has_torch:  # torch.nn's layer of the cell has this cell's parameters
        ours, theirs = layers, spec.torch_layer(3, 4)
        assert [(n, p.shape) for n, p in ours.named_parameters()] == [(n, p.shape) for n, p in theirs.named_parameters()]


def test_an_unknown_cell_is_named():
    with pytest.raises(ValueError, match="unknown cell 'elman'; choose one of lltm, lstm, gru, rnn, rnn_relu"):
        cell_spec("elman")
    with pytest.raises(ValueError, match="PyTorch has no LLTM"):
        lltm_train.backends.check_backend_name("torch", "lltm")
