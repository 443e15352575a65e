"""The output softmax of large vocabularies: awd-lstm-lm's split (adaptive) softmax over the
decoder's weight, which the language model ties to its embedding.

Words are ids sorted by frequency; `cutoffs` cut them into a head (the most frequent words)
and tail clusters. A word of the head has probability ``head(word)``; a word of tail
cluster i has ``head(cluster i) * tail_i(word)``, where the head softmax runs over the head
words plus one entry per tail cluster (their vectors and biases are this module's
parameters) and ``tail_i`` over the cluster's words; every row comes from the decoder
weight, so the embedding stays tied. Training and evaluation compute the head for every
token and each tail only for the tokens whose target is in it: never a tokens x vocabulary
logits tensor. Sampling goes cluster by cluster.

torch's ``nn.AdaptiveLogSoftmaxWithLoss`` owns its own (projected) weights and cannot share
the embedding, so it does not fit a tied model; this is awd-lstm-lm's SplitCrossEntropyLoss
arrangement, in its definition.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["SplitSoftmax", "default_cutoffs", "check_cutoffs", "ADAPTIVE_ABOVE"]

# awd-lstm-lm's rule: a split softmax above this many words.
ADAPTIVE_ABOVE = 75_000


def _widen(logits: Tensor) -> Tensor:
    """16-bit logits (autocast) in float32 for the softmax; float32 and float64 as they are."""
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def default_cutoffs(vocab_size: int) -> tuple:
    """awd-lstm-lm's splits for its vocabularies (over 500k words, over 75k), else a head of a
    twentieth and a first cluster up to a quarter of the words."""
    if vocab_size > 500_000:
        return (4200, 35000, 180000)
    if vocab_size > ADAPTIVE_ABOVE:
        return (2800, 20000, 76000)
    return tuple(sorted({c for c in (max(1, vocab_size // 20), max(2, vocab_size // 4)) if c < vocab_size}))


def check_cutoffs(cutoffs: Sequence[int], vocab_size: int) -> tuple:
    cutoffs = tuple(int(c) for c in cutoffs)
    if not cutoffs or any(b <= a for a, b in zip(cutoffs, cutoffs[1:])) or cutoffs[0] < 1 \
            or cutoffs[-1] >= vocab_size:
        raise ValueError(f"cutoffs must be increasing word counts in [1, {vocab_size}) (the vocabulary), "
                         f"got {list(cutoffs)}")
    return cutoffs


class SplitSoftmax(nn.Module):
    """Split softmax over a decoder ``(weight (vocab, features), bias (vocab,))`` passed to
    each call; holds the tail clusters' head vectors and biases."""

    def __init__(self, features: int, vocab_size: int, cutoffs: Sequence[int]):
        super().__init__()
        self.vocab_size = int(vocab_size)
        self.cutoffs = check_cutoffs(cutoffs, vocab_size)
        self.bounds = self.cutoffs + (self.vocab_size,)
        self.tail_vectors = nn.Parameter(torch.zeros(len(self.cutoffs), features))
        self.tail_bias = nn.Parameter(torch.zeros(len(self.cutoffs)))

    def extra_repr(self) -> str:
        return f"vocab_size={self.vocab_size}, cutoffs={list(self.cutoffs)}"

    def _pieces(self, weight: Tensor, bias: Tensor) -> tuple:
        """The decoder's rows and biases cut at the cutoffs: one split, so that the backward
        assembles the weight's gradient once (a slice per cluster would each allocate a
        vocabulary-sized gradient)."""
        sizes = [hi - lo for lo, hi in zip((0,) + self.bounds[:-1], self.bounds)]
        return weight.split(sizes), bias.split(sizes)

    def _head_log_probs(self, weights: tuple, biases: tuple, hidden: Tensor) -> Tensor:
        w = torch.cat([weights[0], self.tail_vectors.to(weights[0].dtype)])
        b = torch.cat([biases[0], self.tail_bias.to(biases[0].dtype)])
        return F.log_softmax(_widen(F.linear(hidden, w, b)), dim=-1)

    def _tail_log_probs(self, weights: tuple, biases: tuple, hidden: Tensor, cluster: int) -> Tensor:
        return F.log_softmax(_widen(F.linear(hidden, weights[cluster + 1], biases[cluster + 1])), dim=-1)

    def nll(self, weight: Tensor, bias: Tensor, hidden: Tensor, targets: Tensor) -> Tensor:
        """Negative log-likelihoods (float32) of `targets` (N,) given `hidden` (N, features), in
        the order head tokens first, then each cluster's (their sum and mean are the loss's)."""
        self._check_targets(targets)
        weights, biases = self._pieces(weight, bias)
        head_log_probs = self._head_log_probs(weights, biases, hidden)
        head = self.cutoffs[0]
        in_head = targets < head
        parts = [-head_log_probs[in_head].gather(1, targets[in_head].unsqueeze(1)).squeeze(1)]
        for cluster in range(len(self.cutoffs)):
            lo, hi = self.bounds[cluster], self.bounds[cluster + 1]
            rows = ((targets >= lo) & (targets < hi)).nonzero().squeeze(1)
            if rows.numel() == 0:
                continue
            tail = self._tail_log_probs(weights, biases, hidden.index_select(0, rows), cluster)
            picked = tail.gather(1, (targets.index_select(0, rows) - lo).unsqueeze(1)).squeeze(1)
            parts.append(-(head_log_probs.index_select(0, rows)[:, head + cluster] + picked))
        return torch.cat(parts)

    def _check_targets(self, targets: Tensor) -> None:
        """Targets outside [0, vocab_size) would fall in no cluster and leave the loss without a
        word: refused. On the CPU a ValueError; on a GPU, or while compiled, a device-side
        assertion (no host synchronisation per batch)."""
        if targets.numel() == 0:
            return
        if targets.device.type == "cpu" and not torch.compiler.is_compiling():
            low, high = int(targets.min()), int(targets.max())
            if low < 0 or high >= self.vocab_size:
                raise ValueError(f"targets must be word ids in [0, {self.vocab_size}) (the vocabulary), "
                                 f"got ids from {low} to {high}")
            return
        torch._assert_async(((targets >= 0) & (targets < self.vocab_size)).all(),
                            f"targets must be word ids in [0, {self.vocab_size}) (the vocabulary)")

    def sample(self, weight: Tensor, bias: Tensor, hidden: Tensor, temperature: float = 1.0,
               generator: Optional[torch.Generator] = None) -> Tensor:
        """One word id drawn from ``p(word) ** (1 / temperature)`` (normalised) for `hidden`
        (features,): the cluster first (each weighted by its words' tempered mass), then the
        word within it; one cluster's logits at a time. A temperature so small that the
        tempered log-probabilities overflow gives the limit: the most likely word (greedy)."""
        hidden = hidden.reshape(1, -1)
        weights, biases = self._pieces(weight, bias)
        untempered = self._head_log_probs(weights, biases, hidden)[0]
        head_log_probs = untempered / temperature
        head = self.cutoffs[0]
        if temperature != 1.0:  # a tail cluster's tempered mass is not its head probability's
            masses = [torch.logsumexp(self._tail_log_probs(weights, biases, hidden, c)[0] / temperature, 0)
                      for c in range(len(self.cutoffs))]
            head_log_probs = torch.cat([head_log_probs[:head], head_log_probs[head:] + torch.stack(masses)])
        if not torch.isfinite(head_log_probs).all():  # overflowed: softmax would be NaN
            return self._most_likely(weights, biases, hidden, untempered)
        choice = int(torch.multinomial(torch.softmax(head_log_probs, 0), 1, generator=generator))
        if choice < head:
            return torch.tensor([choice], device=hidden.device)
        cluster = choice - head
        tail = self._tail_log_probs(weights, biases, hidden, cluster)[0] / temperature
        word = int(torch.multinomial(torch.softmax(tail, 0), 1, generator=generator))
        return torch.tensor([self.bounds[cluster] + word], device=hidden.device)

    def _most_likely(self, weights: tuple, biases: tuple, hidden: Tensor, head_log_probs: Tensor) -> Tensor:
        """The word of the highest probability for `hidden` (1, features), one cluster's logits
        at a time: a head word's, or a cluster's own probability times its best word's."""
        head = self.cutoffs[0]
        head_best, head_word = head_log_probs[:head].max(0)
        best_log_prob, word = float(head_best), int(head_word)
        for cluster in range(len(self.cutoffs)):
            tail_best, tail_word = self._tail_log_probs(weights, biases, hidden, cluster)[0].max(0)
            log_prob = float(head_log_probs[head + cluster] + tail_best)
            if log_prob > best_log_prob:
                best_log_prob, word = log_prob, self.bounds[cluster] + int(tail_word)
        return torch.tensor([word], device=hidden.device)

    def log_probs(self, weight: Tensor, bias: Tensor, hidden: Tensor) -> Tensor:
        """Every word's log-probability for each row of `hidden` (N, features): (N, vocab).
        For tests and small N only (this is the full tensor training never builds)."""
        weights, biases = self._pieces(weight, bias)
        head_log_probs = self._head_log_probs(weights, biases, hidden)
        head = self.cutoffs[0]
        parts = [head_log_probs[:, :head]]
        for cluster in range(len(self.cutoffs)):
            parts.append(head_log_probs[:, head + cluster: head + cluster + 1]
                         + self._tail_log_probs(weights, biases, hidden, cluster))
        return torch.cat(parts, dim=1)
