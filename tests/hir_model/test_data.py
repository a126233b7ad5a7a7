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

from hir_model.config import TrainConfig
from hir_model.data import (
    CONTENT_COLUMNS,
    NEIGHBOURHOOD_COLUMNS,
    NeighbourhoodRows,
    PetastormReader,
    PyarrowReader,
    TrainingBatches,
    file_url,
    make_pairs,
    parquet_row_counts,
    read_content,
    read_neighbourhoods,
    row_batches,
)
from hir_model.synthetic import make_synthetic
from hir_model.trainer import Trainer

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


def pairs_of(data, rows: NeighbourhoodRows):
    users = np.repeat(data.users.node_id[:, 0].numpy(), data.user_conversions.shape[1])
    items = data.items.node_id[data.user_conversions.reshape(-1), 0].numpy()
    return make_pairs(rows, users, items)


def assert_batches_equal(left, right) -> None:
    assert len(left) == len(right)
    for a, b in zip(left, right, strict=True):
        for part_a, part_b in zip(a, b, strict=True):
            if isinstance(part_a, torch.Tensor):
                assert torch.equal(part_a, part_b)
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
        pairs = pairs_of(data, rows)
        # 3 epochs of 5 batches: crosses epoch boundaries, where the shuffle is redrawn.
        batches[reader.name] = list(TrainingBatches(rows, pairs, batch_size=16, steps=15, seed=7))
    assert_batches_equal(batches["petastorm"], batches["pyarrow"])


def test_batches_do_not_depend_on_file_order_or_split_but_on_the_seed(tmp_path: Path, data) -> None:
    table = day_table(data)
    first = read_neighbourhoods(PyarrowReader(), write_day(table, tmp_path / "a", parts=2, seed=1))
    second = read_neighbourhoods(PyarrowReader(), write_day(table, tmp_path / "b", parts=5, seed=2)[::-1])
    np.testing.assert_array_equal(first.node_id, np.sort(first.node_id))  # canonical order: by node id

    def run(rows, seed):
        return list(TrainingBatches(rows, pairs_of(data, rows), batch_size=16, steps=6, seed=seed))

    assert_batches_equal(run(first, 7), run(second, 7))
    other_seed = run(first, 8)
    assert not torch.equal(other_seed[0][0].node_id, run(first, 7)[0][0].node_id)


def test_an_epoch_trains_every_pair_once_and_every_other_row_by_distillation(tmp_path: Path, data) -> None:
    rows = read_neighbourhoods(PyarrowReader(), write_day(day_table(data), tmp_path / "d", parts=2, seed=0))
    pairs = pairs_of(data, rows)
    loader = TrainingBatches(rows, pairs, batch_size=8, steps=0, seed=0)
    loader.steps = loader.batches_per_epoch  # exactly one epoch
    seen_pairs, seen_rows = [], set()
    for users, items, log_pop, is_pair in loader:
        user_rows = rows.index_of(users.node_id[:, 0].numpy())
        item_rows = rows.index_of(items.node_id[:, 0].numpy())
        seen_rows.update(user_rows.tolist() + item_rows.tolist())
        mask = is_pair.numpy()
        seen_pairs += list(zip(user_rows[mask].tolist(), item_rows[mask].tolist(), strict=True))
        assert (log_pop.numpy()[~mask] == 0).all() and (log_pop.numpy()[mask] < 0).all()
    assert sorted(seen_pairs) == sorted(zip(pairs.user_row.tolist(), pairs.item_row.tolist(), strict=True))
    assert seen_rows == set(range(len(rows)))


def test_make_pairs_dedupes_drops_missing_rows_and_computes_log_share(tmp_path: Path, data) -> None:
    rows = read_neighbourhoods(PyarrowReader(), write_day(day_table(data), tmp_path / "p", parts=1, seed=0))
    u1, u2 = data.users.node_id[:2, 0].tolist()
    i1, i2 = data.items.node_id[:2, 0].tolist()
    pairs = make_pairs(rows, np.array([u1, u1, u2, u2, 999]), np.array([i1, i1, i1, i2, i1]))
    assert pairs.missing == 1  # user 999 has no neighbourhood row
    assert len(pairs) == 3  # (u1, i1) twice counts once
    np.testing.assert_allclose(np.exp(pairs.item_log_pop), [2 / 3, 2 / 3, 1 / 3], rtol=1e-6)


def test_resuming_at_a_step_gives_the_same_remaining_batches(tmp_path: Path, data) -> None:
    rows = read_neighbourhoods(PyarrowReader(), write_day(day_table(data), tmp_path / "r", parts=2, seed=0))
    pairs = pairs_of(data, rows)
    full = list(TrainingBatches(rows, pairs, batch_size=16, steps=9, seed=3))
    tail = list(TrainingBatches(rows, pairs, batch_size=16, steps=9, seed=3, start_step=4))
    assert_batches_equal(full[4:], tail)


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


def test_trainer_trains_retrieval_only_on_pair_rows(tiny_config, data) -> None:
    config = dataclasses.replace(tiny_config, content_dim=0)
    train = TrainConfig(steps=4, batch_size=8, warmup_steps=1, seed=0)
    users, items = data.users.select(range(8)), data.items.select(range(8))
    log_pop = torch.full((8,), -2.0)

    def step(*is_pair):
        return Trainer(config, train, device="cpu").train_step(users, items, log_pop, *is_pair)

    every_row, marked_all = step(), step(torch.ones(8, dtype=torch.bool))
    assert every_row == marked_all  # no mask = every row is a pair (the loader-of-3 behaviour)
    none = step(torch.zeros(8, dtype=torch.bool))
    assert none["retrieval"] == 0.0 and none["pairs"] == 0 and np.isfinite(none["loss"])
    assert none["distill"] == every_row["distill"]  # distillation still sees every row


def test_rows_outside_the_pair_mask_do_not_reach_the_retrieval_loss(tiny_config, data) -> None:
    config = dataclasses.replace(
        tiny_config, content_dim=0
    )  # tiny_config has no dropout: rows are independent
    train = TrainConfig(steps=4, batch_size=8, warmup_steps=1, seed=0)
    users = data.users.select(range(8))
    items, log_pop = data.items.select(range(8)), torch.full((8,), -2.0)
    # Rows 4-7 get other items and popularities: the retrieval term must not notice when they are not pairs.
    swapped = data.items.select([0, 1, 2, 3, 12, 13, 14, 15])
    swapped_log_pop = torch.tensor([-2.0] * 4 + [-9.0] * 4)
    first_half = torch.tensor([True] * 4 + [False] * 4)

    def retrieval(pos_items, pop, *is_pair):
        return Trainer(config, train, device="cpu").train_step(users, pos_items, pop, *is_pair)["retrieval"]

    assert retrieval(items, log_pop, first_half) == retrieval(swapped, swapped_log_pop, first_half)
    assert retrieval(items, log_pop) != retrieval(
        swapped, swapped_log_pop
    )  # the swap matters to unmasked rows
