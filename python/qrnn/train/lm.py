"""An AWD-QRNN-style language model: embedding, a stack of ``qrnn.QRNN`` layers (the first
with window 2), locked dropout on the embedding and between layers, and a decoder tied to
the embedding.

The forward pass takes and returns the carried state explicitly (per layer: the last cell
state and the window's input tail), so truncated BPTT over consecutive chunks equals one
pass over the whole sequence, and DDP / torch.compile see no hidden module state.
"""

from __future__ import annotations

from typing import Optional, cast

import torch
from torch import Tensor, nn

from .. import QRNN, QRNNState

__all__ = ["QRNNLanguageModel", "generate", "locked_dropout"]


def locked_dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Dropout with one mask per sequence, shared by every time step (variational dropout)."""
    if not training or p == 0.0:
        return x
    mask = x.new_empty(1, x.shape[1], x.shape[2]).bernoulli_(1 - p) / (1 - p)
    return x * mask


class QRNNLanguageModel(nn.Module):
    """Token ids (seq_len, batch) -> logits (seq_len, batch, vocab), carried state.

    With `tie_weights` the decoder shares the embedding matrix; the last layer then
    produces `emsize` features (the AWD-LSTM arrangement), which needs two or more layers
    or `hidden == emsize`.
    """

    def __init__(self, vocab_size: int, emsize: int = 128, hidden: int = 512, layers: int = 3,
                 dropout: float = 0.1, dropout_emb: float = 0.1, first_window: int = 2,
                 tie_weights: bool = True):
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("emsize", emsize), ("hidden", hidden),
                            ("layers", layers)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name, rate in (("dropout", dropout), ("dropout_emb", dropout_emb)):
            if not 0.0 <= rate < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {rate!r}")
        self.tied = bool(tie_weights) and (layers > 1 or hidden == emsize)
        self.config = dict(vocab_size=vocab_size, emsize=emsize, hidden=hidden, layers=layers,
                           dropout=dropout, dropout_emb=dropout_emb, first_window=first_window,
                           tie_weights=bool(tie_weights))
        self.dropout = dropout
        self.dropout_emb = dropout_emb
        self.embedding = nn.Embedding(vocab_size, emsize)
        sizes = [emsize] + [hidden] * layers
        if self.tied:
            sizes[-1] = emsize
        self.layers = nn.ModuleList(
            _make_layer(sizes[i], sizes[i + 1], window=first_window if i == 0 else 1) for i in range(layers)
        )
        self.decoder = nn.Linear(sizes[-1], vocab_size)
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        if self.tied:
            self.decoder.weight = self.embedding.weight

    def forward(self, tokens: Tensor, state: Optional[list] = None) -> tuple:
        if state is None:
            state = [None] * len(self.layers)
        x = locked_dropout(self.embedding(tokens), self.dropout_emb, self.training)
        new_state = []
        for i, layer in enumerate(self.layers):
            x, layer_state = _layer_forward(cast(QRNN, layer), x, state[i])
            new_state.append(layer_state)
            # Between layers and before the decoder (AWD's dropout and dropouth).
            x = locked_dropout(x, self.dropout, self.training)
        return self.decoder(x), new_state


# The two functions below are the only places that know the qrnn.QRNN API. A layer's carried
# state is kept as a plain (cell state, input tail) tuple so checkpoints hold only tensors.

def _make_layer(input_size: int, hidden_size: int, window: int) -> QRNN:
    return QRNN(input_size, hidden_size, window=window)


def _layer_forward(layer: QRNN, x: Tensor, state) -> tuple:
    """One layer over a chunk, taking and returning its carried (cell, input tail) state."""
    hx = layer.initial_state() if state is None else QRNNState(state[0], (state[1],))
    output, new_state = layer(x, hx)
    return output, (new_state.c, new_state.x_tails[0])


@torch.no_grad()
def generate(model: QRNNLanguageModel, prompt: Tensor, length: int, temperature: float = 1.0,
             generator: Optional[torch.Generator] = None) -> Tensor:
    """Sample `length` token ids after the 1-D `prompt` ids, one step at a time with the
    carried state. `generator` (on the model's device) makes the sample reproducible."""
    if prompt.numel() == 0:
        raise ValueError("prompt must hold at least one token")
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    logits, state = model(prompt.to(device).view(-1, 1))
    sampled = []
    for _ in range(length):
        probs = torch.softmax(logits[-1, 0].float() / temperature, dim=-1)
        token = torch.multinomial(probs, 1, generator=generator)
        sampled.append(token)
        logits, state = model(token.view(1, 1), state)
    model.train(was_training)
    return torch.cat(sampled).cpu() if sampled else torch.empty(0, dtype=torch.long)
