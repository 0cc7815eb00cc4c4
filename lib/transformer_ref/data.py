"""Toy datasets made in code for the chapters (not part of the reference API).

Nothing is downloaded: every dataset is a few lines of tensor code with a seeded
``torch.Generator``, so a chapter that trains on it gives the same numbers on
every build.

* :func:`majority_batch` / :func:`all_binary_sequences` — chapter 4's toy: does a
  0/1 sequence hold more ones than zeros?
* :func:`reversal_batch` — chapter 5's toy: reverse a short sequence of tokens,
  with the special tokens the three model families need (:data:`PAD`, :data:`BOS`,
  :data:`SEP`).
"""

import torch

from ._checks import check_int

__all__ = [
    "majority_batch",
    "all_binary_sequences",
    "majority_labels",
    "PAD",
    "BOS",
    "SEP",
    "N_SPECIAL",
    "reversal_batch",
]


def majority_labels(x):
    """Label each 0/1 row of ``x`` ``(B, T)``: 1 if it holds more ones than zeros, else 0.

    A tie (as many ones as zeros, possible when T is even) is labelled 0: the
    question "more ones than zeros?" has the answer *no*.
    """
    ones = x.sum(dim=-1)
    return (2 * ones > x.shape[-1]).long()


def majority_batch(batch_size, length=6, *, generator=None):
    """Draw ``batch_size`` uniform random 0/1 sequences of ``length`` and their labels.

    Returns ``x`` ``(B, T)`` int64 tokens in {0, 1} and ``y`` ``(B,)`` int64 labels
    from :func:`majority_labels`.
    """
    batch_size = check_int("batch_size", batch_size, minimum=1)
    length = check_int("length", length, minimum=1)
    x = torch.randint(0, 2, (batch_size, length), generator=generator)
    return x, majority_labels(x)


def all_binary_sequences(length=6):
    """Every 0/1 sequence of ``length`` (``2**length`` rows, in binary counting order) and its label.

    Small enough to evaluate a model on the whole input space: for length 6 the
    64 rows are the complete test set, so accuracy on them is exact, not sampled.
    """
    length = check_int("length", length, minimum=1)
    codes = torch.arange(2**length)
    bits = torch.arange(length - 1, -1, -1)
    x = (codes[:, None] >> bits) & 1  # (2**T, T), most significant bit first
    return x, majority_labels(x)


#: special tokens shared by the sequence-to-sequence toys; content tokens start at N_SPECIAL
PAD, BOS, SEP = 0, 1, 2
N_SPECIAL = 3


def reversal_batch(batch_size, length=6, n_symbols=8, *, generator=None):
    """Random sequences of content tokens and their reversals.

    Content tokens are ``N_SPECIAL .. N_SPECIAL + n_symbols - 1`` (the special tokens
    :data:`PAD`, :data:`BOS`, :data:`SEP` come first), so a model needs a vocabulary
    of ``N_SPECIAL + n_symbols`` tokens.

    Returns ``src`` ``(B, T)`` and ``tgt = src.flip(-1)`` ``(B, T)``, both int64.
    """
    batch_size = check_int("batch_size", batch_size, minimum=1)
    length = check_int("length", length, minimum=1)
    n_symbols = check_int("n_symbols", n_symbols, minimum=2)
    src = torch.randint(N_SPECIAL, N_SPECIAL + n_symbols, (batch_size, length), generator=generator)
    return src, src.flip(-1)
