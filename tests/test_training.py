"""The training framework end to end on the CPU: every data set with every backend, resume, precision, compile."""

from __future__ import annotations

import warnings

import lightning as L
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar.layout_pb2 import Layout
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

import lltm_train.nn
from conftest import CUDA_READY, CUDA_SKIP_REASON
from helpers import LossRecorder, make_cfg
from lltm_train.config import ConfigError
from lltm_train.ops.cells import CELLS
from lltm_train.train import build, train

SMALL = {  # a few small batches of every data set
    "shakespeare": ["dataset.seq_len=32", "dataset.batch_size=4"],
    "text": ["dataset.seq_len=16", "dataset.batch_size=4"],  # path set by the test
    "smnist": ["dataset.batch_size=4"],
    "japanese_vowels": ["dataset.batch_size=8"],
    "co2": ["dataset.batch_size=8"],
    "adding": ["dataset.seq_len=30", "dataset.train_size=64", "dataset.val_size=16", "dataset.batch_size=8"],
    "copy": ["dataset.delay=20", "dataset.length=4", "dataset.train_size=64", "dataset.val_size=16", "dataset.batch_size=8"],
}


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("It is a truth universally acknowledged, that a single man in possession of a good fortune. " * 60)
    return path


@pytest.mark.parametrize("backend", ["python", "cpp"])
@pytest.mark.parametrize("dataset", sorted(SMALL))
def test_fast_dev_run_every_dataset_and_backend(tmp_path, text_file, dataset, backend):
    extra = [f"dataset.path={text_file}"] if dataset == "text" else []
    cfg = make_cfg(tmp_path, f"dataset={dataset}", f"backend={backend}", "+trainer.fast_dev_run=2", *SMALL[dataset], *extra)
    metrics = train(cfg)
    assert torch.isfinite(torch.tensor(metrics["train/loss"])) and torch.isfinite(torch.tensor(metrics["val/loss"]))


@pytest.mark.parametrize("dataset", ["shakespeare", "japanese_vowels", "adding"])
def test_backends_give_the_same_first_losses(tmp_path, dataset):
    _same_first_losses(tmp_path, dataset, "cpp")


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA_READY, reason=CUDA_SKIP_REASON)
def test_cuda_backend_gives_the_same_first_losses(tmp_path):
    _same_first_losses(tmp_path, "adding", "cuda", "trainer.accelerator=gpu", "float32_matmul_precision=highest")


CUDA_RUN = pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not CUDA_READY, reason=CUDA_SKIP_REASON)])


def _on(backend: str, *values):
    """A parameter set, marked to run on the GPU machine for the cuda backend."""
    return pytest.param(*values, marks=CUDA_RUN.marks) if backend == "cuda" else pytest.param(*values)


@pytest.mark.parametrize("dataset, backend, cell", [
    *(_on(b, d, b, "lltm") for d in ("shakespeare", "japanese_vowels") for b in ("python", "cpp", "cuda")),
    _on("cpp", "shakespeare", "cpp", "lstm"), _on("cpp", "japanese_vowels", "cpp", "gru"),
    _on("cuda", "shakespeare", "cuda", "gru")])
def test_deterministic_runs_are_identical_bit_for_bit(tmp_path, dataset, backend, cell):
    """trainer.deterministic=true: two runs of the same config (dropout on) end with the same weights, bit for bit."""
    extra = ["trainer.accelerator=gpu", "float32_matmul_precision=highest"] if backend == "cuda" else []
    common = [f"dataset={dataset}", *SMALL[dataset], f"backend={backend}", f"model.cell={cell}", "model.num_layers=2",
              "model.dropout=0.3",
              "trainer.deterministic=true", "trainer.max_steps=6", "trainer.val_check_interval=3", "trainer.limit_val_batches=1",
              *extra]
    weights = []
    for run in ("a", "b"):
        train(make_cfg(tmp_path / run, *common))
        weights.append(torch.load(tmp_path / run / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"])
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert not torch.equal(weights[0]["net.head.weight"], build(make_cfg(tmp_path / "c", *common)).task.net.head.weight.cpu())


def _same_first_losses(tmp_path, dataset, backend_under_test, *extra):
    losses = {}
    for backend in ("python", backend_under_test):
        cfg = make_cfg(tmp_path / backend, f"dataset={dataset}", f"backend={backend}", "model.num_layers=2", *SMALL[dataset], *extra)
        built = build(cfg)  # seeds from cfg.seed: the same initial weights
        datamodule, task = built.datamodule, built.task
        assert built.backend_used == backend
        recorder = LossRecorder()
        L.seed_everything(7)  # the same batches
        L.Trainer(max_steps=4, callbacks=[recorder], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, limit_val_batches=0, gradient_clip_val=1.0,
                  accelerator=cfg.trainer.accelerator, devices=1).fit(task, datamodule=datamodule)
        losses[backend] = recorder.losses
    assert len(losses[backend_under_test]) == 4
    assert losses[backend_under_test] == pytest.approx(losses["python"], abs=1e-5, rel=0)


def scalars(run_dir, tag):
    """(step, value) of a scalar over every event file of the run, in the order the files were written."""
    found = []
    for events in sorted((run_dir / "tensorboard").glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime_ns):
        acc = EventAccumulator(str(events))
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            found += [(e.step, e.value) for e in acc.Scalars(tag)]
    return found


class KillAt(L.Callback):
    """Stands in for a crash or kill -9 part-way through a run."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            raise RuntimeError("killed")


def test_killed_run_resumes_step_schedule_and_tensorboard(tmp_path):
    common = ["dataset=adding", "dataset.seq_len=20", "dataset.train_size=640", "dataset.val_size=16", "dataset.batch_size=8",
              "trainer.max_steps=24", "trainer.val_check_interval=6", "trainer.limit_val_batches=2", "trainer.log_every_n_steps=1",
              "trainer.num_sanity_val_steps=0"]
    reference = tmp_path / "uninterrupted"
    train(make_cfg(reference, *common))
    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match="killed"):
        train(make_cfg(run, *common, "+callbacks.kill._target_=test_training.KillAt", "+callbacks.kill.step=15"))
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 12
    with pytest.raises(ConfigError, match="holds checkpoints of an earlier run: resume it with ckpt_path=last"):
        build(make_cfg(run, *common))
    train(make_cfg(run, *common, "ckpt_path=last"))
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 24
    steps = [s for s, _ in scalars(run, "train/loss")]
    assert max(steps) == 23 and set(steps) == set(range(24))  # the TensorBoard step went on from the checkpoint
    resumed = dict(scalars(run, "lr-AdamW"))  # the last write of each step wins, as in TensorBoard
    assert resumed == pytest.approx(dict(scalars(reference, "lr-AdamW")), rel=1e-6)  # the schedule did not restart


def test_an_extended_run_goes_on_at_the_learning_rate_of_its_new_schedule(tmp_path):
    """Resumed with a larger max_steps, the first new step trains at the stretched schedule's rate for that
    step (not at the old schedule's final 0), and every later step follows the new schedule."""
    from lltm_train.tasks.schedule import warmup_cosine

    common = ["dataset=adding", *SMALL["adding"], "trainer.val_check_interval=6", "trainer.limit_val_batches=1",
              "trainer.log_every_n_steps=1", "trainer.num_sanity_val_steps=0"]
    train(make_cfg(tmp_path, *common, "trainer.max_steps=12"))
    train(make_cfg(tmp_path, *common, "trainer.max_steps=24", "ckpt_path=last"))
    schedule = warmup_cosine(torch.optim.SGD([torch.zeros(1)], lr=1.0), total_steps=lambda: 24)
    peak = make_cfg(tmp_path, *common).model.optimizer.lr
    logged = dict(scalars(tmp_path, "lr-AdamW"))
    assert [logged[s] for s in range(12, 24)] == pytest.approx([peak * schedule.lr_lambdas[0](s) for s in range(12, 24)], rel=1e-6)
    assert logged[12] > 0.4 * peak


def test_validation_counts_optimiser_steps_under_gradient_accumulation(tmp_path):
    train(make_cfg(tmp_path, "dataset=adding", *SMALL["adding"], "trainer.max_steps=8", "trainer.val_check_interval=4",
                   "+trainer.accumulate_grad_batches=2", "trainer.log_every_n_steps=1", "trainer.num_sanity_val_steps=0"))
    assert [s for s, _ in scalars(tmp_path, "val/loss")] == [3, 7]  # after steps 4 and 8 (TensorBoard counts from 0)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.ckpt")) == ["best-step8.ckpt", "last.ckpt"]


def test_a_run_that_ends_between_validations_validates_its_last_step_as_any_other(tmp_path, caplog, capsys):
    """max_steps=7 with a validation every 4 steps: the final validation, after step 7, is one like the others:
    the best checkpoints (every validation's, here) include step 7's, its sample is step 7's (printed and in
    TensorBoard) and the closing line still has the training loss."""
    cfg = make_cfg(tmp_path, *SMALL["shakespeare"], "trainer.max_steps=7", "trainer.val_check_interval=4",
                   "trainer.limit_val_batches=1", "trainer.num_sanity_val_steps=0", "callbacks.model_checkpoint.save_top_k=-1")
    with caplog.at_level("INFO", logger="lltm_train"):
        metrics = train(cfg)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.ckpt")) == ["best-step4.ckpt", "best-step7.ckpt",
                                                                              "last.ckpt"]
    printed = capsys.readouterr().out
    assert "--- sample at step 4 ---" in printed and "--- sample at step 7 ---" in printed
    assert "sample at step 0" not in printed
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Tensors("sample/text_summary")] == [4, 7]
    done = next(r.getMessage() for r in caplog.records if "lltm-train: done." in r.getMessage())
    assert "train/loss" in metrics and f"train/loss={metrics['train/loss']:.4g}" in done


def test_resuming_a_finished_run_says_it_trained_nothing(tmp_path, caplog):
    common = ["dataset=adding", *SMALL["adding"], "trainer.max_steps=4", "trainer.val_check_interval=2"]
    train(make_cfg(tmp_path, *common))
    caplog.clear()
    with caplog.at_level("INFO", logger="lltm_train"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = train(make_cfg(tmp_path, *common, "ckpt_path=last"))
    said = [r.getMessage() for r in caplog.records]
    assert "train/loss" not in metrics
    assert any("nothing left to train at step 4 (raise trainer.max_steps" in m for m in said), said
    assert any(m.startswith("lltm-train: done (no step trained, nothing measured)") for m in said), said
    # Lightning's "Checkpoint directory ... exists and is not empty": a resume's own folder, not news
    assert not [w for w in caught if "exists and is not empty" in str(w.message)]


def test_test_split_is_evaluated_with_the_best_checkpoint_even_when_it_is_gone(tmp_path, caplog):
    common = ["dataset=adding", *SMALL["adding"], "dataset.test_size=16", "trainer.max_steps=4", "trainer.val_check_interval=2",
              "test=true"]
    metrics = train(make_cfg(tmp_path / "a", *common))
    best = next((tmp_path / "a" / "checkpoints").glob("best-*.ckpt"))
    assert metrics["test/loss"] > 0 and "test/loss" in scalar_tags(tmp_path / "a")
    # a new run (validating nothing) from the first one's last checkpoint inherits its best path, deleted since
    last = tmp_path / "a" / "checkpoints" / "last.ckpt"
    best.unlink()
    caplog.clear()
    with caplog.at_level("WARNING", logger="lltm_train"):
        metrics = train(make_cfg(tmp_path / "b", *common, "trainer.max_steps=6", "trainer.limit_val_batches=0",
                                 f"ckpt_path={last}"))
    assert metrics["test/loss"] > 0 and f"the best checkpoint {best} is gone; testing the final weights" in caplog.text


def scalar_tags(run_dir):
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return acc.Tags()["scalars"]


def test_tensorboard_gets_loss_metric_throughput_and_hparams(tmp_path):
    cfg = make_cfg(tmp_path, "dataset=shakespeare", *SMALL["shakespeare"], "trainer.max_steps=8", "model.hidden_size=24",
                   "trainer.val_check_interval=4", "trainer.limit_val_batches=2", "trainer.log_every_n_steps=2")
    metrics = train(cfg)
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "val/loss", "val/bpc", "val/perplexity", "lr-AdamW", "train/grad_norm",
            "throughput/tokens_per_s", "throughput/samples_per_s", "throughput/step_ms"} <= tags
    assert all(v > 0 for _, v in scalars(tmp_path, "throughput/tokens_per_s"))
    assert "hp_metric" not in tags  # no placeholder: the HPARAMS tab shows the run's own metrics
    hparams_tab = {tag: HParamsPluginData.FromString(content) for tag, content in acc.PluginTagToContent("hparams").items()}
    experiment = hparams_tab["_hparams_/experiment"].experiment
    shown = [m.name.tag for m in experiment.metric_infos]
    assert shown == ["val/loss", "val/bpc", "val/perplexity", "val/acc", "train/loss", "throughput/tokens_per_s_run_average"]
    windows = [v for _, v in scalars(tmp_path, "throughput/tokens_per_s")]
    (average,) = [v for _, v in scalars(tmp_path, "throughput/tokens_per_s_run_average")]  # once, at the end
    assert min(windows) <= average <= max(windows)
    assert set(shown) <= tags  # each column's value is the last point of that curve
    assert scalars(tmp_path, "val/bpc")[-1] == (7, pytest.approx(metrics["val/bpc"]))  # logged after step 8 (index 7)
    start = hparams_tab["_hparams_/session_start_info"].session_start_info
    assert start.hparams["backend_used"].string_value == "cpp"
    assert not [k for k in start.hparams if k.startswith(("callbacks.", "paths.")) or k.endswith("_target_")]
    assert start.hparams["model.hidden_size"].number_value == 24
    assert hparams_tab["_hparams_/session_end_info"].session_end_info.status == 1  # STATUS_SUCCESS
    layout = Layout.FromString(acc.Tensors("custom_scalars__config__")[0].tensor_proto.string_val[0])
    charts = {c.title: list(c.multiline.tag) for cat in layout.category for c in cat.chart}
    assert charts["loss (train and val)"] == ["^train/loss$", "^val/loss$"]
    assert charts["validation metrics"] == ["^val/bpc$", "^val/perplexity$", "^val/acc$"]
    assert "sample" in "".join(acc.Tags()["tensors"])
    hparams = (tmp_path / "tensorboard" / "hparams.yaml").read_text()
    assert "backend_used: cpp" in hparams
    task = build(make_cfg(tmp_path / "again", "dataset=shakespeare", *SMALL["shakespeare"], "model.hidden_size=24")).task
    assert f"num_parameters: {task.num_parameters()}" in hparams


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_mixed_precision_on_cpu(tmp_path, precision):
    cfg = make_cfg(tmp_path, "dataset=adding", *SMALL["adding"], f"trainer.precision={precision}", "+trainer.fast_dev_run=2")
    assert torch.isfinite(torch.tensor(train(cfg)["train/loss"]))


@pytest.mark.parametrize("dataset", ["copy", "japanese_vowels"])  # the latter: packed sequences of varying lengths
def test_compiled_model_trains(tmp_path, dataset):
    torch._dynamo.reset()
    cfg = make_cfg(tmp_path, f"dataset={dataset}", *SMALL[dataset], "model.compile=true", "+trainer.fast_dev_run=2")
    assert torch.isfinite(torch.tensor(train(cfg)["train/loss"]))


def test_bidirectional_language_model_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="bidirectional=true cannot be used to predict the next token"):
        train(make_cfg(tmp_path, "model.bidirectional=true"))


@pytest.mark.parametrize("cell", [name for name, spec in CELLS.items() if name != "lltm"])
@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_every_cell_trains_fused_or_on_the_torch_baseline(tmp_path, cell, backend):
    """model.cell=<cell> trains the fused cell; with backend=torch, torch.nn's layer of the same width where
    PyTorch has the cell, and a one-line refusal where it has not."""
    spec = CELLS[cell]
    overrides = ("dataset=shakespeare", *SMALL["shakespeare"], f"model.cell={cell}", f"backend={backend}")
    if backend == "torch" and not spec.has_torch:
        with pytest.raises(ValueError, match=f"PyTorch has no {spec.title}"):  # (ConfigError is a ValueError)
            build(make_cfg(tmp_path, *overrides))
        return
    metrics = train(make_cfg(tmp_path, *overrides, "+trainer.fast_dev_run=2"))
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))
    built = build(make_cfg(tmp_path / "again", *overrides))
    layer = built.task.net.rnn
    if backend == "torch":
        assert type(layer) is type(spec.torch_layer(1, 1)) and built.backend_used == "torch"
    else:
        assert isinstance(layer, lltm_train.nn.RecurrentLayers) and layer.cell is spec and built.backend_used == "cpp"
    assert layer.hidden_size == 16 and getattr(layer, "nonlinearity", "tanh") == ("relu" if cell == "rnn_relu" else "tanh")


def test_checkpoint_of_another_model_is_refused_before_training(tmp_path):
    common = ["dataset=adding", *SMALL["adding"], "trainer.max_steps=2", "trainer.val_check_interval=2", "trainer.limit_val_batches=1"]
    train(make_cfg(tmp_path / "a", *common))
    ckpt = tmp_path / "a" / "checkpoints" / "last.ckpt"
    with pytest.raises(ConfigError, match=r"was written by another model \(net.head.weight is \(1, 16\) there, \(1, 32\) here; net.rnn.bias_l0"):
        build(make_cfg(tmp_path / "b", *common, "model.hidden_size=32", f"ckpt_path={ckpt}"))
    with pytest.raises(ConfigError, match=r"another model \(model.cell=lltm; this run has model.cell=slstm\)"):
        build(make_cfg(tmp_path / "s", *common, "model.cell=slstm", f"ckpt_path={ckpt}"))  # named, not its weights
    train(make_cfg(tmp_path / "tanh", *common, "model.cell=rnn"))  # the same shapes as rnn_relu's
    with pytest.raises(ConfigError, match=r"another model \(model.cell=rnn; this run has model.cell=rnn_relu\)"):
        build(make_cfg(tmp_path / "relu", *common, "model.cell=rnn_relu",
                       f"ckpt_path={tmp_path / 'tanh' / 'checkpoints' / 'last.ckpt'}"))
    # the data settings that decide the batches are those of the run that wrote it; the loader processes are free
    with pytest.raises(ConfigError, match=r"with other data settings \(global batch \(dataset.batch_size x processes\)=8 there, 4 here\): its remaining"):
        build(make_cfg(tmp_path / "d", *common, "dataset.batch_size=4", f"ckpt_path={ckpt}"))
    with pytest.raises(ConfigError, match=r"other data settings \(dataset.seq_len=30 there, 20 here; seed=1234 there, 3 here\)"):
        build(make_cfg(tmp_path / "e", *common, "dataset.seq_len=20", "seed=3", f"ckpt_path={ckpt}"))
    with pytest.raises(ConfigError, match=r"other data settings \(dataset.seq_len=30 there, \(not set\) here\)"):
        build(make_cfg(tmp_path / "g", *common, "~dataset.seq_len", f"ckpt_path={ckpt}"))  # the module's default: 100
    assert build(make_cfg(tmp_path / "f", *common, "dataset.num_workers=1", f"ckpt_path={ckpt}")).ckpt_path == str(ckpt)
    old = torch.load(ckpt, weights_only=False)  # as written before checkpoints held data settings
    del old["AddingDataModule"]
    torch.save(old, tmp_path / "old.ckpt")
    with pytest.warns(UserWarning, match=r"old\.ckpt holds no data settings .*, so other ones are not refused"):
        build(make_cfg(tmp_path / "h", *common, "dataset.batch_size=4", f"ckpt_path={tmp_path / 'old.ckpt'}"))
    (tmp_path / "junk.ckpt").write_text("not a checkpoint")
    with pytest.raises(ConfigError, match="junk.ckpt is not a readable checkpoint"):
        build(make_cfg(tmp_path / "c", *common, f"ckpt_path={tmp_path / 'junk.ckpt'}"))
    from lltm_train.checkpoints import read_checkpoint  # as lltm-evaluate / lltm-export read one

    with pytest.raises(ConfigError, match=r"^no such checkpoint file: .*gone\.ckpt$"):
        read_checkpoint(tmp_path / "gone.ckpt")
    with pytest.raises(ConfigError, match=r"^no such checkpoint file: .*checkpoints \(a folder\)$"):
        read_checkpoint(tmp_path / "a" / "checkpoints")


def test_the_run_folders_write_check_leaves_other_processes_files_alone(tmp_path):
    """DDP's processes check the run folder at once, each with a file of its own: with one shared `.write-test`,
    which each created and removed, one removed another's before that one did (3 of 4 runs of 64 processes
    failed with a traceback)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / ".write-test").touch()  # another process's check file, under the shared name
    build(make_cfg(tmp_path / "a", "dataset=adding", *SMALL["adding"]))
    assert (tmp_path / "a" / ".write-test").is_file()
    assert not list((tmp_path / "a").glob(".write-test-*"))  # this process's own is gone


def test_the_permutation_seed_of_an_unpermuted_data_set_may_change_on_resume():
    from lltm_train.checkpoints import check_data_settings

    saved = {"dataset.permute": False, "dataset.permutation_seed": 0, "seed": 1}
    check_data_settings("x.ckpt", saved, {**saved, "dataset.permutation_seed": 7})  # no batch changes
    check_data_settings("x.ckpt", saved, {"dataset.permute": False, "seed": 1})
    permuted = {**saved, "dataset.permute": True}
    with pytest.raises(ConfigError, match=r"other data settings \(dataset.permutation_seed=0 there, 7 here\)"):
        check_data_settings("x.ckpt", permuted, {**permuted, "dataset.permutation_seed": 7})
    with pytest.raises(ConfigError, match=r"other data settings \(dataset.permute=False there, True here\)"):
        check_data_settings("x.ckpt", saved, {**saved, "dataset.permute": True})


DIVERGING = ["dataset=shakespeare", "dataset.seq_len=32", "dataset.batch_size=16", "model.hidden_size=32",
             "model.cell=gru", "model.optimizer.lr=20", "trainer.max_steps=150", "trainer.val_check_interval=50",
             "trainer.log_every_n_steps=10", "trainer.limit_val_batches=2", "model.sample_length=0"]


@pytest.mark.parametrize("policy", ["warn", "stop"])
def test_a_forced_divergence_is_named_under_both_policies(tmp_path, policy, caplog):
    """lr=20: the losses stay finite (clipping) but far above a uniform guess's; warn goes on and says so,
    stop ends the run with one line (diverged from the first validation on, it has no best checkpoint to
    keep); both leave diverged.txt for the report."""
    from lltm_train.report import read_run, summarise
    from lltm_train.tasks.base import DivergedError

    cfg = make_cfg(tmp_path, *DIVERGING, f"model.divergence={policy}")
    if policy == "warn":
        with caplog.at_level("WARNING", logger="lltm_train"):
            metrics = train(cfg)
        assert metrics["train/diverged"] == 1.0
        assert any("the run diverged by step" in r.getMessage() and "model.divergence=warn" in r.getMessage()
                   for r in caplog.records)
        assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 150
    else:
        with pytest.raises(DivergedError, match=r"the run diverged by step 50: val/loss .* is above 1.5x a uniform "
                                                r"guess's \(4.43\d\); stopped \(model.divergence=stop\)"):
            train(cfg)
        assert not list((tmp_path / "checkpoints").glob("best-*.ckpt"))  # no best checkpoint of diverged weights
    note = (tmp_path / "diverged.txt").read_text()
    assert note.startswith("the run diverged by step") and f"model.divergence={policy}" in note
    (row,) = summarise([read_run(tmp_path)], "val/loss")
    assert row["status"].startswith("diverged") and row["rank"] is None


@pytest.mark.parametrize("dataset, steps", [("shakespeare", 300), ("adding", 200)])
def test_a_normal_run_is_never_flagged(tmp_path, dataset, steps):
    """The default job (shortened: its schedule over 300 steps) and a regression recipe train without a
    divergence warning."""
    small = SMALL[dataset] if dataset != "shakespeare" else ["dataset.seq_len=64", "model.hidden_size=64",
                                                             "model.sample_length=0"]
    metrics = train(make_cfg(tmp_path, f"dataset={dataset}", *small, f"trainer.max_steps={steps}",
                             "trainer.val_check_interval=50", "trainer.log_every_n_steps=10", "trainer.limit_val_batches=4"))
    assert "train/diverged" not in metrics and not (tmp_path / "diverged.txt").exists()
