"""``lltm-bench --training``: the default job's model trained by ``lltm-train`` against a bare loop.

The model is the default job's (CharLM: embedding 64, 1 x 256, T = 128, B = 64, AdamW, clipping at 1.0).
The bare loop is that model and optimiser in eager PyTorch over one fixed batch, with no framework: forward,
loss, zero_grad, backward, clipping, fused AdamW; timed before and after the ``lltm-train`` runs, its figure
is the mean of the two. ``lltm-train`` is :func:`lltm_train.train.build` on the composed default config
(Lightning, the Shakespeare data, logging, checkpoints), fitted for ``steps`` steps; its figure is the
Throughput callback's average over the run after its first window (validation, and the first window's
one-time set-up: CUDA graph capture, ``torch.compile``'s compilation, excluded).

The contenders come from the cell registry (:data:`CONTENDERS`). On a GPU: every cell on the ``cuda``
backend, each followed by ``torch.nn``'s same cell (cuDNN) where PyTorch has it; each fused one is also
trained with the step eager (``model.cuda_graph=false``), in ``bf16-mixed`` and with ``model.compile=true``,
so that the ratios the targets name come from one run.

With ``--repeats N`` each ``lltm-train`` figure is the median of N runs, alternated between the variants
(plain, eager step, bf16-mixed, compile, plain, ...): on the H200 the host's share of a step is as long as
the GPU's, so one run's pace swings by up to 1.3x (0.84 against 1.08 ms a step in one process, 2026-12-03),
and alternating puts a drift of the host's pace into every variant alike.
"""

from __future__ import annotations

import statistics
import tempfile

import torch

from ..models import CharLM
from ..ops.cells import CELLS, LLTM
from .common import measure


def on_backend_and_torch(cells, backend: str) -> list[tuple[str, str]]:
    """(cell, backend) for each cell on ``backend``, each followed by (cell, "torch") where PyTorch has it."""
    return [pair for spec in cells for pair in ((spec.name, backend), *([(spec.name, "torch")] if spec.has_torch else []))]


# (cell, backend) by device. On a GPU, every cell of the registry (on cuda, and on torch where PyTorch has it).
# On a CPU, where each run takes minutes: the default job's cell (the LLTM) and its main baseline (the LSTM),
# on cpp and, for the baseline, torch: [("lltm", "cpp"), ("lstm", "cpp"), ("lstm", "torch")].
CONTENDERS = {"cuda": on_backend_and_torch(CELLS.values(), "cuda"),
              "cpu": on_backend_and_torch((LLTM, CELLS[LLTM.baselines[0]]), "cpp")}
VARIANTS = {"cuda": {"eager step": ["model.cuda_graph=false"], "bf16-mixed": ["trainer.precision=bf16-mixed"],
                     "compile": ["model.compile=true"]},
            "cpu": {}}


def bare_loop_tokens_per_s(cell: str, backend: str, device: torch.device, steps: int, vocab: int = 84) -> float:
    """The default job's model and optimiser in a plain eager loop over one fixed batch."""
    torch.manual_seed(0)
    model = CharLM(vocab, hidden_size=256, embedding_dim=64, cell=cell, backend=backend).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.008, weight_decay=0.01, fused=True)
    x = torch.randint(0, vocab, (128, 64), device=device)
    y = torch.randint(0, vocab, (128, 64), device=device)

    def step():
        logits, _ = model(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab).float(), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()

    seconds = measure(step, device, repeats=3, calls=max(1, steps // 3), warmup=5)
    return 128 * 64 / seconds


def lltm_train_tokens_per_s(cell: str, backend: str, device: torch.device, steps: int, *overrides: str) -> float:
    """The default job through lltm-train for ``steps`` steps: the Throughput callback's steady pace (its
    windows after the first, which holds the one-time set-up: capture, compilation)."""
    # Imported here, not at the top: Lightning and Hydra take seconds to import, which lltm-bench's other modes
    # (and --help) would pay for nothing.
    from hydra import compose, initialize_config_dir

    from ..callbacks import Throughput
    from ..config import config_dir
    from ..train import build

    with tempfile.TemporaryDirectory() as out:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            cfg = compose("config", overrides=[
                f"paths.output_dir={out}", f"model.cell={cell}", f"backend={backend}", f"trainer.max_steps={steps}",
                f"trainer.accelerator={'gpu' if device.type == 'cuda' else 'cpu'}", f"trainer.val_check_interval={steps}",
                "trainer.limit_val_batches=2", "trainer.num_sanity_val_steps=0", "model.sample_length=0",
                "callbacks.progress_bar.refresh_rate=0", *overrides])
        built = build(cfg)
        built.trainer.fit(built.task, datamodule=built.datamodule)
        throughput = next(c for c in built.callbacks if isinstance(c, Throughput))
        return throughput.steady_tokens_per_s or float("nan")


def run_training(device: torch.device, steps: int, repeats: int = 1) -> dict:
    """Every contender's bare loop and lltm-train figures (and, on a GPU, the variants), each lltm-train
    figure the median of ``repeats`` alternated runs (all of them kept under ``runs``); prints a line each."""
    result = {"steps": steps, "repeats": repeats, "rows": []}
    for cell, backend in CONTENDERS[device.type]:
        # The bare loop is timed before and after lltm-train and averaged: on a shared 2-core machine the pace
        # drifts by several percent within a minute, which one timing on one side would put into the ratio.
        before = bare_loop_tokens_per_s(cell, backend, device, steps)
        variants = VARIANTS[device.type] if backend != "torch" else {}  # the baseline: as a user runs it
        runs = {name: [] for name in ("lltm_train", *variants)}
        for _ in range(repeats):
            for name, overrides in (("lltm_train", []), *variants.items()):
                runs[name].append(lltm_train_tokens_per_s(cell, backend, device, steps, *overrides))
        row = {"cell": cell, "backend": backend, **{name: statistics.median(v) for name, v in runs.items()}}
        row["runs"] = runs
        row["bare_before_after"] = [before, bare_loop_tokens_per_s(cell, backend, device, steps)]
        row["bare"] = sum(row["bare_before_after"]) / 2
        row["lltm_train_vs_bare"] = row["lltm_train"] / row["bare"]
        extra = "".join(f", {name} {row[name]:,.0f} ({row[name] / row['lltm_train']:.2f}x)"
                        for name in variants)
        median = f" (medians of {repeats} alternated runs)" if repeats > 1 else ""
        print(f"training, cell={cell} backend={backend}: bare loop {row['bare']:,.0f} tokens/s, lltm-train "
              f"{row['lltm_train']:,.0f} tokens/s ({row['lltm_train_vs_bare']:.2f}x of the bare loop){extra}{median}",
              flush=True)
        result["rows"].append(row)
    return result
