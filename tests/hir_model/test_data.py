"""hir_model.data: the petastorm and pyarrow readers give the same rows, and the batches are a pure function of
(rows, pairs, batch size, seed, step), whatever reader, file order or file split delivered the rows."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from hir_model.data import (
    CONTENT_COLUMNS,
    NEIGHBOURHOOD_COLUMNS,
    NeighbourhoodRows,
    PetastormReader,
    PyarrowReader,
    file_url,
    parquet_row_counts,
    read_content,
    read_neighbourhoods,
    row_batches,
)
from hir_model.pairs import PairBatches, make_next_period_pairs
from hir_model.synthetic import make_synthetic

_ARROW_TYPES = {
    "node_id": pa.int64(),
    "node_type": pa.string(),
    "num_tokens": pa.int32(),
    "token_node_id": pa.list_(pa.int64()),
    "token_node_type": pa.list_(pa.int32()),
    "token_edge_type": pa.list_(pa.int32()),
    "token_hop": pa.list_(pa.int32()),
    "token_parent_pos": pa.list_(pa.int32()),
    "token_recency": pa.list_(pa.int32()),
    "token_weight": pa.list_(pa.float32()),
    "token_is_deep": pa.list_(pa.bool_()),
}


@pytest.fixture(scope="module")
def data():
    return make_synthetic(
        num_users=40,
        num_parents=2,
        clusters_per_parent=2,
        items_per_cluster=5,
        views_per_user=(2, 5),
        max_tokens=16,
        seed=3,
    )


def day_table(data) -> pa.Table:
    """Users and items of the synthetic day as a neighbourhoods partition (the table's column types)."""
    columns = {
        name: np.concatenate([data.user_columns[name], data.item_columns[name]])
        for name in NEIGHBOURHOOD_COLUMNS
        if name not in ("node_id", "node_type")
    }
    columns["node_id"] = columns["token_node_id"][:, 0]
    columns["node_type"] = np.array(["user"] * data.users.batch_size + ["item"] * data.items.batch_size)
    arrays = {
        name: pa.array(
            list(columns[name]) if columns[name].ndim == 2 else columns[name], type=_ARROW_TYPES[name]
        )
        for name in NEIGHBOURHOOD_COLUMNS
    }
    arrays["raw_id"] = pa.array([str(i) for i in columns["node_id"]])  # a column the model does not read
    return pa.table(arrays)


def write_day(table: pa.Table, folder: Path, parts: int, seed: int, row_group_size: int = 7) -> list[str]:
    """The rows shuffled and split over `parts` files of several row groups each, like a Spark write."""
    folder.mkdir(parents=True)
    order = np.random.default_rng(seed).permutation(table.num_rows)
    table = table.take(pa.array(order))
    files = []
    for part, rows in enumerate(np.array_split(np.arange(table.num_rows), parts)):
        path = folder / f"part-{part:05d}.snappy.parquet"
        pq.write_table(table.take(pa.array(rows)), path, row_group_size=row_group_size)
        files.append(str(path))
    return files


def loader(data, rows: NeighbourhoodRows, steps: int, seed: int) -> PairBatches:
    """The synthetic users' conversions as pairs over the rows read back (inputs and served alike)."""
    users = np.repeat(data.users.node_id[:, 0].numpy(), data.user_conversions.shape[1])
    items = data.items.node_id[data.user_conversions.reshape(-1), 0].numpy()
    pairs = make_next_period_pairs(rows, users, items, np.ones(len(users)))
    return PairBatches(rows, rows, pairs, batch_size=16, negatives=8, steps=steps, seed=seed)


def assert_batches_equal(left, right) -> None:
    assert len(left) == len(right)
    for a, b in zip(left, right, strict=True):
        for part_a, part_b in zip(
            *([getattr(x, f.name) for f in dataclasses.fields(x)] for x in (a, b)), strict=True
        ):
            if isinstance(part_a, torch.Tensor):
                assert torch.equal(part_a, part_b)
            elif part_a is None or part_b is None:  # optional parts (a warm start's anchor users)
                assert part_a is None and part_b is None
            else:
                for f in dataclasses.fields(part_a):
                    x, y = getattr(part_a, f.name), getattr(part_b, f.name)
                    assert (x is None and y is None) or torch.equal(x, y), f.name


def test_petastorm_and_pyarrow_read_the_same_rows_and_give_the_same_batches(tmp_path: Path, data) -> None:
    files = write_day(day_table(data), tmp_path / "ds=2026-01-07", parts=3, seed=0)
    urls = ["file:" + f for f in files]  # Hadoop's spelling, as Delta's inputFiles() returns them
    by_petastorm = PetastormReader().read(urls, NEIGHBOURHOOD_COLUMNS)
    by_pyarrow = PyarrowReader().read(urls, NEIGHBOURHOOD_COLUMNS)
    for name in NEIGHBOURHOOD_COLUMNS:
        assert by_petastorm[name].dtype == by_pyarrow[name].dtype, name
        np.testing.assert_array_equal(by_petastorm[name], by_pyarrow[name], err_msg=name)
    assert by_pyarrow["token_node_id"].shape == (60, 16)

    batches = {}
    for reader in (PetastormReader(), PyarrowReader()):
        rows = read_neighbourhoods(reader, urls)
        # 3 epochs: crosses epoch boundaries, where the shuffle is redrawn.
        batches[reader.name] = list(loader(data, rows, steps=15, seed=7))
    assert_batches_equal(batches["petastorm"], batches["pyarrow"])


def test_batches_do_not_depend_on_file_order_or_split_but_on_the_seed(tmp_path: Path, data) -> None:
    table = day_table(data)
    first = read_neighbourhoods(PyarrowReader(), write_day(table, tmp_path / "a", parts=2, seed=1))
    second = read_neighbourhoods(PyarrowReader(), write_day(table, tmp_path / "b", parts=5, seed=2)[::-1])
    np.testing.assert_array_equal(first.node_id, np.sort(first.node_id))  # canonical order: by node id

    def run(rows, seed):
        return list(loader(data, rows, steps=6, seed=seed))

    assert_batches_equal(run(first, 7), run(second, 7))
    other_seed = run(first, 8)
    assert not torch.equal(other_seed[0].users.node_id, run(first, 7)[0].users.node_id)


def test_two_rows_for_one_target_are_refused(tmp_path: Path, data) -> None:
    table = day_table(data)
    doubled = pa.concat_tables([table, table.slice(0, 1)])
    files = write_day(doubled, tmp_path / "dup", parts=1, seed=0)
    with pytest.raises(ValueError, match="more than one neighbourhood row"):
        read_neighbourhoods(PyarrowReader(), files)


def test_content_vectors_are_attached_by_node_id(tmp_path: Path, data) -> None:
    item_ids = data.items.node_id[:3, 0].numpy()
    vectors = np.eye(3, 4, dtype=np.float32)
    path = tmp_path / "content.parquet"
    pq.write_table(
        pa.table({"node_id": item_ids, "vector": pa.array(list(vectors), type=pa.list_(pa.float32()))}), path
    )
    for reader in (PetastormReader(), PyarrowReader()):
        content = read_content(reader, [str(path)])
        assert content.content_dim == 4
        rows = read_neighbourhoods(
            reader, write_day(day_table(data), tmp_path / reader.name, parts=1, seed=0)
        )
        batch = next(row_batches(rows, 100, content))
        targets = rows.index_of(item_ids)
        torch.testing.assert_close(batch.content[targets, 0], torch.from_numpy(vectors))
        assert int(batch.has_content.sum()) >= 3
    assert set(PyarrowReader().read([str(path)], CONTENT_COLUMNS)) == set(CONTENT_COLUMNS)


def test_readers_on_no_files_and_row_counts(tmp_path: Path, data) -> None:
    for reader in (PetastormReader(), PyarrowReader()):
        assert len(reader.read([], NEIGHBOURHOOD_COLUMNS)["node_id"]) == 0
    files = write_day(day_table(data), tmp_path / "c", parts=3, seed=0)
    assert parquet_row_counts(files) == [20, 20, 20]
    assert file_url("file:/a/b.parquet") == file_url("/a/b.parquet") == "file:///a/b.parquet"
