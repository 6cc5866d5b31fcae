"""The training step as one CUDA graph (``model.cuda_graph``, :mod:`lltm_train.tasks.captured`) and
torch.compile(mode="reduce-overhead") training of the modules: both train as the eager step does (GPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from conftest import CUDA_READY, CUDA_SKIP_REASON
from lltm_train import nn as fused
from lltm_train.data.base import Batch
from lltm_train.models import CharLM
from lltm_train.ops.cells import CELLS
from lltm_train.tasks.captured import CapturedStep
from helpers import LossRecorder, make_cfg
from lltm_train.train import build

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not CUDA_READY, reason=CUDA_SKIP_REASON)]
# Weights after a dozen AdamW steps at lr 0.01, captured against eager: the captured step's optimiser is
# capturable with its lr in a device tensor, the eager one takes a float, so the updates differ in their last
# bits; Adam's g / (sqrt(v) + eps) turns that into up to 6e-6 on a weight whose gradients are near zero (H200,
# 2026-12-01). 1e-4 is 1% of one step: a skipped, repeated or stale-lr step moves weights by about 1e-2.
WEIGHT_ATOL = 1e-4
MODULES = {name: (lambda *a, _n=name, **k: fused.recurrent_layers(_n, *a, **k)) for name in CELLS}


@pytest.mark.parametrize("cell", list(MODULES))
@pytest.mark.parametrize("backend", ["cuda", "python"])
def test_reduce_overhead_training_that_accumulates_gradients_matches_eager(cell, backend):
    """The documented pattern, with .grad accumulating over the steps (no zero_grad): each step
    cudagraph_mark_step_begin(), the compiled loss, its backward. The accumulated gradients equal eager's
    (a captured backward's gradient kept as .grad would be overwritten by the next replay)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    module, eager = MODULES[cell](16, 64, backend=backend).cuda(), MODULES[cell](16, 64, backend=backend).cuda()
    eager.load_state_dict(module.state_dict())
    f = torch.compile(lambda x: module(x)[0].square().mean(), mode="reduce-overhead")
    for _ in range(4):
        x = torch.randn(12, 5, 16, device="cuda")
        torch.compiler.cudagraph_mark_step_begin()
        loss = f(x)
        loss.backward()
        want = eager(x)[0].square().mean()
        want.backward()
        assert_close(loss, want, rtol=1e-5, atol=1e-6)
    assert not counters["inductor"]["cudagraph_skips"]  # the graphs ran
    for p, q in zip(module.parameters(), eager.parameters()):
        assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)


def _train(cell: str, backend: str, batches: list[Batch], captured: bool):
    """A small language model trained on ``batches`` with fused AdamW, clipping and a schedule, eagerly or
    through :class:`CapturedStep`. Returns (losses, parameters, the CapturedStep or None)."""
    torch.manual_seed(0)
    # torch.nn's layers with dropout between them are not captured (cuDNN's own dropout state): one layer
    model = CharLM(11, hidden_size=32, embedding_dim=8, num_layers=1 if backend == "torch" else 2, dropout=0.2,
                   cell=cell, backend=backend).cuda()
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=0.01, fused=True)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 / (1 + s))

    def step(batch: Batch):
        logits, _ = model(batch.x)
        loss = F.cross_entropy(logits.reshape(-1, 11), batch.y.reshape(-1))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, 0.5, foreach=True)
        optimizer.found_inf = (~torch.isfinite(norm)).float()
        optimizer.step()
        return loss.detach(), norm

    runner = CapturedStep(step, optimizer, max_graphs=2) if captured else None
    losses = []
    for batch in batches:
        if runner is None:
            optimizer.zero_grad(set_to_none=True)
            loss, _ = step(batch)
        else:
            loss, _ = runner.run(batch)
        losses.append(float(loss))
        schedule.step()
    return losses, [p.detach().clone() for p in params], runner


@pytest.mark.parametrize("cell, backend", [*((c, "cuda") for c in CELLS), ("lstm", "torch"), ("rnn_relu", "torch")])
def test_captured_steps_train_as_eager_steps_through_shape_changes(cell, backend):
    """A capture per shape at its first batch (after warm-up steps that leave no trace), replays from then
    on, a shape beyond max_graphs (eager): the same losses and weights as eager training (dropout's random
    numbers included), and the learning-rate schedule reaches the graph."""
    shapes = [(12, 4)] * 4 + [(7, 4)] * 4 + [(12, 4)] * 3 + [(12, 3)] * 2
    batches = [Batch(torch.randint(0, 11, s, device="cuda"), None, torch.randint(0, 11, s, device="cuda")) for s in shapes]
    eager_losses, eager_weights, _ = _train(cell, backend, batches, captured=False)
    losses, weights, runner = _train(cell, backend, batches, captured=True)
    assert len(runner.graphs) == 2 and runner.replays == 4 + 4 + 3
    assert_close(losses, eager_losses, rtol=1e-5, atol=1e-6)
    for a, b in zip(weights, eager_weights):
        assert_close(a, b, rtol=1e-5, atol=WEIGHT_ATOL)


@pytest.mark.parametrize("cell, backend", [("lltm", "cuda"), ("gru", "cuda"), ("rnn", "cuda"), ("lstm", "torch")])
def test_lltm_train_captures_the_step_and_trains_as_the_eager_step(tmp_path, cell, backend):
    """Through lltm-train (Lightning): model.cuda_graph=true replays every step, gives the losses and final
    weights of model.cuda_graph=false, and callbacks still see each step's loss."""
    common = ["dataset.seq_len=32", "dataset.batch_size=4", f"model.cell={cell}", f"backend={backend}",
              "trainer.accelerator=gpu", "trainer.max_steps=12", "trainer.val_check_interval=6",
              "trainer.limit_val_batches=1", "trainer.log_every_n_steps=1", "model.dropout=0.2",
              # torch.nn's layers with dropout between them are not captured (cuDNN's own dropout state)
              f"model.num_layers={1 if backend == 'torch' else 2}"]
    runs = {}
    for graph in ("true", "false"):
        built = build(make_cfg(tmp_path / graph, *common, f"model.cuda_graph={graph}"))
        datamodule, task, trainer = built.datamodule, built.task, built.trainer
        recorder = LossRecorder()
        trainer.callbacks.append(recorder)
        trainer.fit(task, datamodule=datamodule)
        runs[graph] = (recorder.losses, [p.detach().clone() for p in task.parameters()], task.graph_replays)
    assert runs["true"][2] == 12 and runs["false"][2] == 0
    assert_close(runs["true"][0], runs["false"][0], rtol=1e-5, atol=1e-6)
    for a, b in zip(runs["true"][1], runs["false"][1]):
        assert_close(a, b, rtol=1e-4, atol=WEIGHT_ATOL)


@pytest.mark.parametrize("overrides, reason", [
    (["+trainer.accumulate_grad_batches=2"], "gradient accumulation"),
    (["model.optimizer.fused=false"], "is not a fused Adam or AdamW"),
    (["trainer.precision=16-mixed"], "16-mixed"),
    (["model.cell=lstm", "backend=torch", "model.num_layers=2", "model.dropout=0.2"], "dropout between layers"),
])
def test_a_step_that_cannot_be_captured_says_why_in_one_line_and_trains_eagerly(tmp_path, caplog, overrides, reason):
    cfg = make_cfg(tmp_path, "dataset.seq_len=16", "dataset.batch_size=4", "trainer.accelerator=gpu", "backend=cuda",
                   "trainer.max_steps=4", "trainer.val_check_interval=4", "trainer.limit_val_batches=1", *overrides)
    built = build(cfg)
    datamodule, task, trainer = built.datamodule, built.task, built.trainer
    with caplog.at_level("INFO", logger="lltm_train"):
        trainer.fit(task, datamodule=datamodule)
    lines = [r.getMessage() for r in caplog.records if "CUDA graph" in r.getMessage()]
    assert len(lines) == 1 and reason in lines[0] and "eagerly" in lines[0]
    assert task.graph_replays == 0 and trainer.global_step == 4


def test_a_compiled_network_is_captured_and_trains_as_eager(tmp_path):
    """model.compile=true with the captured step: compiled once (the graph's input buffers keep the batch's
    strides, so the capture does not recompile), then replayed; the same losses as the eager step."""
    common = ["dataset.seq_len=32", "dataset.batch_size=4", "backend=cuda", "trainer.accelerator=gpu",
              "trainer.max_steps=8", "trainer.val_check_interval=8", "trainer.limit_val_batches=1",
              "trainer.log_every_n_steps=1", "model.compile=true"]
    runs = {}
    for graph in ("true", "false"):
        torch._dynamo.reset()
        built = build(make_cfg(tmp_path / graph, *common, f"model.cuda_graph={graph}"))
        datamodule, task, trainer = built.datamodule, built.task, built.trainer
        recorder = LossRecorder()
        trainer.callbacks.append(recorder)
        trainer.fit(task, datamodule=datamodule)
        runs[graph] = (recorder.losses, task.graph_replays)
    assert runs["true"][1] == 8
    assert_close(runs["true"][0], runs["false"][0], rtol=1e-5, atol=1e-6)
