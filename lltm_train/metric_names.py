"""Which way each metric is better, shared by the report (ranking), the Optuna search (its direction) and the best
checkpoint (ModelCheckpoint's mode). No imports: the config and the report both read it."""

HIGHER_IS_BETTER = ("acc",)  # metric names (after the stage/) ranked best-highest; every other one best-lowest


def higher_is_better(metric: str) -> bool:
    """True for ``val/acc``-like metrics: a report ranks them, a search maximises them, and the best checkpoint is
    the one with the highest value."""
    return metric.rsplit("/", 1)[-1] in HIGHER_IS_BETTER
