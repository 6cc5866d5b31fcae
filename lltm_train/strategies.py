"""Lightning's DDP strategy, with the model wrapped on the stream that runs the training steps."""

from __future__ import annotations

from lightning.pytorch.strategies import DDPStrategy as LightningDDPStrategy
from torch.nn import Module
from torch.nn.parallel import DistributedDataParallel


class DDPStrategy(LightningDDPStrategy):
    """:class:`lightning.pytorch.strategies.DDPStrategy` (``trainer.strategy=ddp`` selects this one), with
    one change: Lightning builds the ``DistributedDataParallel`` wrapper on a new CUDA stream, which then
    owns the parameters' gradient accumulators; every backward on the default stream then waits across
    streams for each parameter, and torch >= 2.11 warns "The AccumulateGrad node's stream does not match"
    once per run. Built on the current stream, the wrapper and the steps share one.

    Keyword arguments are DDPStrategy's, and through it ``DistributedDataParallel``'s. Two of those default to True
    here: ``static_graph`` (the models use every parameter in every step, so DDP can plan its all-reduces once; it
    does not support gradient accumulation, for which lltm-train turns it off) and ``gradient_as_bucket_view``
    (gradients live in the communication buckets, one copy fewer). With them the default job on two H200s went from
    1.38x to 1.59x one H200's tokens/s (benchmarks/log/2026-11-30_two-gpus-ddp.md).
    """

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("static_graph", True)
        kwargs.setdefault("gradient_as_bucket_view", True)
        super().__init__(*args, **kwargs)

    def _setup_model(self, model: Module) -> DistributedDataParallel:
        return DistributedDataParallel(module=model, device_ids=self.determine_ddp_device_ids(), **self._ddp_kwargs)
