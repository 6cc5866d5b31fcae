"""Lightning callbacks of lltm-train (the rest come from Lightning itself: see conf/callbacks/)."""

from .stop import StopCheckpoint
from .throughput import Throughput

__all__ = ["StopCheckpoint", "Throughput"]
