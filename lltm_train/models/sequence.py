"""Sequence-in, vector-out networks: a classifier and a regressor (forecaster) over the final hidden state."""

from __future__ import annotations

from collections.abc import Sequence
import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence

from .. import checks as v
from .recurrent import final_hidden, recurrent_layer


class FinalStateHead(nn.Module):
    """Recurrent layers over a sequence, then a linear layer over the last layer's final h (each direction).

    Args:
        input_size: features per step. output_size: outputs per sequence.
        hidden_size, num_layers, dropout, bidirectional: as torch.nn.LSTM; dropout also before the head.
        cell: ``lltm``, ``lstm``, ``gru``, ``rnn`` or ``rnn_relu``; backend, forget_bias, weight_drop, zoneout,
            num_heads: as :func:`~lltm_train.models.recurrent_layer`.

    forward(x (B, T, input_size), lengths (B,) int64 on the CPU or None) -> (B, output_size). With lengths,
    the batch is zero-padded and each sequence's final state is taken at its own length.
    """

    def __init__(self, input_size: int, output_size: int, hidden_size: int, num_layers: int = 1, dropout: float = 0.0,
                 bidirectional: bool = False, cell: str = "lltm", backend: str = "auto",
                 forget_bias: float | None = None, weight_drop: float = 0.0, zoneout: float | Sequence[float] = 0.0,
                 num_heads: int = 1) -> None:
        super().__init__()
        owner = type(self).__name__
        v.positive_int(owner, "output_size", output_size)
        self.directions = 2 if v.flag(owner, "bidirectional", bidirectional) else 1
        self.rnn = recurrent_layer(cell, input_size, hidden_size, num_layers, dropout, bidirectional, backend,
                                   forget_bias, weight_drop, zoneout, num_heads)
        self.dropout = nn.Dropout(v.dropout(owner, dropout))
        self.head = nn.Linear(hidden_size * self.directions, output_size)

    def forward(self, x: Tensor, lengths: Tensor | None = None) -> Tensor:
        x = x.transpose(0, 1)  # time-major: the layer ops run over (T, B, F)
        if lengths is not None:
            x = pack_padded_sequence(x, lengths, enforce_sorted=False)
        _, state = self.rnn(x)
        last = final_hidden(state)[-self.directions :]  # the last layer, each direction at its final step
        return self.head(self.dropout(torch.cat(list(last), -1)))


class SequenceClassifier(FinalStateHead):
    """Class logits per sequence: (B, T, input_size) -> (B, num_classes). Arguments as :class:`FinalStateHead`."""

    def __init__(self, input_size: int, num_classes: int, hidden_size: int, **kwargs) -> None:
        super().__init__(input_size, num_classes, hidden_size, **kwargs)


class SequenceRegressor(FinalStateHead):
    """A vector per sequence: (B, T, input_size) -> (B, output_size). Arguments as :class:`FinalStateHead`."""
