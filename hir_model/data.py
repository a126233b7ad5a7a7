"""Training data: the day's neighbourhood rows read from an exact list of Parquet files, and the batches built from
them. No Spark here: the training job resolves a Delta snapshot to its files and hands them over.

Two readers sit behind one small interface (`RowReader.read(files, columns) -> columns as numpy arrays`):

* `PetastormReader`: petastorm's `make_batch_reader` over the file URLs (the pipeline's default, DESIGN.md), and
* `PyarrowReader`: `pyarrow.parquet`, file by file.

Files are paths or URIs (file:, s3a://, hdfs://) opened through hir_model.storage, with its S3 settings.

Both return the same arrays, so the trainer never depends on one library (tests/hir_model/test_data.py).

Determinism: the rows are put in a canonical order (sorted by target node id) after reading, so the batches depend
only on the rows, the batch size and the seed: not on the reader, the file order or how Spark split the day into
files (hir_model.pairs builds the training batches on them).

Memory trade-off: the whole day's neighbourhood rows are held in memory (about 33 bytes per token: 64 tokens make
~2 KB a row, so 1M target nodes take ~2 GB; content vectors add 4 bytes x content_dim per entity). That buys a true
uniform shuffle and random access to each converted item's row. A day too large for one machine needs the
pairs joined in Spark and streamed with a row-group shuffle instead (a buffer-limited, less uniform shuffle).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlparse

import numpy as np
import torch

from hir_model import storage
from hir_model.batch import TOKEN_COLUMNS, ContentTable, TokenBatch, batch_from_columns, drop_with_descendants
from schemas.codes import NODE_TYPES

# Columns of schemas.tables.NEIGHBOURHOODS the model reads (the partition column ds is not in the files).
NEIGHBOURHOOD_COLUMNS: tuple[str, ...] = ("node_id", "node_type", "num_tokens", *TOKEN_COLUMNS)
# Columns of schemas.tables.ENTITY_CONTENT the model reads.
CONTENT_COLUMNS: tuple[str, ...] = ("node_id", "vector")

# In-memory dtypes: the table's own widths (int32 codes), widened to int64 only per batch by batch_from_columns.
_DTYPES: dict[str, type] = {
    "node_id": np.int64,
    "num_tokens": np.int32,
    "token_node_id": np.int64,
    "token_node_type": np.int32,
    "token_edge_type": np.int32,
    "token_hop": np.int32,
    "token_parent_pos": np.int32,
    "token_recency": np.int32,
    "token_weight": np.float32,
    "token_is_deep": np.bool_,
    "vector": np.float32,
}


def file_url(path: str) -> str:
    """An absolute URL for a file: `/x` and Hadoop's `file:/x` become `file:///x`; other schemes pass through."""
    parsed = urlparse(path)
    if parsed.scheme in ("", "file"):
        return "file://" + parsed.path
    return path


# -- readers ---------------------------------------------------------------------------------------------------


class RowReader(Protocol):
    """Reads every row of `files`, in file order, as one numpy array per column.

    Scalar columns come back as (N,) arrays, list columns of equal length as (N, L) arrays, strings as object
    arrays. An empty file list gives empty columns.
    """

    name: str

    def read(self, files: Sequence[str], columns: Sequence[str]) -> dict[str, np.ndarray]: ...


def _as_column(name: str, chunks: list[np.ndarray]) -> np.ndarray:
    """Concatenate per-batch arrays of one column; list columns become 2-D, with the column's in-memory dtype."""
    dtype = _DTYPES.get(name)
    parts = []
    for chunk in chunks:
        if chunk.dtype == object and len(chunk) and isinstance(chunk[0], np.ndarray | list):
            chunk = np.stack([np.asarray(v) for v in chunk]) if len(chunk) else chunk
        parts.append(chunk)
    parts = [p for p in parts if len(p)]
    if not parts:
        return np.zeros(0, dtype=dtype or object)
    try:
        column = np.concatenate(parts)
    except ValueError as err:
        raise ValueError(f"column {name}: rows have different list lengths across files") from err
    if dtype is not None:
        return column.astype(dtype, copy=False)
    # Strings: petastorm gives fixed-width numpy strings, pyarrow Python objects; settle on objects.
    return column.astype(object) if column.dtype.kind in "US" else column


class PyarrowReader:
    """pyarrow.parquet, one file after another; each file's footer is checked for the columns first."""

    name = "pyarrow"

    def read(self, files: Sequence[str], columns: Sequence[str]) -> dict[str, np.ndarray]:
        import pyarrow.parquet as pq

        chunks: dict[str, list[np.ndarray]] = {c: [] for c in columns}
        for url in files:
            fs, path = storage.filesystem(url)
            with fs.open_input_file(path) as handle:
                table = pq.ParquetFile(handle).read(columns=list(columns))
            for name in columns:
                chunks[name].append(_arrow_to_numpy(table.column(name)))
        return {name: _as_column(name, parts) for name, parts in chunks.items()}


def arrow_columns(table, columns: Sequence[str]) -> dict[str, np.ndarray]:
    """Columns of an in-memory Arrow table as the readers return them (what Spark's toArrow gives)."""
    return {name: _as_column(name, [_arrow_to_numpy(table.column(name))]) for name in columns}


def _arrow_to_numpy(column) -> np.ndarray:
    """A (chunked) Arrow column as numpy: fixed-length lists as (N, L) without a Python loop."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
        values = column.flatten().to_numpy(zero_copy_only=False)
        if len(lengths) and (lengths == lengths[0]).all():
            return values.reshape(len(lengths), int(lengths[0]) if len(lengths) else 0)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        out = np.empty(len(lengths), dtype=object)
        out[:] = [values[offsets[i] : offsets[i + 1]] for i in range(len(lengths))]
        return out
    return column.to_numpy(zero_copy_only=False)


class PetastormReader:
    """petastorm's make_batch_reader over the exact file URLs, one row group per batch, in file order.

    Settings that work with pyarrow 14 and keep the order: the dummy pool (rows decoded in this thread, in order;
    the thread pool yields row groups as they finish), no row-group shuffle (we shuffle after canonical sorting),
    one epoch.
    """

    name = "petastorm"

    def read(self, files: Sequence[str], columns: Sequence[str]) -> dict[str, np.ndarray]:
        chunks: dict[str, list[np.ndarray]] = {c: [] for c in columns}
        if files:
            from petastorm import make_batch_reader

            with warnings.catch_warnings():
                # petastorm 0.12 calls pyarrow's legacy ParquetDataset API, deprecated (not broken) in pyarrow 14.
                warnings.simplefilter("ignore", FutureWarning)
                warnings.simplefilter("ignore", DeprecationWarning)
                with make_batch_reader(
                    [file_url(f) for f in files],
                    # A remote store's filesystem with the configured settings; petastorm resolves local paths.
                    # (On s3a:// petastorm 0.12 still strips the scheme with fsspec, which needs s3fs.)
                    filesystem=None if storage.is_local(files[0]) else storage.filesystem(files[0])[0],
                    schema_fields=list(columns),
                    reader_pool_type="dummy",
                    workers_count=1,
                    shuffle_row_groups=False,
                    num_epochs=1,
                ) as reader:
                    for batch in reader:
                        values = batch._asdict()
                        for name in columns:
                            chunks[name].append(np.asarray(values[name]))
        return {name: _as_column(name, parts) for name, parts in chunks.items()}


READERS: dict[str, type] = {"petastorm": PetastormReader, "pyarrow": PyarrowReader}


def make_reader(name: str) -> RowReader:
    if name not in READERS:
        raise ValueError(f"unknown loader '{name}' (choose from {', '.join(READERS)})")
    return READERS[name]()


def parquet_row_counts(files: Sequence[str]) -> list[int]:
    """Rows per file from the Parquet footers (no data read)."""
    import pyarrow.parquet as pq

    counts = []
    for url in files:
        fs, path = storage.filesystem(url)
        with fs.open_input_file(path) as handle:
            counts.append(pq.ParquetFile(handle).metadata.num_rows)
    return counts


# -- the day's rows ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NeighbourhoodRows:
    """The day's neighbourhood rows in canonical order (sorted by target node id, which is unique per day)."""

    node_id: np.ndarray  # (N,) int64, sorted
    node_type: np.ndarray  # (N,) object (str): user, item, advertiser, category
    columns: dict[str, np.ndarray]  # num_tokens (N,) and the token columns (N, L)

    @classmethod
    def from_columns(cls, columns: dict[str, np.ndarray]) -> NeighbourhoodRows:
        missing = [c for c in NEIGHBOURHOOD_COLUMNS if c not in columns]
        if missing:
            raise ValueError(f"neighbourhood columns missing: {', '.join(missing)}")
        node_id = np.asarray(columns["node_id"], dtype=np.int64)
        order = np.argsort(node_id, kind="stable")
        node_id = node_id[order]
        duplicated = node_id[1:][node_id[1:] == node_id[:-1]]
        if len(duplicated):
            raise ValueError(f"node {int(duplicated[0])} has more than one neighbourhood row in the day")
        tokens = {c: np.asarray(columns[c])[order] for c in ("num_tokens", *TOKEN_COLUMNS)}
        if len(node_id) and tokens["token_node_id"].ndim != 2:
            raise ValueError(
                "token arrays have different lengths: neighbourhood rows must be padded to max_tokens"
            )
        return cls(node_id, np.asarray(columns["node_type"], dtype=object)[order], tokens)

    def __len__(self) -> int:
        return len(self.node_id)

    @property
    def max_tokens(self) -> int:
        return int(self.columns["token_node_id"].shape[1]) if len(self) else 0

    def index_of(self, node_ids: np.ndarray) -> np.ndarray:
        """Row index per node id, -1 where the node has no row."""
        node_ids = np.asarray(node_ids, dtype=np.int64)
        if not len(self):
            return np.full(node_ids.shape, -1, dtype=np.int64)
        pos = np.searchsorted(self.node_id, node_ids).clip(max=len(self) - 1)
        return np.where(self.node_id[pos] == node_ids, pos, -1)

    def take(self, rows: np.ndarray) -> NeighbourhoodRows:
        """Rows `rows` (in node id order)."""
        return NeighbourhoodRows.from_columns(
            {"node_id": self.node_id[rows], "node_type": self.node_type[rows]}
            | {c: v[rows] for c, v in self.columns.items()}
        )

    def without_users(self) -> NeighbourhoodRows:
        """Every row without its user tokens past the target and the tokens under them: an item as it stood
        before anyone engaged with it (its category, brand and content stay)."""
        hop = self.columns["token_hop"]
        real = np.arange(self.max_tokens)[None, :] < self.columns["num_tokens"][:, None]
        users = real & (self.columns["token_node_type"] == NODE_TYPES["user"]) & (hop > 0)
        kept = keep_tokens(self.columns, real & ~with_descendants(users, self.columns))
        return NeighbourhoodRows.from_columns({"node_id": self.node_id, "node_type": self.node_type} | kept)

    @classmethod
    def concat(cls, parts: Sequence[NeighbourhoodRows]) -> NeighbourhoodRows:
        """One set of rows from several of the same width, with no node in two of them."""
        widths = {p.max_tokens for p in parts if len(p)}
        if len(widths) > 1:
            raise ValueError(f"neighbourhood rows of different widths {sorted(widths)} cannot be joined")
        columns = {"node_id": np.concatenate([p.node_id for p in parts])}
        columns["node_type"] = np.concatenate([p.node_type for p in parts])
        for c in parts[0].columns:
            columns[c] = np.concatenate([p.columns[c] for p in parts if len(p)] or [parts[0].columns[c]])
        return cls.from_columns(columns)

    def batch(self, rows: np.ndarray, content: ContentTable | None = None) -> TokenBatch:
        """Rows `rows` as a TokenBatch cut to the longest of them: the positions after every row's last token are
        padding for all of them (the attention ignores padding), and a Taobao item averages 6 of its 64."""
        num_tokens = self.columns["num_tokens"][rows]
        width = int(num_tokens.max()) if len(rows) else self.max_tokens
        batch = batch_from_columns(
            {c: v[rows] if v.ndim == 1 else v[rows, :width] for c, v in self.columns.items()}
        )
        return content.attach(batch) if content is not None else batch


def with_descendants(drop: np.ndarray, columns: dict[str, np.ndarray]) -> np.ndarray:
    """A (N, L) mask of rows' tokens extended to every token under one of them (hir_model.batch's rule)."""
    tensor = lambda name: torch.from_numpy(np.ascontiguousarray(columns[name]))  # noqa: E731
    return drop_with_descendants(
        torch.from_numpy(drop), tensor("token_parent_pos"), tensor("token_hop")
    ).numpy()


def keep_tokens(columns: dict[str, np.ndarray], keep: np.ndarray) -> dict[str, np.ndarray]:
    """The token columns with only the `keep` (N, L) tokens, moved to the front, parents renumbered."""
    new_pos = np.cumsum(keep, axis=1) - 1  # (N, L): where each kept token lands
    parent = columns["token_parent_pos"]
    columns = dict(columns)
    columns["token_parent_pos"] = np.where(
        parent >= 0, np.take_along_axis(new_pos, np.maximum(parent, 0), axis=1), -1
    ).astype(parent.dtype)
    order = np.argsort(~keep, axis=1, kind="stable")  # kept tokens first, in their order
    out = {c: np.take_along_axis(v, order, axis=1) for c, v in columns.items() if v.ndim == 2}
    out["num_tokens"] = keep.sum(axis=1).astype(np.int32)
    return out


def read_neighbourhoods(reader: RowReader, files: Sequence[str]) -> NeighbourhoodRows:
    return NeighbourhoodRows.from_columns(reader.read(files, NEIGHBOURHOOD_COLUMNS))


def read_content(reader: RowReader, files: Sequence[str]) -> ContentTable | None:
    """entity_content's (node_id, vector) as a ContentTable; None when the table has no rows."""
    columns = reader.read(files, CONTENT_COLUMNS)
    if not len(columns["node_id"]):
        return None
    if columns["vector"].ndim != 2:
        raise ValueError("entity_content vectors have different lengths: one encoder per table")
    return ContentTable(columns["node_id"], columns["vector"])


def row_batches(
    rows: NeighbourhoodRows, batch_size: int, content: ContentTable | None = None
) -> Iterator[TokenBatch]:
    """Every row once, in canonical order, for embedding the day's entities."""
    for start in range(0, len(rows), batch_size):
        yield rows.batch(np.arange(start, min(start + batch_size, len(rows))), content)
