"""The chapters' toy datasets (transformer_ref.data) and training loop (transformer_ref.training)."""

import math
from itertools import product

import pytest
import torch

from transformer_ref.data import (BOS, N_SPECIAL, PAD, SEP, all_binary_sequences, majority_batch,
                                  majority_labels, reversal_batch)
from transformer_ref.training import global_grad_norm, train


def test_all_binary_sequences_is_the_whole_input_space_with_22_positives():
    x, y = all_binary_sequences(6)
    assert x.shape == (64, 6)
    assert {tuple(row) for row in x.tolist()} == set(product((0, 1), repeat=6))
    # C(6,4) + C(6,5) + C(6,6) = 15 + 6 + 1 sequences have more ones than zeros; ties are 0
    assert int(y.sum()) == math.comb(6, 4) + math.comb(6, 5) + math.comb(6, 6) == 22


@pytest.mark.parametrize("row, label", [([1, 1, 1, 0, 0, 0], 0), ([1, 1, 1, 1, 0, 0], 1),
                                        ([0, 0, 0, 0, 0, 0], 0), ([1, 0, 1], 1), ([0, 1, 0], 0)])
def test_majority_labels_counts_ones_and_labels_ties_zero(row, label):
    assert majority_labels(torch.tensor([row])).item() == label


def test_majority_batch_is_seeded_and_consistent():
    a = majority_batch(32, 6, generator=torch.Generator().manual_seed(3))
    b = majority_batch(32, 6, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    x, y = a
    assert set(x.unique().tolist()) <= {0, 1}
    assert torch.equal(y, (x.sum(1) > 3).long())
    with pytest.raises(ValueError, match="^batch_size"):
        majority_batch(0)


def test_reversal_batch_uses_content_tokens_and_reverses():
    src, tgt = reversal_batch(16, 5, n_symbols=4, generator=torch.Generator().manual_seed(0))
    assert len({PAD, BOS, SEP}) == N_SPECIAL
    assert src.min() >= N_SPECIAL and src.max() < N_SPECIAL + 4
    assert torch.equal(tgt[:, 0], src[:, -1]) and torch.equal(tgt.flip(-1), src)


def test_train_fits_a_linear_regression_and_records_history():
    torch.manual_seed(0)
    w_true = torch.tensor([[2.0], [-3.0]])
    model = torch.nn.Linear(2, 1, bias=False)

    def batch(step):
        x = torch.randn(64, 2)
        return x, x @ w_true

    def loss_fn(m, b):
        return torch.nn.functional.mse_loss(m(b[0]), b[1])

    hist = train(model, loss_fn, batch, steps=300, lr=0.05,
                 eval_fn=lambda m: (m.weight - w_true.T).abs().max().item(), eval_every=100)
    assert len(hist["loss"]) == len(hist["grad_norm"]) == 300
    assert hist["eval_step"] == [100, 200, 300]
    assert hist["loss"][-1] < 1e-3 * hist["loss"][0]
    assert hist["eval"][-1] < 0.05


def test_train_stops_at_a_non_finite_loss():
    model = torch.nn.Linear(1, 1)
    calls = []

    def loss_fn(m, b):
        calls.append(1)
        return m(b).sum() * (float("nan") if len(calls) == 3 else 1.0)

    hist = train(model, loss_fn, lambda step: torch.ones(1, 1), steps=10)
    assert len(hist["loss"]) == 3 and math.isnan(hist["loss"][-1])


def test_global_grad_norm_is_the_norm_of_all_gradients_together():
    a, b = torch.zeros(3, requires_grad=True), torch.zeros(2, requires_grad=True)
    a.grad, b.grad = torch.tensor([3.0, 0.0, 0.0]), torch.tensor([0.0, 4.0])
    assert global_grad_norm([a, b, torch.zeros(1, requires_grad=True)]) == pytest.approx(5.0)
