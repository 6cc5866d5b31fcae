"""TensorBoard views that compare runs by themselves: the HPARAMS tab (every run of a sweep as one row, its
config beside its final metrics) and a custom-scalars layout (train/val loss, the task's validation
metrics, throughput on one page each). Written with tensorboard's own summary protos, through the logger's
writer; the values in the HPARAMS rows are the last values of the named scalar tags, which the run logs
anyway (no placeholder values are logged).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.tensorboard.summary import hparams


HIDDEN = ("callbacks.", "paths.", "logger.", "hydra.")  # settings that do not tell runs apart in the HPARAMS tab


def hparams_columns(config: Mapping) -> dict[str, int | float | str | bool]:
    """The flattened config without the bookkeeping (callbacks, paths, logger, ``_target_`` keys)."""
    return {k: v for k, v in flatten(config).items()
            if not k.startswith(HIDDEN) and not k.rsplit(".", 1)[-1].startswith("_")}


def flatten(config: Mapping, prefix: str = "") -> dict[str, int | float | str | bool]:
    """``{"model": {"hidden_size": 256}}`` -> ``{"model.hidden_size": 256}``; other values (None, lists) as text."""
    flat: dict[str, int | float | str | bool] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return flat


def metric_tags(task_metrics: Iterable[str], test: bool, cuda: bool) -> list[str]:
    """The scalar tags a run's HPARAMS row shows: the task's validation (and test) metrics, the training loss,
    the throughput and, on a GPU, the peak memory."""
    stages = ("val", "test") if test else ("val",)
    tags = [f"{stage}/{name}" for stage in stages for name in task_metrics]
    return tags + ["train/loss", "throughput/tokens_per_s_run_average"] + (["memory/peak_cuda_mib"] if cuda else [])


def layout(task_metrics: Iterable[str]) -> dict:
    """The custom-scalars layout: one chart each for the losses, the other validation metrics, throughput
    tokens/s, samples/s, step time and memory, one unit a chart (tags as anchored regular expressions)."""
    others = [f"^val/{name}$" for name in task_metrics if name != "loss"]
    charts = {
        "loss (train and val)": ["Multiline", ["^train/loss$", "^val/loss$"]],
        "tokens/s": ["Multiline", ["^throughput/tokens_per_s$", "^throughput/tokens_per_s_run_average$"]],
        "samples/s": ["Multiline", ["^throughput/samples_per_s$"]],
        "step time (ms)": ["Multiline", ["^throughput/step_ms$"]],
        "peak CUDA memory (MiB)": ["Multiline", ["^memory/peak_cuda_mib$"]],
    }
    if others:
        charts["validation metrics"] = ["Multiline", others]
    return {"lltm-train": charts}


def describe_run(logger: TensorBoardLogger, config: Mapping, tags: list[str], task_metrics: Iterable[str]) -> None:
    """Writes the run's HPARAMS entry (config and metric names) and the custom-scalars layout. Call it on the
    global-zero process only (the other processes' loggers have no writer)."""
    experiment, session_start, _ = hparams(hparams_columns(config), dict.fromkeys(tags, 0.0))  # values unused
    writer = logger.experiment._get_file_writer()
    writer.add_summary(experiment)
    writer.add_summary(session_start)
    logger.experiment.add_custom_scalars(layout(task_metrics))


def end_run(logger: TensorBoardLogger, success: bool) -> None:
    """Marks the HPARAMS session finished (success) or failed."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    status = api_pb2.Status.Value("STATUS_SUCCESS" if success else "STATUS_FAILURE")
    content = plugin_data_pb2.HParamsPluginData(session_end_info=plugin_data_pb2.SessionEndInfo(status=status),
                                                version=metadata.PLUGIN_DATA_VERSION)
    data = SummaryMetadata.PluginData(plugin_name=metadata.PLUGIN_NAME, content=content.SerializeToString())
    summary = Summary(value=[Summary.Value(tag=metadata.SESSION_END_INFO_TAG, metadata=SummaryMetadata(plugin_data=data))])
    logger.experiment._get_file_writer().add_summary(summary)
    logger.experiment.flush()
