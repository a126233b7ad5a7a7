"""Bias-aware attention over a neighbourhood tree, with two backends of identical semantics.

Who sees whom (the hierarchy mask): a real token i attends to a real token j iff j is i itself, i's parent, one of
i's children, or the target (position 0); the target attends to every real token. A padding token attends only to
itself (so no softmax row is empty and nothing turns NaN); its output is ignored downstream and no real token
ever attends to it.

Learned additive biases, per head, by the *key* token's (edge type, hop) and by its recency bucket, tell the
model how much a purchase-edge neighbour counts against a view-edge one, or yesterday's against last month's.

Backends:
* "flex": `torch.nn.attention.flex_attention` with a `score_mod` adding the biases and a `block_mask` for tree and
  padding. Compiled with torch.compile on CUDA (fused kernel, never materialises the (B, H, L, L) scores).
  On CPU it runs eager, which in this torch version is forward-only (no backward) and unfused; it is there
  for inference and for checking agreement with SDPA.
* "sdpa": `F.scaled_dot_product_attention` with an additive float mask (bias, -inf where invisible), built dense
  as (B, H, L, L). Trains anywhere.
"auto" picks flex on CUDA and SDPA elsewhere.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from hir_model.batch import TokenBatch
from hir_model.config import ATTENTION_BACKENDS


def resolve_backend(requested: str, device: torch.device | str) -> str:
    """'flex' or 'sdpa' for a requested backend ('auto', 'flex', 'sdpa') on a device."""
    if requested not in ATTENTION_BACKENDS:
        raise ValueError(f"attention backend must be one of {ATTENTION_BACKENDS}, got {requested!r}")
    if requested != "auto":
        return requested
    return "flex" if torch.device(device).type == "cuda" else "sdpa"


def tree_visibility(parent_pos: Tensor, is_real: Tensor, use_hierarchy_mask: bool = True) -> Tensor:
    """(B, L, L) bool: entry [b, i, j] is True iff query token i may attend to key token j."""
    num_tokens = parent_pos.shape[1]
    pos = torch.arange(num_tokens, device=parent_pos.device)
    same = pos[:, None] == pos[None, :]  # (L, L)
    both_real = is_real[:, :, None] & is_real[:, None, :]  # (B, L, L)
    if not use_hierarchy_mask:
        return both_real | same
    key_is_parent = parent_pos[:, :, None] == pos[None, None, :]  # (B, L, L): j == parent(i)
    key_is_child = parent_pos[:, None, :] == pos[None, :, None]  # (B, L, L): i == parent(j)
    with_target = (pos[None, :] == 0) | (pos[:, None] == 0)  # (L, L): key is the target, or query is
    tree = same | key_is_parent | key_is_child | with_target
    return (both_real & tree) | same


def tree_mask_mod(parent_pos: Tensor, is_real: Tensor, use_hierarchy_mask: bool = True) -> Callable:
    """The same rule as `tree_visibility`, written point-wise for flex_attention's block mask."""

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        both_real = is_real[b, q_idx] & is_real[b, kv_idx]
        if not use_hierarchy_mask:
            return both_real | (q_idx == kv_idx)
        tree = (
            (q_idx == kv_idx)
            | (parent_pos[b, q_idx] == kv_idx)
            | (parent_pos[b, kv_idx] == q_idx)
            | (kv_idx == 0)
            | (q_idx == 0)
        )
        return (both_real & tree) | (q_idx == kv_idx)

    return mask_mod


@dataclass(frozen=True)
class TreeLayout:
    """What every attention layer needs about a batch's trees, computed once per forward."""

    backend: str  # "flex" or "sdpa"
    edge_type: Tensor  # (B, L) int64, clamped to the bias table
    hop: Tensor  # (B, L) int64, clamped
    recency: Tensor  # (B, L) int64, clamped
    visible: Tensor | None  # (B, L, L) bool, sdpa only
    block_mask: BlockMask | None  # flex only


def build_layout(
    batch: TokenBatch,
    backend: str,
    use_hierarchy_mask: bool,
    num_edge_types: int,
    max_hop: int,
    num_recency_buckets: int,
) -> TreeLayout:
    """Masks and bias indices for a batch; `backend` must already be resolved ('flex' or 'sdpa')."""
    if backend not in ("flex", "sdpa"):
        raise ValueError(f"build_layout needs a resolved backend ('flex' or 'sdpa'), got {backend!r}")
    is_real = batch.is_real
    visible = block_mask = None
    if backend == "sdpa":
        visible = tree_visibility(batch.parent_pos, is_real, use_hierarchy_mask)
    else:
        batch_size, num_tokens = batch.node_id.shape
        mask_mod = tree_mask_mod(batch.parent_pos, is_real, use_hierarchy_mask)
        block_mask = create_block_mask(
            mask_mod,
            batch_size,
            None,
            num_tokens,
            num_tokens,
            device=batch.device,
            _compile=batch.device.type == "cuda",
        )
    return TreeLayout(
        backend=backend,
        edge_type=batch.edge_type.clamp(0, num_edge_types - 1),
        hop=batch.hop.clamp(0, max_hop),
        recency=batch.recency.clamp(0, num_recency_buckets - 1),
        visible=visible,
        block_mask=block_mask,
    )


@functools.cache
def _compiled_flex_attention() -> Callable:
    # dynamic=False: L is fixed by the sampler's max_tokens, so one specialised kernel per batch shape.
    return torch.compile(flex_attention, dynamic=False)


def flex_tree_attention(
    q: Tensor, k: Tensor, v: Tensor, key_bias: Tensor | None, block_mask: BlockMask
) -> Tensor:
    """flex_attention with per-key biases (B, H, L) added to the scores; q, k, v are (B, H, L, Dh)."""
    score_mod = None
    if key_bias is not None:

        def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score + key_bias[b, h, kv_idx]

    if q.device.type == "cuda":
        return _compiled_flex_attention()(q, k, v, score_mod=score_mod, block_mask=block_mask)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, key_bias)):
        raise NotImplementedError(
            f"flex attention has no backward on {q.device.type} in torch {torch.__version__}: "
            "train with attention_backend='sdpa' (or 'auto'), or call under torch.no_grad()"
        )
    with warnings.catch_warnings():
        # Eager flex is intended off CUDA (see module docstring); its "use torch.compile" warning is noise here.
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)


def sdpa_tree_attention(q: Tensor, k: Tensor, v: Tensor, key_bias: Tensor | None, visible: Tensor) -> Tensor:
    """SDPA with a dense additive mask: key bias where visible (B, L, L), -inf elsewhere."""
    if key_bias is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible[:, None])  # bool mask, (B, 1, L, L)
    bias = key_bias.to(q.dtype)[:, :, None, :]  # (B, H, 1, L)
    attn_mask = bias.masked_fill(~visible[:, None], float("-inf"))  # (B, H, L, L)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)


class HierarchicalAttention(nn.Module):
    """Multi-head self-attention over a neighbourhood tree with edge/hop and recency biases on the keys."""

    def __init__(
        self,
        dim: int,
        heads: int,
        num_edge_types: int,
        max_hop: int,
        num_recency_buckets: int,
        use_attention_bias: bool = True,
    ) -> None:
        super().__init__()
        if dim % heads != 0:
            raise ValueError(f"dim ({dim}) must be divisible by heads ({heads})")
        self.heads = heads
        self.use_attention_bias = use_attention_bias
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        # Zero init: the model starts as plain tree attention and learns which edges/recencies matter.
        self.edge_hop_bias = nn.Parameter(torch.zeros(heads, num_edge_types, max_hop + 1))
        self.recency_bias = nn.Parameter(torch.zeros(heads, num_recency_buckets))

    def key_bias(self, layout: TreeLayout) -> Tensor | None:
        """(B, H, L) additive bias of each key token, or None when biases are switched off."""
        if not self.use_attention_bias:
            return None
        edge_hop = self.edge_hop_bias[:, layout.edge_type, layout.hop]  # (H, B, L)
        recency = self.recency_bias[:, layout.recency]  # (H, B, L)
        return (edge_hop + recency).permute(1, 0, 2)  # (B, H, L)

    def forward(self, x: Tensor, layout: TreeLayout) -> Tensor:
        batch_size, num_tokens, dim = x.shape
        q, k, v = self.qkv(x).split(dim, dim=2)
        q, k, v = (
            t.view(batch_size, num_tokens, self.heads, -1).transpose(1, 2) for t in (q, k, v)
        )  # (B, H, L, Dh)
        key_bias = self.key_bias(layout)
        if layout.backend == "flex":
            out = flex_tree_attention(q, k, v, key_bias, layout.block_mask)
        else:
            out = sdpa_tree_attention(q, k, v, key_bias, layout.visible)
        out = out.transpose(1, 2).reshape(batch_size, num_tokens, dim)  # (B, L, D)
        return self.proj(out)
