"""Locating ``conf/``, the config options made from the cells' specs, and checking a composed config before
anything is built from it."""

from __future__ import annotations

import inspect
import math
import re
import typing
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from .metric_names import higher_is_better
from .ops.cells import CELLS, default_lr


class ConfigError(ValueError):
    """A configuration the run cannot start with; the CLI prints its message as one line."""


def _default_lr(cell, hidden_size) -> float:
    return default_lr(str(cell), hidden_size)


# model.optimizer.lr's default: each cell's rule (conf/model/optim/adamw_cosine.yaml)
OmegaConf.register_new_resolver("lltm_lr", _default_lr, replace=True)

TIME_BUDGET_WARMUP_STEPS = 50  # the schedule's warm-up with a time budget: a short budget takes a few hundred steps


def _warmup_steps(max_time) -> int | None:
    """model.scheduler.warmup_steps's default: with a time budget (trainer.max_time) the warm-up is a number of
    steps, not a fraction of an estimate that the first steps' timing sets; else None (warmup_fraction)."""
    return None if max_time is None else TIME_BUDGET_WARMUP_STEPS


OmegaConf.register_new_resolver("lltm_warmup_steps", _warmup_steps, replace=True)


def _checkpoint_mode(metric) -> str:
    """callbacks.model_checkpoint.mode for the run's optimized_metric: max for an accuracy, min for the rest."""
    return "max" if higher_is_better(str(metric)) else "min"


OmegaConf.register_new_resolver("lltm_mode", _checkpoint_mode, replace=True)

FUSED_BACKENDS = ("python", "cpp", "cuda")


def cell_backends(spec) -> tuple[str, ...]:
    """The backends of a cell (a CellSpec): python, cpp, cuda, and torch for a cell PyTorch has."""
    return (*FUSED_BACKENDS, "torch") if spec.has_torch else FUSED_BACKENDS


def register_cell_configs() -> None:
    """The ``cell_backend`` config group, made from :data:`lltm_train.ops.cells.CELLS`: an option
    ``<cell>_<backend>`` (``cell_backend=rnn_cpp``) for each cell and each of its backends, which sets
    ``model.cell`` and ``backend`` (experiment=compare_backends and compare_cells sweep them). A new cell
    gets its options here, with no file of its own."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for spec in CELLS.values():
        for backend in cell_backends(spec):
            store.store(group="cell_backend", name=f"{spec.name}_{backend}", package="_global_",
                        node={"model": {"cell": spec.name}, "backend": backend})


register_cell_configs()


def config_dir() -> Path:
    """``conf/`` of a source checkout or editable install, else the copy packaged as ``lltm_train/conf``."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "conf", here.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise ConfigError(f"no conf/config.yaml beside {here}; reinstall lltm-train")


def _hints(target) -> tuple[dict, bool]:
    """Type hints of ``target``'s parameters (Any where a hint cannot be resolved) and whether it takes
    **kwargs. A class whose ``__init__`` passes **kwargs on to its base class's also takes the base's
    parameters (e.g. a task's optimizer and scheduler)."""
    if not inspect.isclass(target):
        return _signature_hints(target)
    hints: dict = {}
    for cls in target.__mro__:
        if "__init__" not in cls.__dict__:
            continue
        own, takes_kwargs = _signature_hints(cls.__init__)
        hints = own | hints
        if not takes_kwargs or cls.__init__ is object.__init__:
            return hints, takes_kwargs
        if not _passes_kwargs_to_base(cls.__init__):  # e.g. Lightning's DDPStrategy: **kwargs go to DDP
            return hints, True
    return hints, True


def _passes_kwargs_to_base(init) -> bool:
    """Whether an ``__init__`` hands its **kwargs to ``super().__init__`` (True when its source is unknown)."""
    try:
        source = inspect.getsource(init)
    except (OSError, TypeError):
        return True
    return re.search(r"super\(\)\.__init__\([^)]*\*\*\w+", source) is not None


def _signature_hints(fn) -> tuple[dict, bool]:
    params = inspect.signature(fn).parameters
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - forward references only importable under TYPE_CHECKING
        hints = {}
        for name, p in params.items():
            try:
                hints[name] = typing.get_type_hints(type("_", (), {"__annotations__": {name: p.annotation}}), fn.__globals__)[name]
            except Exception:  # noqa: BLE001
                pass
    names = {n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and n != "self"}
    return {n: h for n, h in hints.items() if n in names} | {n: typing.Any for n in names - hints.keys()}, takes_kwargs


def check_node(node: DictConfig, key: str) -> None:
    """Checks a ``_target_`` node: the target exists, takes every key given, and each value has the right type.

    Raises ConfigError naming the full key, e.g. ``trainer.max_steps: expected int, got 'abc' (str)``.
    """
    from hydra.utils import get_object
    from typeguard import TypeCheckError, check_type

    try:
        target = get_object(node._target_)
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"{key}._target_: cannot import {node._target_!r} ({exc})") from None
    hints, takes_kwargs = _hints(target)
    for name in node:
        if str(name).startswith("_"):
            continue
        full = f"{key}.{name}"
        if name not in hints:
            if takes_kwargs:
                continue
            raise ConfigError(f"{full}: {node._target_} takes no argument {name!r}; it takes {', '.join(sorted(hints))}")
        value = node[name]
        if isinstance(value, DictConfig) and "_target_" in value:
            check_node(value, full)
            continue
        if isinstance(value, ListConfig) and any(isinstance(item, DictConfig) and "_target_" in item for item in value):
            for i, item in enumerate(value):  # a list of objects to build, e.g. trainer.plugins
                if isinstance(item, DictConfig) and "_target_" in item:
                    check_node(item, f"{full}[{i}]")
            continue
        plain = OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value
        if full == "trainer.max_time":
            continue  # max_time_seconds checks it (lltm_train.train gives it to Lightning as a timedelta)
        if plain is None and hints[name] is not typing.Any and type(None) not in typing.get_args(hints[name]):
            raise ConfigError(f"{full}: expected {inspect.formatannotation(hints[name])}, got null")
        try:
            check_type(plain, hints[name])
        except TypeCheckError:
            raise ConfigError(
                f"{full}: expected {inspect.formatannotation(hints[name])}, got {plain!r} ({type(plain).__name__})"
            ) from None


def hydra_value(text: str) -> str:
    """``text`` as a value in Hydra's override grammar: as it is when plain, else quoted (``'.../0_lr=0.1'``), a
    quote in it escaped (``'o\\'brien.txt'``) and the backslashes before a quote or the end doubled, as the grammar
    reads them."""
    if re.fullmatch(r"[\w./:+-]+", text, re.ASCII):  # the grammar reads ASCII only
        return text
    escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    return "'" + re.sub(r"(\\+)$", lambda m: m.group(1) * 2, escaped) + "'"


def known_top_level_keys() -> set[str]:
    """The primary config's own keys and its config groups (conf/*/), read from conf/."""
    primary = OmegaConf.load(config_dir() / "config.yaml")
    groups = {p.name for p in config_dir().iterdir() if p.is_dir() and p.name != "hydra"}
    return (set(primary.keys()) - {"defaults", "hydra"}) | groups


def close_setting(key: str) -> str | None:
    """The known setting nearest a mistyped ``key`` (``model.cel`` -> ``model.cell``), or None: for ``group.name``
    the keys of that config group's options (conf/<group>/*.yaml and their nested groups), else the top-level
    keys. A hint for Hydra's "Could not override" error."""
    import difflib

    head, _, rest = key.lstrip("+~").partition(".")
    if not rest:
        candidates, prefix = known_top_level_keys(), ""
    elif (config_dir() / head).is_dir() and "." not in rest:
        candidates, prefix = set(), head + "."
        for path in (config_dir() / head).rglob("*.yaml"):
            node = OmegaConf.load(path)
            if isinstance(node, DictConfig):
                candidates |= {k for k in node.keys() if k != "defaults"}
    else:
        return None
    match = difflib.get_close_matches(rest or head, sorted(candidates), n=1, cutoff=0.6)
    return prefix + match[0] if match else None


def check_cell_backend(cfg: DictConfig, choice: str | None) -> None:
    """``cell_backend=<cell>_<backend>`` sets model.cell and backend; an override of either on the same command line
    would win silently (a sweep's folders would then name a backend or cell its job did not run): refused.

    Raises:
        ConfigError: model.cell or backend differs from what the ``cell_backend`` option ``choice`` sets.
    """
    if not choice:
        return
    cell, _, backend = str(choice).rpartition("_")  # (a cell may have one: rnn_relu_cpp)
    for key, want in (("model.cell", cell), ("backend", backend)):
        got = OmegaConf.select(cfg, key)
        if got != want:
            raise ConfigError(f"cell_backend={choice} sets {key}={want}, but {key}={got} was given too; drop one of them "
                              "(cell_backend sweeps take their cells and backends from its options)")


def check_config(cfg: DictConfig) -> None:
    """Checks every instantiable node against its target's signature, and the primary config's plain values.

    Raises ConfigError naming the key, before anything is built.
    """
    missing = OmegaConf.missing_keys(cfg)
    if missing:
        raise ConfigError(f"missing value for {', '.join(sorted(missing))}: set it on the command line, e.g. {sorted(missing)[0]}=...")
    unknown = sorted(set(cfg.keys()) - known_top_level_keys())
    if unknown:
        raise ConfigError(f"{unknown[0]}: no such setting; the config has {', '.join(sorted(known_top_level_keys()))}")
    for key in ("dataset", "model", "trainer", "logger"):
        node = OmegaConf.select(cfg, key)
        if isinstance(node, DictConfig) and "_target_" in node:
            check_node(node, key)
    interval = OmegaConf.select(cfg, "trainer.val_check_interval")
    if interval is not None and (isinstance(interval, bool) or not isinstance(interval, int)):
        # (not Lightning's fraction of an epoch: the last checkpoint is saved every this many steps)
        raise ConfigError("trainer.val_check_interval must be a whole number of training steps (null: once an epoch), "
                          f"got {interval!r}")
    if interval is not None and interval <= 0:
        raise ConfigError(f"trainer.val_check_interval must be positive, got {interval}")
    for name, node in (cfg.get("callbacks") or {}).items():
        if isinstance(node, DictConfig) and "_target_" in node:
            check_node(node, f"callbacks.{name}")
    for key, kind in {"seed": int, "test": bool, "backend": str, "float32_matmul_precision": str,
                      "optimized_metric": str}.items():
        value = cfg.get(key)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ConfigError(f"{key}: expected {kind.__name__}, got {value!r} ({type(value).__name__})")
    if not 0 <= cfg.seed < 2**32:
        raise ConfigError(f"seed: expected an integer in [0, 2**32), got {cfg.seed}")
    if cfg.float32_matmul_precision not in ("highest", "high", "medium"):
        raise ConfigError(f"float32_matmul_precision: expected highest, high or medium, got {cfg.float32_matmul_precision!r}")
    ckpt = cfg.get("ckpt_path")
    if ckpt is not None and not isinstance(ckpt, str):
        raise ConfigError(f"ckpt_path: expected a path or 'last', got {ckpt!r}")
    if OmegaConf.select(cfg, "model.compile") is True:
        missing = missing_compiler()
        if missing:
            raise ConfigError(f"model.compile=true: torch.compile's Inductor needs a C++ compiler ({missing}); install g++ "
                              "(or name one in CXX), or set model.compile=false")


def missing_compiler() -> str | None:
    """None where torch.compile's default backend (Inductor) finds a C++ compiler (it builds the CPU kernels and
    a GPU's Triton launchers with it), else what it says: a wheel install on a bare machine has none, and the
    first step would end in a long Inductor traceback."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler
    except ImportError:  # a torch that moved it: leave the check to Inductor
        return None
    try:
        get_cpp_compiler()
    except Exception as exc:  # noqa: BLE001 - InvalidCxxCompiler, or whatever a future torch raises
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


MAX_TIME_UNITS = {"days": 86400, "hours": 3600, "minutes": 60, "seconds": 1}


def max_time_seconds(value) -> float | None:
    """``trainer.max_time`` in seconds, checked; None when it is not set. It may be seconds
    (``trainer.max_time=90``), "DD:HH:MM:SS", or a dict of timedelta's keys such as {minutes: 5}.

    Raises ConfigError for anything else, and for a time that is not positive, finite and under 30 years.
    """
    if value is None:
        return None
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, str) and re.fullmatch(r"\d+:\d+:\d+:\d+", value.strip()):
        value = dict(zip(MAX_TIME_UNITS, (int(part) for part in value.strip().split(":"))))
    seconds = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and re.fullmatch(r"\s*\d+(\.\d+)?\s*", value):
        seconds = float(value)
    elif isinstance(value, dict) and value and set(value) <= set(MAX_TIME_UNITS) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values()):
        seconds = sum(float(v) * MAX_TIME_UNITS[k] for k, v in value.items())
    if seconds is None:
        raise ConfigError(f"trainer.max_time: expected seconds (e.g. 600), DD:HH:MM:SS or a dict such as {{minutes: 5}}, "
                          f"got {value!r}")
    if not (seconds > 0 and math.isfinite(seconds) and seconds < 1e9):
        raise ConfigError(f"trainer.max_time must be a positive, finite time under 30 years, got {value!r} ({seconds:g} s)")
    return seconds
