"""The captured step's warm-up leaves no trace (:func:`lltm_train.tasks.captured.unchanged`), checked on the
CPU: weights, optimiser state, counters and random numbers as before, so that the first real step is the
one a run without warm-up takes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import make_cfg
from lltm_train.models import CharLM
from lltm_train.tasks.captured import unchanged
from lltm_train.train import build


def _setup():
    torch.manual_seed(0)
    model = CharLM(11, hidden_size=16, embedding_dim=8, num_layers=2, dropout=0.3, backend="python")
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, fused=True)
    counter = torch.zeros((), dtype=torch.long)
    return model, optimizer, counter


def _step(model, optimizer, counter, x, y):
    optimizer.zero_grad(set_to_none=True)
    logits, _ = model(x)
    loss = F.cross_entropy(logits.reshape(-1, 11), y.reshape(-1))
    loss.backward()
    optimizer.step()
    counter.add_(1)
    return float(loss)


@pytest.mark.parametrize("steps_before", [0, 2])
def test_steps_inside_unchanged_leave_no_trace(steps_before):
    """With no optimiser state yet (0) and with some (2): after steps inside unchanged(), the next real steps
    give the same losses, weights, optimiser state and counter as a run that never took them."""
    x, y = torch.randint(0, 11, (9, 3)), torch.randint(0, 11, (9, 3))
    runs = []
    for warm in (False, True):
        model, optimizer, counter = _setup()
        for _ in range(steps_before):
            _step(model, optimizer, counter, x, y)
        if warm:
            with unchanged(optimizer, [counter]):
                for _ in range(3):
                    _step(model, optimizer, counter, x, y)
            assert int(counter) == steps_before
        losses = [_step(model, optimizer, counter, x, y) for _ in range(3)]  # dropout draws random numbers
        state = [{k: v.clone() for k, v in optimizer.state[p].items()} for p in model.parameters()]
        runs.append((losses, [p.detach().clone() for p in model.parameters()], state, int(counter)))
    (losses_a, weights_a, state_a, count_a), (losses_b, weights_b, state_b, count_b) = runs
    assert losses_a == losses_b and count_a == count_b
    assert all(torch.equal(a, b) for a, b in zip(weights_a, weights_b))
    assert all(a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a) for a, b in zip(state_a, state_b))


def test_unchanged_restores_in_place():
    """The tensors keep their identity (a CUDA graph captured afterwards holds their addresses)."""
    model, optimizer, counter = _setup()
    x, y = torch.randint(0, 11, (5, 2)), torch.randint(0, 11, (5, 2))
    _step(model, optimizer, counter, x, y)
    ids = [p.data_ptr() for p in model.parameters()] + [v.data_ptr() for p in model.parameters()
                                                         for v in optimizer.state[p].values()]
    with unchanged(optimizer, [counter]):
        _step(model, optimizer, counter, x, y)
    assert ids == [p.data_ptr() for p in model.parameters()] + [v.data_ptr() for p in model.parameters()
                                                                for v in optimizer.state[p].values()]


@pytest.mark.parametrize("overrides, refused", [
    (["model.cell=lstm", "backend=torch", "model.num_layers=2", "model.dropout=0.2"], True),
    (["model.cell=gru", "backend=torch", "model.num_layers=2", "model.dropout=0.2"], True),
    (["model.cell=lstm", "backend=torch", "model.num_layers=1", "model.dropout=0.2"], False),
    (["model.cell=lstm", "backend=torch", "model.num_layers=2", "model.dropout=0.0"], False),
    (["model.cell=lstm", "backend=python", "model.num_layers=2", "model.dropout=0.2"], False),
])
def test_torch_nn_layers_with_dropout_between_them_are_not_captured(tmp_path, overrides, refused):
    """cuDNN's dropout between layers re-seeds itself with a host synchronisation after the capture's warm-up
    restores the random-number state (a capture then fails, H200): such models train eagerly, named."""
    task = build(make_cfg(tmp_path, "trainer.accelerator=cpu", *overrides)).task
    reason = task.capture_refusal()
    assert (reason is not None) == refused
    if refused:
        assert "dropout between layers" in reason and "torch.nn." in reason
