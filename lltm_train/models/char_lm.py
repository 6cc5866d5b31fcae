"""Token-in, class-per-step network: the character language model (and the copy task)."""

from __future__ import annotations

from collections.abc import Sequence
import torch
from torch import Tensor, nn

from .. import checks as v
from .recurrent import recurrent_layer

# Vocabularies up to this size embed on a GPU as a one-hot matrix product (CharLM.embed): forward and
# backward of T x B = 8192 ids took 19-48 us against nn.Embedding's 96-102 us for 84-1,024 ids (H200, 2026-12-03).
ONE_HOT_MAX_VOCAB = 1024
# ... while the one-hot matrix (T x B x vocabulary, kept for the backward) has at most this many elements
# (64 MiB in float32; the default job's is 0.69 M): beyond, nn.Embedding's few bytes an id are kept instead.
ONE_HOT_MAX_ELEMENTS = 1 << 24


class CharLM(nn.Module):
    """Embedding -> recurrent layers (LLTM, LSTM or GRU) -> dropout -> linear head, time-major.

    Args:
        vocab_size: input token ids are in [0, vocab_size).
        hidden_size, embedding_dim: the widths of the recurrent layers and the embedding.
        num_layers, dropout: as torch.nn.LSTM; dropout also applies before the head.
        num_classes: output classes per step (defaults to vocab_size, as in language modelling).
        cell: ``lltm``, ``lstm`` or ``gru``; backend: ``auto``, ``python``, ``cpp``, ``cuda`` or ``torch``
            (:mod:`lltm_train.models.recurrent`); forget_bias, weight_drop, zoneout, num_heads: as
            :func:`~lltm_train.models.recurrent_layer`.
        bidirectional: must be False: a next-token model cannot read the future.

    forward(tokens (T, B) int64, state=None) -> (logits (T, B, num_classes), state). The embedding is
    ``embed`` (a one-hot product on a GPU for small vocabularies).

    Raises:
        ValueError: bad sizes, dropout or cell, or bidirectional=True.
    """

    def __init__(self, vocab_size: int, hidden_size: int, embedding_dim: int, num_layers: int = 1, dropout: float = 0.0,
                 num_classes: int | None = None, cell: str = "lltm", backend: str = "auto",
                 bidirectional: bool = False, forget_bias: float | None = None, weight_drop: float = 0.0,
                 zoneout: float | Sequence[float] = 0.0, num_heads: int = 1) -> None:
        super().__init__()
        v.positive_int("CharLM", "vocab_size", vocab_size)
        v.positive_int("CharLM", "embedding_dim", embedding_dim)
        if v.flag("CharLM", "bidirectional", bidirectional):
            raise ValueError("model.bidirectional=true cannot be used to predict the next token (it would read the "
                             "future); use it with a sequence-level data set")
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.rnn = recurrent_layer(cell, embedding_dim, hidden_size, num_layers, dropout, backend=backend,
                                   forget_bias=forget_bias, weight_drop=weight_drop, zoneout=zoneout,
                                   num_heads=num_heads)
        self.dropout = nn.Dropout(v.dropout("CharLM", dropout))
        self.head = nn.Linear(hidden_size, num_classes or vocab_size)

    def forward(self, tokens: Tensor, state=None):
        output, state = self.rnn(self.embed(tokens), state)
        return self.head(self.dropout(output)), state

    def embed(self, tokens: Tensor) -> Tensor:
        """``self.embedding(tokens)``: (T, B) int64 -> (T, B, embedding_dim). On a GPU, for a vocabulary of at most
        ONE_HOT_MAX_VOCAB ids (and a one-hot matrix of at most ONE_HOT_MAX_ELEMENTS), as
        ``one_hot(tokens) @ weight``, whose backward is one small matrix product where nn.Embedding's sorts the ids (CUB radix sort and
        segment kernels: 70-90 us of a 0.75 ms training step of the default job on an H200,
        benchmarks/log/2026-12-03_s09-training-step-profile.md). Under TF32 (the default
        ``float32_matmul_precision=high``) the product rounds the rows and the gradient's terms to TF32, as the
        recurrent layer's input projection rounds its input anyway. Ids out of range fail as nn.Embedding's do on a
        GPU (a device-side assertion)."""
        weight = self.embedding.weight
        vocab = weight.shape[0]
        if not tokens.is_cuda or vocab > ONE_HOT_MAX_VOCAB or tokens.numel() * vocab > ONE_HOT_MAX_ELEMENTS:
            return self.embedding(tokens)
        # built in the weight's dtype: F.one_hot would first make an int64 matrix twice this size
        one_hot = torch.zeros(*tokens.shape, vocab, dtype=weight.dtype, device=tokens.device)
        return one_hot.scatter_(-1, tokens.unsqueeze(-1), 1.0) @ weight

    @torch.no_grad()
    def generate(self, prompt: list[int], steps: int, temperature: float = 0.8, generator: torch.Generator | None = None) -> list[int]:
        """Samples ``steps`` token ids after ``prompt`` (a non-empty list of ids), one step at a time."""
        device = self.head.weight.device
        # forward() directly: a model compiled with nn.Module.compile() would recompile for every shape here
        logits, state = self.forward(torch.tensor(prompt, device=device)[:, None])
        last, out = logits[-1, 0], []
        for _ in range(steps):
            probs = torch.softmax(last.float() / temperature, -1)
            token = int(torch.multinomial(probs.cpu(), 1, generator=generator))
            out.append(token)
            logits, state = self.forward(torch.tensor([[token]], device=device), state)
            last = logits[-1, 0]
        return out
