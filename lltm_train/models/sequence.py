"""Sequence-in, vector-out networks: a classifier and a regressor (forecaster) over the final LLTM state."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence

from ..nn import LLTM
from ..nn._params import check_probability


class _FinalState(nn.Module):
    def __init__(self, input_size: int, output_size: int, hidden_size: int = 128, num_layers: int = 1,
                 dropout: float = 0.0, bidirectional: bool = False, backend: str = "auto") -> None:
        super().__init__()
        self.lltm = LLTM(input_size, hidden_size, num_layers, dropout=dropout if num_layers > 1 else 0.0,
                         bidirectional=bidirectional, backend=backend)
        self.dropout = nn.Dropout(check_probability(type(self).__name__, "dropout", dropout))
        self.head = nn.Linear(hidden_size * (2 if bidirectional else 1), output_size)

    def forward(self, x: Tensor, lengths: Tensor | None = None) -> Tensor:
        """x (B, T, input_size); lengths (B,) for zero-padded batches (packed, so padding is never read)."""
        x = x.transpose(0, 1)  # time-major: the layer ops run over (T, B, F)
        if lengths is not None:
            x = pack_padded_sequence(x, lengths.cpu(), enforce_sorted=False)
        _, (h_n, _) = self.lltm(x)
        last = h_n[-self.lltm.num_directions :]  # the last layer, each direction at its final step
        return self.head(self.dropout(torch.cat(list(last), -1)))


class SequenceClassifier(_FinalState):
    """LLTM over a sequence, then a linear layer over the last layer's final h: (B, T, F) -> logits (B, num_classes)."""

    def __init__(self, input_size: int, num_classes: int, **kwargs) -> None:
        super().__init__(input_size, num_classes, **kwargs)


class SequenceRegressor(_FinalState):
    """LLTM over a sequence, then a linear layer over the last layer's final h: (B, T, F) -> (B, output_size)."""

    def __init__(self, input_size: int, output_size: int, **kwargs) -> None:
        super().__init__(input_size, output_size, **kwargs)
