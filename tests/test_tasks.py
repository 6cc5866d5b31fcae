"""The LightningModules: losses and metrics against hand computations, counting, clipping, divergence."""

from __future__ import annotations

import math
from types import SimpleNamespace

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from lltm_train.data import Batch, Problem, SequenceDataModule
from lltm_train.ops.cells import CELLS
from lltm_train.tasks import ClassificationTask, LanguageModelTask, RegressionTask

NET = {"hidden_size": 8, "num_layers": 1, "dropout": 0.0, "bidirectional": False, "cell": "lltm", "backend": "python"}


def lm_task(vocab=7, **kwargs):
    args = {**NET, "embedding_dim": 4, "sample_length": 0, "sample_temperature": 1.0, **kwargs}
    return LanguageModelTask(vocab, vocab, **args)


def classifier(input_size=3, classes=4, **kwargs):
    return ClassificationTask(input_size, classes, **{**NET, **kwargs})


def regressor(input_size=2, outputs=1, **kwargs):
    return RegressionTask(input_size, outputs, **{**NET, **kwargs})


def trainer(**kwargs):
    args = {"accelerator": "cpu", "devices": 1, "logger": False, "enable_checkpointing": False,
            "enable_progress_bar": False, "enable_model_summary": False, **kwargs}
    return L.Trainer(**args)


class TensorDataModule(SequenceDataModule):
    """Fixed (x, y) tensors as all three splits, with a given Problem."""

    def __init__(self, problem: Problem, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> None:
        super().__init__(batch_size=batch_size)
        self.problem, self.x, self.y = problem, x, y

    def build(self) -> None:
        self.train_set = self.val_set = self.test_set = TensorDataset(self.x, self.y)


def attach(task, log_every_n_steps=1, global_step=0):
    """A stand-in trainer with what the task's own code reads, and a recorder of self.log calls."""
    task._trainer = SimpleNamespace(log_every_n_steps=log_every_n_steps, global_step=global_step, fast_dev_run=False,
                                    max_steps=-1, world_size=1, gradient_clip_val=None, gradient_clip_algorithm=None)
    logged = {}
    task.log = lambda name, value, **kwargs: logged.__setitem__(name, value)
    return logged


def total_norm(tensors):
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t) for t in tensors]))


# --- losses and metrics ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cell", list(CELLS))
def test_language_model_loss_is_cross_entropy_of_the_net(cell):
    task = lm_task(vocab=7, cell=cell)
    x, y = torch.randint(0, 7, (3, 5)), torch.randint(0, 7, (3, 5))
    loss = task.step(Batch(x, None, y), "train")
    logits, _ = task.net(x.t())  # (T, B, C): time-major
    expected = F.cross_entropy(logits.permute(1, 2, 0), y)  # (B, C, T) against (B, T): another layout, same mean
    torch.testing.assert_close(loss, expected)
    assert loss.requires_grad and loss.shape == ()
    # by hand: minus the mean log-probability of each target
    logp = logits.log_softmax(-1)
    by_hand = -torch.stack([logp[t, b, y[b, t]] for b in range(3) for t in range(5)]).mean()
    torch.testing.assert_close(loss, by_hand)


def test_language_model_val_metrics_are_weighted_by_tokens():
    task = lm_task(vocab=5)
    batches = [Batch(torch.randint(0, 5, (b, 4)), None, torch.randint(0, 5, (b, 4))) for b in (3, 1)]
    losses = [task.step(batch, "val").detach() for batch in batches]
    nll = task.metrics["val"]["nll"].compute()
    torch.testing.assert_close(nll, (3 * losses[0] + 1 * losses[1]) / 4)  # per token, not per batch
    hits = torch.cat([(task.net(b.x.t())[0].argmax(-1) == b.y.t()).flatten() for b in batches])
    torch.testing.assert_close(task.metrics["val"]["acc"].compute(), hits.float().mean())
    task.step(batches[0], "train")  # training updates no metric
    torch.testing.assert_close(task.metrics["val"]["nll"].compute(), nll)


def test_language_model_validate_logs_perplexity_bpc_and_baseline():
    torch.manual_seed(0)
    x, y = torch.randint(0, 6, (8, 5)), torch.randint(0, 6, (8, 5))
    dm = TensorDataModule(Problem("tokens", 6, 6), x, y, batch_size=4)
    task = lm_task(vocab=6, baseline_loss=1.25)
    metrics = trainer().validate(task, datamodule=dm, verbose=False)[0]
    with torch.no_grad():
        logits, _ = task.net(x.t())
    expected = float(F.cross_entropy(logits.permute(1, 2, 0), y))
    assert metrics["val/loss"] == pytest.approx(expected, rel=1e-5)
    assert metrics["val/perplexity"] == pytest.approx(math.exp(expected), rel=1e-5)
    assert metrics["val/bpc"] == pytest.approx(expected / math.log(2), rel=1e-5)
    assert metrics["val/acc"] == pytest.approx(float((logits.argmax(-1) == y.t()).float().mean()))
    assert metrics["val/baseline_loss"] == pytest.approx(1.25)


def test_classification_loss_with_lengths_uses_each_sequence_alone():
    task = classifier(input_size=3, classes=4, bidirectional=True).eval()
    lengths = torch.tensor([5, 2, 4])
    x = torch.randn(3, 5, 3)
    for i, n in enumerate(lengths.tolist()):
        x[i, n:] = 0.0
    y = torch.tensor([0, 3, 1])
    loss = task.step(Batch(x, lengths, y), "train")
    with torch.no_grad():
        alone = torch.cat([task.net(x[i : i + 1, :n]) for i, n in enumerate(lengths.tolist())])
    torch.testing.assert_close(loss.detach(), F.cross_entropy(alone, y), rtol=1e-5, atol=1e-6)
    # the padded steps are not read: without lengths the padded rows' logits differ (compared row by row, not
    # through the mean loss, where the two rows' changes cancelled to 1e-5 in one draw, LLTM_TEST_SEED=2279471106;
    # over 300 CPU draws the largest logit change of the padded rows was at least 0.02)
    with torch.no_grad():
        padded = task.net(x)
    torch.testing.assert_close(padded[0], alone[0], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(padded[1:], alone[1:], rtol=1e-3, atol=1e-5)


def test_classification_val_accuracy_and_loss():
    torch.manual_seed(1)
    x, y = torch.randn(12, 4, 3), torch.randint(0, 4, (12,))
    dm = TensorDataModule(Problem("classification", 3, 4), x, y, batch_size=4)
    task = classifier(input_size=3, classes=4)
    metrics = trainer().validate(task, datamodule=dm, verbose=False)[0]
    with torch.no_grad():
        logits = task.net(x)
    assert metrics["val/loss"] == pytest.approx(float(F.cross_entropy(logits, y)), rel=1e-5)
    assert metrics["val/acc"] == pytest.approx(float((logits.argmax(-1) == y).float().mean()))


@pytest.mark.parametrize("scale", [10.0, 1.0])
def test_regression_logs_mae_and_mae_in_units(scale):
    torch.manual_seed(2)
    x, y = torch.randn(12, 6, 2), torch.randn(12, 3)
    dm = TensorDataModule(Problem("regression", 2, 3, scale=scale), x, y, batch_size=5)  # batches of 5, 5 and 2
    task = regressor(input_size=2, outputs=3)
    metrics = trainer().validate(task, datamodule=dm, verbose=False)[0]
    with torch.no_grad():
        pred = task.net(x)
    mae = float((pred - y).abs().mean())
    assert metrics["val/loss"] == pytest.approx(float(F.mse_loss(pred, y)), rel=1e-5)
    assert metrics["val/mae"] == pytest.approx(mae, rel=1e-5)
    if scale != 1.0:
        assert metrics["val/mae_units"] == pytest.approx(mae * scale, rel=1e-5)
    else:
        assert "val/mae_units" not in metrics


def test_regression_test_stage_logs_mae_units():
    torch.manual_seed(3)
    x, y = torch.randn(8, 5, 2), torch.randn(8, 1)
    dm = TensorDataModule(Problem("regression", 2, 1, scale=0.5), x, y, batch_size=8)
    task = regressor()
    metrics = trainer().test(task, datamodule=dm, verbose=False)[0]
    with torch.no_grad():
        mae = float((task.net(x) - y).abs().mean())
    assert metrics["test/mae"] == pytest.approx(mae, rel=1e-5)
    assert metrics["test/mae_units"] == pytest.approx(mae * 0.5, rel=1e-5)


# --- counting ----------------------------------------------------------------------------------------------------


def test_count_with_and_without_lengths():
    x = torch.zeros(3, 7, 2)
    assert RegressionTask.count(Batch(x, None, torch.zeros(3, 1))) == (3, 21)
    assert RegressionTask.count(Batch(x, torch.tensor([7, 1, 4]), torch.zeros(3, 1))) == (3, 12)
    tokens = torch.zeros(4, 9, dtype=torch.long)
    assert lm_task().count(Batch(tokens, None, tokens)) == (4, 36)
    samples, steps = classifier().count(Batch(x, torch.tensor([2, 2, 2]), torch.zeros(3, dtype=torch.long)))
    assert (samples, steps) == (3, 6) and type(steps) is int


# --- gradient clipping and its logged norm -------------------------------------------------------------------------


def backward_once(task, scale=100.0):
    x, y = torch.randn(4, 6, 3), torch.randint(0, 4, (4,))
    (scale * task.step(Batch(x, None, y), "train")).backward()
    return [p.grad.clone() for p in task.net.parameters() if p.grad is not None]


@pytest.mark.parametrize("max_norm", [0.01, 1e6])
def test_clipping_by_norm_logs_the_norm_before_clipping(max_norm):
    task = classifier()
    logged = attach(task, log_every_n_steps=1)
    before = backward_once(task)
    norm = float(total_norm(before))
    assert norm > 0.01  # the small max_norm does clip
    task.configure_gradient_clipping(None, gradient_clip_val=max_norm, gradient_clip_algorithm="norm")
    assert float(logged["train/grad_norm"]) == pytest.approx(norm, rel=1e-5)
    after = [p.grad for p in task.net.parameters()]
    factor = min(1.0, max_norm / (norm + 1e-6))  # clip_grad_norm_'s rule
    for b, a in zip(before, after):
        torch.testing.assert_close(a, b * factor)
    assert float(total_norm(after)) == pytest.approx(min(norm, max_norm), rel=1e-4)


def test_clipping_by_norm_is_the_default_algorithm():
    task = classifier()
    attach(task)
    backward_once(task)
    task.configure_gradient_clipping(None, gradient_clip_val=0.5, gradient_clip_algorithm=None)
    assert float(total_norm([p.grad for p in task.net.parameters()])) == pytest.approx(0.5, rel=1e-4)


def test_no_clipping_still_logs_the_norm():
    task = classifier()
    task.net.head.weight.requires_grad_(False)  # a frozen parameter has no gradient and is left out
    logged = attach(task)
    task._trainer.precision_plugin = L.pytorch.plugins.precision.Precision()
    before = backward_once(task)
    assert task.net.head.weight.grad is None
    task.configure_gradient_clipping(None, gradient_clip_val=None, gradient_clip_algorithm=None)
    assert float(logged["train/grad_norm"]) == pytest.approx(float(total_norm(before)), rel=1e-5)
    for b, p in zip(before, [p for p in task.net.parameters() if p.grad is not None]):
        torch.testing.assert_close(p.grad, b)  # untouched


def test_norm_is_logged_only_on_logging_steps():
    task = classifier()
    logged = attach(task, log_every_n_steps=3, global_step=1)  # steps 0 (the first), 2, 5, ... log
    before = backward_once(task)
    task.configure_gradient_clipping(None, gradient_clip_val=0.01, gradient_clip_algorithm="norm")
    assert "train/grad_norm" not in logged
    assert float(total_norm([p.grad for p in task.net.parameters()])) == pytest.approx(0.01, rel=1e-3)  # clipped anyway
    task._trainer.global_step = 2
    task.zero_grad()
    before = backward_once(task)
    task.configure_gradient_clipping(None, gradient_clip_val=0.01, gradient_clip_algorithm="norm")
    assert float(logged["train/grad_norm"]) == pytest.approx(float(total_norm(before)), rel=1e-5)


def test_clipping_by_value_logs_the_norm_before_clipping():
    task = classifier()
    logged = attach(task)
    task._trainer.precision_plugin = L.pytorch.plugins.precision.Precision()
    before = backward_once(task)
    optimizer = torch.optim.SGD(task.parameters(), lr=0.1)
    task.configure_gradient_clipping(optimizer, gradient_clip_val=1e-3, gradient_clip_algorithm="value")
    for b, p in zip(before, task.net.parameters()):
        torch.testing.assert_close(p.grad, b.clamp(-1e-3, 1e-3))  # clipped by value (this part holds)
    assert float(logged["train/grad_norm"]) == pytest.approx(float(total_norm(before)), rel=1e-5)


class NormRecorder(RegressionTask):
    """Records the gradient norm before and after the task's clipping at every optimiser step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.before, self.after = [], []

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        self.before.append(float(total_norm([p.grad for p in self.net.parameters()])))
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        self.after.append(float(total_norm([p.grad for p in self.net.parameters()])))


def test_trainer_clips_and_logs_grad_norm_on_logging_steps(tmp_path):
    torch.manual_seed(4)
    x, y = torch.randn(32, 5, 2), 100 * torch.randn(32, 1)  # large targets: large gradients
    dm = TensorDataModule(Problem("regression", 2, 1), x, y, batch_size=4)
    task = NormRecorder(2, 1, **NET)
    logger = L.pytorch.loggers.CSVLogger(tmp_path, name="", version="")
    trainer(max_steps=6, log_every_n_steps=2, gradient_clip_val=0.5, limit_val_batches=0, logger=logger).fit(task, datamodule=dm)
    assert len(task.before) == 6 and min(task.before) > 0.5
    assert task.after == pytest.approx([0.5] * 6, rel=1e-4)
    logger.save()
    import csv

    rows = [r for r in csv.DictReader(open(tmp_path / "metrics.csv")) if r.get("train/grad_norm")]
    assert [int(r["step"]) for r in rows] == [1, 3, 5]  # the logging steps only
    assert [float(r["train/grad_norm"]) for r in rows] == pytest.approx([task.before[i] for i in (1, 3, 5)], rel=1e-5)


# --- divergence ---------------------------------------------------------------------------------------------------


def test_non_finite_loss_raises_at_a_logging_step_without_syncing_on_the_others():
    task = classifier()
    attach(task, log_every_n_steps=3, global_step=1)  # steps 0 (the first), 2, 5, ... log
    batch = Batch(torch.randn(2, 4, 3), None, torch.tensor([0, 1]))
    losses = iter([math.nan, math.nan])  # a diverged run stays diverged
    task.step = lambda batch, stage: torch.tensor(next(losses))
    assert task.training_step(batch, 1).isnan()  # step 1 logs nothing: not looked at, no stall
    task._trainer.global_step = 2  # a logging step
    with pytest.raises(FloatingPointError, match="became nan by step 2"):
        task.training_step(batch, 2)


def test_finite_losses_do_not_raise():
    task = classifier()
    logged = attach(task, log_every_n_steps=1)
    batch = Batch(torch.randn(2, 4, 3), None, torch.tensor([0, 1]))
    loss = task.training_step(batch, 0)
    assert torch.isfinite(loss) and torch.equal(logged["train/loss"], loss.detach())
    assert logged["train/loss"].device.type == "cpu"  # read at every step by the progress bar: never a device wait


class NaNFrom(ClassificationTask):
    """The loss turns NaN from a given step on, as in a diverged run."""

    def __init__(self, *args, start=0, **kwargs):
        super().__init__(*args, **kwargs)
        self.start, self.steps_run = start, []

    def step(self, batch, stage):
        loss = super().step(batch, stage)
        if stage == "train":
            self.steps_run.append(self.global_step)
            if self.global_step >= self.start:
                loss = loss + torch.tensor(math.nan)
        return loss


@pytest.mark.parametrize("every", [1, 3])
def test_trainer_stops_on_a_nan_loss_at_a_logging_step(every):
    torch.manual_seed(5)
    dm = TensorDataModule(Problem("classification", 3, 4), torch.randn(40, 4, 3), torch.randint(0, 4, (40,)), batch_size=4)
    task = NaNFrom(3, 4, start=1, **NET)  # diverges after the first step
    first_logging_step = 1 if every == 1 else every - 1
    with pytest.raises(FloatingPointError, match=f"became nan by step {first_logging_step}"):
        trainer(max_steps=8, log_every_n_steps=every, limit_val_batches=0).fit(task, datamodule=dm)
    assert task.steps_run == list(range(first_logging_step + 1))


@pytest.mark.parametrize("clip, hint", [(0.25, "or trainer.gradient_clip_val (now 0.25)"),
                                        (None, "or set trainer.gradient_clip_val (clipping is off)")])
def test_the_non_finite_hint_names_the_clipping_in_force(clip, hint):
    """Clipping is on by default (1.0): the hint says to lower it then, to set it only when it is off."""
    dm = TensorDataModule(Problem("classification", 3, 4), torch.randn(40, 4, 3), torch.randint(0, 4, (40,)), batch_size=4)
    with pytest.raises(FloatingPointError) as error:
        trainer(max_steps=4, log_every_n_steps=1, limit_val_batches=0, gradient_clip_val=clip).fit(
            NaNFrom(3, 4, start=1, **NET), datamodule=dm)
    assert str(error.value).endswith("lower model.optimizer.lr " + hint)


def test_a_negative_clip_value_never_flips_the_gradients():
    """clip_grad_norm_ with a negative bound would multiply every gradient by a negative factor."""
    task = classifier()
    attach(task, log_every_n_steps=1)
    before = backward_once(task)
    task._trainer.precision_plugin = L.pytorch.plugins.precision.Precision()
    task.configure_gradient_clipping(None, gradient_clip_val=-1.0, gradient_clip_algorithm="norm")
    for b, p in zip(before, (p for p in task.net.parameters() if p.grad is not None)):
        assert torch.equal(b, p.grad)


@pytest.mark.parametrize("backend", ["python", "cpp"])
def test_a_stateful_language_model_carries_its_state_as_one_forward_over_the_joined_windows(backend):
    """Truncated BPTT: over consecutive windows of TokenStreams, the state carried from batch to batch and
    each window's logits equal those of one forward pass over the windows joined; a new epoch starts from zeros."""
    from lltm_train.data.text import TokenStreams

    torch.manual_seed(0)
    task = lm_task(vocab=11, stateful=True, backend=backend, num_layers=2)
    streams = TokenStreams(torch.randint(0, 11, (3 * 61,), dtype=torch.int32), rows=3, seq_len=7)
    windows = [streams[k] for k in range(len(streams))]  # 8 windows of 7 steps, 3 rows
    assert len(windows) == 8 and all(torch.equal(b.x[:, 0], a.y[:, -1]) for a, b in zip(windows, windows[1:]))
    losses = []
    with torch.no_grad():
        for k, batch in enumerate(windows):
            task.on_train_batch_start(batch, k)
            assert ("train" in task._carried) == (k > 0)
            losses.append(task.step(batch, "train"))
        joined_logits, joined_state = task.net(torch.cat([w.x for w in windows], 1).t())
    state = task._carried["train"]
    expected = [F.cross_entropy(joined_logits[7 * k : 7 * k + 7].reshape(-1, 11), w.y.t().reshape(-1))
                for k, w in enumerate(windows)]
    torch.testing.assert_close(torch.stack(losses), torch.stack(expected), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state[0], joined_state[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state[1], joined_state[1], rtol=1e-5, atol=1e-5)
    task.on_train_batch_start(windows[0], 0)
    assert "train" not in task._carried  # the next epoch starts from zeros
