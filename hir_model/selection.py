"""Model selection on the training data itself: the stopping epoch is chosen on held-out users' next-period
engagements, never on an evaluation's targets.

The validation users (a seeded share, user-disjoint from training: NextPeriodPairs.split_users) are embedded from
their input rows, every corpus item from its served row, and each user's top-k corpus items by inner product are
scored against its next-period items: recall@k weighted by the pairs' stage weights, so a validated cart counts
as much in selection as in the loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from hir_model.batch import ContentTable, TokenBatch
from hir_model.data import NeighbourhoodRows
from hir_model.pairs import NextPeriodPairs

_BATCH = 1024  # rows per inference pass


def embed_rows(
    embed: Callable[[TokenBatch], Tensor],
    rows: NeighbourhoodRows,
    index: np.ndarray,
    content: ContentTable | None,
) -> Tensor:
    """Embeddings (len(index), dim) of rows `index`, in that order."""
    parts = [
        embed(rows.batch(index[start : start + _BATCH], content)).float().cpu()
        for start in range(0, len(index), _BATCH)
    ]
    return torch.cat(parts) if parts else torch.zeros(0, 0)


@dataclass(frozen=True)
class Validation:
    """Held-out users' next-period items, scored against the whole corpus."""

    inputs: NeighbourhoodRows
    served: NeighbourhoodRows
    pairs: NextPeriodPairs
    k: int = 50

    def recall(self, embed: Callable[[TokenBatch], Tensor], content: ContentTable | None = None) -> float:
        """Stage-weighted recall@k over the validation pairs (1.0 = every held-out engagement in its user's top k)."""
        corpus = np.flatnonzero(self.served.node_type == "item")
        users, user_of_pair = np.unique(self.pairs.user_row, return_inverse=True)
        user_emb = embed_rows(embed, self.inputs, users, content)
        item_emb = embed_rows(embed, self.served, corpus, content)
        k = min(self.k, len(corpus))
        top = torch.topk(user_emb @ item_emb.T, k, dim=1).indices.numpy()  # (U, k) corpus positions
        top_rows = corpus[top]
        hit = (top_rows[user_of_pair] == self.pairs.item_row[:, None]).any(axis=1)
        weights = self.pairs.weight.astype(np.float64)
        return float((hit * weights).sum() / weights.sum())
