"""The AWD-QRNN language model (Merity et al.'s awd-lstm-lm, ``--model QRNN``): embedding, a
stack of ``qrnn.QRNN`` layers (the first with window 2), a decoder tied to the embedding,
and awd-lstm-lm's regularisers, each under its name there:

* ``dropout_words`` (``--dropoute``): whole rows of the embedding dropped (one mask over the
  vocabulary per batch, kept rows scaled by 1 / (1 - p));
* ``dropout_emb`` (``--dropouti``): locked dropout on the embedded input;
* ``dropout_hidden`` (``--dropouth``): locked dropout between QRNN layers;
* ``dropout`` (``--dropout``): locked dropout on the last layer's output;
* ``weight_drop`` (``--wdrop``): DropConnect on each layer's gate weights;
* in the loss (:func:`lm_loss`): activation regularisation ``alpha * mean(output**2)`` on
  the dropped last-layer output and temporal activation regularisation
  ``beta * mean((raw[t] - raw[t-1])**2)`` on the raw one.

Locked (variational) dropout draws one mask per sequence, shared by every time step. The
forward pass takes and returns the carried state explicitly (per layer: the last cell
state and the window's input tail), so truncated BPTT over consecutive chunks equals one
pass over the whole sequence, and DDP / torch.compile see no hidden module state. It
returns the features the decoder reads (:class:`LMFeatures`), not logits: the loss and
sampling apply the decoder themselves, through a full softmax or, with `cutoffs`, the split
softmax of large vocabularies (:mod:`qrnn.train.softmax`), which never builds a tokens x
vocabulary tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from .. import QRNN, QRNNState
from .softmax import SplitSoftmax

__all__ = ["ModelConfig", "QRNNLanguageModel", "LMFeatures", "lm_loss", "generate", "locked_dropout",
           "embedding_dropout"]


def locked_dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Dropout with one mask per sequence, shared by every time step (variational dropout)."""
    if not training or p == 0.0:
        return x
    mask = x.new_empty(1, x.shape[1], x.shape[2]).bernoulli_(1 - p) / (1 - p)
    return x * mask


def embedding_dropout(embedding: nn.Embedding, tokens: Tensor, p: float, training: bool) -> Tensor:
    """awd-lstm-lm's embedded_dropout: each word's row of the embedding kept with probability
    1 - p (scaled by 1 / (1 - p)) or zeroed, one draw per word of the vocabulary. The mask is
    applied to the looked-up rows rather than to a masked copy of the whole matrix (the same
    values and gradients; the same draws from the random stream)."""
    weight = embedding.weight
    if not training or p == 0.0:
        return F.embedding(tokens, weight)
    row_mask = weight.new_empty(weight.shape[0], 1).bernoulli_(1 - p) / (1 - p)
    return F.embedding(tokens, weight) * F.embedding(tokens, row_mask)


class LMFeatures(NamedTuple):
    """What :class:`QRNNLanguageModel` returns for each step: ``output``, the last layer's
    output after its dropout (what the decoder reads; activation regularisation's input),
    and ``raw``, the same before that dropout (temporal activation regularisation's)."""

    output: Tensor
    raw: Tensor


class QRNNLanguageModel(nn.Module):
    """Token ids (seq_len, batch) -> (:class:`LMFeatures`, carried state); ``logits(features)``
    applies the decoder.

    With `tie_weights` the decoder shares the embedding matrix; the last layer then
    produces `emsize` features (the AWD-LSTM arrangement), which needs two or more layers
    or `hidden == emsize`. `dropout_hidden` defaults to `dropout` (one rate for both).
    `cutoffs`: a split softmax over the decoder with these cluster boundaries (word ids are
    sorted by frequency); None: the full softmax.
    """

    def __init__(self, vocab_size: int, emsize: int = 128, hidden: int = 512, layers: int = 3,
                 dropout: float = 0.1, dropout_emb: float = 0.1, first_window: int = 2,
                 tie_weights: bool = True, *, dropout_hidden: Optional[float] = None, dropout_words: float = 0.0,
                 weight_drop: float = 0.0, cutoffs: Optional[Sequence[int]] = None):
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("emsize", emsize), ("hidden", hidden),
                            ("layers", layers), ("first_window", first_window)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if dropout_hidden is None:
            dropout_hidden = dropout
        for name, rate in (("dropout", dropout), ("dropout_emb", dropout_emb), ("dropout_hidden", dropout_hidden),
                           ("dropout_words", dropout_words), ("weight_drop", weight_drop)):
            if not 0.0 <= rate < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {rate!r}")
        self.tied = bool(tie_weights) and (layers > 1 or hidden == emsize)
        self.config = dict(vocab_size=vocab_size, emsize=emsize, hidden=hidden, layers=layers,
                           dropout=dropout, dropout_emb=dropout_emb, first_window=first_window,
                           tie_weights=bool(tie_weights), dropout_hidden=dropout_hidden,
                           dropout_words=dropout_words, weight_drop=weight_drop,
                           cutoffs=None if cutoffs is None else [int(c) for c in cutoffs])
        self.dropout = dropout
        self.dropout_emb = dropout_emb
        self.dropout_hidden = dropout_hidden
        self.dropout_words = dropout_words
        self.embedding = nn.Embedding(vocab_size, emsize)
        sizes = [emsize] + [hidden] * layers
        if self.tied:
            sizes[-1] = emsize
        self.layers = nn.ModuleList(
            QRNN(sizes[i], sizes[i + 1], window=first_window if i == 0 else 1, weight_drop=weight_drop)
            for i in range(layers)
        )
        self.decoder = nn.Linear(sizes[-1], vocab_size)
        self.split = None if cutoffs is None else SplitSoftmax(sizes[-1], vocab_size, cutoffs)
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        if self.tied:
            self.decoder.weight = self.embedding.weight

    def forward(self, tokens: Tensor, state: Optional[list] = None) -> tuple:
        if state is None:
            state = [None] * len(self.layers)
        x = embedding_dropout(self.embedding, tokens, self.dropout_words, self.training)
        x = locked_dropout(x, self.dropout_emb, self.training)
        new_state = []
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x, layer_state = _layer_forward(cast(QRNN, layer), x, state[i])
            new_state.append(layer_state)
            if i < last:
                x = locked_dropout(x, self.dropout_hidden, self.training)
        return LMFeatures(locked_dropout(x, self.dropout, self.training), x), new_state

    def logits(self, features: LMFeatures) -> Tensor:
        """The decoder over every step's features: (seq_len, batch, vocab) (log-probabilities
        under a split softmax; for short inputs only, as generation and tests use it)."""
        if self.split is not None:
            out = features.output
            flat = self.split.log_probs(self.decoder.weight, self.decoder.bias, out.reshape(-1, out.shape[-1]))
            return flat.view(*out.shape[:-1], -1)
        return self.decoder(features.output)

    def nll(self, features: LMFeatures, targets: Tensor) -> Tensor:
        """Mean negative log-likelihood of `targets` (seq_len, batch): the cross-entropy."""
        if self.split is not None:
            out = features.output
            nll = self.split.nll(self.decoder.weight, self.decoder.bias, out.reshape(-1, out.shape[-1]),
                                 targets.reshape(-1))
            return nll.mean()
        logits = self.decoder(features.output)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class _SkipInitialisers(TorchFunctionMode):
    """Leaves meta tensors to ``torch.nn.init``'s functions and ``Tensor.normal_`` /
    ``uniform_`` untouched: a meta tensor holds no values to draw, and torch's meta
    ``normal_`` imports torch._dynamo (seconds) on its first call."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init" or func in (Tensor.normal_, Tensor.uniform_):
            target = args[0] if args else kwargs.get("tensor")
            if isinstance(target, Tensor) and target.is_meta:
                return target
        return func(*args, **kwargs)


@dataclass(frozen=True)
class ModelConfig:
    """``qrnn-train``'s language model: :class:`QRNNLanguageModel`'s sizes and regularisers,
    each under its name there (the flags are awd-lstm-lm's: ``--window`` is ``first_window``,
    ``--dropouti`` ``dropout_emb``, ``--dropouth`` ``dropout_hidden``, ``--dropoute``
    ``dropout_words``, ``--wdrop`` ``weight_drop``), the softmax asked for (``softmax``: auto,
    full or adaptive; ``cutoffs``: its clusters, () for the default rule) and :func:`lm_loss`'s
    ``alpha`` and ``beta``. Fields: emsize, hidden, layers, first_window, dropout, dropout_emb,
    dropout_hidden, dropout_words, weight_drop, softmax, cutoffs, alpha, beta.
    """

    emsize: int
    hidden: int
    layers: int
    first_window: int
    dropout: float
    dropout_emb: float
    dropout_hidden: float
    dropout_words: float
    weight_drop: float
    softmax: str
    cutoffs: tuple
    alpha: float
    beta: float

    def arguments(self, vocab_size: int, cutoffs: Optional[tuple]) -> dict:
        """QRNNLanguageModel's keyword arguments for a vocabulary of `vocab_size` tokens and
        the split softmax's `cutoffs` (None: the full softmax): a checkpoint's ``model_config``."""
        return dict(vocab_size=vocab_size, emsize=self.emsize, hidden=self.hidden, layers=self.layers,
                    dropout=self.dropout, dropout_emb=self.dropout_emb, first_window=self.first_window,
                    dropout_hidden=self.dropout_hidden, dropout_words=self.dropout_words,
                    weight_drop=self.weight_drop, cutoffs=cutoffs)


def meta_model(model_config: dict) -> QRNNLanguageModel:
    """``QRNNLanguageModel(**model_config)`` on the meta device (shapes, no memory), its
    initialisers skipped: what sizes are checked and parameters counted on."""
    with torch.device("meta"), _SkipInitialisers():
        return QRNNLanguageModel(**model_config)


def _layer_forward(layer: QRNN, x: Tensor, state) -> tuple:
    """One layer over a chunk, taking and returning its carried (cell, input tail) state.
    A layer's carried state is kept as a plain tuple so checkpoints hold only tensors."""
    hx = layer.initial_state() if state is None else QRNNState(state[0], (state[1],))
    output, new_state = layer(x, hx)
    return output, (new_state.c, new_state.x_tails[0])


def lm_loss(model: QRNNLanguageModel, features: LMFeatures, targets: Tensor, alpha: float = 0.0,
            beta: float = 0.0) -> tuple:
    """(objective, cross-entropy): the mean cross-entropy of `targets` (seq_len, batch) plus,
    in training, awd-lstm-lm's activation regularisation ``alpha * mean(output**2)`` and
    temporal activation regularisation ``beta * mean((raw[1:] - raw[:-1])**2)`` (computed in
    float32). The cross-entropy alone is what is reported."""
    cross_entropy = model.nll(features, targets)
    objective = cross_entropy
    if model.training:
        if alpha:
            objective = objective + alpha * features.output.float().pow(2).mean()
        if beta and features.raw.shape[0] > 1:
            raw = features.raw.float()
            objective = objective + beta * (raw[1:] - raw[:-1]).pow(2).mean()
    return objective, cross_entropy


@torch.no_grad()
def generate(model: QRNNLanguageModel, prompt: Tensor, length: int, temperature: float = 1.0,
             generator: Optional[torch.Generator] = None) -> Tensor:
    """Sample `length` token ids after the 1-D `prompt` ids, one step at a time with the
    carried state. `generator` (on the model's device) makes the sample reproducible. A
    `temperature` so small that the tempered logits overflow (say 1e-300) is the limit it
    tends to: the most likely token each step (greedy)."""
    if prompt.numel() == 0:
        raise ValueError("prompt must hold at least one token")
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    features, state = model(prompt.to(device).view(-1, 1))
    sampled = []
    for _ in range(length):
        last = features.output[-1, 0]
        if model.split is not None:  # cluster by cluster
            token = model.split.sample(model.decoder.weight, model.decoder.bias, last, temperature, generator)
        else:
            logits = model.decoder(last).float()
            tempered = logits / temperature
            if torch.isfinite(tempered).all():
                token = torch.multinomial(torch.softmax(tempered, dim=-1), 1, generator=generator)
            else:  # overflowed: softmax would be NaN; its limit is the one-hot of the argmax
                token = logits.argmax().view(1)
        sampled.append(token)
        features, state = model(token.view(1, 1), state)
    model.train(was_training)
    return torch.cat(sampled).cpu() if sampled else torch.empty(0, dtype=torch.long)
