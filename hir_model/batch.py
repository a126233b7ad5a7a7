"""Token batches: the neighbourhood table's token arrays as tensors, and the student's sparse view of them.

A row is one target node's sampled neighbourhood tree (schemas.tables.NEIGHBOURHOODS): position 0 is the target,
then hop-1 tokens, then hop-2 tokens, each pointing at its parent with `parent_pos`. A token is padding when its
node type is 0 (schemas.codes.PAD); the model never reads anything else to decide that, so masking a token out
(the sparse view) and padding are the same thing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from schemas.codes import PAD

# Column names of the neighbourhood table (schemas.tables.NEIGHBOURHOODS), mapped to TokenBatch fields.
TOKEN_COLUMNS: dict[str, str] = {
    "token_node_id": "node_id",
    "token_node_type": "node_type",
    "token_edge_type": "edge_type",
    "token_hop": "hop",
    "token_parent_pos": "parent_pos",
    "token_recency": "recency",
    "token_weight": "weight",
    "token_is_deep": "is_deep",
}
_COLUMN_DTYPES: dict[str, Any] = {
    "token_node_id": np.int64,
    "token_node_type": np.int64,
    "token_edge_type": np.int64,
    "token_hop": np.int64,
    "token_parent_pos": np.int64,
    "token_recency": np.int64,
    "token_weight": np.float32,
    "token_is_deep": np.bool_,
}
# Value a padding token carries in each field.
_PAD_VALUES: dict[str, Any] = {
    "node_id": 0,
    "node_type": PAD,
    "edge_type": PAD,
    "hop": 0,
    "parent_pos": -1,
    "recency": 0,
    "weight": 0.0,
    "is_deep": False,
}


@dataclass(frozen=True)
class TokenBatch:
    """B neighbourhood trees of L tokens each. Shapes: token fields (B, L), num_tokens (B,)."""

    node_id: Tensor  # (B, L) int64, raw graph node id (hashed into buckets by the encoder)
    node_type: Tensor  # (B, L) int64, schemas.codes.NODE_TYPES, 0 = padding
    edge_type: Tensor  # (B, L) int64, edge linking the token to its parent, 1 = self (the target)
    hop: Tensor  # (B, L) int64, 0 target, 1 or 2 neighbours
    parent_pos: Tensor  # (B, L) int64, position of the parent token, -1 for the target and padding
    recency: Tensor  # (B, L) int64, recency bucket of the edge
    weight: Tensor  # (B, L) float32, edge weight
    is_deep: Tensor  # (B, L) bool, deep-funnel edge (cart, purchase)
    num_tokens: Tensor  # (B,) int64, real tokens per row
    content: Tensor | None = None  # (B, L, content_dim) float32
    has_content: Tensor | None = None  # (B, L) bool

    @property
    def batch_size(self) -> int:
        return self.node_id.shape[0]

    @property
    def max_tokens(self) -> int:
        return self.node_id.shape[1]

    @property
    def device(self) -> torch.device:
        return self.node_id.device

    @property
    def is_real(self) -> Tensor:
        """(B, L) bool: True for real tokens, False for padding and masked-out tokens."""
        return self.node_type != PAD

    def to(self, device: torch.device | str) -> TokenBatch:
        return TokenBatch(**{k: None if v is None else v.to(device) for k, v in self._fields().items()})

    def select(self, index: Tensor | Sequence[int]) -> TokenBatch:
        """Rows `index` of the batch (a sub-batch)."""
        index = torch.as_tensor(index, dtype=torch.long, device=self.device)
        return TokenBatch(**{k: None if v is None else v[index] for k, v in self._fields().items()})

    def replace(self, **fields: Tensor | None) -> TokenBatch:
        return dataclasses.replace(self, **fields)

    def _fields(self) -> dict[str, Tensor | None]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def _as_matrix(name: str, column: Any, dtype: Any) -> np.ndarray:
    """A (B, L) array from a 2-D array, a list of lists, or an object array of per-row arrays (pandas + Arrow)."""
    array = np.asarray(column)
    if array.dtype == object or array.ndim == 1:
        if len(array) == 0:
            raise ValueError(f"column {name} is empty")
        try:
            array = np.stack(array)
        except ValueError as err:
            raise ValueError(
                f"column {name}: rows have different lengths; the neighbourhoods table pads every row to max_tokens"
            ) from err
    if array.ndim != 2:
        raise ValueError(f"column {name}: expected one token array per row, got shape {array.shape}")
    return array.astype(dtype, copy=False)


def batch_from_columns(columns: dict[str, Any]) -> TokenBatch:
    """Build a TokenBatch from the neighbourhood table's columns (names as in schemas.tables.NEIGHBOURHOODS).

    Columns may be 2-D arrays, lists of lists, or numpy object arrays of per-row arrays (what pandas returns for
    Arrow list columns). Positions >= num_tokens are forced to padding whatever they hold.
    """
    missing = [c for c in (*TOKEN_COLUMNS, "num_tokens") if c not in columns]
    if missing:
        raise ValueError(f"neighbourhood columns missing: {', '.join(missing)}")
    arrays = {c: _as_matrix(c, columns[c], _COLUMN_DTYPES[c]) for c in TOKEN_COLUMNS}
    shapes = {c: a.shape for c, a in arrays.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"token columns have different shapes: {shapes}")
    num_rows, max_tokens = arrays["token_node_id"].shape
    num_tokens = np.asarray(columns["num_tokens"], dtype=np.int64).reshape(-1)
    if num_tokens.shape != (num_rows,):
        raise ValueError(f"num_tokens has {num_tokens.shape[0]} rows, token columns have {num_rows}")
    _check_rows(arrays, num_tokens, max_tokens)

    padding = np.arange(max_tokens)[None, :] >= num_tokens[:, None]  # (B, L)
    fields: dict[str, Tensor] = {}
    for column, field in TOKEN_COLUMNS.items():
        array = arrays[column]
        if padding.any():
            array = np.where(padding, np.asarray(_PAD_VALUES[field], dtype=array.dtype), array)
        fields[field] = torch.from_numpy(np.ascontiguousarray(array))
    return TokenBatch(**fields, num_tokens=torch.from_numpy(num_tokens.copy()))


def _check_rows(arrays: dict[str, np.ndarray], num_tokens: np.ndarray, max_tokens: int) -> None:
    """Reject rows that break the table's contract, naming the first bad row."""

    def fail(what: str, rows: np.ndarray) -> None:
        raise ValueError(f"neighbourhood row {int(np.flatnonzero(rows)[0])}: {what}")

    bad = (num_tokens < 1) | (num_tokens > max_tokens)
    if bad.any():
        fail(f"num_tokens must be in [1, {max_tokens}]", bad)
    inside = np.arange(max_tokens)[None, :] < num_tokens[:, None]  # (B, L)
    bad = (inside & (arrays["token_node_type"] == PAD)).any(axis=1)
    if bad.any():
        fail("a token inside num_tokens has node type 0 (padding)", bad)
    parent = arrays["token_parent_pos"]
    neighbour = inside.copy()
    neighbour[:, 0] = False
    positions = np.arange(max_tokens)[None, :]
    bad = (neighbour & ((parent < 0) | (parent >= positions))).any(axis=1)
    if bad.any():
        fail("a neighbour token's parent_pos does not point at an earlier token", bad)


def mask_tokens(batch: TokenBatch, drop: Tensor) -> TokenBatch:
    """Turn the tokens where `drop` (B, L) is True into padding; shapes stay the same."""
    fields: dict[str, Tensor | None] = {}
    for field, pad_value in _PAD_VALUES.items():
        value = getattr(batch, field)
        fields[field] = value.masked_fill(drop, pad_value)
    has_content = None if batch.has_content is None else batch.has_content & ~drop
    content = None if batch.content is None else batch.content.masked_fill(drop[..., None], 0.0)
    num_tokens = (fields["node_type"] != PAD).sum(dim=1)
    return TokenBatch(**fields, num_tokens=num_tokens, content=content, has_content=has_content)


def drop_with_descendants(drop: Tensor, parent_pos: Tensor, hop: Tensor) -> Tensor:
    """Extend a (B, L) drop mask to every token whose parent (or grand-parent ...) is dropped; `parent_pos` and
    `hop` are the rows' (B, L) token columns (a TokenBatch's, or a NeighbourhoodRows' as tensors)."""
    has_parent = parent_pos >= 0
    parent = parent_pos.clamp(min=0).long()
    # One pass per level of the tree: hop-2 tokens inherit from hop-1 parents, which never inherit from the target.
    for _ in range(int(hop.max().item()) if hop.numel() else 0):
        drop = drop | (has_parent & drop.gather(1, parent))
    return drop


def sparse_view(batch: TokenBatch, generator: torch.Generator, token_dropout: float) -> TokenBatch:
    """The student's view: no deep-funnel tokens, and a random `token_dropout` share of neighbours dropped.

    A dropped token takes its descendants with it (a hop-2 token under a removed hop-1 token goes too). The target
    (hop 0) is never dropped. Tokens are masked into padding, so the batch keeps its shape.
    """
    neighbour = batch.is_real & (batch.hop > 0)
    drop = batch.is_deep & neighbour
    if token_dropout > 0:
        coin = torch.rand(batch.node_id.shape, generator=generator, device=generator.device).to(batch.device)
        drop = drop | (neighbour & (coin < token_dropout))
    drop = drop_with_descendants(drop, batch.parent_pos, batch.hop) & neighbour
    return mask_tokens(batch, drop)


class ContentTable:
    """Content embeddings by node id, attached to the tokens of a batch (entity_content -> TokenBatch.content).

    Build it once per worker from the entity_content table (node_id, vector); `attach` looks each token's node id
    up with a binary search, so tokens without content get zeros and has_content False.
    """

    def __init__(self, node_ids: np.ndarray | Tensor, vectors: np.ndarray | Tensor) -> None:
        node_ids = torch.as_tensor(np.asarray(node_ids), dtype=torch.long)
        vectors = torch.as_tensor(np.asarray(vectors), dtype=torch.float32)
        if vectors.ndim != 2 or vectors.shape[0] != node_ids.shape[0]:
            raise ValueError(
                f"expected one vector per node id, got ids {node_ids.shape}, vectors {vectors.shape}"
            )
        order = torch.argsort(node_ids)
        self.node_ids = node_ids[order]  # (N,) sorted
        self.vectors = vectors[order]  # (N, content_dim)

    @property
    def content_dim(self) -> int:
        return self.vectors.shape[1]

    def attach(self, batch: TokenBatch) -> TokenBatch:
        if self.node_ids.device != batch.device:
            self.node_ids, self.vectors = self.node_ids.to(batch.device), self.vectors.to(batch.device)
        if self.node_ids.numel() == 0:
            found = torch.zeros_like(batch.is_real)
            content = torch.zeros(*batch.node_id.shape, self.content_dim, device=batch.device)
            return batch.replace(content=content, has_content=found)
        pos = torch.searchsorted(self.node_ids, batch.node_id).clamp(max=self.node_ids.numel() - 1)  # (B, L)
        found = (self.node_ids[pos] == batch.node_id) & batch.is_real
        content = self.vectors[pos] * found[..., None]  # (B, L, content_dim)
        return batch.replace(content=content, has_content=found)
