"""The ranking task's parts worked out by hand (the planted-signal and fold tests run in test_evaluate.py, on its
synthetic source)."""

from __future__ import annotations

import numpy as np
import pytest

from jobs.eval import features as fx
from jobs.eval import ranking as rk


def test_token_features_by_hand(spark):
    """Two users, two items, bags worked out by hand: overlap sums the smaller weights of shared tokens."""
    schema = "entity_type string, node_id long, bom_level int, token string, weight float, rank int"
    tokens = spark.createDataFrame(
        [
            ("user", 1, 0, "L0:a", 0.7, 1), ("user", 1, 0, "L0:b", 0.3, 2),
            ("user", 2, 0, "L0:c", 1.0, 1),
            ("item", 10, 0, "L0:b", 0.6, 1), ("item", 10, 0, "L0:a", 0.4, 2),
            ("item", 11, 0, "L0:d", 1.0, 1),
        ],
        schema,
    )  # fmt: skip
    cands = spark.createDataFrame([(1, 10), (1, 11), (2, 10), (3, 10)], "user long, item long")
    got = {(r["user"], r["item"]): r for r in fx.token_features(cands, tokens, [0]).collect()}
    assert got[(1, 10)]["tok_l0_overlap"] == pytest.approx(0.3 + 0.4)
    assert got[(1, 10)]["tok_l0_shared"] == 2.0
    assert got[(1, 10)]["tok_l0_item_token_in_user_bag"] == 1.0  # item 10's top token b is in user 1's bag
    assert got[(1, 10)]["tok_l0_user_weight_on_item_token"] == pytest.approx(0.3)
    assert got[(1, 11)]["tok_l0_overlap"] == 0.0 and got[(1, 11)]["tok_l0_item_token_in_user_bag"] == 0.0
    assert got[(2, 10)]["tok_l0_shared"] == 0.0
    assert got[(3, 10)]["tok_l0_overlap"] is None  # user 3 has no bag: unknown, not "no overlap"


def test_candidates_are_the_union_of_each_generators_top_n_with_every_score_and_rank():
    tops = {
        "co_visitation": ({1: np.array([10, 11, 12])}, {1: np.array([3.0, 2.0, 1.0])}),
        "hir": ({1: np.array([12, 13, 14]), 2: np.array([10])}, {1: np.array([0.9, 0.8, 0.7]), 2: np.array([0.5])}),
    }  # fmt: skip
    frame = fx.candidate_frame(tops, np.array([1, 2]), per_generator=2)
    assert [tuple(r) for r in frame[["user", "item"]].to_numpy()] == [
        (1, 10),
        (1, 11),
        (1, 12),
        (1, 13),
        (2, 10),
    ]
    row = frame[(frame["user"] == 1) & (frame["item"] == 12)].iloc[0]
    # Item 12 is co-visitation's third (beyond its top 2) and HIR's first: both ranks are features.
    assert row["co_visitation_rank"] == 3 and row["hir_rank"] == 1 and row["co_visitation_score"] == 1.0
    assert np.isnan(frame[(frame["user"] == 1) & (frame["item"] == 10)].iloc[0]["hir_rank"])


def test_per_user_auc_by_hand():
    import pandas as pd

    frame = pd.DataFrame({"user": [1, 1, 1, 1, 2, 2], "item": [1, 2, 3, 4, 5, 6]})
    scores = np.array([0.9, 0.1, 0.5, 0.3, 0.2, 0.2])
    auc = rk.per_user_auc(frame, scores, {1: {1, 4}, 2: {5}})
    # user 1: positives 0.9 and 0.3 against negatives 0.1 and 0.5 -> 3 of 4 pairs ordered; user 2: a tie -> 0.5.
    assert auc == {1: 0.75, 2: 0.5}
