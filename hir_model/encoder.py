"""The HIR encoder: token features, pre-norm transformer blocks with tree attention, target token out.

tokens (B, L) --features--> (B, L, D) --blocks x layers--> (B, L, D) --position 0, project, L2--> (B, D)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hir_model.attention import HierarchicalAttention, TreeLayout, build_layout, resolve_backend
from hir_model.batch import TokenBatch
from hir_model.config import ModelConfig
from schemas.codes import NODE_TYPES, NUM_EDGE_TYPES, NUM_NODE_TYPES, PAD

# Scale of the bag projection at init: id embeddings start at std 0.02 (x2 hashes), the transformer output at ~0.1
# per dimension; 5 puts a row's own items on the same footing.
_BAG_INIT_GAIN = 5.0
# Starting weight of the neighbourhood bag's other slots (users, categories, hop-2 items) against the item slots'
# 1: present from the first step, small enough that the repeat signal leads until training says otherwise.
_NEIGHBOUR_SLOT_INIT = 0.25


def _signed64(value: int) -> int:
    """A 64-bit unsigned constant as the int64 torch stores it."""
    return value - (1 << 64) if value >= (1 << 63) else value


# splitmix64 constants (Steele et al. 2014): a cheap, well-mixing 64-bit finaliser.
_GOLDEN = _signed64(0x9E3779B97F4A7C15)
_MIX_1 = _signed64(0xBF58476D1CE4E5B9)
_MIX_2 = _signed64(0x94D049BB133111EB)


def _shift_right(x: Tensor, bits: int) -> Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic and would smear the sign bit)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def hash_node_ids(node_id: Tensor, node_type: Tensor, num_buckets: int, salt: int = 0) -> Tensor:
    """Bucket in [0, num_buckets) of each (node_type, node_id), by splitmix64 in int64 (wrap-around arithmetic).

    The node type is mixed in so equal raw ids of different types land apart; `salt` gives independent hashes.
    """
    z = node_id + _GOLDEN * (node_type * 64 + salt + 1)
    z = (z ^ _shift_right(z, 30)) * _MIX_1
    z = (z ^ _shift_right(z, 27)) * _MIX_2
    z = z ^ _shift_right(z, 31)
    return torch.remainder(z, num_buckets)


def bag_weights(batch: TokenBatch) -> Tensor:
    """(B, L) weight of each token in a row's id bag: 1 for the target, log1p of the edge weight for a neighbour
    (heavy-tailed counts x decay: a 100-event edge must not swamp the bag)."""
    return torch.where(batch.hop == 0, 1.0, torch.log1p(batch.weight.clamp(min=0)))


def bag_slot_init(max_hop: int) -> Tensor:
    """(S,) starting weights of the neighbourhood bag's slots, S = types x (max_hop + 1) x types: 1 for the slots
    the item bag reads (an item's own id, a user's history items), _NEIGHBOUR_SLOT_INIT for every other one."""
    scale = torch.full((NUM_NODE_TYPES, max_hop + 1, NUM_NODE_TYPES), _NEIGHBOUR_SLOT_INIT)
    item, user = NODE_TYPES["item"], NODE_TYPES["user"]
    scale[item, 0, item] = 1.0
    scale[user, 1, item] = 1.0
    scale[PAD] = 0.0  # no target is padding
    scale[:, :, PAD] = 0.0  # nor is any token the bag reads
    return scale.flatten()


class TokenFeatures(nn.Module):
    """Sum of per-token embeddings: hashed id, node type, edge type, hop, recency, log-weight and content."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        dim = config.dim
        # Sparse gradients: a step looks the table up about twenty times (two hashes x users, positives, negatives,
        # the student's views, the bag), and a dense gradient would zero and add the whole id_buckets x dim table
        # for each lookup. The trainer makes the sum dense once before AdamW (densify_sparse_grads), so the
        # update is the dense one: every row still decays (bench/train_step.py measures the difference).
        self.id_embedding = nn.Embedding(config.id_buckets, dim, sparse=True)
        self.node_type_embedding = nn.Embedding(NUM_NODE_TYPES, dim)
        self.edge_type_embedding = nn.Embedding(NUM_EDGE_TYPES, dim)
        self.hop_embedding = nn.Embedding(config.max_hop + 1, dim)
        self.recency_embedding = nn.Embedding(config.num_recency_buckets, dim)
        self.weight_proj = nn.Linear(1, dim)
        self.content_proj = nn.Linear(config.content_dim, dim) if config.content_enabled else None

    def id_vectors(self, batch: TokenBatch) -> Tensor:
        """(B, L, D) hashed id embedding of every token (the sum over the id hashes)."""
        cfg = self.config
        return sum(
            self.id_embedding(hash_node_ids(batch.node_id, batch.node_type, cfg.id_buckets, salt))
            for salt in range(cfg.num_id_hashes)
        )

    def forward(self, batch: TokenBatch) -> Tensor:
        cfg = self.config
        x = self.id_vectors(batch)  # (B, L, D)
        x = x + self.node_type_embedding(batch.node_type.clamp(0, NUM_NODE_TYPES - 1))
        x = x + self.edge_type_embedding(batch.edge_type.clamp(0, NUM_EDGE_TYPES - 1))
        x = x + self.hop_embedding(batch.hop.clamp(0, cfg.max_hop))
        x = x + self.recency_embedding(batch.recency.clamp(0, cfg.num_recency_buckets - 1))
        # Edge weights are heavy-tailed counts x decay: log1p keeps a 100-event edge from swamping the sum.
        x = x + self.weight_proj(torch.log1p(batch.weight.clamp(min=0)).unsqueeze(-1))
        # A batch without content (no ContentTable attached) simply has no content term.
        if self.content_proj is not None and batch.content is not None:
            if batch.content.shape[-1] != cfg.content_dim:
                raise ValueError(
                    f"batch content has dim {batch.content.shape[-1]}, model expects {cfg.content_dim}"
                )
            has_content = batch.has_content if batch.has_content is not None else batch.is_real
            x = x + self.content_proj(batch.content) * has_content.unsqueeze(-1)
        return x


class Block(nn.Module):
    """Pre-norm transformer block (nanoGPT) with hierarchical attention."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(config.dim)
        self.attn = HierarchicalAttention(
            config.dim,
            config.heads,
            num_edge_types=NUM_EDGE_TYPES,
            max_hop=config.max_hop,
            num_recency_buckets=config.num_recency_buckets,
            use_attention_bias=config.use_attention_bias,
        )
        self.ln_ffn = nn.LayerNorm(config.dim)
        self.ffn = nn.Sequential(
            nn.Linear(config.dim, config.ffn_mult * config.dim),
            nn.GELU(),
            nn.Linear(config.ffn_mult * config.dim, config.dim),
        )
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, layout: TreeLayout) -> Tensor:
        x = x + self.dropout(self.attn(self.ln_attn(x), layout))
        return x + self.dropout(self.ffn(self.ln_ffn(x)))


class HIREncoder(nn.Module):
    """Neighbourhood tree -> universal embedding of the target node, (B, dim), L2-normalised."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.features = TokenFeatures(config)
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.ln_out = nn.LayerNorm(config.dim)
        self.out_proj = nn.Linear(config.dim, config.dim)
        self.bag_proj = nn.Linear(config.dim, config.dim, bias=False) if config.use_item_bag else None
        # One learned weight per bag slot (target type, hop, token type); 1-D, so AdamW does not decay it.
        self.bag_slot_scale = (
            nn.Parameter(bag_slot_init(config.max_hop))
            if config.use_item_bag and config.bag_scope == "neighbourhood"
            else None
        )
        self.apply(self._init_weights)
        if self.bag_proj is not None:
            # Starts as the identity at a scale near the transformer output's: two rows holding the same item
            # score high from the first step, and training reshapes it.
            nn.init.eye_(self.bag_proj.weight)
            self.bag_proj.weight.data.mul_(_BAG_INIT_GAIN)
        # GPT-2 scaled init of the residual projections: keeps the residual stream's variance flat with depth.
        for name, param in self.named_parameters():
            if name.endswith("attn.proj.weight") or name.endswith("ffn.2.weight"):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * config.layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def layout(self, batch: TokenBatch) -> TreeLayout:
        cfg = self.config
        return build_layout(
            batch,
            resolve_backend(cfg.attention_backend, batch.device),
            cfg.use_hierarchy_mask,
            num_edge_types=NUM_EDGE_TYPES,
            max_hop=cfg.max_hop,
            num_recency_buckets=cfg.num_recency_buckets,
        )

    def encode_tokens(self, batch: TokenBatch) -> Tensor:
        """(B, L, dim) contextual token states after the last block (padding rows are meaningless)."""
        if batch.max_tokens > self.config.max_tokens:
            raise ValueError(
                f"batch has {batch.max_tokens} tokens per row, model max_tokens={self.config.max_tokens}"
            )
        layout = self.layout(batch)
        x = self.dropout(self.features(batch))
        for block in self.blocks:
            x = block(x, layout)
        return x

    def item_bag(self, batch: TokenBatch) -> Tensor:
        """(B, D): the weighted mean id embedding of the row's items at hop 0 and 1: an item row's is its own id,
        a user row's the items of its history (weights log1p of the edge weight). Its inner product between a
        user and an item is high when the item is in the user's row, in proportion to its weight there: the
        repeat signal, inside the embedding itself."""
        is_item = (batch.node_type == NODE_TYPES["item"]) & (batch.hop <= 1)
        weight = bag_weights(batch) * is_item
        total = weight.sum(dim=1, keepdim=True).clamp_min(1e-6)
        return (weight.unsqueeze(-1) * self.features.id_vectors(batch)).sum(dim=1) / total

    def neighbourhood_bag(self, batch: TokenBatch) -> Tensor:
        """(B, D): the id bag of the whole row, slot by slot. A slot is (target type, hop, token type); its vector
        is the weighted mean id embedding of the row's tokens in it (log1p of the edge weight; the target 1), and
        the bag is the sum of the slots' vectors, each times a learned weight.

        The inner product of two bags counts the nodes their rows share, slot pair by slot pair, as graph
        collaborative filtering's propagated embeddings do (LightGCN, He et al. 2020): a user's history items
        against an item's own id (a repeat), the users under the user's items (who else engaged with them)
        against the item's users (item co-visitation), the categories under the user's items against the item's
        category (category affinity, which reaches an item nobody engaged with yet)."""
        cfg = self.config
        node_type = batch.node_type.clamp(0, NUM_NODE_TYPES - 1)
        hop = batch.hop.clamp(0, cfg.max_hop)
        slot = (node_type[:, :1] * (cfg.max_hop + 1) + hop) * NUM_NODE_TYPES + node_type  # (B, L)
        weight = bag_weights(batch) * (batch.node_type != PAD)  # (B, L)
        ids = self.features.id_vectors(batch)  # (B, L, D)
        slots = self.bag_slot_scale.shape[0]
        sums = ids.new_zeros(ids.shape[0], slots, ids.shape[2]).scatter_add(
            1, slot.unsqueeze(-1).expand_as(ids), weight.unsqueeze(-1) * ids
        )  # (B, S, D)
        totals = weight.new_zeros(ids.shape[0], slots).scatter_add(1, slot, weight)  # (B, S)
        means = sums / totals.clamp_min(1e-6).unsqueeze(-1)
        return (means * self.bag_slot_scale[None, :, None]).sum(dim=1)

    def forward(self, batch: TokenBatch) -> Tensor:
        target = self.encode_tokens(batch)[:, 0]  # (B, D): position 0 is the target node
        out = self.out_proj(self.ln_out(target))
        if self.bag_slot_scale is not None:
            out = out + self.bag_proj(self.neighbourhood_bag(batch))
        elif self.bag_proj is not None:
            out = out + self.bag_proj(self.item_bag(batch))
        return F.normalize(out, dim=-1)
