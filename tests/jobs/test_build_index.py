"""Index build: the choice rule, tuning to a recall target, sharded = single-node, atomic publish and its kill
points, pruning, the reader's checks, and the job on a small `embeddings` table (Spark tests share one table)."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import faiss
import numpy as np
import pytest

from jobs import build_index as job
from jobs.common.errors import HirError
from jobs.index import build
from jobs.index.choose import (
    FLAT_MAX_VECTORS,
    HNSW_MAX_VECTORS,
    choose_factory,
    estimate_bytes,
    nb_lists,
    parse_bytes,
)
from jobs.index.publish import (
    CRASH_ENV,
    ID_MAP_FILE,
    INDEX_FILE,
    LATEST,
    MANIFEST_FILE,
    STALE_TMP_SECONDS,
    entity_root,
    list_versions,
    prune,
    publish,
    read_latest,
    swap_latest,
)
from jobs.index.reader import IndexReader, open_index

REPO_ROOT = Path(__file__).resolve().parents[2]
GiB = 2**30


def clustered(n: int, d: int = 16, *, clusters: int = 20, noise: float = 0.5, seed: int = 0) -> np.ndarray:
    """L2-normalised vectors around `clusters` gaussian centres (fixed by `seed`'s centres, drawn per call)."""
    centres = np.random.default_rng(1000).standard_normal((clusters, d))
    rng = np.random.default_rng(seed)
    x = centres[rng.integers(0, clusters, n)] + noise * rng.standard_normal((n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def signed_ids(n: int, seed: int = 0) -> np.ndarray:
    """Distinct signed 64-bit ids like the graph's hashed node ids (negative ones included, never -1)."""
    ids = np.unique(np.random.default_rng(seed).integers(-(2**62), 2**62, n + 16))
    ids = ids[ids != -1][:n]
    return np.random.default_rng(seed + 1).permutation(ids)


def hash_key(ids: np.ndarray) -> np.ndarray:
    return (ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)).astype(np.int64)


# ------------------------------------------------------------------------------------------- choice rule


@pytest.mark.parametrize(
    "n, budget, expected",
    [
        (FLAT_MAX_VECTORS - 1, 4 * GiB, "Flat"),
        (100_000, 4 * GiB, "HNSW32"),
        (HNSW_MAX_VECTORS, 4 * GiB, "IVF2048,Flat"),
        (1_000_000, 4 * GiB, "IVF4096_HNSW32,Flat"),
        (1_000_000, 128 * 2**20, "OPQ64_128,IVF4096_HNSW32,PQ64x8np"),
        (100_000, 7 * 2**20, "OPQ48_96,IVF1024,PQ48x8np"),
        (100_000_000, 4 * GiB, "OPQ32_128,IVF32768_HNSW32,PQ32x8np"),
    ],
)
def test_choose_factory_tiers_fit_the_budget_and_parse(n, budget, expected):
    choice = choose_factory(n, 128, budget)
    assert choice.factory == expected
    assert choice.estimated_bytes <= budget
    assert choice.reason
    index = faiss.index_factory(128, choice.factory, faiss.METRIC_INNER_PRODUCT)  # a valid faiss string
    assert choice.search_param == (
        None if choice.factory == "Flat" else "efSearch" if choice.factory.startswith("HNSW") else "nprobe"
    )
    assert index.d == 128


def test_choose_factory_refuses_an_impossible_budget():
    with pytest.raises(HirError, match="too small.*--memory-budget"):
        choose_factory(10_000_000, 128, 64 * 2**20)
    with pytest.raises(HirError, match="too few vectors"):
        choose_factory(5_000, 128, 1024)


def test_nb_lists_is_a_power_of_two_near_4_sqrt_n_with_enough_training_points():
    assert nb_lists(1_000_000) == 4096  # 4 * sqrt(1M) = 4000
    assert nb_lists(100_000) == 1024  # 1265 -> closest power of two
    assert nb_lists(20_000) == 512  # 566 -> 512 (and 20000 / 39 = 512 lists are trainable)
    assert nb_lists(12_000) == 256  # 438 -> 512 wanted, only 307 lists trainable
    for n in (10_000, 77_777, 3_000_000):
        nlist = nb_lists(n)
        assert nlist & (nlist - 1) == 0 and n // nlist >= 39


def test_estimates_grow_with_precision():
    n, d = 1_000_000, 128
    pq = estimate_bytes("ivf_pq", n, d, nlist=4096, pq_bytes=32)
    assert pq < estimate_bytes("ivf_flat", n, d, nlist=4096) < estimate_bytes("hnsw", n, d)
    assert estimate_bytes("flat", n, d) == n * (4 * d + 8)


def test_parse_bytes():
    assert parse_bytes("4GiB") == 4 * GiB
    assert parse_bytes("512M") == 512 * 2**20
    assert parse_bytes("1.5g") == int(1.5 * GiB)
    assert parse_bytes("1000") == 1000
    for bad in ("lots", "-1", "0"):
        with pytest.raises(ValueError):
            parse_bytes(bad)


# ---------------------------------------------------------------------------------------- build + tuning


def test_recall_at_k_counts_overlap_and_ignores_padding():
    exact = np.array([[1, 2, 3], [4, 5, -1]])
    found = np.array([[3, 9, 1], [5, -1, -1]])
    assert build.recall_at_k(found, exact, 3) == pytest.approx(3 / 5)


def test_invalid_factory_and_reserved_id_are_clear_errors():
    with pytest.raises(HirError, match="index factory 'IVFx,Flat' is not valid for dimension 16"):
        build.new_index("IVFx,Flat", 16)
    with pytest.raises(HirError, match="node id -1 is reserved"):
        build.build_in_memory("Flat", clustered(10), np.arange(-5, 5), np.arange(10))


@pytest.mark.parametrize("factory", ["Flat", "HNSW16", "IVF32,Flat", "PQ4x4np"])
def test_every_kind_stores_signed_node_ids(factory):
    vectors, ids = clustered(3000), signed_ids(3000)
    built = build.build_in_memory(factory, vectors, ids, hash_key(ids))
    assert built.index.ntotal == 3000
    build.set_search_params(built.index, build.search_knob(built.index).params(64) or {})
    _, found = built.index.search(vectors[:50], 1)
    assert set(found[:, 0]) <= set(ids.tolist())
    if factory != "PQ4x4np":  # lossy codes may rank a near-duplicate first
        assert np.array_equal(found[:, 0], ids[:50])


def test_tune_stops_at_the_first_value_reaching_the_target():
    vectors, ids = clustered(5000), signed_ids(5000)
    queries = clustered(300, seed=9)
    built = build.build_in_memory("IVF64,Flat", vectors, ids, hash_key(ids))
    _, exact = build.exact_top_k(vectors, ids, queries, 10)
    tuning = build.tune(built.index, queries, exact, 0.95)
    assert tuning.reached and tuning.recall >= 0.95
    assert tuning.params["nprobe"] == tuning.trace[-1]["nprobe"]
    assert all(step["recall"] < 0.95 for step in tuning.trace[:-1])  # every narrower value fell short
    assert [s["nprobe"] for s in tuning.trace] == [1, 2, 4, 8, 16, 32, 64][: len(tuning.trace)]
    recalls = [s["recall"] for s in tuning.trace]
    assert recalls == sorted(recalls)


def test_tune_hnsw_sets_ef_search():
    vectors, ids = clustered(4000), signed_ids(4000)
    queries = clustered(200, seed=9)
    built = build.build_in_memory("HNSW16", vectors, ids, hash_key(ids))
    _, exact = build.exact_top_k(vectors, ids, queries, 10)
    tuning = build.tune(built.index, queries, exact, 0.99)
    assert tuning.reached and set(tuning.params) == {"efSearch"} and tuning.params["efSearch"] >= 10


def test_tune_reports_an_index_that_cannot_reach_the_target():
    vectors, ids = clustered(4000), signed_ids(4000)
    queries = clustered(200, seed=9)
    built = build.build_in_memory("IVF16,PQ2x4np", vectors, ids, hash_key(ids))
    _, exact = build.exact_top_k(vectors, ids, queries, 10)
    tuning = build.tune(built.index, queries, exact, 0.95)
    assert not tuning.reached and tuning.recall < 0.95
    assert [s["nprobe"] for s in tuning.trace] == [1, 2, 4, 8, 16]  # the whole ladder was tried
    best = max(tuning.trace, key=lambda s: s["recall"])
    assert tuning.params["nprobe"] == best["nprobe"] and tuning.recall == pytest.approx(
        best["recall"], abs=1e-4
    )


def inverted_lists(index) -> list[list[tuple[int, bytes]]]:
    """Each IVF list's (id, code) pairs, sorted: what an index holds regardless of insertion order."""
    ivf = faiss.extract_index_ivf(index)
    lists = []
    for i in range(ivf.nlist):
        size = ivf.invlists.list_size(i)
        ids = faiss.rev_swig_ptr(ivf.invlists.get_ids(i), size).copy()
        codes = faiss.rev_swig_ptr(ivf.invlists.get_codes(i), size * ivf.code_size).copy()
        lists.append(sorted(zip(ids.tolist(), [bytes(c) for c in codes.reshape(size, -1)], strict=True)))
    return lists


@pytest.mark.parametrize("factory", ["IVF32,Flat", "IVF32_HNSW32,Flat", "PCAR16,IVF16,PQ4x4np"])
def test_sharded_build_equals_single_node_build(factory):
    vectors, ids = clustered(12_000), signed_ids(12_000)
    keys, queries = hash_key(ids), clustered(200, seed=9)
    single = build.build_in_memory(factory, vectors, ids, keys)

    empty = build.new_index(factory, 16)
    order = build.sample_order(keys, ids)
    build.train_index(empty, vectors[order[: single.train_size]])
    blob = build.serialize(empty)
    parts = [build.add_shard(blob, vectors[s::3], ids[s::3], queries) for s in range(3)]
    parts.append(build.add_shard(blob, vectors[:0], ids[:0], queries))  # an empty partition is harmless
    merged = build.merge_shards(blob, [p[0] for p in parts])

    assert merged.ntotal == single.index.ntotal == 12_000
    assert inverted_lists(merged) == inverted_lists(single.index)  # same (id, code) in every list
    for index in (single.index, merged):
        build.set_search_params(index, build.search_knob(index).params(4))
    single_scores, single_ids = single.index.search(queries, 10)
    merged_scores, merged_ids = merged.search(queries, 10)
    np.testing.assert_allclose(single_scores, merged_scores, rtol=1e-6)
    if "PQ" not in factory:  # PQ codes tie often; tied neighbours may come in list order
        assert np.array_equal(single_ids, merged_ids)

    exact_scores, exact_ids = build.exact_top_k(vectors, ids, queries, 10)
    shard_scores, shard_ids = build.merge_top_k([(p[1], p[2]) for p in parts], 10)
    assert np.array_equal(shard_ids, exact_ids)
    np.testing.assert_allclose(shard_scores, exact_scores, rtol=1e-6)


def test_only_ivf_indexes_merge():
    blob = build.serialize(build.new_index("HNSW16", 16))
    with pytest.raises(HirError, match="only IVF indexes"):
        build.merge_shards(blob, [])


def test_device_resolution_without_a_gpu():
    if build.gpu_count() > 0:
        pytest.skip("a GPU is visible: the CPU-only behaviour cannot be observed here")
    assert build.resolve_device("auto") == "cpu"
    with pytest.raises(HirError, match="--device gpu: faiss sees no GPU"):
        build.resolve_device("gpu")


@pytest.mark.skipif(build.gpu_count() == 0, reason="needs faiss with GPU support and a CUDA device")
def test_gpu_training_matches_cpu_within_tolerance():
    vectors, ids = clustered(20_000), signed_ids(20_000)
    queries = clustered(300, seed=9)
    _, exact = build.exact_top_k(vectors, ids, queries, 10)
    recalls = []
    for device in ("cpu", "gpu"):
        built = build.build_in_memory("IVF64,Flat", vectors, ids, hash_key(ids), device=device)
        build.set_search_params(built.index, {"nprobe": 8})
        recalls.append(build.recall_at_k(built.index.search(queries, 10)[1], exact))
    assert abs(recalls[0] - recalls[1]) < 0.02
    _, gpu_exact = build.exact_top_k(vectors, ids, queries, 10, device="gpu")
    assert build.recall_at_k(gpu_exact, exact) > 0.999


# ------------------------------------------------------------------------------------------------ publish


def publish_small(
    root: Path, run_id: str, *, ds: str = "2026-01-07", keep: int = 3, seed: int = 0, hook=None
):
    """Build a Flat index of 500 vectors and publish it; return (vectors, ids, raw ids, version folder)."""
    vectors, ids = clustered(500, seed=seed), signed_ids(500, seed=seed)
    raw = np.asarray([f"item-{seed}-{i}" for i in range(500)], dtype=object)
    built = build.build_in_memory("Flat", vectors, ids, hash_key(ids))
    order = np.argsort(ids)
    manifest = {
        "entity_type": "item",
        "factory": "Flat",
        "metric": build.METRIC_NAME,
        "search_params": {},
        "count": 500,
        "dimension": 16,
        "model_version": f"m{seed}",
    }
    folder, _ = publish(
        root,
        ds,
        run_id,
        lambda f: job.write_version_files(built.index, ids[order], raw[order], f),
        manifest,
        keep=keep,
        before_swap=hook,
    )
    return vectors, ids, raw, folder


def test_publish_writes_a_complete_version_and_swaps_latest(tmp_path):
    root = Path(entity_root(str(tmp_path / "wh"), "item"))
    vectors, ids, raw, folder = publish_small(root, "run1")
    assert folder == str(root / "2026-01-07" / "run1")
    folder = Path(folder)
    assert read_latest(root) == "2026-01-07/run1"
    assert sorted(p.name for p in folder.iterdir()) == sorted([INDEX_FILE, ID_MAP_FILE, MANIFEST_FILE])
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    assert manifest["files"][INDEX_FILE]["bytes"] == (folder / INDEX_FILE).stat().st_size
    assert len(manifest["files"][ID_MAP_FILE]["sha256"]) == 64
    assert not list(root.glob(".tmp-*")) and not list(root.glob("LATEST.tmp*"))
    with pytest.raises(HirError, match="already exists"):
        publish_small(root, "run1")


def test_id_map_round_trip_through_the_reader(tmp_path):
    root = Path(entity_root(str(tmp_path / "wh"), "item"))
    vectors, ids, raw, _ = publish_small(root, "run1")
    reader = IndexReader(root)
    by_id = dict(zip(ids.tolist(), raw.tolist(), strict=True))
    assert dict(zip(reader.node_ids.tolist(), reader.raw_ids.tolist(), strict=True)) == by_id
    raw_ids, node_ids, scores = reader.search(vectors[:20], 5)
    assert raw_ids.shape == node_ids.shape == scores.shape == (20, 5)
    assert node_ids[:, 0].tolist() == ids[:20].tolist()  # each vector finds itself first
    assert [by_id[n] for n in node_ids.ravel().tolist()] == raw_ids.ravel().tolist()
    assert np.all(np.diff(scores, axis=1) <= 1e-6)
    single = reader.search(vectors[3], 3)  # one vector (d,) works too
    assert single.raw_ids[0, 0] == raw[3]
    assert reader.raw_ids_of(np.array([-1, 12345]))[0] is None
    with pytest.raises(HirError, match=r"shape \(2, 8\); this index needs \(n, 16\)"):
        reader.search(np.zeros((2, 8)), 3)


def test_search_restricted_to_allowed_ids_equals_exact_search_over_them(tmp_path):
    root = Path(entity_root(str(tmp_path / "wh"), "item"))
    vectors, ids, raw, _ = publish_small(root, "run1")
    reader = IndexReader(root)
    allowed = ids[::7]  # a sparse candidate set: most true neighbours are excluded
    _, node_ids, scores = reader.search(vectors[:30], 10, allowed=allowed)
    inside = np.isin(ids, allowed)
    exact = vectors[:30] @ vectors[inside].T
    expected = ids[inside][np.argsort(-exact, axis=1, kind="stable")[:, :10]]
    assert np.isin(node_ids, allowed).all()
    assert node_ids.tolist() == expected.tolist()
    assert np.allclose(scores, np.sort(exact, axis=1)[:, ::-1][:, :10], atol=1e-5)
    # Fewer allowed ids than k: the rest is padding.
    _, few, _ = reader.search(vectors[:2], 5, allowed=ids[:3])
    assert sorted(few[0][:3].tolist()) == sorted(ids[:3].tolist()) and few[0][3:].tolist() == [-1, -1]


def test_a_build_failing_before_the_swap_cleans_up_and_keeps_latest(tmp_path):
    root = Path(entity_root(str(tmp_path / "wh"), "item"))
    publish_small(root, "good")

    def crash(folder):
        assert (Path(folder) / MANIFEST_FILE).is_file()  # the version was complete when the error hit
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        publish_small(root, "failed", ds="2026-01-08", hook=crash)
    assert read_latest(root) == "2026-01-07/good"
    assert [v.relative for v in list_versions(root)] == ["2026-01-07/good"]
    assert not list(root.glob(".tmp-*")) and not list(root.glob("*/.trash-*"))
    assert IndexReader(root).manifest["run_id"] == "good"


def test_prune_keeps_the_newest_and_never_the_live_one(tmp_path):
    root = Path(entity_root(str(tmp_path / "wh"), "item"))
    for i in range(3):
        publish_small(root, f"run{i}", ds=f"2026-01-0{i + 1}", keep=10)
    swap_latest(root, "2026-01-01/run0")  # a rollback to the oldest version
    publish_small(root, "run3", ds="2026-01-04", keep=10, hook=lambda _: None)
    swap_latest(root, "2026-01-01/run0")
    assert [v.relative for v in list_versions(root)][0] == "2026-01-01/run0"
    removed = prune(root, keep=2)
    assert sorted(removed) == ["2026-01-02/run1"]
    assert [v.relative for v in list_versions(root)] == [
        "2026-01-01/run0",
        "2026-01-03/run2",
        "2026-01-04/run3",
    ]
    assert not (root / "2026-01-02").exists()  # the emptied day folder goes too
    assert IndexReader(root).manifest["run_id"] == "run0"

    publish_small(root, "run4", ds="2026-01-05", keep=1)  # a normal build: keeps only itself
    assert [v.relative for v in list_versions(root)] == ["2026-01-05/run4"]
    with pytest.raises(HirError, match="at least 1"):
        prune(root, keep=0)


def test_prune_removes_only_stale_staging_folders(tmp_path):
    root = Path(entity_root(str(tmp_path / "wh"), "item"))
    publish_small(root, "run1")
    stale, young = root / ".tmp-killed", root / ".tmp-running"
    stale.mkdir()
    young.mkdir()
    old = time.time() - STALE_TMP_SECONDS - 60
    os.utime(stale, (old, old))
    prune(root, keep=3)
    assert not stale.exists() and young.exists()


KILLED_BUILD = """
import sys
from pathlib import Path
sys.path.insert(0, {repo!r})
sys.path.insert(0, {tests!r})
from test_build_index import publish_small
publish_small(Path({root!r}), "killed", ds="2026-01-08", seed=1)
print("swap happened")
"""


@pytest.mark.parametrize("point", ["before_rename", "before_swap"])
def test_a_build_killed_before_the_swap_leaves_latest_valid(tmp_path, point):
    root = Path(entity_root(str(tmp_path / "wh"), "item"))
    vectors, ids, raw, _ = publish_small(root, "good")
    before = IndexReader(root).search(vectors[:10], 5)

    script = KILLED_BUILD.format(repo=str(REPO_ROOT), tests=str(Path(__file__).parent), root=str(root))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env={**os.environ, CRASH_ENV: point},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr  # SIGKILL, no cleanup ran
    assert "swap happened" not in proc.stdout

    assert read_latest(root) == "2026-01-07/good"
    after = IndexReader(root).search(vectors[:10], 5)
    assert np.array_equal(after.node_ids, before.node_ids) and np.array_equal(after.raw_ids, before.raw_ids)
    leftover = root / ".tmp-killed" if point == "before_rename" else root / "2026-01-08" / "killed"
    assert leftover.is_dir()  # the half-done work stays out of sight, LATEST never names it
    publish_small(root, "next", ds="2026-01-09", keep=2, seed=2)  # the next build publishes normally
    assert read_latest(root) == "2026-01-09/next"


# ------------------------------------------------------------------------------------------------- reader


@pytest.fixture()
def published(tmp_path) -> Path:
    root = Path(entity_root(str(tmp_path / "wh"), "item"))
    publish_small(root, "run1")
    return root


def _edit_manifest(folder: Path, edit) -> None:
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    edit(manifest)
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    "damage, message",
    [
        (
            lambda f: (f / MANIFEST_FILE).unlink(),
            r"manifest.json is missing: .* not a complete index version",
        ),
        (lambda f: (f / MANIFEST_FILE).write_text("{not json"), r"manifest.json is corrupt: not valid JSON"),
        (
            lambda f: (f / MANIFEST_FILE).write_text("[1, 2]"),
            r"manifest.json is corrupt: expected a JSON object",
        ),
        (
            lambda f: _edit_manifest(f, lambda m: m.pop("dimension")),
            r"manifest.json is corrupt: field 'dimension' is missing",
        ),
        (
            lambda f: _edit_manifest(f, lambda m: m.update(count="500")),
            r"field 'count' should be int",
        ),
        (
            lambda f: _edit_manifest(f, lambda m: m.update(format_version=99)),
            r"format_version 99; this reader knows up to 1",
        ),
        (lambda f: (f / INDEX_FILE).unlink(), r"index.faiss is missing \(listed in the manifest\)"),
        (
            lambda f: (f / INDEX_FILE).write_bytes((f / INDEX_FILE).read_bytes()[:-100]),
            r"index.faiss has \d+ bytes, the manifest recorded \d+: corrupt or truncated",
        ),
        (
            lambda f: (f / ID_MAP_FILE).write_bytes(b"x" * (f / ID_MAP_FILE).stat().st_size),
            r"id_map.parquet does not match the sha256 in the manifest",
        ),
        (
            lambda f: _edit_manifest(f, lambda m: m.update(count=7)),
            r"holds 500 vectors of dimension 16, the manifest says 7",
        ),
    ],
)
def test_reader_gives_a_clear_error_for_a_damaged_version(published, damage, message):
    folder = published / read_latest(published)
    damage(folder)
    with pytest.raises(HirError, match=message):
        IndexReader(published)


def test_reader_checks_the_pointer(tmp_path, published):
    (published / LATEST).write_text("../../etc\n")
    with pytest.raises(HirError, match="not '<ds>/<run_id>': the pointer is corrupt"):
        IndexReader(published)
    (published / LATEST).write_text("2026-01-07/gone\n")
    with pytest.raises(HirError, match="points to 2026-01-07/gone, which does not exist"):
        IndexReader(published)
    (published / LATEST).unlink()
    with pytest.raises(HirError, match="LATEST is missing: versions exist"):
        IndexReader(published)
    with pytest.raises(HirError, match="no index at .*run `hir build-index` first"):
        IndexReader(tmp_path / "nothing")


def test_open_index_by_day(tmp_path):
    warehouse = str(tmp_path / "wh")
    root = Path(entity_root(warehouse, "item"))
    publish_small(root, "a", ds="2026-01-07")
    publish_small(root, "b", ds="2026-01-08", seed=1)
    assert open_index(warehouse, "item").manifest["run_id"] == "b"
    assert open_index(warehouse, "item", "2026-01-07").manifest["run_id"] == "a"
    with pytest.raises(HirError, match="no item index version for ds 2026-01-09"):
        open_index(warehouse, "item", "2026-01-09")


@pytest.mark.parametrize(
    "uri, message",
    [
        ("s3://bucket/warehouse", "use s3a://"),
        ("gs://b/w", "unknown scheme 'gs://'"),
        ("abfss://c@a.dfs.core.windows.net/w", "unknown scheme 'abfss://'"),
    ],
)
def test_unknown_warehouse_schemes_are_refused_in_one_line(uri, message):
    with pytest.raises(HirError, match=message):
        entity_root(uri, "item")


def test_file_uri_is_a_local_warehouse_and_remote_roots_stay_uris(tmp_path):
    assert entity_root(f"file://{tmp_path}", "item") == str(tmp_path.resolve() / "indexes" / "item")
    assert entity_root("s3a://bucket/wh/", "user") == "s3a://bucket/wh/indexes/user"


# ------------------------------------------------------------------------------------------------ flags


def test_flags_parse_and_bad_values_are_one_line_errors():
    cfg = job.config_from_args(["--ds", "2026-01-07", "--entity-type", "items", "--memory-budget", "512M"])
    assert (cfg.entity_type, cfg.memory_budget_bytes, cfg.recall_target) == ("item", 512 * 2**20, 0.95)
    with pytest.raises(HirError, match="--recall-target must be in"):
        job.config_from_args(["--ds", "2026-01-07", "--recall-target", "1.5"])
    with pytest.raises(HirError, match="--entity-type"):
        job.config_from_args(["--ds", "2026-01-07", "--entity-type", "shops"])
    with pytest.raises(HirError, match="not a size"):
        job.config_from_args(["--ds", "2026-01-07", "--memory-budget", "lots"])
    with pytest.raises(HirError, match="use s3a://"):
        job.config_from_args(["--ds", "2026-01-07", "--warehouse", "s3://b/w"])


# ------------------------------------------------------------------------------------ the job, on Spark

DS = dt.date(2026, 1, 7)
N_ITEMS, N_USERS = 3000, 300


@pytest.fixture(scope="module")
def embeddings(spark, tmp_path_factory):
    """One `embeddings` table: items and users of DS from one model, written once for the Spark tests."""
    import pandas as pd

    from jobs.common.delta import write_table
    from schemas.tables import EMBEDDINGS

    warehouse = tmp_path_factory.mktemp("index_job") / "warehouse"
    ids = signed_ids(N_ITEMS + N_USERS, seed=5)
    frame = pd.DataFrame(
        {
            "entity_type": ["item"] * N_ITEMS + ["user"] * N_USERS,
            "node_id": ids,
            "raw_id": [f"i{i}" for i in range(N_ITEMS)] + [f"u{i}" for i in range(N_USERS)],
            "vector": list(np.concatenate([clustered(N_ITEMS, seed=1), clustered(N_USERS, seed=2)])),
            "model_version": "m1",
            "ds": DS,
        }
    )
    version = write_table(
        spark.createDataFrame(frame, EMBEDDINGS.schema), EMBEDDINGS, warehouse, f"ds = DATE'{DS}'"
    )
    return {"warehouse": str(warehouse), "frame": frame, "version": version}


def _config(embeddings, **overrides) -> job.BuildConfig:
    return job.BuildConfig(ds=DS, warehouse=embeddings["warehouse"], recall_queries=200, **overrides)


@pytest.fixture(scope="module")
def driver_build(spark, embeddings):
    return job.build_index(spark, _config(embeddings, index_factory="IVF32,Flat", run_id="driver"))


def test_job_meets_the_recall_target_and_records_it(driver_build, embeddings):
    m = driver_build.manifest
    assert m["recall_at_10"] >= m["recall_target"] == 0.95
    assert m["factory"] == "IVF32,Flat" and m["factory_reason"] == "explicit --index-factory"
    assert set(m["search_params"]) == {"nprobe"} and m["tuning"][-1]["nprobe"] == m["search_params"]["nprobe"]
    assert (m["count"], m["dimension"], m["metric"]) == (N_ITEMS, 16, "inner_product")
    assert (m["query_source"], m["recall_queries"]) == ("user embeddings", 200)
    assert m["source"]["delta_version"] == embeddings["version"] and m["model_version"] == "m1"
    assert m["faiss_version"] == faiss.__version__
    assert m["qps"] > 0 and m["latency_ms_p50"] > 0 and m["exact_qps"] > 0
    assert m["build"]["mode"] == "driver" and m["build"]["train_size"] == 32 * 40
    assert "recall@10" in driver_build.line() and "LATEST -> 2026-01-07/driver" in driver_build.line()


def test_job_id_map_matches_the_table(driver_build, embeddings):
    frame = embeddings["frame"]
    items = frame[frame.entity_type == "item"]
    reader = IndexReader(driver_build.version_dir)
    assert dict(zip(reader.node_ids.tolist(), reader.raw_ids.tolist(), strict=True)) == dict(
        zip(items.node_id.tolist(), items.raw_id.tolist(), strict=True)
    )
    vectors = np.stack(items.vector.to_numpy()[:20])
    assert reader.search(vectors, 1).raw_ids[:, 0].tolist() == items.raw_id.tolist()[:20]


def test_sharded_spark_build_equals_the_driver_build(spark, embeddings, driver_build):
    report = job.build_index(
        spark, _config(embeddings, index_factory="IVF32,Flat", run_id="sharded", build_on="spark", shards=3)
    )
    assert report.manifest["build"]["mode"] == "spark" and report.manifest["build"]["shards"] == 3
    driver, sharded = IndexReader(driver_build.version_dir), IndexReader(report.version_dir)
    assert report.manifest["recall_at_10"] == driver.manifest["recall_at_10"]  # same exact top 10
    queries = clustered(100, seed=3)
    for reader in (driver, sharded):
        build.set_search_params(reader.index, {"nprobe": 4})
    a, b = driver.search(queries, 10), sharded.search(queries, 10)
    assert np.array_equal(a.node_ids, b.node_ids) and np.array_equal(a.raw_ids, b.raw_ids)
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-6)


def test_job_refuses_to_publish_below_the_target(spark, embeddings, driver_build):
    root = Path(entity_root(embeddings["warehouse"], "item"))
    live = read_latest(root)
    with pytest.raises(
        HirError, match=r"reaches recall@10 0\.\d+ at best .* below --recall-target 0.99: not "
    ):
        job.build_index(
            spark, _config(embeddings, index_factory="IVF16,PQ2x4np", run_id="bad", recall_target=0.99)
        )
    assert read_latest(root) == live
    assert not (root / str(DS) / "bad").exists() and not list(root.glob(".tmp-*"))


@pytest.mark.slow
def test_job_process_killed_before_the_swap_leaves_latest_loadable(embeddings, driver_build):
    """The real thing: `hir build-index` in its own process (own JVM), SIGKILLed between rename and swap."""
    root = Path(entity_root(embeddings["warehouse"], "item"))
    live = read_latest(root)
    expected = IndexReader(root).search(clustered(20, seed=4), 10)
    argv = ["--ds", str(DS), "--warehouse", embeddings["warehouse"], "--run-id", "killed-job"]
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.build_index", *argv, "--index-factory", "IVF32,Flat"],
        cwd=REPO_ROOT,
        env={**os.environ, CRASH_ENV: "before_swap", "HIR_DRIVER_MEMORY": "1g"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert (root / str(DS) / "killed-job" / MANIFEST_FILE).is_file()  # it got as far as the rename
    assert read_latest(root) == live
    got = IndexReader(root).search(clustered(20, seed=4), 10)
    assert np.array_equal(got.node_ids, expected.node_ids)


def test_job_chooses_the_index_and_checks_its_input(spark, embeddings, capsys, monkeypatch):
    monkeypatch.setattr(
        job, "COLLECT_CHUNK_BYTES", 100_000
    )  # collect in 4 Arrow chunks, as a large day would
    assert job.main(["--ds", str(DS), "--warehouse", embeddings["warehouse"], "--recall-queries", "100"]) == 0
    assert "published item index Flat (exact): 3000 vectors" in capsys.readouterr().out
    reader = open_index(embeddings["warehouse"], "item")
    assert reader.manifest["factory_reason"].startswith("3000 < 10000 vectors")
    items = embeddings["frame"][embeddings["frame"].entity_type == "item"]
    assert sorted(reader.node_ids.tolist()) == sorted(items.node_id.tolist())
    with pytest.raises(HirError, match="no 'advertiser' vectors in embeddings"):
        job.build_index(spark, _config(embeddings, entity_type="advertiser"))
    with pytest.raises(HirError, match="cannot read embeddings at version 99"):
        job.build_index(spark, _config(embeddings, table_version=99))
    with pytest.raises(HirError, match="--build-on spark needs an IVF index"):
        job.build_index(spark, _config(embeddings, index_factory="HNSW16", build_on="spark"))


def test_query_command_returns_top_items_for_a_user(spark, embeddings, driver_build, capsys):
    from jobs import query_index

    warehouse = embeddings["warehouse"]
    assert query_index.main(["--warehouse", warehouse, "--user-id", "u7", "-k", "5", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    frame = embeddings["frame"]
    user = np.asarray(frame[frame.raw_id == "u7"].vector.iloc[0])
    expected = IndexReader(entity_root(warehouse, "item")).search(user, 5)
    assert [r["raw_id"] for r in rows] == expected.raw_ids[0].tolist()
    assert [r["rank"] for r in rows] == [1, 2, 3, 4, 5] and rows[0]["raw_id"].startswith("i")

    assert query_index.main(["--warehouse", warehouse, "--user-id", "u7", "-k", "3"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("# item index 2026-01-07/") and len(table) == 2 + 3
    with pytest.raises(HirError, match="user 'nobody' has no embedding in embeddings for ds 2026-01-07"):
        query_index.main(["--warehouse", warehouse, "--user-id", "nobody"])
