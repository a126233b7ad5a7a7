"""hir_model.pairs and hir_model.selection on hand-made rows: which pairs train, what each batch masks, and the
validation recall that chooses the stopping epoch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hir_model.data import NeighbourhoodRows
from hir_model.pairs import PairBatches, make_next_period_pairs, stack_periods, training_view
from hir_model.selection import Validation
from schemas.codes import EDGE_TYPES, NODE_TYPES

L = 6
USER, ITEM = NODE_TYPES["user"], NODE_TYPES["item"]


def rows_of(spec: dict[int, tuple[str, list[tuple[int, str, str, int, int]]]]) -> NeighbourhoodRows:
    """{target id: (type, [(node id, node type, edge type, hop, parent position), ...])} as rows of L tokens."""
    n = len(spec)
    cols = {
        "token_node_id": np.zeros((n, L), np.int64),
        "token_node_type": np.zeros((n, L), np.int32),
        "token_edge_type": np.zeros((n, L), np.int32),
        "token_hop": np.zeros((n, L), np.int32),
        "token_parent_pos": np.full((n, L), -1, np.int32),
        "token_recency": np.zeros((n, L), np.int32),
        "token_weight": np.zeros((n, L), np.float32),
        "token_is_deep": np.zeros((n, L), np.bool_),
    }
    num_tokens, node_types = [], []
    for r, (target, (kind, tokens)) in enumerate(spec.items()):
        all_tokens = [(target, kind, "self", 0, -1), *tokens]
        for p, (node, node_kind, edge, hop, parent) in enumerate(all_tokens):
            cols["token_node_id"][r, p] = node
            cols["token_node_type"][r, p] = NODE_TYPES[node_kind]
            cols["token_edge_type"][r, p] = EDGE_TYPES[edge]
            cols["token_hop"][r, p] = hop
            cols["token_parent_pos"][r, p] = parent
            cols["token_weight"][r, p] = 1.0
        num_tokens.append(len(all_tokens))
        node_types.append(kind)
    return NeighbourhoodRows.from_columns(
        {
            "node_id": np.array(list(spec), np.int64),
            "node_type": np.array(node_types, dtype=object),
            "num_tokens": np.array(num_tokens, np.int32),
            **cols,
        }
    )


# Input rows (the graph before the cut-off): users 1 and 2 with history, user 3 with none; items 10-13 (item 10
# viewed by user 1, whose row also holds a co-viewer under it) and a category.
INPUTS = rows_of(
    {
        1: ("user", [(10, "item", "user_view_item", 1, 0)]),
        2: ("user", [(11, "item", "user_view_item", 1, 0), (12, "item", "user_cart_item", 1, 0)]),
        3: ("user", []),
        10: ("item", [(1, "user", "item_viewed_by_user", 1, 0), (11, "item", "user_view_item", 2, 1)]),
        11: ("item", [(2, "user", "item_viewed_by_user", 1, 0)]),
        12: ("item", [(2, "user", "item_carted_by_user", 1, 0)]),
        13: ("item", [(50, "category", "item_in_category", 1, 0)]),
        50: ("category", [(13, "item", "category_has_item", 1, 0)]),
    }
)
# Served rows (the day, the cut-off's next period included): user 1 viewed item 11 after the cut-off, and item
# 14, first seen after it (with user 4, new too).
SERVED = rows_of(
    {
        1: ("user", [(10, "item", "user_view_item", 1, 0), (11, "item", "user_view_item", 1, 0)]),
        4: ("user", [(14, "item", "user_view_item", 1, 0)]),
        14: (
            "item",
            [
                (1, "user", "item_viewed_by_user", 1, 0),
                (10, "item", "user_view_item", 2, 1),
                (50, "category", "item_in_category", 1, 0),
                (4, "user", "item_viewed_by_user", 1, 0),
            ],
        ),
        10: ("item", [(1, "user", "item_viewed_by_user", 1, 0), (11, "item", "user_view_item", 2, 1)]),
        11: ("item", [(2, "user", "item_viewed_by_user", 1, 0), (1, "user", "item_viewed_by_user", 1, 0)]),
    }
)


def test_pairs_keep_the_deepest_stage_and_drop_ends_without_rows() -> None:
    pairs = make_next_period_pairs(
        INPUTS,
        user_ids=np.array([1, 1, 1, 2, 3, 2, 9]),
        item_ids=np.array([11, 11, 10, 13, 10, 99, 10]),
        weights=np.array([1.0, 3.0, 1.0, 5.0, 1.0, 1.0, 1.0]),
    )
    # (1, 11) twice -> weight 3; (3, 10): no history; (2, 99): no item row; (9, 10): no user row.
    assert list(zip(pairs.user_id.tolist(), pairs.item_id.tolist(), pairs.weight.tolist(), strict=True)) == [
        (1, 10, 1.0),
        (1, 11, 3.0),
        (2, 13, 5.0),
    ]
    assert pairs.missing == 3
    assert INPUTS.node_id[pairs.user_row].tolist() == [1, 1, 2]
    assert INPUTS.node_id[pairs.item_row].tolist() == [10, 11, 13]


def test_the_training_view_adds_fresh_items_as_they_stood_before_anyone_engaged_with_them() -> None:
    view = training_view(INPUTS, SERVED)
    assert view.node_id.tolist() == [1, 2, 3, 10, 11, 12, 13, 14, 50]  # no fresh user: user 4 has no history

    def tokens(node: int) -> list[int]:
        row = view.index_of(np.array([node]))[0]
        return view.columns["token_node_id"][row, : view.columns["num_tokens"][row]].tolist()

    assert tokens(14) == [14, 50]  # its users gone, and item 10 under user 1 with them; its category stays
    parents = view.columns["token_parent_pos"][view.index_of(np.array([14]))[0], :2].tolist()
    assert parents == [-1, 0]
    assert tokens(11) == [11, 2]  # an item with an input row keeps it, not its served row
    pairs = make_next_period_pairs(view, np.array([1, 2]), np.array([14, 11]), np.ones(2))
    assert pairs.item_id.tolist() == [14, 11] and pairs.missing == 0


def test_a_batch_reads_items_and_negatives_from_the_input_rows_and_masks_own_positives() -> None:
    pairs = make_next_period_pairs(
        INPUTS, np.array([1, 1, 2]), np.array([10, 11, 13]), np.array([1.0, 3.0, 5.0])
    )
    loader = PairBatches(INPUTS, SERVED, pairs, batch_size=3, negatives=4, steps=1, seed=0)
    (batch,) = list(loader)
    order = batch.weights.tolist()  # the epoch's shuffle: identify each row by its weight
    item_of = {1.0: 10, 3.0: 11, 5.0: 13}
    user_of = {1.0: 1, 3.0: 1, 5.0: 2}
    assert batch.items.node_id[:, 0].tolist() == [item_of[w] for w in order]
    for row, w in enumerate(order):
        real = batch.items.node_id[row][batch.items.is_real[row]].tolist()
        # Item 10 is a repeat: user 1 viewed it before the cut-off, and its row says so. Item 11's row is as it
        # stood before the cut-off: user 1's view of it comes after (it is in the served row only).
        assert real == {10: [10, 1, 11], 11: [11, 2], 13: [13, 50]}[item_of[w]]
    # Negatives: the 4 item rows (never the category), each masked for the users that have it as a positive.
    negative_ids = INPUTS.node_id[np.sort(np.flatnonzero(INPUTS.node_type == "item"))].tolist()
    assert batch.negatives.node_id[:, 0].tolist() == negative_ids == [10, 11, 12, 13]
    assert batch.negatives.node_id[1][batch.negatives.is_real[1]].tolist() == [11, 2]  # the input row
    for row, w in enumerate(order):
        own = {i for u, i in [(1, 10), (1, 11), (2, 13)] if u == user_of[w]}
        assert batch.negative_mask[row].tolist() == [i in own for i in negative_ids]
        assert batch.in_batch_mask[row].tolist() == [item_of[v] in own for v in order]
    # logQ: in-batch items each 1/3 of the pairs x 3 pairs = 1 expected draw; uniform 4 of 4 = 1.
    assert torch.allclose(batch.positive_log_q, torch.zeros(3)) and torch.allclose(
        batch.negative_log_q, torch.zeros(4)
    )


def test_batches_cover_every_pair_once_per_epoch_and_resume_exactly() -> None:
    users = np.array([1] * 2 + [2] * 2)
    items = np.array([10, 11, 12, 13])
    pairs = make_next_period_pairs(INPUTS, users, items, np.ones(4))
    full = list(PairBatches(INPUTS, SERVED, pairs, batch_size=2, negatives=2, steps=6, seed=5))
    epoch = sorted(i for b in full[:2] for i in b.items.node_id[:, 0].tolist())
    assert epoch == [10, 11, 12, 13]
    tail = list(PairBatches(INPUTS, SERVED, pairs, batch_size=2, negatives=2, steps=6, seed=5, start_step=3))
    for a, b in zip(full[3:], tail, strict=True):
        assert torch.equal(a.users.node_id, b.users.node_id) and torch.equal(
            a.negatives.node_id, b.negatives.node_id
        )
    other = list(PairBatches(INPUTS, SERVED, pairs, batch_size=2, negatives=2, steps=6, seed=6))
    assert any(
        not torch.equal(a.negatives.node_id, b.negatives.node_id) for a, b in zip(full, other, strict=True)
    )


def test_validation_recall_counts_weighted_hits_in_the_top_k() -> None:
    pairs = make_next_period_pairs(
        INPUTS, np.array([1, 1, 2]), np.array([10, 12, 11]), np.array([1.0, 3.0, 5.0])
    )
    # An embedding that puts user 1 next to item 10 and user 2 next to item 12: top-1 hits (1, 10) only.
    place = {1: [1.0, 0.0], 10: [1.0, 0.0], 2: [0.0, 1.0], 12: [0.0, 1.0], 11: [-1.0, 0.0], 13: [0.0, -1.0]}

    def embed(batch):
        return torch.tensor([place[int(i)] for i in batch.node_id[:, 0]])

    top1 = Validation(INPUTS, pairs, k=1).score(embed, temperature=1.0)
    # Per user, then averaged: user 1 finds weight 1 of its 4, user 2 none of its 5 (pooled it would be 1/9).
    assert top1["recall"] == (1.0 / 4.0 + 0.0) / 2
    # k = the corpus: every engagement is found.
    assert Validation(INPUTS, pairs, k=4).score(embed, temperature=1.0)["recall"] == 1.0

    # The loss: -log softmax over the 4 items (scores = cosines), weighted 1, 3, 5.
    def nll(user: int, item: int) -> float:
        scores = {i: float(np.dot(place[user], place[i])) for i in (10, 11, 12, 13)}
        return -scores[item] + math.log(sum(math.exp(v) for v in scores.values()))

    expected = (nll(1, 10) + 3 * nll(1, 12) + 5 * nll(2, 11)) / 9
    assert top1["loss"] == pytest.approx(expected, rel=1e-6)


def test_warm_batches_draw_served_user_rows_for_the_stability_term_seeded_by_the_step() -> None:
    # The day's rows with users: user 1 active (a pair), users 2 and 4 idle (no pair), plus SERVED's items.
    served = rows_of(
        {
            10: ("item", [(1, "user", "item_viewed_by_user", 1, 0)]),
            11: ("item", [(2, "user", "item_viewed_by_user", 1, 0)]),
            1: ("user", [(10, "item", "user_view_item", 1, 0)]),
            2: ("user", [(11, "item", "user_view_item", 1, 0)]),
            4: ("user", [(10, "item", "user_view_item", 1, 0)]),
        }
    )
    pairs = make_next_period_pairs(INPUTS, np.array([1, 2]), np.array([10, 11]), np.ones(2))
    cold = list(PairBatches(INPUTS, served, pairs, batch_size=2, negatives=1, steps=3, seed=4))
    assert all(b.anchor_users is None for b in cold)  # no anchor: no rows drawn, no cost
    warm = list(
        PairBatches(INPUTS, served, pairs, batch_size=2, negatives=1, steps=3, seed=4, anchor_users=2)
    )
    drawn = [sorted(b.anchor_users.node_id[:, 0].tolist()) for b in warm]
    assert all(len(d) == 2 and set(d) <= {1, 2, 4} for d in drawn)  # served user rows only, never an item
    assert {4} & set().union(*map(set, drawn))  # an idle user (no pair) gets held too
    # The served row, not the input row: user 2's drawn row holds its day's item 11 (its input row holds 11 and 12).
    for b in warm:
        for r, node in enumerate(b.anchor_users.node_id[:, 0].tolist()):
            assert (
                b.anchor_users.node_id[r][b.anchor_users.is_real[r]].tolist()[1:]
                == {1: [10], 2: [11], 4: [10]}[node]
            )
    # The same negatives as a cold run (the draws do not shift), and resumes draw the same users.
    assert all(torch.equal(a.negatives.node_id, b.negatives.node_id) for a, b in zip(cold, warm, strict=True))
    tail = list(
        PairBatches(
            INPUTS, served, pairs, batch_size=2, negatives=1, steps=3, seed=4, anchor_users=2, start_step=1
        )
    )
    assert [sorted(b.anchor_users.node_id[:, 0].tolist()) for b in tail] == drawn[1:]
    # More than the day has: all of them.
    (every,) = list(
        PairBatches(INPUTS, served, pairs, batch_size=2, negatives=1, steps=1, seed=4, anchor_users=9)
    )
    assert sorted(every.anchor_users.node_id[:, 0].tolist()) == [1, 2, 4]
    with pytest.raises(ValueError, match="anchor_users"):
        PairBatches(INPUTS, served, pairs, batch_size=2, negatives=1, steps=1, seed=4, anchor_users=-1)


# An earlier period: before it user 1 had viewed nothing but item 13 and user 2 had no history; in it user 1
# viewed item 10 and user 2 carted item 11 (dropped: no history to predict from).
EARLIER = rows_of(
    {
        1: ("user", [(13, "item", "user_view_item", 1, 0)]),
        2: ("user", []),
        10: ("item", [(50, "category", "item_in_category", 1, 0)]),
        11: ("item", []),
        13: ("item", [(1, "user", "item_viewed_by_user", 1, 0)]),
    }
)


def test_stacked_periods_read_each_pair_as_its_period_saw_it_and_draw_negatives_from_the_latest_only() -> (
    None
):
    latest = make_next_period_pairs(INPUTS, np.array([1, 2]), np.array([11, 13]), np.array([1.0, 3.0]))
    stacked = stack_periods(
        INPUTS, latest, [(EARLIER, np.array([1, 2]), np.array([10, 11]), np.array([1.0, 3.0], np.float32))]
    )
    assert stacked.pairs_by_period == (2, 1)
    pairs, rows = stacked.pairs, stacked.rows
    # Real ids for the masks, each end's row as its own period saw it: user 1's earlier row holds item 13 only.
    assert sorted(
        zip(pairs.user_id.tolist(), pairs.item_id.tolist(), pairs.weight.tolist(), strict=True)
    ) == [
        (1, 10, 1.0),
        (1, 11, 1.0),
        (2, 13, 3.0),
    ]
    earlier = int(np.flatnonzero(pairs.item_id == 10)[0])
    user_tokens = rows.columns["token_node_id"][pairs.user_row[earlier]]
    assert user_tokens[: rows.columns["num_tokens"][pairs.user_row[earlier]]].tolist() == [1, 13]
    item_tokens = rows.columns["token_node_id"][pairs.item_row[earlier]]
    assert item_tokens[: rows.columns["num_tokens"][pairs.item_row[earlier]]].tolist() == [10, 50]
    later = int(np.flatnonzero(pairs.item_id == 11)[0])
    assert rows.columns["token_node_id"][pairs.user_row[later]][:2].tolist() == [1, 10]
    # Negatives: the latest view's four items, never an earlier period's copy of one.
    assert sorted(rows.columns["token_node_id"][stacked.corpus, 0].tolist()) == [10, 11, 12, 13]
    loader = PairBatches(rows, SERVED, pairs, 3, 4, 1, 0, corpus=stacked.corpus)
    batch = next(iter(loader))
    assert sorted(batch.negatives.node_id[:, 0].tolist()) == [10, 11, 12, 13]
    # A user's positive of any period is masked from its negatives: user 1's items 10 and 11.
    user_1 = np.flatnonzero(batch.users.node_id[:, 0].numpy() == 1)
    masked = batch.negative_mask[user_1].any(dim=0).numpy()
    assert sorted(batch.negatives.node_id[masked, 0].tolist()) == [10, 11]


def test_one_period_stacks_to_the_pairs_themselves() -> None:
    latest = make_next_period_pairs(INPUTS, np.array([1, 2]), np.array([11, 13]), np.array([1.0, 3.0]))
    stacked = stack_periods(INPUTS, latest, [])
    assert stacked.rows is INPUTS and stacked.pairs_by_period == (2,)
    np.testing.assert_array_equal(stacked.pairs.user_row, latest.user_row)
    np.testing.assert_array_equal(stacked.corpus, np.flatnonzero(INPUTS.node_type == "item"))
