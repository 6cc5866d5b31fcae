"""Lightning callbacks of lltm-train (the rest come from Lightning itself: see conf/callbacks/)."""

from .progress import RunProgressBar
from .stop import StopCheckpoint
from .throughput import Throughput

__all__ = ["RunProgressBar", "StopCheckpoint", "Throughput"]
