"""Lightning callbacks of lltm-train (the rest come from Lightning itself: see conf/callbacks/)."""

from .throughput import Throughput

__all__ = ["Throughput"]
