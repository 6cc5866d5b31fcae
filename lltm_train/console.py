"""What a run prints on the console: messages on their own lines beside tqdm's bars, without upstream noise."""

from __future__ import annotations

import logging
import re
import warnings
from pathlib import Path

from tqdm import tqdm

# Upstream messages that are not the user's business: Lightning's advertisements for its cloud products, and
# a deprecation inside Lightning's own code that torch >= 2.10 reports (lightning/pytorch/utilities/_pytree.py).
_TIPS = ("💡 Tip:",)
_DEPRECATIONS = (r"`isinstance\(treespec, LeafSpec\)` is deprecated",)
_PACKAGE = Path(__file__).resolve().parent


class NoTips(logging.Filter):
    """Drops Lightning's "💡 Tip" lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_TIPS)


class ConsoleHandler(logging.StreamHandler):
    """A stream handler that writes through ``tqdm.write``: a message printed while a progress bar is drawn gets
    a line of its own (the bar is cleared and redrawn below it) instead of being glued to the bar's line."""

    def __init__(self, stream=None) -> None:
        super().__init__(stream)
        self.addFilter(NoTips())

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=self.stream)
            self.flush()
        except RecursionError:
            raise
        except Exception:  # noqa: BLE001 - as logging.StreamHandler: a failed write is reported, not raised
            self.handleError(record)


def help_text(doc: str) -> str:
    """A docstring as a command's ``--help`` text: reStructuredText's inline literals and roles as plain text
    (````lltm-export```` -> lltm-export, ``:func:`sample``` -> sample)."""
    return re.sub(r"(?::\w+:)?`{1,2}([^`]+)`{1,2}", r"\1", doc)


def quiet_upstream_warnings() -> None:
    """Silences the upstream deprecation warnings listed above (the user can do nothing about them)."""
    for message in _DEPRECATIONS:
        warnings.filterwarnings("ignore", message=message, category=FutureWarning)


def route_warnings() -> None:
    """Python's warnings (Lightning's among them) go through logging's ``py.warnings`` logger, which the run's
    logging config gives the console handler: on their own lines beside the progress bar, and in train.log.
    lltm-train's own read ``lltm-train: warning: <message>``, without the file, line and source of the call
    (which say nothing to a user); others keep Python's format, which names the library."""
    if not getattr(warnings.formatwarning, "_lltm_train", False):
        upstream = warnings.formatwarning

        def formatwarning(message, category, filename, lineno, line=None):
            if Path(filename).resolve().is_relative_to(_PACKAGE):
                return f"lltm-train: warning: {message}\n"
            return upstream(message, category, filename, lineno, line)

        formatwarning._lltm_train = True
        warnings.formatwarning = formatwarning
    logging.captureWarnings(True)
