"""Model selection on the training data itself: the stopping epoch is chosen on the engagements at the end of the
next period, held out by time (jobs.train.next_period), never on an evaluation's targets.

The users and every corpus item are embedded from their rows sampled from the events before the validation
cut-off: the graph as it stood before the engagements to predict, the view the training pairs have of theirs.
Two scores, both weighted by the pairs' stage weights (a validated cart counts as much in selection as in the
loss):

* recall@k of the users' top-k corpus items, per user and then averaged over the users: what selects the epoch
  (what the evaluation measures, and how it averages);
* the loss: the softmax cross-entropy of each next-period item over the **whole** corpus, reported beside it. It
  is smoother, but it rises while recall still improves (the model grows confident on near misses): selecting on
  it stopped Taobao after one epoch, at a third of the recall.
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
    """Held-out engagements, each scored against the whole corpus for its user; both ends rows of `rows`."""

    rows: NeighbourhoodRows
    pairs: NextPeriodPairs
    k: int = 50

    def score(
        self, embed: Callable[[TokenBatch], Tensor], temperature: float, content: ContentTable | None = None
    ) -> dict[str, float]:
        """{"loss": weighted full-corpus cross-entropy at `temperature`,
        "recall": the mean over users of each user's weighted recall@k}."""
        corpus = np.flatnonzero(self.rows.node_type == "item")
        users, user_of_pair = np.unique(self.pairs.user_row, return_inverse=True)
        user_emb = embed_rows(embed, self.rows, users, content)
        item_emb = embed_rows(embed, self.rows, corpus, content)
        scores = user_emb @ item_emb.T  # (U, N)
        k = min(self.k, len(corpus))
        top_rows = corpus[torch.topk(scores, k, dim=1).indices.numpy()]  # (U, k) rows
        hit = (top_rows[user_of_pair] == self.pairs.item_row[:, None]).any(axis=1)
        position = np.searchsorted(corpus, self.pairs.item_row)  # corpus column of each pair's item
        log_probs = torch.log_softmax(scores / temperature, dim=1)
        nll = -log_probs[torch.from_numpy(user_of_pair), torch.from_numpy(position)].double().numpy()
        weights = self.pairs.weight.astype(np.float64)
        # Recall per user (its weighted share of engagements found), then the mean over users, as the evaluation
        # averages: pooled over pairs, the heaviest users' many views would decide the epoch alone.
        found = np.bincount(user_of_pair, weights=hit * weights, minlength=len(users))
        total = np.bincount(user_of_pair, weights=weights, minlength=len(users))
        return {
            "loss": float((nll * weights).sum() / weights.sum()),
            "recall": float((found / total).mean()),
        }
