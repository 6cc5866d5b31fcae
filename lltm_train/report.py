"""``lltm-report DIR``: one table (and plots) comparing the runs of a run folder or of a whole sweep.

It reads what each run left: TensorBoard's event files (through tensorboard's own ``EventAccumulator``) or
the CSV logger's ``csv/metrics.csv`` (``logger=csv``), ``.hydra/overrides.yaml`` and ``.hydra/config.yaml``,
the logger's ``hparams.yaml`` and ``error.txt`` of a failed sweep job. It writes ``report.md`` and
``report.csv`` (one row per run, best metric first; failed and unfinished runs are listed too), and PNG plots
with matplotlib: the validation metric against step and against seconds of training
(``time/train_seconds``, counted across resumes), with the Pareto front of quality against time marked, the
smoothed training loss, and tokens/s per run, each run named in the legends by the settings that differ
between the runs. It ranks by the runs' own ``optimized_metric`` unless ``--metric`` names another;
``--at-seconds S`` ranks the runs by the metric they had reached after S seconds of training: the fair
comparison of runs with equal time budgets. Steps are counted as optimiser steps taken (``Run.step``). A
folder copied from another machine works: nothing but these files is read.
"""

from __future__ import annotations

import argparse
import csv
import logging
import math
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from hydra.experimental.callback import Callback

from .console import help_text
from .metric_names import HIGHER_IS_BETTER, higher_is_better
from .run_files import (CONFIG, CSV, DIVERGED, ERROR, HPARAMS, HYDRA, LAST_CHECKPOINT, METRICS_CSV, MLFLOW_DB,
                        OVERRIDES, RESUMED_CSV, TENSORBOARD, checkpoint_dir, config_record)
from .run_lock import run_in_progress

# wall_s: seconds of training to the last logged value (time/train_seconds; else from the run's first log);
# tokens_per_s: the run's tokens over its seconds of training (tokens_per_s(), which tokens_per_s.png plots too);
# at_seconds: the metric at --at-seconds (the last validation by then)
COLUMNS = ["rank", "run", "status", "changed", "backend", "cell", "final", "best", "best_step", "at_seconds",
           "tokens_per_s", "peak_cuda_mib", "wall_s", "parameters"]



# Scalars that only training steps log (train/diverged too: a validation during training logs it), at the
# 0-based index of the step just taken; the run average is logged once a training session ends.
TRAINING_TAGS = ("train/", "throughput/", "memory/", "lr-")
RUN_AVERAGE = "throughput/tokens_per_s_run_average"
LANGUAGE_MODEL_TASK = "LanguageModelTask"  # model._target_'s class: its val/bpc ranks as its val/loss does


def _steps_taken(tag: str, logged: int, after_training: int | None) -> int:
    """``Run.step``: ``logged`` itself for the test's values and those logged at ``after_training`` (a
    validation after training), else ``logged + 1``."""
    if tag.startswith("test/") or (logged == after_training and not tag.startswith(TRAINING_TAGS)):
        return logged
    return logged + 1


@dataclass
class Run:
    """What one run folder says about the run."""

    path: Path
    status: str = "finished"
    overrides: dict[str, str] = field(default_factory=dict)
    backend: str = ""
    cell: str = ""
    parameters: int | None = None
    optimized_metric: str | None = None  # the run's config key (what a search optimised; the report's default)
    task: str = ""  # the class of model._target_ (LanguageModelTask, ClassificationTask, ...)
    # tag -> (the logger's step, wall time, value); the step as Lightning logged it: see step()
    curves: dict[str, list[tuple[int, float, float]]] = field(default_factory=dict)
    started: float | None = None  # wall time of the first TensorBoard event (the logger's start)
    problems: list[str] = field(default_factory=list)  # its damaged files: "<file>: <what is wrong>", one line each

    def curve(self, tag: str) -> list[tuple[int, float, float]]:
        return self.curves.get(tag, [])

    def step(self, tag: str, logged: int) -> int:
        """The optimiser steps the run had taken when it logged a value of ``tag`` at the logger's step ``logged``:
        Lightning's ``trainer.global_step`` then, as the checkpoints (``best-step<N>.ckpt``), the samples and the
        console count. Lightning logs what a training step or a validation during training computes at the
        step's 0-based index (``global_step - 1``: the first step's at 0, a validation after step 300 at 299),
        but the test, and a validation after training (``trainer.validate``, when training stopped between
        validations), at ``global_step`` itself: the step after the end of training that the run average
        (logged at its end, at ``global_step - 1``) marks, when no training was logged after it."""
        return _steps_taken(tag, logged, self._after_training())

    def _after_training(self) -> int | None:
        """The logger's step of what followed the run's last training session (the test, a final
        ``trainer.validate``): one past that session's run average, when nothing of training was logged later."""
        ends = [s for s, _, _ in self.curve(RUN_AVERAGE)]
        trained = max((s for tag, c in self.curves.items() if tag.startswith(TRAINING_TAGS) for s, _, _ in c),
                      default=None)
        return max(ends) + 1 if ends and max(ends) == trained else None

    def steps(self, tag: str) -> list[tuple[int, float]]:
        """(optimiser steps taken, value) of a curve: ``step()``'s count."""
        after = self._after_training()
        return [(_steps_taken(tag, s, after), v) for s, _, v in self.curve(tag)]

    def last_step(self) -> int | None:
        """The optimiser steps taken by the run's last logged value (None: it logged nothing)."""
        after = self._after_training()
        return max((_steps_taken(tag, s, after) for tag, c in self.curves.items() for s, _, _ in c), default=None)

    def language_model(self) -> bool:
        return self.task == LANGUAGE_MODEL_TASK or "val/bpc" in self.curves

    def default_metric(self) -> str:
        """The metric the report ranks this run by without ``--metric``: its ``optimized_metric`` (``val/loss``
        when it has none recorded), but ``val/bpc`` for a language model left at the config's ``val/loss`` (not
        set on its command line): bits per character are the loss over ln 2, so they rank the runs in the same
        order, in the unit the README and the console speak of."""
        metric = self.optimized_metric or "val/loss"
        if metric == "val/loss" and "optimized_metric" not in self.overrides and self.language_model():
            return "val/bpc"
        return metric

    def timed(self, tag: str) -> list[tuple[float, float]]:
        """(seconds of training, value) of a curve: the seconds from ``time/train_seconds`` logged at the same
        step (validations), else the wall time since the run's first log (TensorBoard only)."""
        seconds = {s: v for s, _, v in self.curve("time/train_seconds")}
        if seconds:
            return [(seconds[s], v) for s, _, v in self.curve(tag) if s in seconds]
        start = self.started if self.started is not None else min(
            (t for c in self.curves.values() for _, t, _ in c if math.isfinite(t)), default=None)
        if start is None:
            return []
        return [(t - start, v) for _, t, v in self.curve(tag) if math.isfinite(t)]

    def at_seconds(self, tag: str, seconds: float) -> float | None:
        """The value of ``tag`` at its last point within ``seconds`` of training (None: none by then)."""
        reached = [v for t, v in self.timed(tag) if t <= seconds]
        return reached[-1] if reached else None


def _yaml(path: Path, problems: list[str] | None = None, kind: type = dict):
    """The content of a YAML file, a ``kind`` (a mapping, or a list); None when there is no such file, or when
    it cannot be read, is not YAML or holds something else (a damaged file), whose problem, in a few words,
    is then added to ``problems`` as ``<file name>: <problem>``."""
    if not path.is_file():
        return None
    try:
        content = yaml.safe_load(path.read_text())
    except OSError as exc:
        problem = f"cannot be read ({exc.strerror or exc})"
    except UnicodeDecodeError as exc:
        problem = f"not text (byte {exc.object[exc.start]:#04x} at offset {exc.start} is not UTF-8)"
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = f"not valid YAML ({where}{getattr(exc, 'problem', None) or str(exc).splitlines()[0]})"
    else:
        if content is None or isinstance(content, kind):
            return content
        problem = f"holds {_kind_name(type(content))}, not {_kind_name(kind)}"
    if problems is not None:
        problems.append(f"{path.parent.name}/{path.name}: {problem}")
    return None


def _kind_name(kind: type) -> str:
    return {dict: "a mapping", list: "a list", str: "a string"}.get(kind, f"a value of type {kind.__name__}")


def _section(config: dict, key: str, problems: list[str], kind: type = dict):
    """``config[key]`` of the run's config (None when absent, or when it is no ``kind``: a damaged file)."""
    value = config.get(key)
    if value is None or isinstance(value, kind):
        return value
    problems.append(f"{HYDRA}/{CONFIG}: {key} is {_shortened(repr(value), 40)}, not {_kind_name(kind)}")
    return None


def find_runs(root: Path) -> list[Path]:
    """Run folders under ``root`` (itself included): those with a ``.hydra`` folder, TensorBoard events, a
    CSV logger's metrics or an MLflow store."""
    found = {p.parent for p in root.rglob(HYDRA) if p.is_dir()}
    found |= {p.parent.parent for p in root.rglob("events.out.tfevents.*") if p.parent.name == TENSORBOARD}
    found |= {p.parent.parent for p in root.rglob(METRICS_CSV) if p.parent.name == CSV}
    found |= {p.parents[2] for p in root.rglob(f"{RESUMED_CSV}*/{METRICS_CSV}") if p.parents[1].name == CSV}
    found |= {p.parent for p in root.rglob(MLFLOW_DB)}
    return sorted(found)


def read_run(path: Path) -> Run:
    """Reads one run folder; a run with no events is reported as such, not dropped."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logging.getLogger("tensorboard").setLevel(logging.WARNING)  # its reader logs each file it moves to
    run = Run(path)
    # a damaged file (cut short, overwritten, hand-edited) is left out, and said in run.problems
    record = _latest_record(path)
    overrides = _yaml(record.with_name(OVERRIDES), run.problems, list) or []
    resumed = record != config_record(path)  # (whose ckpt_path=last is no setting of the run's)
    run.overrides = dict(o.lstrip("+~").split("=", 1) for o in overrides if isinstance(o, str) and "=" in o
                         and not o.startswith("hydra.") and not (resumed and o.startswith("ckpt_path=")))
    config = _yaml(record, run.problems) or {}
    hparams = (_yaml(path / TENSORBOARD / HPARAMS, run.problems) or _yaml(path / CSV / HPARAMS, run.problems)
               or {})
    if not hparams and (path / MLFLOW_DB).is_file():
        hparams = _mlflow_params(path / MLFLOW_DB)
    run.backend = str(hparams.get("backend_used") or config.get("backend", ""))
    if run.backend in ("none", "torch"):  # torch.nn.LSTM / GRU ("none": runs of lltm-train before backend=torch)
        run.backend = "torch.nn"
    model = _section(config, "model", run.problems) or {}
    run.cell = str(model.get("cell", ""))
    run.parameters = hparams.get("num_parameters")
    # the logger's copy of the config, for a folder copied without .hydra
    run.optimized_metric = _section(config, "optimized_metric", run.problems, str) or (
        hparams.get("optimized_metric") if isinstance(hparams.get("optimized_metric"), str) else None)
    target = model.get("_target_") or hparams.get("model/_target_") or (
        hparams["model"].get("_target_") if isinstance(hparams.get("model"), dict) else None)
    run.task = str(target or "").rsplit(".", 1)[-1]
    if _csv_files(path / CSV):
        run.curves = _csv_curves(path / CSV)
    elif (path / MLFLOW_DB).is_file():
        run.curves = _mlflow_curves(path / MLFLOW_DB)
        run.started = min((t for c in run.curves.values() for _, t, _ in c), default=None)
    if (path / TENSORBOARD).is_dir():
        acc = EventAccumulator(str(path / TENSORBOARD), size_guidance={"scalars": 0})
        acc.Reload()
        try:
            run.started = acc.FirstEventTimestamp()
        except ValueError:  # no events at all
            pass
        for tag in acc.Tags().get("scalars", []):
            run.curves[tag] = [(e.step, e.wall_time, e.value) for e in acc.Scalars(tag)]
    trainer = _section(config, "trainer", run.problems) or {}
    max_steps = trainer.get("max_steps")
    last_step = run.last_step()
    if (path / DIVERGED).is_file():  # model.divergence: warn (it finished) or stop (it also failed)
        first = (path / DIVERGED).read_text(errors="replace").splitlines()[:1]
        stopped = (path / ERROR).is_file()
        run.status = ("diverged, stopped: " if stopped else "diverged: ") + (first[0] if first else "")
    elif (path / ERROR).is_file():
        first = (path / ERROR).read_text(errors="replace").splitlines()[:1]
        run.status = "failed: " + (_shortened(first[0]) if first else "")
    elif not run.curves and "logger" in config and not config["logger"]:
        run.status = "not logged (logger=none)"
    elif not run.curves:
        run.status = "no events (crashed before logging, or still starting)"
    elif (isinstance(max_steps, int) and max_steps > 0 and last_step is not None and last_step < max_steps
          and not _spent_its_time_budget(trainer, run.curves)):
        state = {True: "running", False: "stopped"}.get(run_in_progress(path), "running, or stopped")
        run.status = f"unfinished at step {last_step} of {max_steps} ({state})"
    return run


def _latest_record(path: Path) -> Path:
    """The config record of the run's latest resume that trained (``.hydra/resume_<date>/config.yaml``, written before
    the run's last checkpoint: a resume refused before training writes none), else the first run's: its settings
    (``trainer.max_steps`` above all) decide whether the run finished."""
    first, last = config_record(path), checkpoint_dir(path) / LAST_CHECKPOINT
    if not last.is_file():
        return first
    trained = [p for p in (path / HYDRA).glob(f"resume_*/{CONFIG}") if p.stat().st_mtime <= last.stat().st_mtime]
    return max(trained, key=lambda p: p.stat().st_mtime, default=first)


def _spent_its_time_budget(trainer: dict, curves: dict) -> bool:
    """Whether a run with ``trainer.max_time`` trained for (nearly) all of it: it ended on time, before its
    ``max_steps``."""
    from .config import ConfigError, max_time_seconds  # imported here: it imports torch, which lltm-report never needs

    try:
        budget = max_time_seconds(trainer.get("max_time"))
    except (ConfigError, ValueError):
        return False
    trained = [value for _, _, value in curves.get("time/train_seconds", [])]
    return budget is not None and bool(trained) and max(trained) >= 0.95 * budget


def _csv_files(folder: Path) -> list[Path]:
    """The run's ``csv/metrics.csv`` where it has one (a run resumed from a checkpoint file into a new folder
    has none), then each resume's ``csv/resumed_step<N>/metrics.csv`` by N."""
    resumed = sorted(folder.glob(f"{RESUMED_CSV}*/{METRICS_CSV}"), key=lambda p: int(re.sub(r"\D", "", p.parent.name) or 0))
    return [p for p in [folder / METRICS_CSV] if p.is_file()] + resumed


def _csv_curves(folder: Path) -> dict[str, list[tuple[int, float, float]]]:
    """Lightning's CSVLogger files of a run (:func:`_csv_files`) as curves: tag -> (step, nan (no wall time),
    value). A resume's values replace the earlier ones from its step N on (what the resumed run logged again)."""
    curves: dict[str, dict[int, float]] = {}
    for path in _csv_files(folder):
        if path.parent != folder:  # a resume: what the earlier files hold from its step on is superseded
            start = int(re.sub(r"\D", "", path.parent.name) or 0)
            curves = {tag: {s: v for s, v in points.items() if s < start} for tag, points in curves.items()}
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                try:
                    step = int(float(row.get("step") or "nan"))
                except ValueError:
                    continue
                for tag, value in row.items():
                    if tag in ("step", "epoch") or value in ("", None):
                        continue
                    try:
                        curves.setdefault(tag, {})[step] = float(value)
                    except ValueError:
                        continue
    return {tag: [(s, math.nan, v) for s, v in sorted(points.items())] for tag, points in curves.items() if points}


def _mlflow_rows(db: Path, query: str) -> list[tuple]:
    import sqlite3

    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as connection:
            return connection.execute(query).fetchall()
    except sqlite3.Error:
        return []


def _mlflow_curves(db: Path) -> dict[str, list[tuple[int, float, float]]]:
    """MLflow's store of a run folder (logger=mlflow: ``mlflow.db``, SQLite) as curves, read with sqlite3
    (no mlflow needed): every MLflow run in it, oldest first, a resume's values replacing the earlier ones
    at the steps it logged again."""
    curves: dict[str, dict[int, tuple[float, float]]] = {}
    rows = _mlflow_rows(db, "SELECT m.key, m.step, m.timestamp, m.value FROM metrics m JOIN runs r ON m.run_uuid = "
                            "r.run_uuid ORDER BY r.start_time, m.timestamp")
    for key, step, timestamp, value in rows:
        curves.setdefault(key, {})[int(step)] = (timestamp / 1000.0, float(value))
    return {tag: [(s, t, v) for s, (t, v) in sorted(points.items())] for tag, points in curves.items()}


def _mlflow_params(db: Path) -> dict:
    """The parameters lltm-train logged to the newest MLflow run of the store (backend_used, num_parameters)."""
    rows = _mlflow_rows(db, "SELECT p.key, p.value FROM params p JOIN runs r ON p.run_uuid = r.run_uuid "
                            "ORDER BY r.start_time")
    params = {key: value for key, value in rows}
    if "num_parameters" in params:
        try:
            params["num_parameters"] = int(params["num_parameters"])
        except ValueError:
            params.pop("num_parameters")
    return params


def _shortened(text: str, limit: int = 100) -> str:
    """``text`` cut at a word boundary to at most ``limit`` characters, with an ellipsis when cut."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1].rsplit(" ", 1)[0].rstrip(" ,;:")
    return cut + "…"


def _changed_keys(runs: list[Run]) -> list[str]:
    """The command-line settings whose values differ between the runs (not ``paths.``: where a run wrote, which
    its folder says)."""
    keys = sorted({k for r in runs for k in r.overrides if not k.startswith("paths.")})
    return [k for k in keys if len({r.overrides.get(k) for r in runs}) > 1]


def _changed(run: Run, keys: list[str], names: dict[str, str] | None = None) -> str:
    """The run's values of the ``keys`` (the report's "changed" column: ``model.hidden_size=512 seed=2``, ``-``
    for a setting the run left at its default), each key named as ``names`` says (default: itself)."""
    return " ".join(f"{(names or {}).get(k, k)}={short_number(run.overrides.get(k, '-'))}" for k in keys)


def _short_keys(keys: list[str]) -> dict[str, str]:
    """Legend names of settings: the last part of each key (``hidden_size``), or the whole key where that would
    be ambiguous or a bare ``_target_``."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: s if last.count(s) == 1 and not s.startswith("_") else k for k, s in zip(keys, last)}


def labels(runs: list[Run], limit: int = 72) -> dict[Path, str]:
    """The plots' legend name of each run: its job number in a sweep (``3: ``) and the settings that differ
    between the runs that logged anything (what the plots draw), as in the "changed" column but with shorter
    keys and without those the run left at their defaults (``3: lr=0.01 hidden_size=512``; all of them, as
    ``-``, for a run at the defaults of every one); its folder's name when nothing differs. Each name is at
    most ``limit`` characters (cut with an ellipsis) and names one run: one that would name two gets its
    folder's name added."""
    drawn = [r for r in runs if r.curves] or runs
    keys = _changed_keys(drawn)
    names = _short_keys(keys)

    def cut(text: str, n: int) -> str:
        return text if len(text) <= n else text[: max(n - 1, 0)] + "…"

    folder = {r.path: r.path.name or str(r.path) for r in runs}
    label = {}
    for r in runs:
        number, _, _ = r.path.name.partition("_")
        text = _changed(r, [k for k in keys if k in r.overrides] or keys, names) if keys else ""
        label[r.path] = cut(f"{number}: {text}" if text and number.isdigit() else text or folder[r.path], limit)
    counts = Counter(label.values())
    for r in runs:
        if counts[label[r.path]] > 1 and label[r.path] != folder[r.path]:
            room = limit - len(folder[r.path]) - 3
            label[r.path] = (f"{cut(label[r.path], room)} ({folder[r.path]})" if room >= 12
                             else cut(folder[r.path], limit))
    return label


def choose_metric(runs: list[Run]) -> tuple[str, str]:
    """The metric to rank by when ``--metric`` is not given, and a note (empty when the runs agree): each run's
    ``default_metric()`` (its ``optimized_metric``), counted over the runs that logged anything (else over
    all); where they differ, the most common (a tie: the first run's, in folder order)."""
    voters = [r for r in runs if r.curves] or runs
    counts = Counter(r.default_metric() for r in voters)
    if not counts:
        return "val/loss", ""
    metric = counts.most_common(1)[0][0]  # ties: in the order first met (Counter keeps it)
    if len(counts) == 1:
        return metric, ""
    each = ", ".join(f"{m} ({n} run{'s' if n > 1 else ''})" for m, n in counts.most_common())
    return metric, (f"the runs optimise different metrics: {each}; ranked by {metric}, the most common "
                    "(--metric picks another)")


def tokens_per_s(run: Run) -> float | None:
    """The run's tokens over its seconds of training: the run average it logged at its end (what its console's
    last line said); else (a run killed before its end, or older than that figure) the logged windows'
    tokens over their seconds, a window's seconds being its ``step_ms`` times its steps (taken as those since
    the window before; a validation restarts a window, so the one after it is shorter than that); else the
    mean of the windows' rates. Not that mean when it can be avoided: it counts a slow first window (set-up,
    compilation) or a short one as much as any other, and overstates the run's pace."""
    average = run.curve("throughput/tokens_per_s_run_average")
    if average and math.isfinite(average[-1][2]):
        return average[-1][2]
    rates = {s: v for s, _, v in run.curve("throughput/tokens_per_s") if math.isfinite(v)}
    step_ms = {s: v for s, _, v in run.curve("throughput/step_ms") if math.isfinite(v) and v > 0}
    steps = sorted(rates)
    if steps and set(steps) <= set(step_ms):
        lengths = [b - a for a, b in zip(steps, steps[1:])]
        lengths = [min([steps[0] + 1, *lengths[:1]]), *lengths]  # the first: from step 0, at most as the next
        seconds = [step_ms[s] * n / 1000 for s, n in zip(steps, lengths)]
        return sum(rates[s] * t for s, t in zip(steps, seconds)) / sum(seconds)
    return sum(rates.values()) / len(rates) if rates else None


def summarise(runs: list[Run], metric: str, at_seconds: float | None = None) -> list[dict]:
    """One row per run (see COLUMNS), best final ``metric`` first (highest for accuracies, else lowest), or
    best ``metric`` reached within ``at_seconds`` of training; runs without it, or whose value is not finite
    (diverged), last and unranked."""
    sign = -1.0 if higher_is_better(metric) else 1.0
    changed = _changed_keys(runs)
    rows = []
    for r in runs:
        values = [e for e in r.curve(metric) if math.isfinite(e[2])]
        best = min(values, key=lambda e: sign * e[2]) if values else None
        final = r.curve(metric)[-1][2] if r.curve(metric) else None
        diverged = r.status == "finished" and final is not None and not math.isfinite(final)
        status = f"diverged ({metric} = {final})" if diverged else r.status
        memory = [v for _, _, v in r.curve("memory/peak_cuda_mib")]
        times = [t for c in r.curves.values() for _, t, _ in c if math.isfinite(t)]
        seconds = [t for t, _ in r.timed("time/train_seconds")] or [t for t, _ in r.timed(metric)]
        reached = r.at_seconds(metric, at_seconds) if at_seconds is not None else None
        rows.append({
            "rank": None, "run": str(r.path), "status": status,
            "changed": _changed(r, changed),
            "backend": r.backend, "cell": r.cell,
            "final": final if final is not None and math.isfinite(final) else None, "best": best[2] if best else None,
            "best_step": r.step(metric, best[0]) if best else None,  # optimiser steps taken
            "at_seconds": reached if reached is not None and math.isfinite(reached) else None,
            "tokens_per_s": tokens_per_s(r),
            "peak_cuda_mib": max(memory) if memory else None,
            "wall_s": max(seconds) if seconds else
            ((max(times) - min(times + ([r.started] if r.started else []))) or None if times else None),
            "parameters": r.parameters,
        })
    # ranked: the finished runs; then the unfinished and failed ones that logged the metric, then the others
    key = "final" if at_seconds is None else "at_seconds"
    rows.sort(key=lambda row: (row["status"] != "finished" or row[key] is None, row[key] is None,
                               sign * row[key] if row[key] is not None else 0))
    ranked = [row for row in rows if row["status"] == "finished" and row[key] is not None]
    for place, row in enumerate(ranked, 1):  # equal values share a rank, the next one skips (1, 1, 3): equal as
        # the table shows them (digits it hides would rank runs that read the same)
        tied = place > 1 and _cell(row[key]) == _cell(ranked[place - 2][key])
        row["rank"] = ranked[place - 2]["rank"] if tied else place
    return rows


def short_number(value: str) -> str:
    """``0.0013667205080640642`` -> ``0.001367``: a long float (an Optuna trial's) to 4 significant digits, for
    job folder names and report columns; anything else as it is."""
    return f"{float(value):.4g}" if re.fullmatch(r"-?\d*\.\d{7,}(e-?\d+)?", value) else value


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def markdown(rows: list[dict], metric: str, at_seconds: float | None = None) -> str:
    columns = [c for c in COLUMNS if c != "at_seconds" or at_seconds is not None]
    head = [f"{c} {metric}" if c in ("final", "best") else f"{metric} at {at_seconds:g} s" if c == "at_seconds" else c
            for c in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(_cell(row[c]).replace("|", "/") for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def at_seconds_notes(runs: list[Run], rows: list[dict], metric: str, seconds: float) -> str:
    """What a ranking at ``seconds`` cannot say by itself: runs that had not validated by then, and runs whose
    training ended before then (their value is their final one)."""
    lines = []
    early = [min(t for t, _ in r.timed(metric)) for r in runs if r.timed(metric)]
    if early and all(row["at_seconds"] is None for row in rows):
        lines.append(f"No run had logged {metric} by {seconds:g} s of training (the earliest did at {min(early):.3g} s).")
    ended = [r.path.name or str(r.path) for r in runs if r.timed(metric) and max(t for t, _ in r.timed(metric)) < seconds]
    if ended:
        lines.append(f"Trained for less than {seconds:g} s, ranked by their final {metric}: {', '.join(ended)}.")
    return "".join(f"{line}\n" for line in lines) + ("\n" if lines else "")


def pareto_front(points: list[tuple[float, float]], higher_better: bool) -> list[tuple[float, float]]:
    """The (seconds, value) points that no other point beats on both: as fast or faster and as good or
    better (a better value than every point before it in time)."""
    front, best = [], None
    for t, v in sorted(points, key=lambda p: (p[0], -p[1] if higher_better else p[1])):
        if math.isfinite(v) and (best is None or (v > best if higher_better else v < best)):
            front.append((t, v))
            best = v
    return front


def _legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:  # runs with no values draw nothing to label
        ax.legend(fontsize=7)


def plot(runs: list[Run], metric: str, out: Path) -> list[Path]:
    """The PNG plots; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    label = labels(runs)
    written = []

    def save(fig, name):
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(out / name)

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in runs:
        values = r.steps(metric)
        if values:
            ax.plot([s for s, _ in values], [v for _, v in values], marker="o", ms=3, label=label[r.path])
    ax.set(xlabel="step (optimiser steps taken)", ylabel=metric)
    _legend(ax)
    save(fig, "metric_vs_step.png")
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in runs:
        values = r.timed(metric)
        if values:
            ax.plot([t for t, _ in values], [v for _, v in values], marker="o", ms=3, label=label[r.path])
    front = pareto_front([p for r in runs for p in r.timed(metric)], higher_is_better(metric))
    if len(front) > 1:
        ax.step([t for t, _ in front], [v for _, v in front], where="post", color="black", ls="--", lw=1,
                label="Pareto front")
    ax.set(xlabel="seconds of training", ylabel=metric)
    _legend(ax)
    save(fig, "metric_vs_time.png")
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in runs:
        values, smooth, ema = r.steps("train/loss"), [], None
        for n, (_, v) in enumerate(values, 1):  # TensorBoard's smoothing of 0.9, debiased as it does
            ema = 0.1 * v if ema is None else 0.9 * ema + 0.1 * v
            smooth.append(ema / (1 - 0.9**n))
        if values:
            ax.plot([s for s, _ in values], smooth, label=label[r.path])
    ax.set(xlabel="step (optimiser steps taken)", ylabel="train/loss (smoothed)")
    _legend(ax)
    save(fig, "train_loss.png")
    fig, ax = plt.subplots(figsize=(7, 4))
    names = [label[r.path] for r in runs]
    rates = [tokens_per_s(r) for r in runs]  # the table's figure
    bars = ax.barh(names, [math.nan if v is None else v for v in rates])
    ax.bar_label(bars, labels=["" if v is None else f"{v:,.0f}" for v in rates], fontsize=7, padding=2)
    ax.set(xlabel="tokens/s (the run's tokens over its seconds of training)")
    save(fig, "tokens_per_s.png")
    return written


def _optuna_summary(root: Path) -> str:
    """Optuna's verdict from the sweep's optimization_results.yaml (hparams_search), if there is one."""
    results = _yaml(root / "optimization_results.yaml")
    if not isinstance(results, dict) or not isinstance(results.get("best_params"), dict):
        return ""
    params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in results["best_params"].items())
    return f"Optuna's best trial: {params} (value {results.get('best_value')}).\n\n"


def _relative(path: Path, root: Path) -> str:
    """A run's folder as the report names it: relative to the report's folder (``.``: that folder itself)."""
    return str(path.relative_to(root)) if path != root else "."


class ReportCallback(Callback):
    """A Hydra callback (``hydra.callbacks``) that writes the report of a sweep when it ends: what
    ``experiment=compare_backends`` uses."""

    def __init__(self, metric: str | None = None) -> None:
        self.metric = metric  # None: the runs' optimized_metric

    def on_multirun_end(self, config, **kwargs) -> None:
        try:
            main([str(config.hydra.sweep.dir), *(["--metric", self.metric] if self.metric else [])])
        except SystemExit as exc:  # a sweep whose jobs all failed before logging: say so, keep the exit status
            print(f"lltm-report: no report (status {exc.code})", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="lltm-report", description=help_text(__doc__.split("\n\n")[0]))
    parser.add_argument("dir", help="a run folder, or a sweep's folder (multirun/<date_time>)")
    parser.add_argument("--out", help="where report.md, report.csv and the plots go (default: DIR)")
    parser.add_argument("--metric", help="the validation metric to rank by: lower is better, except for "
                        f"{', '.join(HIGHER_IS_BETTER)} (val/loss, val/bpc, val/acc, val/mae, ...); default: the runs' "
                        "own optimized_metric setting, val/bpc for a language model left at val/loss (the same "
                        "ranking); where the runs' differ, the most common")
    parser.add_argument("--at-seconds", type=float, metavar="S",
                        help="rank by the metric each run had reached after S seconds of training (its last "
                        "validation by then), instead of by its final value")
    a = parser.parse_args(argv)
    if a.metric is not None and not a.metric.strip():
        parser.error("--metric: a metric's name (val/loss, val/bpc, val/acc, ...), not an empty one")
    if a.at_seconds is not None and not (a.at_seconds > 0 and math.isfinite(a.at_seconds)):
        parser.error(f"--at-seconds: a positive number of seconds, not {a.at_seconds:g}")
    root = Path(a.dir)
    if not root.is_dir():
        print(f"lltm-report: error: no such folder: {root}", file=sys.stderr)
        sys.exit(2)
    paths = find_runs(root)
    if not paths:
        print(f"lltm-report: error: no runs in {root} (no .hydra folder or TensorBoard events below it)", file=sys.stderr)
        sys.exit(2)
    if any(root not in (p, *p.parents) for p in paths):  # DIR is a run's own tensorboard/ or csv/ folder
        root = paths[0] if len(paths) == 1 else Path(os.path.commonpath(paths))
    runs = [read_run(p) for p in paths]
    damaged = [f"run {_relative(r.path, root)}: {problem}; reported without it" for r in runs for problem in r.problems]
    for line in damaged:  # one line each, naming the run; the other runs are reported as usual
        print(f"lltm-report: warning: {line}", file=sys.stderr)
    note = ""
    if a.metric is None:
        a.metric, note = choose_metric(runs)
        if note:
            print(f"lltm-report: note: {note}", file=sys.stderr)
    logged = sorted({tag for r in runs for tag in r.curves})
    if logged and a.metric not in logged:
        print(f"lltm-report: error: no run logged {a.metric}; the runs logged "
              + ", ".join(t for t in logged if t.startswith(("val/", "test/", "train/loss"))), file=sys.stderr)
        sys.exit(2)
    out = Path(a.out) if a.out else root
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.md").touch()
    except OSError as exc:
        print(f"lltm-report: error: cannot write the report into {out}: {exc.strerror or exc}", file=sys.stderr)
        sys.exit(2)
    rows = summarise(runs, a.metric, a.at_seconds)
    for row in rows:
        row["run"] = _relative(Path(row["run"]), root)
    table = markdown(rows, a.metric, a.at_seconds)
    plots = plot(runs, a.metric, out)
    better = "higher" if higher_is_better(a.metric) else "lower"
    by = f"the {a.metric} reached within {a.at_seconds:g} s of training" if a.at_seconds else f"the final {a.metric}"
    notes = at_seconds_notes(runs, rows, a.metric, a.at_seconds) if a.at_seconds else ""
    (out / "report.md").write_text(f"# Runs in {root}\n\nRanked by {by} ({better} is better; finished runs "
                                   f"only).{' ' + note[0].upper() + note[1:] + '.' if note else ''} Steps: "
                                   f"optimiser steps taken.\n\n{table}\n{notes}"
                                   + "".join(f"Damaged: {line}.\n" for line in damaged) + ("\n" if damaged else "")
                                   + _optuna_summary(root)
                                   + "".join(f"![{p.stem}]({p.name})\n" for p in plots))
    with open(out / "report.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({k: ("" if v is None or (isinstance(v, float) and math.isnan(v)) else v) for k, v in row.items()}
                         for row in rows)
    print(table + notes + f"lltm-report: wrote {out / 'report.md'}, report.csv and {len(plots)} plots")


if __name__ == "__main__":
    main()
