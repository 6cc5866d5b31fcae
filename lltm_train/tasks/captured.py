"""The whole training step as one CUDA graph per batch shape (``model.cuda_graph``).

On a GPU a small recurrent model's step is a few milliseconds of kernels behind more host time: Python,
autograd, the optimiser's and the clipping's launches. :class:`CapturedStep` records forward, loss,
backward, gradient clipping, the non-finite guard and the optimiser step once into a CUDA graph
(:class:`torch.cuda.CUDAGraph`, PyTorch's "whole-network capture"), then replays it: a step is two copies
into the graph's input buffers and one launch.

What keeps it exact:

- Every step of a captured shape is a replay, the first one included: before a shape's capture, warm-up
  steps on its first batch set up what is lazy (the optimiser's state, cuBLAS workspaces, compiled code,
  the kernels' one-time set-up) and leave no trace (:func:`unchanged` restores the weights, the
  optimiser's state, the random-number state and the task's counters). A run resumed from a checkpoint
  therefore computes each step as the uninterrupted run did, bit for bit.
- The optimiser is a fused Adam/AdamW, made ``capturable`` and handed its learning rate in a device tensor
  during each step (filled from the float that the scheduler sets, before each replay); schedulers,
  loggers and checkpoints see floats.
- The non-finite guard is the fused optimiser's ``found_inf`` (no host synchronisation); random numbers
  (dropout) come from PyTorch's graph-safe generator, which each replay advances as an eager step would.

A batch with ``lengths`` (host-side sizes) or of a shape beyond :attr:`CapturedStep.max_graphs` runs
eagerly: the same step without the graph.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only
from torch import Tensor

from ..data.base import Batch

_log = logging.getLogger("lltm_train")
_info = rank_zero_only(_log.info)
_warn = rank_zero_only(_log.warning)

# Hooks that the captured step does not call (it runs backward and the optimiser itself)
STEP_HOOKS = ("on_before_backward", "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad")


def why_not_captured(trainer, module, optimizer) -> str | None:
    """Why a training run cannot capture its step (None: it can)."""
    if trainer.strategy.root_device.type != "cuda":
        return "the model trains on the CPU"
    if trainer.world_size > 1:
        return "DDP's gradient all-reduce runs outside the graph"
    if (trainer.accumulate_grad_batches or 1) > 1:
        return "gradient accumulation adds several batches' gradients"
    precision = str(trainer.precision)
    if precision not in ("32-true", "bf16-mixed"):
        return f"trainer.precision={precision} (only 32-true and bf16-mixed are captured; 16-mixed scales the loss)"
    if len(trainer.optimizers) != 1:
        return "the model has several optimisers"
    if not (optimizer.defaults.get("fused") and "capturable" in optimizer.defaults):
        return f"the optimiser ({type(optimizer).__name__}) is not a fused Adam or AdamW (model.optimizer.fused=true)"
    for owner in (module, *trainer.callbacks):
        for hook in STEP_HOOKS:
            if _overrides(owner, hook):
                return f"{type(owner).__name__}.{hook} would not be called"
    return module.capture_refusal()


def capture_training(trainer, module, cuda_graph: bool | str, step_fn: Callable[[Batch], tuple[Tensor, Tensor]],
                     state: Callable[[], list[Tensor]]) -> CapturedStep | None:
    """At the start of training: the :class:`CapturedStep` that runs the training steps (``step_fn``,
    ``state``: as it takes them), or None when they run eagerly (``cuda_graph`` False, or the run cannot be
    captured: one line says why, a warning when ``cuda_graph`` is True, else on a GPU only).

    Tells Lightning's fit loop whether to leave out its own backward and zero_grad: the switch its
    StochasticWeightAveraging uses."""
    optimizer = trainer.optimizers[0] if trainer.optimizers else None
    reason = None if cuda_graph is False else (
        why_not_captured(trainer, module, optimizer) if optimizer is not None else "no optimiser")
    captured = CapturedStep(step_fn, optimizer, state=state) if cuda_graph and reason is None else None
    trainer.fit_loop._skip_backward = captured is not None
    if reason is not None and cuda_graph is True:
        _warn(f"lltm-train: warning: model.cuda_graph=true, but the training step is not captured: {reason}; "
              "training eagerly")
    elif reason is not None and trainer.strategy.root_device.type == "cuda":
        _info(f"lltm-train: the training step runs eagerly, not as a CUDA graph: {reason}")
    return captured


def _overrides(owner, hook: str) -> bool:
    """Whether ``owner``'s class defines ``hook`` itself rather than inheriting Lightning's empty one."""
    base = L.LightningModule if isinstance(owner, L.LightningModule) else L.Callback
    return getattr(type(owner), hook) is not getattr(base, hook)


class CapturedStep:
    """Runs training steps ``step_fn(batch) -> (loss, grad_norm)`` as CUDA graph replays.

    Args:
        step_fn: one whole step on a batch (forward, backward, clipping, guard, optimiser step), which must
            only launch device work (no host synchronisation) and may assume ``.grad`` is None.
        optimizer: the torch optimiser (fused Adam or AdamW) that ``step_fn`` steps.
        state: returns the tensors other than the parameters and the optimiser's state that a step changes
            in place (counters, buffers), which the warm-up restores.
        warmup: steps run (and undone) on a shape's first batch before its capture. max_graphs: shapes
            captured at most; the others train eagerly.

    :meth:`run` returns the step's loss and gradient norm; a replay's are the graph's own buffers, which
    the next replay overwrites (clone what must outlive it).
    """

    def __init__(self, step_fn: Callable[[Batch], tuple[Tensor, Tensor]], optimizer: torch.optim.Optimizer,
                 state: Callable[[], list[Tensor]] = list, warmup: int = 2, max_graphs: int = 4) -> None:
        self.step_fn, self.optimizer, self.state = step_fn, optimizer, state
        self.warmup, self.max_graphs = warmup, max_graphs
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, Batch, tuple[Tensor, Tensor]]] = {}
        self.disabled: str | None = None  # why capture stopped (a capture failed)
        self._said: set[str] = set()
        self.replays = 0
        device = optimizer.param_groups[0]["params"][0].device
        self.stream = torch.cuda.Stream(device)  # where eager steps and captures run
        self._lrs = [torch.zeros((), device=device) for _ in optimizer.param_groups]  # what the graphs read

    def run(self, batch: Batch) -> tuple[Tensor, Tensor]:
        if batch.lengths is not None:
            self._say("lengths", "batches with lengths (variable-length sequences) train eagerly")
            return self._eager(batch)
        key = (tuple(batch.x.shape), batch.x.dtype, tuple(batch.y.shape), batch.y.dtype)
        entry = self.graphs.get(key)
        if entry is None:
            if self.disabled:
                return self._eager(batch)
            if len(self.graphs) >= self.max_graphs:
                self._say("shapes", f"more than {self.max_graphs} batch shapes: the others train eagerly")
                return self._eager(batch)
            entry = self._capture(key, batch)
            if entry is None:
                return self._eager(batch)
        graph, static, outputs = entry
        static.x.copy_(batch.x, non_blocking=True)
        static.y.copy_(batch.y, non_blocking=True)
        for lr, group in zip(self._lrs, self.optimizer.param_groups):
            lr.fill_(group["lr"])
        graph.replay()
        self.replays += 1
        return outputs

    @contextlib.contextmanager
    def _stepping(self) -> Iterator[None]:
        """The settings of every step, eager or captured: the optimiser capturable with its learning rates in
        device tensors (restored after: schedulers, checkpoints and loggers see floats); no autocast cache
        (it would hand casts made inside a capture to later eager code)."""
        groups = self.optimizer.param_groups
        saved = [(group["lr"], group["capturable"]) for group in groups]
        for lr, group in zip(self._lrs, groups):
            lr.fill_(group["lr"])
            group["lr"], group["capturable"] = lr, True
        autocast = torch.is_autocast_enabled("cuda")
        try:
            with torch.autocast("cuda", torch.get_autocast_dtype("cuda"), cache_enabled=False) if autocast \
                    else contextlib.nullcontext():
                yield
        finally:
            for (lr, capturable), group in zip(saved, groups):
                group["lr"], group["capturable"] = lr, capturable

    def _eager(self, batch: Batch) -> tuple[Tensor, Tensor]:
        # on the stream that captures (PyTorch's recipe: lazy set-up, e.g. cuBLAS's workspace, happens there)
        self.optimizer.zero_grad(set_to_none=True)
        main = torch.cuda.current_stream()
        self.stream.wait_stream(main)
        with torch.cuda.stream(self.stream), self._stepping():
            loss, norm = self.step_fn(batch)
        main.wait_stream(self.stream)
        self.optimizer.zero_grad(set_to_none=True)
        return loss, norm

    def _capture(self, key: tuple, batch: Batch):
        with unchanged(self.optimizer, self.state()):
            for _ in range(self.warmup):
                self._eager(batch)
        static = Batch(_like(batch.x), None, _like(batch.y))
        graph = torch.cuda.CUDAGraph()
        self.optimizer.zero_grad(set_to_none=True)  # the graph's backward writes its own .grad buffers
        try:
            # thread_local: only this thread's calls can spoil the capture (autograd's and other libraries'
            # threads make calls that are harmless to it), as torch.compile's CUDA graphs do
            with self._stepping(), torch.cuda.graph(graph, stream=self.stream, capture_error_mode="thread_local"):
                outputs = self.step_fn(static)
        except Exception as exc:  # noqa: BLE001 - a step that cannot be captured trains eagerly
            _log.debug("the training step could not be captured", exc_info=True)
            self.disabled = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            try:  # a capture that failed part-way can leave the CUDA random-number state unusable
                with torch.random.fork_rng(devices=[static.x.device.index or 0]):
                    torch.rand(1, device=static.x.device)
            except RuntimeError:
                raise RuntimeError(f"the training step could not be captured as a CUDA graph ({self.disabled}), and "
                                   "CUDA's random numbers cannot be drawn after it; train with model.cuda_graph=false"
                                   ) from exc
            self._say("failed", f"the training step could not be captured as a CUDA graph ({self.disabled}); "
                      "training eagerly")
            self.optimizer.zero_grad(set_to_none=True)
            return None
        self.graphs[key] = (graph, static, outputs)
        self._say(f"captured{len(self.graphs)}", f"the training step runs as a CUDA graph (batch {tuple(batch.x.shape)})"
                  if len(self.graphs) == 1 else f"another CUDA graph for batch {tuple(batch.x.shape)}")
        return self.graphs[key]

    def _say(self, what: str, message: str) -> None:
        if what not in self._said:
            self._said.add(what)
            _info(f"lltm-train: {message}")


def _like(t: Tensor) -> Tensor:
    """A copy of ``t`` with its strides (a batch cut from a wider buffer keeps them: compiled code is
    specialised to them), to be the graph's input buffer."""
    buffer = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    return buffer.copy_(t)


@contextlib.contextmanager
def unchanged(optimizer: torch.optim.Optimizer, state: list[Tensor]) -> Iterator[None]:
    """Steps taken inside leave no trace: afterwards the optimiser's parameters and state, the tensors of
    ``state`` and the CPU's and the parameters' GPUs' random-number states are as before, restored in place.
    Optimiser state that the steps created is zeroed: Adam's and AdamW's moments and step count start at 0,
    as their first real step would create them."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    with torch.no_grad():
        saved_params = [p.detach().clone() for p in params]
        saved_state = {p: {k: v.clone() if isinstance(v, Tensor) else v for k, v in optimizer.state[p].items()}
                       for p in params if p in optimizer.state}
        saved = [t.clone() for t in state]
    devices = sorted({p.device.index or 0 for p in params if p.is_cuda})
    with torch.random.fork_rng(devices=devices):
        yield
    with torch.no_grad():
        for p, value in zip(params, saved_params):
            p.copy_(value)
        for p in params:
            before = saved_state.get(p, {})
            for k, v in optimizer.state.get(p, {}).items():
                if isinstance(v, Tensor) and k in before:
                    v.copy_(before[k])
                elif isinstance(v, Tensor):
                    v.zero_()
                elif k in before:
                    optimizer.state[p][k] = before[k]
        for t, value in zip(state, saved):
            t.copy_(value)
