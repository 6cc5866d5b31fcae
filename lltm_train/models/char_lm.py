"""Token-in, class-per-step network: the character language model (and the copy task)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..nn import LLTM
from ..nn._params import check_probability, check_sizes


class CharLM(nn.Module):
    """Embedding -> LLTM -> dropout -> linear head, time-major.

    Args:
        vocab_size: input token ids are in [0, vocab_size). num_classes: output classes per step
            (defaults to vocab_size, as in language modelling).
        embedding_dim, hidden_size, num_layers, dropout, backend: the layers' sizes; dropout applies
            between LLTM layers and before the head.

    forward(tokens (T, B) int64, hx=None) -> (logits (T, B, num_classes), (h_n, c_n)).
    """

    def __init__(self, vocab_size: int, embedding_dim: int = 64, hidden_size: int = 256, num_layers: int = 1,
                 dropout: float = 0.0, num_classes: int | None = None, backend: str = "auto") -> None:
        super().__init__()
        check_sizes("CharLM", vocab_size=vocab_size, embedding_dim=embedding_dim)
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.lltm = LLTM(embedding_dim, hidden_size, num_layers, dropout=dropout if num_layers > 1 else 0.0, backend=backend)
        self.dropout = nn.Dropout(check_probability("CharLM", "dropout", dropout))
        self.head = nn.Linear(hidden_size, num_classes or vocab_size)

    def forward(self, tokens: Tensor, hx: tuple[Tensor, Tensor] | None = None):
        output, state = self.lltm(self.embedding(tokens), hx)
        return self.head(self.dropout(output)), state

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
