"""Next-period training pairs and their batches: what the retrieval objective (hir_model.objective) reads.

A pair is (user, item, weight): the user engaged with the item after the training cut-off, at the deepest funnel
stage `weight` stands for. Both ends, and every negative, are **input rows**: neighbourhoods sampled from the
events before the cut-off only, by the day's own graph and sampler code. The model learns to predict the next
links from the graph as it stood before them, and at serving time (`embed`) reads the day's graph the same way:
one view for users, positives and negatives alike. A repeat holds its user in the item's row (the user engaged
with it before the cut-off too), in training as in serving.

(Until 2026-12-03 the items came from the day's served rows with the pair's user masked out of the positive's row
only. The model learnt to tell a masked row from an unmasked one: on Taobao a warm model ranked the next day's
repeat purchases in a user's top 50 for 96% of them with their rows masked and 12% as served, and learnt that an
item holding the user is not what the user engages with next.)

A batch holds B pairs and M items drawn uniformly from the corpus (every input item row), with the logQ of each
candidate and the masks of each row's own positives. Warm starts add U served user rows drawn uniformly
(`anchor_users`): the stability term's users. The pairs' users are input rows of active users only; an idle user's
served row, the one a ranker reads tomorrow, would otherwise never be held. Batch k of a run is a pure function of
(rows, pairs, seed, k): reruns and `--resume` give the same batches.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from hir_model.batch import ContentTable, TokenBatch
from hir_model.data import NeighbourhoodRows


@dataclass(frozen=True)
class NextPeriodPairs:
    """Distinct (user, item) pairs sorted by (user id, item id), with the rows of both ends and a weight."""

    user_id: np.ndarray  # (P,) int64
    item_id: np.ndarray  # (P,) int64
    weight: np.ndarray  # (P,) float32, > 0
    user_row: np.ndarray  # (P,) rows of the input rows
    item_row: np.ndarray  # (P,) rows of the input rows
    missing: int = 0  # engagements dropped because the user or the item has no input row

    def __len__(self) -> int:
        return len(self.user_id)


def training_view(inputs: NeighbourhoodRows, served: NeighbourhoodRows) -> NeighbourhoodRows:
    """The input rows, and each served item that has none (first engaged with after the cut-off) as it stood
    before: its served row without its users (hir_model.data.NeighbourhoodRows.without_users). So a fresh item can
    be a positive and a negative like any other, and its row never holds the engagement to predict."""
    fresh = np.flatnonzero((served.node_type == "item") & (inputs.index_of(served.node_id) < 0))
    return NeighbourhoodRows.concat([inputs, served.take(fresh).without_users()]) if len(fresh) else inputs


def make_next_period_pairs(
    inputs: NeighbourhoodRows,
    user_ids: np.ndarray,
    item_ids: np.ndarray,
    weights: np.ndarray,
) -> NextPeriodPairs:
    """Pairs whose user has an input row with at least one neighbour and whose item has an input row (an item
    first seen after the cut-off has none); a pair given several times (one per stage) keeps its largest weight."""
    user_ids = np.asarray(user_ids, dtype=np.int64)
    item_ids = np.asarray(item_ids, dtype=np.int64)
    weights = np.asarray(weights, dtype=np.float32)
    if len(user_ids):
        order = np.lexsort((-weights, item_ids, user_ids))  # by user, item, heaviest first
        user_ids, item_ids, weights = user_ids[order], item_ids[order], weights[order]
        first = np.ones(len(user_ids), dtype=bool)
        first[1:] = (user_ids[1:] != user_ids[:-1]) | (item_ids[1:] != item_ids[:-1])
        user_ids, item_ids, weights = user_ids[first], item_ids[first], weights[first]
    user_row, item_row = inputs.index_of(user_ids), inputs.index_of(item_ids)
    with_history = np.zeros(len(user_row), dtype=bool)
    found = user_row >= 0
    with_history[found] = inputs.columns["num_tokens"][user_row[found]] > 1
    keep = with_history & (item_row >= 0) & (weights > 0)
    return NextPeriodPairs(
        user_ids[keep],
        item_ids[keep],
        weights[keep],
        user_row[keep],
        item_row[keep],
        missing=int((~keep).sum()),
    )


# Row keys of an earlier period's rows in a stacked view: the node id XOR a per-period odd constant (splitmix64's
# golden gamma times the period): distinct from every real id of the day but with odds of 2^-64 a pair, and its
# own inverse. Only the stacked view's row index reads them; the tokens keep the real ids the model embeds.
_PERIOD_KEY = 0x9E3779B97F4A7C15


def _period_keys(node_ids: np.ndarray, period: int) -> np.ndarray:
    key = np.uint64((_PERIOD_KEY * period) % (1 << 64))
    return (np.asarray(node_ids, dtype=np.int64).view(np.uint64) ^ key).view(np.int64)


@dataclass(frozen=True)
class StackedPairs:
    """The pairs of several periods over one set of rows: the latest period's view (the negatives' corpus) and the
    rows of each earlier period's pairs, re-keyed so a node has one row per period."""

    rows: NeighbourhoodRows
    pairs: NextPeriodPairs  # real user and item ids; user_row and item_row index `rows`
    corpus: np.ndarray  # rows of the latest period's items: what the uniform negatives are drawn from
    pairs_by_period: tuple[int, ...]  # latest first


def stack_periods(
    latest: NeighbourhoodRows,
    latest_pairs: NextPeriodPairs,
    earlier: Sequence[tuple[NeighbourhoodRows, np.ndarray, np.ndarray, np.ndarray]],
) -> StackedPairs:
    """One training set from the latest period's view and pairs and earlier periods' (view, user ids, item ids,
    weights), latest first. An earlier pair reads its user and its item as they stood at its period's start, so the
    model learns from every position of the window's history; negatives are drawn from the latest view only."""
    if not earlier:
        return StackedPairs(
            latest, latest_pairs, np.flatnonzero(latest.node_type == "item"), (len(latest_pairs),)
        )
    periods = [(latest, latest_pairs)]
    periods += [(view, make_next_period_pairs(view, u, i, w)) for view, u, i, w in earlier]
    # Period k's rows keyed by _period_keys(id, k): period 0's keys are its ids, so the latest view stays whole
    # and real; an earlier period brings only the rows its pairs read.
    parts = [latest]
    for k, (view, own) in enumerate(periods[1:], start=1):
        taken = view.take(np.unique(np.concatenate([own.user_row, own.item_row])))
        parts.append(NeighbourhoodRows(_period_keys(taken.node_id, k), taken.node_type, taken.columns))
    rows = NeighbourhoodRows.concat(parts)

    def in_rows(view: NeighbourhoodRows, own: NextPeriodPairs, k: int) -> NextPeriodPairs:
        """The pairs with their rows moved from the period's view to the stacked rows (ids stay real)."""
        moved = [rows.index_of(_period_keys(view.node_id[r], k)) for r in (own.user_row, own.item_row)]
        return dataclasses.replace(own, user_row=moved[0], item_row=moved[1])

    stacked = [in_rows(view, own, k) for k, (view, own) in enumerate(periods)]
    fields = ("user_id", "item_id", "weight", "user_row", "item_row")
    pairs = NextPeriodPairs(
        *(np.concatenate([getattr(p, f) for p in stacked]) for f in fields),
        missing=sum(p.missing for p in stacked),
    )
    # The latest items' rows, in order: their ids are sorted, and so are the stacked rows'.
    corpus = rows.index_of(latest.node_id[latest.node_type == "item"])
    return StackedPairs(rows, pairs, corpus, tuple(len(p) for p in stacked))


@dataclass(frozen=True)
class RetrievalBatch:
    """One step's inputs: B users, their B positive items, M uniform negatives, and the loss's side tensors."""

    users: TokenBatch  # (B, L) input rows
    items: TokenBatch  # (B, L) input rows of the positives
    negatives: TokenBatch  # (M, L) input item rows drawn uniformly from the corpus
    positive_log_q: Tensor  # (B,) log expected count of each in-batch column among the candidates
    negative_log_q: Tensor  # (M,)
    in_batch_mask: Tensor  # (B, B) column j is one of row i's own positives
    negative_mask: Tensor  # (B, M)
    weights: Tensor  # (B,) stage weights
    # (U, L) served user rows drawn uniformly: the stability term's users (warm starts only)
    anchor_users: TokenBatch | None = None
    # Where the rows come from: users, items and negatives' numbers in the loader's input rows (B + B + M,) and
    # anchor_users' in its served rows (U,). The stability term reads the continued model's embedding of each
    # by these (PairBatches.embed_rows) instead of running it every step.
    input_rows: Tensor | None = None
    served_rows: Tensor | None = None

    def to(self, device: torch.device | str) -> RetrievalBatch:
        moved = lambda t: None if t is None else t.to(device)  # noqa: E731
        return RetrievalBatch(
            self.users.to(device),
            self.items.to(device),
            self.negatives.to(device),
            *(
                t.to(device)
                for t in (
                    self.positive_log_q,
                    self.negative_log_q,
                    self.in_batch_mask,
                    self.negative_mask,
                    self.weights,
                )
            ),
            moved(self.anchor_users),
            moved(self.input_rows),
            moved(self.served_rows),
        )


class PairBatches:
    """The trainer's loader: RetrievalBatch for steps [start_step, steps).

    An epoch is a seeded shuffle of the pairs cut into balanced batches of at most `batch_size`; each step draws
    its `negatives` corpus items and its `anchor_users` served user rows uniformly without replacement, seeded by
    the step.
    """

    def __init__(
        self,
        inputs: NeighbourhoodRows,
        served: NeighbourhoodRows,
        pairs: NextPeriodPairs,
        batch_size: int,
        negatives: int,
        steps: int,
        seed: int,
        content: ContentTable | None = None,
        start_step: int = 0,
        anchor_users: int = 0,
        corpus: np.ndarray | None = None,
    ) -> None:
        if batch_size < 2 or negatives < 0 or steps < 0 or anchor_users < 0:
            raise ValueError("batch_size must be >= 2, negatives, anchor_users and steps >= 0")
        if len(pairs) < 2:
            raise ValueError(f"need at least 2 next-period pairs to train, got {len(pairs)}")
        self.inputs, self.served, self.pairs, self.content = inputs, served, pairs, content
        self.batch_size, self.steps, self.seed, self.start_step = batch_size, steps, seed, start_step
        # The rows negatives are drawn from: every item row, or (stacked periods) the latest period's.
        self.corpus = np.flatnonzero(inputs.node_type == "item") if corpus is None else np.asarray(corpus)
        self.negatives = min(negatives, len(self.corpus))
        self.user_corpus = np.flatnonzero(served.node_type == "user")
        self.anchor_users = min(anchor_users, len(self.user_corpus))
        # Dense codes of users and items make each (user, item) pair one exact int64 key.
        self.user_codes, user_index = np.unique(pairs.user_id, return_inverse=True)
        self.item_codes, item_index = np.unique(pairs.item_id, return_inverse=True)
        self.keys = np.unique(user_index.astype(np.int64) * len(self.item_codes) + item_index)
        self.pair_user, self.pair_item = user_index, item_index
        counts = np.bincount(item_index, minlength=len(self.item_codes))
        self.item_share = (counts / len(pairs)).astype(np.float64)  # in-batch sampling probability per item

    @property
    def batches_per_epoch(self) -> int:
        return math.ceil(len(self.pairs) / self.batch_size)

    def _is_positive(self, user_index: np.ndarray, item_ids: np.ndarray) -> np.ndarray:
        """(B, C) True where item_ids[c] is one of user_index[b]'s pairs."""
        pos = np.searchsorted(self.item_codes, item_ids).clip(max=len(self.item_codes) - 1)
        known = self.item_codes[pos] == item_ids
        keys = user_index[:, None].astype(np.int64) * len(self.item_codes) + pos[None, :]
        slot = np.searchsorted(self.keys, keys).clip(max=len(self.keys) - 1)
        return known[None, :] & (self.keys[slot] == keys)

    def batch(
        self, pair_index: np.ndarray, negative_rows: np.ndarray, anchor_rows: np.ndarray | None = None
    ) -> RetrievalBatch:
        p = self.pairs
        users = self.inputs.batch(p.user_row[pair_index], self.content)
        items = self.inputs.batch(p.item_row[pair_index], self.content)
        negatives = self.inputs.batch(negative_rows, self.content)
        user_index = self.pair_user[pair_index]
        in_batch_mask = self._is_positive(user_index, p.item_id[pair_index])
        negative_mask = self._is_positive(user_index, self.inputs.node_id[negative_rows])
        b, m = len(pair_index), len(negative_rows)
        input_rows = np.concatenate([p.user_row[pair_index], p.item_row[pair_index], negative_rows])
        positive_log_q = np.log(b * self.item_share[self.pair_item[pair_index]])
        negative_log_q = np.full(m, math.log(m / len(self.corpus)) if m else 0.0)
        return RetrievalBatch(
            users,
            items,
            negatives,
            torch.from_numpy(positive_log_q.astype(np.float32)),
            torch.from_numpy(negative_log_q.astype(np.float32)),
            torch.from_numpy(in_batch_mask),
            torch.from_numpy(negative_mask),
            torch.from_numpy(p.weight[pair_index].copy()),
            None if anchor_rows is None else self.served.batch(anchor_rows, self.content),
            torch.from_numpy(input_rows.astype(np.int64)),
            None if anchor_rows is None else torch.from_numpy(anchor_rows.astype(np.int64)),
        )

    def embed_rows(self, embed: Callable[[TokenBatch], Tensor], chunk: int = 512) -> tuple[Tensor, Tensor]:
        """`embed` of every input row (N, D) and of every served user row (the served rows' count, D; zero for
        the items, which are never drawn): one pass in chunks of `chunk` rows of similar length (the batch is cut
        to its longest), in a fixed order, so a resumed run reads the same numbers as an uninterrupted one."""

        def table(rows: NeighbourhoodRows, wanted: np.ndarray) -> Tensor:
            wanted = wanted[np.argsort(rows.columns["num_tokens"][wanted], kind="stable")]
            out: Tensor | None = None
            for start in range(0, len(wanted), chunk):
                index = wanted[start : start + chunk]
                values = embed(rows.batch(index, self.content))
                if out is None:
                    out = values.new_zeros(len(rows), values.shape[1])
                out[torch.from_numpy(index).to(out.device)] = values
            return out if out is not None else torch.zeros(len(rows), 0)

        return table(self.inputs, np.arange(len(self.inputs))), table(self.served, self.user_corpus)

    def __iter__(self) -> Iterator[RetrievalBatch]:
        per_epoch = self.batches_per_epoch
        epoch, order = -1, None
        for step in range(self.start_step, self.steps):
            if step // per_epoch != epoch:
                epoch = step // per_epoch
                order = np.random.default_rng([self.seed, epoch]).permutation(len(self.pairs))
            index = step % per_epoch
            start = index * len(self.pairs) // per_epoch
            end = (index + 1) * len(self.pairs) // per_epoch
            negative_rows = self._draw(self.corpus, self.negatives, stream=1, step=step)
            anchor_rows = (
                self._draw(self.user_corpus, self.anchor_users, stream=3, step=step)
                if self.anchor_users
                else None
            )
            yield self.batch(order[start:end], negative_rows, anchor_rows)

    def _draw(self, corpus: np.ndarray, count: int, stream: int, step: int) -> np.ndarray:
        """`count` rows of `corpus` uniformly without replacement, sorted; seeded by (seed, stream, step) so each
        kind of draw is its own stream and a resumed run draws what an uninterrupted one did."""
        rng = np.random.default_rng([self.seed, stream, step])
        return np.sort(rng.choice(corpus, count, replace=False))

    def __len__(self) -> int:
        return max(self.steps - self.start_step, 0)
