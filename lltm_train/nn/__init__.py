"""``torch.nn``-style LLTM modules: :class:`LLTMCell` (one step) and :class:`LLTM` (layers over sequences)."""

from .cell import LLTMCell
from .lltm import LLTM

__all__ = ["LLTM", "LLTMCell"]
