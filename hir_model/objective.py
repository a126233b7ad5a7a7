"""The retrieval objective: predict each user's next-period engagements, a sampled softmax over mixed negatives.

PinnerFormer's dense all-action loss (Pancha et al. 2022) with mixed negative sampling (Yang et al. 2020):

    candidates of row i = the batch's positive items (in-batch, drawn in proportion to their pair count)
                        + M items drawn uniformly from the whole corpus
    logit(i, c)         = <user_i, item_c> / T - log E[count of c among the candidates]   (logQ correction)
    loss                = sum_i w_i * CE(row i, its own positive) / sum_i w_i

Each candidate carries the logQ of the distribution that drew it: `B * p(item)` for an in-batch column (B pairs
sampled uniformly, so an item appears in proportion to its share of the pairs) and `M / N` for a uniform one. A
column that is one of the row's own positives (another next-period engagement of the same user, or the same item
twice) is masked, never pushed down as a negative. `w_i` is the pair's funnel-stage weight: carts and purchases
count more than views, the upper-to-deep transfer the representation exists for.

Pure tensors; the batches come from hir_model.pairs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:
    from hir_model.pairs import RetrievalBatch


def mixed_negative_loss(
    users: Tensor,
    positives: Tensor,
    negatives: Tensor,
    positive_log_q: Tensor,
    negative_log_q: Tensor,
    in_batch_mask: Tensor,
    negative_mask: Tensor,
    weights: Tensor,
    temperature: float,
) -> Tensor:
    """Weighted sampled softmax of each user's positive against in-batch and uniform candidates.

    Shapes: users, positives (B, D); negatives (M, D) (M may be 0); positive_log_q (B,); negative_log_q (M,);
    in_batch_mask (B, B) True where column j must not count as a negative of row i (the diagonal is ignored);
    negative_mask (B, M) likewise; weights (B,) >= 0, not all 0.
    """
    batch = users.shape[0]
    if positives.shape[0] != batch or in_batch_mask.shape != (batch, batch):
        raise ValueError(f"{batch} users need {batch} positives and a ({batch}, {batch}) in-batch mask")
    if negative_mask.shape != (batch, negatives.shape[0]):
        raise ValueError(f"negative mask {tuple(negative_mask.shape)} != ({batch}, {negatives.shape[0]})")
    diagonal = torch.eye(batch, dtype=torch.bool, device=users.device)
    in_batch = users @ positives.T / temperature - positive_log_q[None, :]
    in_batch = in_batch.masked_fill(in_batch_mask & ~diagonal, float("-inf"))
    uniform = users @ negatives.T / temperature - negative_log_q[None, :]
    uniform = uniform.masked_fill(negative_mask, float("-inf"))
    logits = torch.cat([in_batch, uniform], dim=1)  # (B, B + M)
    labels = torch.arange(batch, device=users.device)
    losses = F.cross_entropy(logits, labels, reduction="none")
    weights = weights.to(losses.dtype)
    return (losses * weights).sum() / weights.sum().clamp_min(1e-12)


def batch_loss(
    batch: RetrievalBatch, users: Tensor, positives: Tensor, negatives: Tensor, temperature: float
) -> Tensor:
    """mixed_negative_loss of a RetrievalBatch's embeddings, with the batch's logQ, masks and weights."""
    return mixed_negative_loss(
        users,
        positives,
        negatives,
        batch.positive_log_q,
        batch.negative_log_q,
        batch.in_batch_mask,
        batch.negative_mask,
        batch.weights,
        temperature,
    )
