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


def _train(cell: str, backend: str, batches: list[Batch], captured: bool, hidden_size: int = 32,
           num_layers: int = 2):
    """A small language model trained on ``batches`` with fused AdamW, clipping and a schedule, eagerly or
    through :class:`CapturedStep`. Returns (losses, parameters, the CapturedStep or None)."""
    torch.manual_seed(0)
    # torch.nn's layers with dropout between them are not captured (cuDNN's own dropout state): one layer
    model = CharLM(11, hidden_size=hidden_size, embedding_dim=8, num_layers=1 if backend == "torch" else num_layers,
                   dropout=0.2, cell=cell, backend=backend).cuda()
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



def _spy_streams(monkeypatch, bidirectional: bool) -> list:
    """Records (capturing, extra streams in use) at each forward of a stack: its side stream (bidirectional) or
    its wavefront's layer streams, each distinct from the current stream (a pool stream could be the same one)."""
    import lltm_train.nn.rnn as rnn

    seen = []
    if bidirectional:
        real_side = rnn._side_stream

        def side(x):
            stream = real_side(x)
            seen.append((torch.cuda.is_current_stream_capturing(),
                         stream is not None and stream != torch.cuda.current_stream()))
            return stream
        monkeypatch.setattr(rnn, "_side_stream", side)
    else:
        real_layers = rnn.layer_streams

        def layers(m, x):
            streams = real_layers(m, x)
            seen.append((torch.cuda.is_current_stream_capturing(),
                         streams is not None and len(set(streams)) == len(streams)))
            return streams
        monkeypatch.setattr(rnn, "layer_streams", layers)
    return seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("size, layers, bidirectional", [(64, 2, True), (256, 3, False)], ids=["directions", "wavefront"])
def test_a_stack_captured_with_its_streams_replays_what_it_computes_eagerly(size, layers, bidirectional, dtype,
                                                                            monkeypatch):
    """A stack's forward and backward captured in one CUDA graph with its extra streams (a bidirectional layer's
    two directions, a one-direction stack's wavefront), its random draws included (dropout between layers,
    zoneout, weight drop; bfloat16: the persistent kernels, float32 at full precision: the stepped path): each
    replay on a new input gives the outputs, final states and gradients that the same module computes eagerly on
    it from the same seed. The streams were in the capture (a stream left out of it would have run once, at
    capture time: the replays would repeat the first input's results)."""
    seen = _spy_streams(monkeypatch, bidirectional)
    torch.manual_seed(0)
    kwargs = dict(num_layers=layers, bidirectional=bidirectional, dropout=0.3, zoneout=0.1, weight_drop=0.2,
                  backend="cuda")
    module = fused.recurrent_layers("lstm", 16, size, **kwargs).to("cuda", dtype)
    eager = fused.recurrent_layers("lstm", 16, size, **kwargs).to("cuda", dtype)
    eager.load_state_dict(module.state_dict())
    x = torch.randn(16, 4, 16, device="cuda", dtype=dtype)
    g = torch.randn(16, 4, size * (2 if bidirectional else 1), device="cuda", dtype=dtype)

    def step(m):
        out, (h_n, c_n) = m(x)
        (out * g).sum().backward()
        return out, h_n, c_n

    side = torch.cuda.Stream()  # warm-up off the default stream, as torch.cuda.graph asks
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step(module)
            module.zero_grad(set_to_none=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        results = step(module)
    assert (True, True) in seen and all(used for _, used in seen)  # the streams were used, in the capture too
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    for seed in (1, 2):
        x.copy_(torch.randn_like(x))
        torch.manual_seed(seed)  # a replay draws from the generator's seed and offset at replay time
        graph.replay()
        eager.zero_grad(set_to_none=True)
        torch.manual_seed(seed)
        want = step(eager)
        torch.cuda.synchronize()
        for a, b in zip(results, want, strict=True):
            assert_close(a, b, **tol)
        for p, q in zip(module.parameters(), eager.parameters(), strict=True):
            assert_close(p.grad, q.grad, **tol)


def test_captured_steps_of_a_wavefront_stack_train_as_eager_steps(monkeypatch):
    """The captured training step (CapturedStep: clipping, the non-finite guard, fused AdamW) of a 3-layer stack
    at width 256, which runs as a wavefront on its layer streams in the capture too: the eager losses and
    weights (dropout's draws included)."""
    seen = _spy_streams(monkeypatch, bidirectional=False)
    batches = [Batch(torch.randint(0, 11, (12, 4), device="cuda"), None, torch.randint(0, 11, (12, 4), device="cuda"))
               for _ in range(6)]
    eager_losses, eager_weights, _ = _train("lstm", "cuda", batches, captured=False, hidden_size=256, num_layers=3)
    losses, weights, runner = _train("lstm", "cuda", batches, captured=True, hidden_size=256, num_layers=3)
    assert runner.replays == 6 and (True, True) in seen and all(used for _, used in seen)
    assert_close(losses, eager_losses, rtol=1e-4, atol=1e-5)
    for a, b in zip(weights, eager_weights):
        assert_close(a, b, rtol=1e-4, atol=WEIGHT_ATOL)
