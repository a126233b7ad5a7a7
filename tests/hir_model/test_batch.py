from __future__ import annotations

import numpy as np
import pytest
import torch

from hir_model.batch import ContentTable, batch_from_columns, sparse_view
from schemas.codes import EDGE_TYPES, NODE_TYPES, PAD

ITEM, CATEGORY, USER = NODE_TYPES["item"], NODE_TYPES["category"], NODE_TYPES["user"]


def tree_columns() -> dict[str, np.ndarray]:
    """Two users. Row 0: target, 3 items (item at pos 2 carted = deep), each item's category at hop 2, 1 pad.

    pos:        0     1      2      3      4     5     6     7
    hop:        0     1      1      1      2     2     2     pad
    parent:    -1     0      0      0      1     2     3
    deep:             no     yes    no
    Row 1: target and one viewed item, then padding holding junk that must be ignored.
    """
    view, cart, in_cat = (
        EDGE_TYPES["user_view_item"],
        EDGE_TYPES["user_cart_item"],
        EDGE_TYPES["item_in_category"],
    )
    return {
        "num_tokens": np.array([7, 2]),
        "token_node_id": np.array([[1, 11, 12, 13, 21, 22, 23, 0], [2, 11, 99, 99, 99, 99, 99, 99]]),
        "token_node_type": np.array(
            [[USER, ITEM, ITEM, ITEM, CATEGORY, CATEGORY, CATEGORY, 0], [USER, ITEM] + [ITEM] * 6]
        ),
        "token_edge_type": np.array(
            [[1, view, cart, view, in_cat, in_cat, in_cat, 0], [1, view] + [view] * 6]
        ),
        "token_hop": np.array([[0, 1, 1, 1, 2, 2, 2, 0], [0, 1] + [1] * 6]),
        "token_parent_pos": np.array([[-1, 0, 0, 0, 1, 2, 3, -1], [-1, 0] + [0] * 6]),
        "token_recency": np.array([[0, 1, 2, 3, 0, 0, 0, 0], [0, 5] + [5] * 6]),
        "token_weight": np.array([[0, 1, 3, 1, 1, 1, 1, 0], [0, 1] + [9] * 6], dtype=np.float32),
        "token_is_deep": np.array([[0, 0, 1, 0, 0, 0, 0, 0], [0, 0] + [1] * 6], dtype=bool),
    }


def as_object_columns(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What pandas hands over for Arrow list columns: a 1-D object array of per-row arrays."""
    out = {}
    for name, value in columns.items():
        if value.ndim == 2:
            rows = np.empty(len(value), dtype=object)
            rows[:] = list(value)
            out[name] = rows
        else:
            out[name] = value
    return out


def test_object_array_columns_give_the_same_batch_as_2d_arrays() -> None:
    dense = batch_from_columns(tree_columns())
    from_pandas = batch_from_columns(as_object_columns(tree_columns()))
    for field in ("node_id", "node_type", "edge_type", "hop", "parent_pos", "recency", "weight", "is_deep"):
        assert torch.equal(getattr(dense, field), getattr(from_pandas, field)), field
    assert dense.node_id.dtype == torch.int64 and dense.weight.dtype == torch.float32
    assert dense.is_deep.dtype == torch.bool and dense.node_id.shape == (2, 8)


def test_positions_beyond_num_tokens_become_padding_whatever_they_hold() -> None:
    batch = batch_from_columns(tree_columns())
    assert batch.is_real[1].tolist() == [True, True] + [False] * 6
    assert batch.node_type[1, 2:].eq(PAD).all() and batch.node_id[1, 2:].eq(0).all()
    assert batch.parent_pos[1, 2:].eq(-1).all() and batch.weight[1, 2:].eq(0).all()
    assert not batch.is_deep[1, 2:].any()


def test_contract_violations_name_the_row() -> None:
    ragged = as_object_columns(tree_columns())
    ragged["token_hop"][1] = np.array([0, 1, 1])
    with pytest.raises(ValueError, match="token_hop: rows have different lengths"):
        batch_from_columns(ragged)
    bad_parent = tree_columns()
    bad_parent["token_parent_pos"][0, 4] = 6  # points forward, at a later token
    with pytest.raises(ValueError, match="row 0: a neighbour token's parent_pos"):
        batch_from_columns(bad_parent)
    pad_inside = tree_columns()
    pad_inside["token_node_type"][1, 1] = PAD
    with pytest.raises(ValueError, match="row 1: a token inside num_tokens has node type 0"):
        batch_from_columns(pad_inside)
    missing = tree_columns()
    del missing["token_recency"]
    with pytest.raises(ValueError, match="missing: token_recency"):
        batch_from_columns(missing)


def test_sparse_view_removes_deep_tokens_with_their_descendants_and_keeps_shape() -> None:
    batch = batch_from_columns(tree_columns())
    view = sparse_view(batch, torch.Generator().manual_seed(0), token_dropout=0.0)
    assert view.node_id.shape == batch.node_id.shape
    # The carted item (pos 2) and its category (pos 5) are gone; everything else of row 0 stays.
    assert view.is_real[0].tolist() == [True, True, False, True, True, False, True, False]
    assert view.num_tokens.tolist() == [5, 2]
    assert view.node_id[0, 2] == 0 and view.parent_pos[0, 5] == -1 and not view.is_deep.any()


def test_token_dropout_takes_descendants_and_never_the_target() -> None:
    batch = batch_from_columns(tree_columns())
    generator = torch.Generator().manual_seed(1)
    dropped_any = False
    for _ in range(50):
        view = sparse_view(batch, generator, token_dropout=0.5)
        assert view.is_real[:, 0].all(), "the target was dropped"
        real = view.is_real
        for b in range(batch.batch_size):
            for pos in range(1, batch.max_tokens):
                parent = int(batch.parent_pos[b, pos])
                if real[b, pos] and parent > 0:
                    assert real[b, parent], f"token {pos} kept while its parent {parent} was dropped"
        dropped_any |= bool((batch.is_real & ~batch.is_deep & ~real).any())
    assert dropped_any, "token_dropout=0.5 never dropped an upper-funnel token"
    same_seed = sparse_view(batch, torch.Generator().manual_seed(7), 0.5)
    assert torch.equal(same_seed.is_real, sparse_view(batch, torch.Generator().manual_seed(7), 0.5).is_real)


def test_content_table_attaches_vectors_by_node_id() -> None:
    batch = batch_from_columns(tree_columns())
    table = ContentTable(np.array([12, 11, 500]), np.array([[0.0, 2.0], [1.0, 0.0], [5.0, 5.0]]))
    with_content = table.attach(batch)
    assert with_content.content.shape == (2, 8, 2)
    assert with_content.has_content[0].tolist() == [False, True, True] + [False] * 5
    assert with_content.content[0, 1].tolist() == [1.0, 0.0] and with_content.content[0, 2].tolist() == [
        0.0,
        2.0,
    ]
    assert with_content.content[0, 0].abs().sum() == 0
    # Node 99 sits in padding of row 1: never given content.
    assert not with_content.has_content[1, 2:].any()
