"""Planted hierarchical interests as neighbourhood batches: ground truth for tests and benchmarks.

Fine interest clusters sit inside parent clusters (cluster c belongs to parent c // clusters_per_parent). Every
item belongs to one fine cluster and (mostly) to that cluster's category. A user has a parent cluster, a primary
fine cluster in it and sometimes a secondary one; the user views popular items of its clusters (plus some noise)
and converts (cart/purchase) on items of its clusters.

Neighbourhoods follow the table contract (schemas.tables.NEIGHBOURHOODS):
  user: target | viewed items (upper) + converted items (deep) | each item's category under it
  item: target | its category + users who viewed it (upper) + who converted (deep) | one other item per user
Everything is drawn from one numpy Generator, so a seed fixes the data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from hir_model.batch import TokenBatch, batch_from_columns
from hir_model.data import NeighbourhoodRows, keep_tokens, with_descendants
from hir_model.pairs import PairBatches, make_next_period_pairs
from schemas.codes import EDGE_TYPES, NODE_TYPES

USER_ID_BASE, ITEM_ID_BASE, CATEGORY_ID_BASE = 10_000, 1_000_000, 5_000_000
STAGE_WEIGHT = {
    "view": 1.0,
    "cart": 3.0,
    "purchase": 5.0,
}  # deeper funnel stages weigh more, as in build_graph


@dataclass(frozen=True)
class SyntheticNeighbourhoods:
    """Users' and items' neighbourhoods with their planted labels; row i of `users` is user i."""

    users: TokenBatch  # (U, L)
    items: TokenBatch  # (I, L)
    user_columns: dict[str, np.ndarray]  # the same users as neighbourhood-table columns
    item_columns: dict[str, np.ndarray]
    user_parent: Tensor  # (U,) planted parent cluster
    user_cluster: Tensor  # (U,) planted primary fine cluster
    item_parent: Tensor  # (I,)
    item_cluster: Tensor  # (I,)
    user_conversions: Tensor  # (U, C) item rows each user converted on
    item_log_pop: Tensor  # (I,) log share of conversions (logQ of the in-batch sampler)
    num_parents: int
    num_clusters: int


class _Rows:
    """Accumulates token rows in the neighbourhood table's column layout."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.rows: list[list[tuple[int, int, int, int, int, int, float, bool]]] = []

    def add(self, tokens: list[tuple[int, int, int, int, int, int, float, bool]]) -> None:
        if len(tokens) > self.max_tokens:
            raise ValueError(f"{len(tokens)} tokens do not fit max_tokens={self.max_tokens}")
        self.rows.append(tokens)

    def columns(self) -> dict[str, np.ndarray]:
        names = (
            "token_node_id",
            "token_node_type",
            "token_edge_type",
            "token_hop",
            "token_parent_pos",
            "token_recency",
            "token_weight",
            "token_is_deep",
        )
        dtypes = (np.int64, np.int32, np.int32, np.int32, np.int32, np.int32, np.float32, np.bool_)
        pads = (0, 0, 0, 0, -1, 0, 0.0, False)
        out = {
            n: np.full((len(self.rows), self.max_tokens), p, dtype=d)
            for n, d, p in zip(names, dtypes, pads, strict=True)
        }
        for r, tokens in enumerate(self.rows):
            for name, values in zip(names, zip(*tokens, strict=True), strict=True):
                out[name][r, : len(tokens)] = values
        out["num_tokens"] = np.array([len(t) for t in self.rows], dtype=np.int32)
        return out


def make_synthetic(
    num_users: int = 600,
    num_parents: int = 6,
    clusters_per_parent: int = 3,
    items_per_cluster: int = 20,
    views_per_user: tuple[int, int] = (4, 8),
    conversions_per_user: int = 2,
    max_viewers: int = 4,
    view_noise: float = 0.1,
    category_noise: float = 0.1,
    num_recency_buckets: int = 8,
    max_tokens: int = 24,
    seed: int = 0,
) -> SyntheticNeighbourhoods:
    """Generate users, items and their neighbourhoods with planted parent/fine interest clusters."""
    rng = np.random.default_rng(seed)
    num_clusters = num_parents * clusters_per_parent
    num_items = num_clusters * items_per_cluster
    item_cluster = np.repeat(np.arange(num_clusters), items_per_cluster)
    noisy = rng.random(num_items) < category_noise
    item_category = np.where(noisy, rng.integers(num_clusters, size=num_items), item_cluster)
    # Zipf-like popularity inside each cluster, so logQ has something to correct.
    popularity = np.tile(1.0 / np.arange(1, items_per_cluster + 1) ** 0.7, num_clusters)
    members = [np.flatnonzero(item_cluster == c) for c in range(num_clusters)]

    def draw_item(cluster: int) -> int:
        weights = popularity[members[cluster]]
        return int(rng.choice(members[cluster], p=weights / weights.sum()))

    user_parent = rng.integers(num_parents, size=num_users)
    user_cluster = user_parent * clusters_per_parent + rng.integers(clusters_per_parent, size=num_users)
    has_second = rng.random(num_users) < 0.5
    second = user_parent * clusters_per_parent + rng.integers(clusters_per_parent, size=num_users)
    second = np.where(has_second, second, user_cluster)

    def draw_interest(u: int) -> int:
        return int(user_cluster[u] if rng.random() < 0.7 else second[u])

    views: list[list[int]] = []
    conversions = np.zeros((num_users, conversions_per_user), dtype=np.int64)
    for u in range(num_users):
        seen: list[int] = []
        for _ in range(rng.integers(views_per_user[0], views_per_user[1] + 1)):
            item = int(rng.integers(num_items)) if rng.random() < view_noise else draw_item(draw_interest(u))
            if item not in seen:
                seen.append(item)
        views.append(seen)
        conversions[u] = [draw_item(draw_interest(u)) for _ in range(conversions_per_user)]

    def recency() -> tuple[int, float]:
        bucket = int(rng.integers(num_recency_buckets))
        return bucket, 0.9**bucket  # weight decays with age, as the graph's recency decay does

    user_rows = _Rows(max_tokens)
    viewers: list[list[int]] = [[] for _ in range(num_items)]
    converters: list[list[tuple[int, str]]] = [[] for _ in range(num_items)]
    for u in range(num_users):
        stages = [(item, "view") for item in views[u]]
        stages += [(int(item), "cart" if rng.random() < 0.5 else "purchase") for item in conversions[u]]
        tokens = [(USER_ID_BASE + u, NODE_TYPES["user"], EDGE_TYPES["self"], 0, -1, 0, 0.0, False)]
        for item, stage in stages:
            bucket, decay = recency()
            edge = EDGE_TYPES[f"user_{stage}_item"]
            tokens.append(
                (
                    ITEM_ID_BASE + item,
                    NODE_TYPES["item"],
                    edge,
                    1,
                    0,
                    bucket,
                    STAGE_WEIGHT[stage] * decay,
                    stage != "view",
                )
            )
            if stage == "view":
                viewers[item].append(u)
            else:
                converters[item].append((u, stage))
        for pos in range(1, len(stages) + 1):  # hop 2: each item's category under it
            item = tokens[pos][0] - ITEM_ID_BASE
            cat = CATEGORY_ID_BASE + int(item_category[item])
            tokens.append(
                (cat, NODE_TYPES["category"], EDGE_TYPES["item_in_category"], 2, pos, 0, 1.0, False)
            )
        user_rows.add(tokens)

    item_rows = _Rows(max_tokens)
    for i in range(num_items):
        cat = CATEGORY_ID_BASE + int(item_category[i])
        tokens = [
            (ITEM_ID_BASE + i, NODE_TYPES["item"], EDGE_TYPES["self"], 0, -1, 0, 0.0, False),
            (cat, NODE_TYPES["category"], EDGE_TYPES["item_in_category"], 1, 0, 0, 1.0, False),
        ]
        picked = [(u, "view") for u in rng.permutation(viewers[i])[:max_viewers]]
        picked += [converters[i][k] for k in rng.permutation(len(converters[i]))[:2]]
        for u, stage in picked:
            bucket, decay = recency()
            edge_name = {
                "view": "item_viewed_by_user",
                "cart": "item_carted_by_user",
                "purchase": "item_purchased_by_user",
            }
            user_token = (
                USER_ID_BASE + int(u),
                NODE_TYPES["user"],
                EDGE_TYPES[edge_name[stage]],
                1,
                0,
                bucket,
            )
            tokens.append((*user_token, STAGE_WEIGHT[stage] * decay, stage != "view"))
        for pos in range(2, len(tokens)):  # hop 2: one other item each user viewed
            others = [v for v in views[tokens[pos][0] - USER_ID_BASE] if v != i]
            if others:
                other = int(others[int(rng.integers(len(others)))])
                bucket, decay = recency()
                tokens.append(
                    (
                        ITEM_ID_BASE + other,
                        NODE_TYPES["item"],
                        EDGE_TYPES["user_view_item"],
                        2,
                        pos,
                        bucket,
                        decay,
                        False,
                    )
                )
        item_rows.add(tokens)

    counts = (
        np.bincount(conversions.ravel(), minlength=num_items) + 1.0
    )  # +1: unseen items keep a finite logQ
    user_columns, item_columns = user_rows.columns(), item_rows.columns()
    item_parent = item_cluster // clusters_per_parent
    return SyntheticNeighbourhoods(
        users=batch_from_columns(user_columns),
        items=batch_from_columns(item_columns),
        user_columns=user_columns,
        item_columns=item_columns,
        user_parent=torch.from_numpy(user_parent),
        user_cluster=torch.from_numpy(user_cluster),
        item_parent=torch.from_numpy(item_parent),
        item_cluster=torch.from_numpy(item_cluster),
        user_conversions=torch.from_numpy(conversions),
        item_log_pop=torch.from_numpy(np.log(counts / counts.sum()).astype(np.float32)),
        num_parents=num_parents,
        num_clusters=num_clusters,
    )


def synthetic_rows(data: SyntheticNeighbourhoods) -> tuple[NeighbourhoodRows, NeighbourhoodRows]:
    """(input rows, served rows) of the next-period objective: every user and item row without the conversions
    (the past: views, and the tokens under them), and every user and item row as served."""

    def with_ids(columns: dict[str, np.ndarray], node_type: str) -> dict[str, np.ndarray]:
        n = len(columns["token_node_id"])
        num_tokens = columns.get("num_tokens", (columns["token_node_type"] != 0).sum(axis=1).astype(np.int32))
        return {
            **columns,
            "num_tokens": num_tokens,
            "node_id": columns["token_node_id"][:, 0],
            "node_type": np.array([node_type] * n, dtype=object),
        }

    def past(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        real = columns["token_node_type"] != 0
        deep_hop1 = columns["token_is_deep"] & (columns["token_hop"] == 1)
        return keep_tokens(columns, real & ~with_descendants(deep_hop1, columns))

    def rows(users: dict[str, np.ndarray], items: dict[str, np.ndarray]) -> NeighbourhoodRows:
        users, items = with_ids(users, "user"), with_ids(items, "item")
        return NeighbourhoodRows.from_columns({c: np.concatenate([users[c], items[c]]) for c in users})

    users, items = data.user_columns, data.item_columns
    return rows(past(users), past(items)), rows(users, items)


def synthetic_batches(
    data: SyntheticNeighbourhoods,
    batch_size: int,
    steps: int,
    seed: int = 0,
    negatives: int | None = None,
    anchor_users: int = 0,
) -> PairBatches:
    """A trainer loader of next-period pairs: each user's conversions predicted from its views (`anchor_users`:
    served user rows per step for a warm start's stability term)."""
    inputs, served = synthetic_rows(data)
    users = np.repeat(data.users.node_id[:, 0].numpy(), data.user_conversions.shape[1])
    items = data.items.node_id[data.user_conversions.reshape(-1), 0].numpy()
    pairs = make_next_period_pairs(inputs, users, items, np.full(len(users), STAGE_WEIGHT["cart"]))
    negatives = batch_size if negatives is None else negatives
    return PairBatches(inputs, served, pairs, batch_size, negatives, steps, seed, anchor_users=anchor_users)


def random_tree_batch(
    batch_size: int,
    max_tokens: int,
    seed: int = 0,
    min_tokens: int = 1,
    deep_share: float = 0.3,
    num_recency_buckets: int = 16,
) -> TokenBatch:
    """Random valid neighbourhood trees with padding (for attention tests and benchmarks).

    Each row has num_tokens in [min_tokens, max_tokens]: the target, then at least one hop-1 token (when there is
    room), then hop-2 tokens hanging under random hop-1 tokens.
    """
    rng = np.random.default_rng(seed)
    num_tokens = rng.integers(min_tokens, max_tokens + 1, size=batch_size)  # (B,)
    num_hop1 = np.where(num_tokens > 1, 1 + (rng.random(batch_size) * (num_tokens - 1)).astype(np.int64), 0)
    pos = np.arange(max_tokens)[None, :]  # (1, L)
    hop = np.where(pos == 0, 0, np.where(pos <= num_hop1[:, None], 1, 2))  # (B, L)
    hop2_parent = 1 + (rng.random((batch_size, max_tokens)) * np.maximum(num_hop1, 1)[:, None]).astype(
        np.int64
    )
    parent_pos = np.where(hop == 0, -1, np.where(hop == 1, 0, hop2_parent))
    node_type = np.select(
        [hop == 0, hop == 1], [NODE_TYPES["user"], NODE_TYPES["item"]], NODE_TYPES["category"]
    )
    edge_type = np.where(
        hop == 0, EDGE_TYPES["self"], rng.integers(2, max(EDGE_TYPES.values()) + 1, hop.shape)
    )
    columns = {
        "num_tokens": num_tokens,
        "token_node_id": rng.integers(1, 2**40, size=hop.shape),
        "token_node_type": node_type,
        "token_edge_type": edge_type,
        "token_hop": hop,
        "token_parent_pos": parent_pos,
        "token_recency": rng.integers(num_recency_buckets, size=hop.shape),
        "token_weight": np.where(hop == 0, 0.0, rng.exponential(2.0, size=hop.shape)),
        "token_is_deep": (hop > 0) & (rng.random(hop.shape) < deep_share),
    }
    return batch_from_columns(columns)
