"""Locating ``conf/`` and checking a composed config before anything is built from it."""

from __future__ import annotations

import inspect
import typing
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf


class ConfigError(ValueError):
    """A configuration the run cannot start with; the CLI prints its message as one line."""


def config_dir() -> Path:
    """``conf/`` of a source checkout or editable install, else the copy packaged as ``lltm_train/conf``."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "conf", here.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise ConfigError(f"no conf/config.yaml beside {here}; reinstall lltm-train")


def _hints(target) -> tuple[dict, bool]:
    """Type hints of ``target``'s parameters (skipping any that cannot be resolved) and whether it takes **kwargs."""
    fn = target.__init__ if inspect.isclass(target) else target
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
    names = {n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
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
        plain = OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value
        if plain is None and hints[name] is not typing.Any and type(None) not in typing.get_args(hints[name]):
            raise ConfigError(f"{full}: expected {inspect.formatannotation(hints[name])}, got null")
        try:
            check_type(plain, hints[name])
        except TypeCheckError:
            raise ConfigError(
                f"{full}: expected {inspect.formatannotation(hints[name])}, got {plain!r} ({type(plain).__name__})"
            ) from None


_TOP_LEVEL = {"seed", "ckpt_path", "test", "backend", "dataset", "model", "trainer", "logger", "callbacks", "paths", "experiment"}
_MODEL_KEYS = {"hidden_size", "num_layers", "dropout", "bidirectional", "embedding_dim", "compile", "sample_length",
               "sample_temperature", "optimizer", "scheduler"}


def check_config(cfg: DictConfig) -> None:
    """Checks every instantiable node and the plain values of the primary config and the model group."""
    missing = OmegaConf.missing_keys(cfg)
    if missing:
        raise ConfigError(f"missing value for {', '.join(sorted(missing))}: set it on the command line, e.g. {sorted(missing)[0]}=...")
    for key in ("dataset", "trainer", "logger", "model.optimizer", "model.scheduler"):
        node = OmegaConf.select(cfg, key)
        if isinstance(node, DictConfig) and "_target_" in node:
            check_node(node, key)
    for name, node in (cfg.get("callbacks") or {}).items():
        if isinstance(node, DictConfig) and "_target_" in node:
            check_node(node, f"callbacks.{name}")
    expected = {"seed": int, "test": bool, "model.hidden_size": int, "model.num_layers": int, "model.embedding_dim": int,
                "model.dropout": float, "model.bidirectional": bool, "model.compile": bool, "model.sample_length": int,
                "model.sample_temperature": float}
    for key, kind in expected.items():
        value = OmegaConf.select(cfg, key)
        ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            raise ConfigError(f"{key}: expected {kind.__name__}, got {value!r} ({type(value).__name__})")
    if not 0 <= cfg.seed < 2**32:
        raise ConfigError(f"seed: expected an integer in [0, 2**32), got {cfg.seed}")
    for where, node, known in (("", cfg, _TOP_LEVEL), ("model.", cfg.model, _MODEL_KEYS)):
        unknown = sorted(set(node.keys()) - known)
        if unknown:
            raise ConfigError(f"{where}{unknown[0]}: no such setting; the {'model group' if where else 'config'} has "
                              f"{', '.join(sorted(known))}")
    ckpt = cfg.get("ckpt_path")
    if ckpt is not None and not isinstance(ckpt, str):
        raise ConfigError(f"ckpt_path: expected a path or 'last', got {ckpt!r}")
