"""The ``lltm-train`` command (also ``python -m lltm_train``): Hydra composes ``conf/``, :func:`train` runs it.

Errors in the command line or the configuration are printed as one line (``lltm-train: error: ...``) with
exit status 2, before any training; set HYDRA_FULL_ERROR=1 for Hydra's own report with a traceback.

In a sweep (``-m``) a failing job does not end the sweep: its error goes to ``error.txt`` in its directory and
to one line, the other jobs run, and the exit status is the number of failed jobs. Job directories are
named by the job number and the swept settings only.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import sys
import time
import traceback
from datetime import datetime
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.errors import HydraException, InstantiationException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, read_write
from omegaconf.errors import OmegaConfBaseException

from .checkpoint_io import CheckpointWriteError
from .config import ConfigError, cell_backends, close_setting, config_dir, hydra_value
from .console import quiet_upstream_warnings, route_warnings
from .metric_names import higher_is_better
from .report import short_number
from .run_files import CHECKPOINT_SUFFIX, CHECKPOINTS, DIVERGED, ERROR, HYDRA, LOCK, LOG, SWEEP_JOB, config_record, overrides_record
from .run_lock import RunFolderBusy

# Errors that mean "fix the command line or the config" (or a diverged run), not a bug: one line each.
_REPORTED = (ConfigError, HydraException, OmegaConfBaseException, FloatingPointError, CheckpointWriteError)
_one_line_errors = True  # False when the user asked for Hydra's full reports (HYDRA_FULL_ERROR)
_job_started = False
_failed_jobs: dict[str, str] = {}  # job directory -> error, of a sweep's failed jobs (here and in FailedJobs)
_diverged_jobs: dict[str, str] = {}  # job directory -> why, of the jobs that diverged and went on (diverged.txt)
# hydra.run.dir where it names a folder that exists, and which of Hydra's record and log and the lock it held then
_named_run_dir: tuple[Path, set[str]] | None = None
_started = time.time()  # error.txt files older than this are from an earlier sweep into the same folder
_OWN_FULL_ERROR = "LLTM_TRAIN_SET_HYDRA_FULL_ERROR"  # "1": HYDRA_FULL_ERROR=1 was set by main(), not by the user
_SWEPT_KEYS = "LLTM_TRAIN_SWEPT_KEYS"  # the keys a sweep varies (for job folder names), for jobs in other processes


def _swept_settings() -> str:
    """The job's value of each setting the sweep varies (those given as a,b,... or range/choice/glob on the
    command line), as a short directory name: ``backend=cpp_model.hidden_size=128``."""
    swept = set(filter(None, os.environ.get(_SWEPT_KEYS, "").split(","))) if _SWEPT_KEYS in os.environ else _swept_keys(sys.argv)
    swept |= {str(k) for k in (HydraConfig.get().sweeper.get("params") or {})}  # a config's sweep (an experiment's)
    task = HydraConfig.get().overrides.task
    parts = [o.lstrip("+~") for o in task if o.lstrip("+~").partition("=")[0] in swept]
    parts = [f"{key}={short_number(value)}" for key, _, value in (p.partition("=") for p in parts)]
    named = re.sub(r"(\d)[eE]\+(\d)", r"\1e\2", "_".join(parts))  # 1e+30 -> 1e30: "+" would become "-" below
    return re.sub(r"[^A-Za-z0-9=._,-]+", "-", named)[:200]  # a file name has at most 255 bytes


def _swept_keys(argv: list[str]) -> set[str]:
    """The keys a sweep's command line varies: those given as a,b,... or range/choice/glob/interval."""
    swept = set()
    for arg in argv[1:]:
        key, _, value = arg.partition("=")
        if value and ("," in value or re.match(r"(range|choice|glob|interval)\(", value)):
            swept.add(key.lstrip("+~"))
    return swept


def _config_subdir(ckpt_path: str | None, output_dir: str | None = None) -> str:
    """Where Hydra records a job's config: ``.hydra`` in a folder that holds no run's record yet (a new run, or a
    resume from a checkpoint file into a new folder, which later resumes and ``lltm-evaluate`` read); in a folder
    that holds one, ``.hydra/resume_<date_time>`` (``run_<date_time>`` without ``ckpt_path``: a command aimed at
    an earlier run's folder, which is refused), so that the first run's record, which a resume must match, is
    never overwritten. ``output_dir``: the job's folder (None: treated as new)."""
    if output_dir is None or not config_record(output_dir).is_file():
        return HYDRA
    return f"{HYDRA}/{'run' if ckpt_path is None else 'resume'}_{datetime.now():%Y-%m-%d_%H-%M-%S}"


def _cell_backends() -> str:
    """Every cell on every backend this machine runs, as the options of the cell_backend group (lltm_train.config),
    comma-separated (experiment=compare_backends sweeps them): e.g. lltm_python,lltm_cpp,lstm_python,...,rnn_relu_torch."""
    from .backends import available_backends
    from .ops.cells import CELLS

    here = {*available_backends(), "torch"}
    return ",".join(f"{name}_{b}" for name, spec in CELLS.items() for b in cell_backends(spec) if b in here)


def _fused_and_torch() -> str:
    """Each cell on this machine's fused backend (cuda with a GPU, else cpp) and torch.nn's own layer of each cell
    PyTorch has, as options of the cell_backend group (experiment=compare_cells): e.g. lltm_cpp,...,rnn_relu_torch."""
    from .backends import available_backends
    from .ops.cells import CELLS

    fused = "cuda" if "cuda" in available_backends() else "cpp"
    return ",".join([*(f"{c}_{fused}" for c in CELLS), *(f"{c}_torch" for c, spec in CELLS.items() if spec.has_torch)])


def _accelerator_for(backend: str) -> str:
    """Where a backend runs: cpp on the CPU, cuda on the GPU, python, torch and auto wherever Lightning picks."""
    return {"cpp": "cpu", "cuda": "gpu"}.get(str(backend), "auto")


OmegaConf.register_new_resolver("lltm_swept", _swept_settings, replace=True)
OmegaConf.register_new_resolver("lltm_accelerator", _accelerator_for, replace=True)
OmegaConf.register_new_resolver("lltm_cell_backends", _cell_backends, replace=True)
OmegaConf.register_new_resolver("lltm_fused_and_torch", _fused_and_torch, replace=True)
OmegaConf.register_new_resolver("lltm_config_subdir", _config_subdir, replace=True)
OmegaConf.register_new_resolver(  # hparams_search: maximise accuracies, minimise the rest
    "lltm_direction", lambda metric: "maximize" if higher_is_better(str(metric)) else "minimize", replace=True)


@hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="config")
def _run(cfg: DictConfig) -> float | None:
    from .train import train

    global _job_started
    _job_started = True
    in_sweep = HydraConfig.get().mode == RunMode.MULTIRUN
    if in_sweep and _optimising_sweeper() and cfg.get("ckpt_path") is not None:
        _remove_if_empty(Path(cfg.paths.output_dir))  # the first trial's folder, which Hydra made
        _fail(ConfigError("ckpt_path: a hyperparameter search cannot be resumed (the sweeper's study lives in memory, "
                          "and its trials learn their values only from runs that train to the end); run it again "
                          "without ckpt_path, or resume one trial: hydra.run.dir=<its folder> ckpt_path=last"))
    argv, environ = sys.argv, dict(os.environ)
    _pin_job_for_ddp_processes(in_sweep)
    try:
        value = train(cfg).get(cfg.optimized_metric)  # what a sweeper optimises (None: the run did not log it)
        if in_sweep and _optimising_sweeper() and (value is None or not math.isfinite(value)):
            # Optuna cannot rank it, and a NaN would end the whole search: a failed trial instead
            reason = "never logged" if value is None else f"{value} (the run diverged)"
            return _record_failed_job(Path(cfg.paths.output_dir), None, f"optimized_metric {cfg.optimized_metric}: {reason}")
        return value
    except _REPORTED as exc:  # reported here: Hydra would add its own line about the failed job
        if not _one_line_errors:
            raise
        if isinstance(exc, RunFolderBusy):  # the folder is another run's: nothing left in it, nor removed
            _remove_own_record(Path(cfg.paths.output_dir))
            if in_sweep:
                return _record_failed_job(Path(cfg.paths.output_dir), exc, one_line(exc), write=False)
            _fail(exc)
        if in_sweep:
            return _record_failed_job(Path(cfg.paths.output_dir), exc, one_line(exc))
        _remove_what_it_made(Path(cfg.paths.output_dir))
        print(file=sys.stdout, flush=True)  # end a progress bar's line (tqdm draws on stdout), so the error stands alone
        _fail(exc)
    except Exception as exc:  # noqa: BLE001 - in a sweep, a crashed job must not take the others with it
        if not in_sweep or not _one_line_errors:
            raise
        return _record_failed_job(Path(cfg.paths.output_dir), exc, f"{type(exc).__name__}: {one_line(exc)}")
    finally:
        # Lightning's DDP launcher leaves LOCAL_RANK, WORLD_SIZE, ... in this process's environment, from
        # which the sweep's next job would conclude that its processes were started for it, and wait for them.
        sys.argv = argv
        os.environ.clear()
        os.environ.update(environ)
        _end_process_group()
    return None


def _config_source_flags(argv: list[str]) -> list[str]:
    """Hydra's options that say where the config comes from (``--config-dir``, ``-cp``, ...), with their values."""
    names = ("--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn")
    kept: list[str] = []
    for i, arg in enumerate(argv[1:], 1):
        if arg in names and i + 1 < len(argv):
            kept += [arg, argv[i + 1]]
        elif arg.startswith(tuple(f"{n}=" for n in names)):
            kept.append(arg)
    return kept


def _end_process_group() -> None:
    """Ends a job's DDP process group, whose other processes have exited: the sweep's next job would
    otherwise reuse it and wait on them."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _pin_job_for_ddp_processes(in_sweep: bool) -> None:
    """Makes the command that Lightning re-runs for DDP's other processes (``sys.argv`` plus
    ``hydra.run.dir=<run.dir>``) run this very job in this job's directory, and tells them (``LLTM_SWEEP_JOB``)
    when it is a sweep's job, which they run as a single run.

    Without this, a sweep's job would start the whole sweep again in every other process (the command line
    has ``-m`` and the swept lists), and ``run.dir``, which is not the job's directory in a sweep and holds
    ``${now:...}``, would send the other processes' files to another, new ``outputs/`` folder."""
    if "LOCAL_RANK" in os.environ:  # one of those processes itself
        return
    if in_sweep:  # (the job's environment is restored when it ends)
        os.environ[SWEEP_JOB] = "1"
    hydra_cfg = HydraConfig.get()
    sys.argv = [sys.argv[0], *_config_source_flags(sys.argv), *hydra_cfg.overrides.task]
    with read_write(hydra_cfg):
        hydra_cfg.run.dir = hydra_cfg.runtime.output_dir


class FailedJobs(Callback):
    """A Hydra callback (conf/config.yaml): when a sweep ends, collects its failed jobs from the ``error.txt``
    each leaves in its folder, wherever it ran (in this process, or in its own with hydra/launcher=local or
    slurm), for the summary line and the exit status."""

    def on_multirun_end(self, config, **kwargs) -> None:
        for error in sorted(Path(str(config.hydra.sweep.dir)).resolve().glob(f"*/{ERROR}")):
            if error.stat().st_mtime >= _started:
                _failed_jobs.setdefault(str(error.parent), (error.read_text().splitlines() or [""])[0])
        for note in sorted(Path(str(config.hydra.sweep.dir)).resolve().glob(f"*/{DIVERGED}")):
            if note.stat().st_mtime >= _started and str(note.parent) not in _failed_jobs:
                _diverged_jobs[str(note.parent)] = (note.read_text().splitlines() or [""])[0]


def _optimising_sweeper() -> bool:
    """True when the sweeper uses the jobs' return values: any but Hydra's grid sweeper (BasicSweeper), e.g.
    the Optuna sweeper of hparams_search."""
    return not str(HydraConfig.get().sweeper.get("_target_", "")).endswith(".BasicSweeper")


def _record_failed_job(job_dir: Path, exc: BaseException | None, message: str, write: bool = True) -> None:
    """Counts the job as failed and says so; ``write``: also into its folder's error.txt (not where the folder is
    another run's)."""
    _failed_jobs[str(job_dir.resolve())] = message
    print(f"lltm-train: error in job {job_dir.name}: {message}", file=sys.stderr, flush=True)
    if not write or any(p.stat().st_mtime < _started for p in job_dir.glob(f"{CHECKPOINTS}/*{CHECKPOINT_SUFFIX}")):
        return  # the folder is an earlier run's (a sweep run again into the same hydra.sweep.dir): not ours to mark
    job_dir.mkdir(parents=True, exist_ok=True)
    trace = "".join(traceback.format_exception(exc)) if exc is not None else ""
    (job_dir / ERROR).write_text(message + "\n\n" + trace)


def _remove_if_empty(run_dir: Path) -> None:
    """Removes the run directory Hydra made for a job that failed before writing anything of its own."""
    if run_dir.is_dir() and {p.name for p in run_dir.iterdir()} <= {HYDRA, LOG, LOCK} and not (run_dir / LOCK).is_dir():
        shutil.rmtree(run_dir, ignore_errors=True)


def _remove_what_it_made(run_dir: Path) -> None:
    """Removes what a run refused before training made in its folder: the folder itself where Hydra made it; in a
    folder that was there (hydra.run.dir: a sweep's root by mistake, any folder) Hydra's record and log and the
    lock file where they were not there before. (A run's folder keeps the refused resume's record beside its own,
    ``.hydra/resume_<date>``, which its error message points to.)"""
    if _named_run_dir is None or run_dir.resolve() != _named_run_dir[0]:
        return _remove_if_empty(run_dir)
    for name in {HYDRA, LOG, LOCK} - _named_run_dir[1]:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return None


def _remove_own_record(run_dir: Path) -> None:
    """Removes the settings record Hydra wrote for this job into another run's folder (``.hydra/resume_<date>`` or
    ``.hydra/run_<date>``: hydra.output_subdir); the folder's own ``.hydra`` record is never touched."""
    subdir = HydraConfig.get().output_subdir if HydraConfig.initialized() else None
    if subdir and Path(subdir).parent.name == HYDRA:
        shutil.rmtree(run_dir / subdir, ignore_errors=True)


def _fail(exc: BaseException) -> None:
    message = one_line(exc)
    if "Unable to configure handler 'file'" in message:  # Hydra's log file in a run directory it cannot write
        cause = exc.__cause__ or exc.__context__
        message = f"cannot write the run's log file ({cause or message}); check the permissions of hydra.run.dir"
        exc = ConfigError(message)
    if not message:  # e.g. an assert inside a plugin (Hydra's Optuna sweeper checks its settings so)
        cause = exc.__cause__ or exc.__context__ or exc
        message = f"{type(cause).__name__} without a message; run with HYDRA_FULL_ERROR=1 for the traceback"
    elif not isinstance(exc, (ConfigError, HydraException, OmegaConfBaseException)):
        message = f"{type(exc).__name__}: {message}"
    print(f"lltm-train: error: {message}", file=sys.stderr)
    sys.exit(2)


def one_line(exc: BaseException) -> str:
    """Hydra's and OmegaConf's multi-line messages folded into one line."""
    while isinstance(exc, InstantiationException) and exc.__cause__ is not None:
        exc = exc.__cause__
    parts: list[str] = []
    for raw in str(exc).splitlines():
        line = raw.strip()
        if line.startswith(("Config search path", "Set the environment variable")):
            break
        if not line:
            continue
        if raw[:1].isspace() and parts:  # an indented list under a heading, e.g. the available options
            parts[-1] += (" " if parts[-1].endswith(":") else ", ") + line
        else:
            parts.append(line)
    mistyped = re.fullmatch(r"Could not override '([^']+)'\.", parts[0]) if parts else None
    if mistyped:  # Hydra's unknown key: its sentence's "." dropped before "; ", and the nearest known key
        parts[0] = parts[0][:-1]
        near = close_setting(mistyped.group(1))
        if near and near != mistyped.group(1):
            parts.append(f"did you mean {near}?")
    return "; ".join(parts)


def _sweep_group_settings(argv: list[str]) -> list[str]:
    """``G.key=value`` settings of a config group that the sweep varies (``-m dataset=adding,copy``) as
    ``++G.key=value``. Hydra checks a sweep's settings against the default group option (shakespeare has no
    ``train_size``) before it composes each job, and refuses them; each job checks them against its own
    options anyway (an unknown key is a one-line error there)."""
    if not {"-m", "--multirun"} & set(argv):
        return argv
    groups = {p.name for p in config_dir().iterdir() if p.is_dir()}
    swept = {a.partition("=")[0] for a in argv if a.partition("=")[0] in groups and "," in a.partition("=")[2]}
    return [f"++{a}" if a.partition(".")[0] in swept and "=" in a and not a.startswith(("+", "~")) else a for a in argv]


def _resumed_run_overrides(argv: list[str]) -> list[str]:
    """A resume (``hydra.run.dir=DIR ckpt_path=last``, or ``ckpt_path=DIR/checkpoints/FILE``, into DIR or another
    folder) of a run that recorded its command line settings (``DIR/.hydra/overrides.yaml``) starts from them:
    ``argv`` with those settings put first, so that the ones given now still win. Without this a resume would run
    with the defaults for every setting not repeated (4,500 steps where the run asked for 300; the default cell
    where the run trained another)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    given = [a for a in argv[1:] if not a.startswith("-")]
    try:
        parsed = {o.key_or_group: o for o in OverridesParser.create().parse_overrides(given)}
    except Exception:  # noqa: BLE001 - a bad command line: Hydra reports it
        return argv
    if "ckpt_path" not in parsed or "-m" in argv or "--multirun" in argv:
        return argv
    ckpt = Path(str(parsed["ckpt_path"].value()))
    if ckpt.parent.name == "checkpoints":  # a checkpoint file of a run's folder (DIR/checkpoints/FILE): that run's
        run_dir = str(ckpt.parent.parent)  # settings, also into another folder (hydra.run.dir) than its own
    elif "hydra.run.dir" in parsed:
        run_dir = str(parsed["hydra.run.dir"].value())
    else:
        return argv
    record = overrides_record(run_dir)
    if not record.is_file():
        return argv
    saved = [o for o in OmegaConf.to_container(OmegaConf.load(record))
             if isinstance(o, str) and not o.lstrip("+~").startswith(("hydra.", "ckpt_path="))]
    ours = {o.lstrip("+~").split("=", 1)[0] for o in given}
    saved = [o for o in saved if o.lstrip("+~").split("=", 1)[0] not in ours]
    if not saved:
        return argv
    print(f"lltm-train: resuming with the run's own settings ({record}): {' '.join(saved)}", file=sys.stderr)
    # one run, also when the saved settings name a recipe that sweeps (experiment=compare_backends, hparams_search)
    return [argv[0], *saved, "hydra.mode=RUN", *argv[1:]]


_PATH_KEYS = ("hydra.run.dir", "hydra.sweep.dir", "ckpt_path", "dataset.path")


def _quote_paths(argv: list[str]) -> list[str]:
    """Path settings quoted for Hydra's override grammar when they hold characters it reads, such as the
    ``=`` of a sweep job's folder (``hydra.run.dir=multirun/x/0_lr=0.1``) or a letter outside ASCII: the
    path is meant as written. In a sweep (``-m``) a comma still separates the values swept, as in every
    other setting, and each path of the list is quoted on its own."""
    sweep = bool({"-m", "--multirun"} & set(argv))
    quoted = []
    for arg in argv:
        key, _, value = arg.partition("=")
        if key.lstrip("+~") in _PATH_KEYS and value and value[0] not in "'\"":
            if sweep and "," in value and not re.match(r"\w+\(", value):  # a list, not choice(...), glob(...)
                arg = f"{key}=" + ",".join(hydra_value(v) for v in value.split(","))
            else:
                arg = f"{key}={hydra_value(value)}"
        quoted.append(arg)
    return quoted


_REQUIRED_GROUPS = ("dataset", "model", "trainer", "logger", "callbacks", "paths")


def _check_required_groups(argv: list[str]) -> None:
    """``trainer=null`` (or ``~trainer``) for a group every run needs: one line naming the group and its
    options, where Hydra would say only that a group override got None (or fail on an interpolation)."""
    for arg in argv[1:]:
        key, _, value = arg.partition("=")
        group = key.lstrip("+")
        removed = key.startswith("~") and key[1:] in _REQUIRED_GROUPS and not value
        if removed or (group in _REQUIRED_GROUPS and value.lower() == "null" and "=" in arg):
            name = key.lstrip("+~")
            options = sorted(p.stem for p in (config_dir() / name).glob("*.yaml"))
            hint = {"logger": "; logger=none trains without a logger",
                    "callbacks": "; drop one callback with ~callbacks.NAME"}.get(name, "")
            raise ConfigError(f"{arg}: every run needs the {name} group; choose one of {', '.join(options)}{hint}")


def _check_run_dir(argv: list[str]) -> None:
    """An existing ``hydra.run.dir`` that cannot be written: one line (Hydra fails later, setting up its log
    file, with "Unable to configure handler 'file'"); an empty one (Hydra would take the current directory).
    Notes what an existing one holds (:func:`_remove_what_it_made`)."""
    global _named_run_dir
    for arg in argv[1:]:
        key, _, value = arg.partition("=")
        if key.lstrip("+") != "hydra.run.dir" or "=" not in arg:
            continue
        if not value.strip("'\" "):
            raise ConfigError("hydra.run.dir is empty (an unset shell variable?): it would write the run into the "
                              "current directory; give a folder, or leave hydra.run.dir out for a new one")
        path = Path(value.strip("'\""))
        if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(f"cannot write the run directory {path} (permission denied); choose another "
                              "hydra.run.dir")
        if path.is_dir():
            _named_run_dir = (path.resolve(), {name for name in (HYDRA, LOG, LOCK) if (path / name).exists()})


def main() -> None:
    quiet_upstream_warnings()
    route_warnings()
    if not sys.stderr.isatty():  # a log file: no colour codes (Optuna's log handler colours unconditionally)
        os.environ.setdefault("NO_COLOR", "1")
    sys.argv = [sys.argv[0], *_quote_paths(sys.argv[1:])]
    sys.argv = _resumed_run_overrides(sys.argv)
    sys.argv = _sweep_group_settings(sys.argv)
    # for jobs that run in other processes (hydra/launcher=slurm or local), which have other command lines
    os.environ[_SWEPT_KEYS] = ",".join(sorted(_swept_keys(sys.argv)))
    # With HYDRA_FULL_ERROR set, Hydra raises its composition errors instead of printing them, so they can
    # be reported here in one line; a user who sets it gets Hydra's full report instead. The processes this one
    # starts (DDP's) inherit the variable, and _OWN_FULL_ERROR tells them it was set here, not by the user.
    global _one_line_errors
    if "HYDRA_FULL_ERROR" in os.environ and os.environ.get(_OWN_FULL_ERROR) != os.environ["HYDRA_FULL_ERROR"]:
        _one_line_errors = False
        _run()
        return
    os.environ["HYDRA_FULL_ERROR"] = os.environ[_OWN_FULL_ERROR] = "1"
    try:
        _check_required_groups(sys.argv)
        _check_run_dir(sys.argv)
        _run()
        if _diverged_jobs:
            print(f"lltm-train: {len(_diverged_jobs)} job(s) of the sweep diverged (their diverged.txt says how): "
                  + "; ".join(f"{job}: {why}" for job, why in _diverged_jobs.items()), file=sys.stderr)
        if _failed_jobs:
            print(f"lltm-train: {len(_failed_jobs)} job(s) of the sweep failed (a traceback in each one's error.txt, where it ran): "
                  + "; ".join(f"{job}: {message}" for job, message in _failed_jobs.items()), file=sys.stderr)
            sys.exit(min(len(_failed_jobs), 125))
    except _REPORTED as exc:
        _fail(exc)
    except Exception as exc:  # noqa: BLE001
        if "No trials are completed yet" in str(exc):  # Optuna, at the end of a search without one finished trial
            for job, message in _failed_jobs.items():
                print(f"lltm-train: failed: {job}: {message}", file=sys.stderr)
            print("lltm-train: error: no trial of the search finished (hydra.sweeper.n_trials must be at least 1; "
                  "each failed trial's reason is above and in its error.txt)", file=sys.stderr)
            sys.exit(min(len(_failed_jobs), 125) or 2)
        if _job_started:  # a failure during training: a bug or the machine; keep the traceback
            raise
        _fail(exc)  # Hydra could not even start the job: the command line or the run directory is wrong
