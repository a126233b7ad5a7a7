"""hir_model.objective: the mixed-negative softmax, checked against sums written out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from hir_model.objective import mixed_negative_loss


def _loss(users, positives, negatives, pos_q, neg_q, in_mask=None, neg_mask=None, weights=None, t=1.0):
    b, m = users.shape[0], negatives.shape[0]
    return float(
        mixed_negative_loss(
            users,
            positives,
            negatives,
            torch.tensor(pos_q),
            torch.tensor(neg_q),
            torch.zeros(b, b, dtype=torch.bool) if in_mask is None else in_mask,
            torch.zeros(b, m, dtype=torch.bool) if neg_mask is None else neg_mask,
            torch.ones(b) if weights is None else torch.tensor(weights),
            t,
        )
    )


def test_two_users_one_uniform_negative_match_the_written_out_softmax() -> None:
    users = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    positives = torch.tensor([[1.0, 0.0], [0.6, 0.8]])
    negatives = torch.tensor([[0.0, -1.0]])
    # Row 0: logits 1 - log 2 (own), 0.6 - log 1, 0 - log 0.5.  Row 1: 0 - log 2, 0.8 - log 1 (own), -1 - log 0.5.
    row0 = [1 - math.log(2), 0.6 - math.log(1), 0 - math.log(0.5)]
    row1 = [0 - math.log(2), 0.8 - math.log(1), -1 - math.log(0.5)]

    def ce(logits, label):
        return -logits[label] + math.log(sum(math.exp(x) for x in logits))

    expected = (ce(row0, 0) + ce(row1, 1)) / 2
    got = _loss(users, positives, negatives, [math.log(2), 0.0], [math.log(0.5)])
    assert got == pytest.approx(expected, rel=1e-6)


def test_a_masked_column_counts_as_if_it_were_not_there() -> None:
    torch.manual_seed(0)
    users, positives, negatives = torch.randn(3, 4), torch.randn(3, 4), torch.randn(2, 4)
    in_mask = torch.zeros(3, 3, dtype=torch.bool)
    in_mask[0, 2] = True  # row 0's other positive sits in column 2
    neg_mask = torch.zeros(3, 2, dtype=torch.bool)
    neg_mask[1, 0] = True
    masked = _loss(users, positives, negatives, [0.0] * 3, [0.0] * 2, in_mask, neg_mask)
    # The same rows with the masked columns removed by hand.
    logits = [
        [users[0] @ positives[0], users[0] @ positives[1], users[0] @ negatives[0], users[0] @ negatives[1]],
        [users[1] @ positives[0], users[1] @ positives[1], users[1] @ positives[2], users[1] @ negatives[1]],
        [*(users[2] @ positives[j] for j in range(3)), *(users[2] @ negatives[j] for j in range(2))],
    ]
    labels = [0, 1, 2]
    by_hand = sum(
        -float(r[lab]) + math.log(sum(math.exp(float(x)) for x in r))
        for r, lab in zip(logits, labels, strict=True)
    )
    assert masked == pytest.approx(by_hand / 3, rel=1e-5)
    # A mask on the diagonal never removes a row's own positive.
    diagonal = torch.eye(3, dtype=torch.bool)
    assert _loss(users, positives, negatives, [0.0] * 3, [0.0] * 2, diagonal) == pytest.approx(
        _loss(users, positives, negatives, [0.0] * 3, [0.0] * 2), rel=1e-6
    )


def test_weights_average_the_rows_and_log_q_lowers_a_popular_candidate() -> None:
    torch.manual_seed(1)
    users, positives, negatives = torch.randn(2, 3), torch.randn(2, 3), torch.randn(0, 3)
    s = (users @ positives.T).tolist()

    def row_loss(row: int, log_q: list[float]) -> float:
        logits = [s[row][j] - log_q[j] for j in range(2)]
        return -logits[row] + math.log(sum(math.exp(x) for x in logits))

    flat, popular = [0.0, 0.0], [0.0, math.log(10)]  # column 1 drawn 10x more often
    assert _loss(users, positives, negatives, flat, [], weights=[1.0, 0.0]) == pytest.approx(
        row_loss(0, flat)
    )
    assert _loss(users, positives, negatives, flat, [], weights=[1.0, 3.0]) == pytest.approx(
        (row_loss(0, flat) + 3 * row_loss(1, flat)) / 4, rel=1e-6
    )
    # Row 0 loses less to the popular column 1 once its logit is lowered by log 10.
    row0_popular = _loss(users, positives, negatives, popular, [], weights=[1.0, 0.0])
    assert row0_popular == pytest.approx(row_loss(0, popular)) and row0_popular < row_loss(0, flat)


def test_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match="positives"):
        _loss(torch.randn(2, 3), torch.randn(3, 3), torch.randn(1, 3), [0.0] * 3, [0.0])
