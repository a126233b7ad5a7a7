"""Index versions on an s3a:// warehouse, against a real S3 server (s3proxy): the job publishes the same version
as on a local warehouse and `hir query` answers the same; a publisher killed during the upload or before the
pointer write leaves the previous version live; pruning; the reader's local cache; bad URIs fail before writing."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hir_model import storage
from jobs import build_index as job
from jobs import query_index
from jobs.common.errors import HirError
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
    read_latest,
    swap_latest,
)
from jobs.index.reader import IndexReader, open_index
from tests.jobs.test_build_index import clustered, publish_small, signed_ids

REPO_ROOT = Path(__file__).resolve().parents[2]
DS = dt.date(2026, 1, 7)
N_ITEMS, N_USERS = 3000, 300
# What differs between two builds of the same table: where and when they ran, and timings.
VOLATILE = {"run_id", "published_at", "qps", "latency_ms_p50", "latency_ms_p99", "exact_qps"}


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch) -> Path:
    """A fresh download cache per test, so a test sees its own copies only."""
    monkeypatch.setenv("HIR_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def published(spark, s3_server, tmp_path_factory) -> dict[str, dict]:
    """The same `embeddings` day (items and users of one model) in a local and in an s3a:// warehouse, and the
    item index the job built from each: {"local"|"s3a": {"warehouse": ..., "report": BuildReport}}."""
    from jobs.common.delta import write_table
    from schemas.tables import EMBEDDINGS

    folder = tmp_path_factory.mktemp("index_remote")
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in s3_server.hadoop_conf().items():
        conf.set(key, value)
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
    places = {
        "local": str(folder / "warehouse"),
        "s3a": s3_server.new_bucket("index-remote-job") + "/warehouse",
    }
    out = {}
    with pytest.MonkeyPatch.context() as patch:  # what the s3_settings and cache_dir fixtures do for one test
        patch.setattr(storage, "_settings", storage.S3Settings.from_hadoop(s3_server.hadoop_conf()))
        patch.setenv("HIR_CACHE_DIR", str(folder / "cache"))
        for place, warehouse in places.items():
            rows = spark.createDataFrame(frame, EMBEDDINGS.schema)
            write_table(rows, EMBEDDINGS, warehouse, f"ds = DATE'{DS}'")
            cfg = job.BuildConfig(
                ds=DS,
                warehouse=warehouse,
                index_factory="IVF32,Flat",
                recall_queries=200,
                run_id=f"on-{place}",
            )
            out[place] = {"warehouse": warehouse, "report": job.build_index(spark, cfg)}
    return out


def comparable(manifest: dict) -> dict:
    """A manifest without what legitimately differs between two builds of the same table."""
    kept = {key: value for key, value in manifest.items() if key not in VOLATILE}
    kept["tuning"] = [{k: v for k, v in step.items() if k != "qps"} for step in manifest["tuning"]]
    kept["build"] = {k: v for k, v in manifest["build"].items() if k != "seconds"}
    kept["source"] = {k: v for k, v in manifest["source"].items() if k != "path"}
    return kept


def test_an_s3a_warehouse_gets_the_same_index_and_answers_as_a_local_one(
    s3_spark, published, cache_dir, capsys
):
    reports = {place: built["report"] for place, built in published.items()}
    warehouses = {place: built["warehouse"] for place, built in published.items()}
    remote_root = entity_root(warehouses["s3a"], "item")
    assert reports["s3a"].version_dir == f"{remote_root}/{DS}/on-s3a"
    assert storage.listdir(reports["s3a"].version_dir) == sorted([ID_MAP_FILE, INDEX_FILE, MANIFEST_FILE])
    assert read_latest(remote_root) == f"{DS}/on-s3a"
    assert [name for name in storage.listdir(remote_root) if name.startswith(".tmp-")] == []  # marker removed
    # Same content, byte for byte: the files' sizes and sha256 are in the manifest.
    assert comparable(reports["s3a"].manifest) == comparable(reports["local"].manifest)
    assert reports["s3a"].manifest["source"]["path"] == f"{warehouses['s3a']}/embeddings"

    readers = {place: open_index(warehouse, "item") for place, warehouse in warehouses.items()}
    remote = readers["s3a"]
    assert remote.location == reports["s3a"].version_dir
    assert remote.version_dir.is_relative_to(cache_dir)  # faiss opened a local copy
    assert np.array_equal(remote.node_ids, readers["local"].node_ids)
    assert remote.raw_ids.tolist() == readers["local"].raw_ids.tolist()
    queries = clustered(50, seed=4)
    a, b = readers["local"].search(queries, 10), remote.search(queries, 10)
    assert np.array_equal(a.node_ids, b.node_ids) and a.raw_ids.tolist() == b.raw_ids.tolist()
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-6)
    # A second reader of the same version is served from the cache: still one copy.
    assert open_index(warehouses["s3a"], "item").version_dir == remote.version_dir
    copies = [p for p in cache_dir.iterdir() if p.name != "locks"]  # locks: the publishers' root locks
    assert copies == [remote.version_dir]

    answers = {}
    for place, warehouse in warehouses.items():
        assert query_index.main(["--warehouse", warehouse, "--user-id", "u7", "-k", "5", "--json"]) == 0
        answers[place] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(answers["s3a"]) == 5 and answers["s3a"] == answers["local"]


@pytest.mark.slow
def test_a_build_index_process_killed_mid_upload_leaves_latest_loadable(
    published, s3_server, s3_settings, tmp_path
):
    """The real thing: `hir build-index` in its own process (own JVM) on the s3a warehouse, its S3 settings given
    to Spark only (spark-defaults.conf, as a cluster's would be), SIGKILLed after the data files were uploaded."""
    warehouse = published["s3a"]["warehouse"]
    root = entity_root(warehouse, "item")
    live = read_latest(root)
    expected = IndexReader(root).search(clustered(20, seed=4), 10)
    conf_dir = tmp_path / "spark-conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(
        "".join(f"spark.hadoop.{key} {value}\n" for key, value in s3_server.hadoop_conf().items())
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith("AWS_")}
    argv = ["--ds", str(DS), "--warehouse", warehouse, "--run-id", "killed-job", "--recall-queries", "200"]
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.build_index", *argv, "--index-factory", "IVF32,Flat"],
        cwd=REPO_ROOT,
        env={
            **env,
            "SPARK_CONF_DIR": str(conf_dir),
            "HIR_CACHE_DIR": str(tmp_path / "cache"),
            "HIR_DRIVER_MEMORY": "1g",
            CRASH_ENV: "before_manifest",
        },
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == -9, proc.stderr[-3000:]
    killed = storage.join(root, str(DS), "killed-job")
    assert storage.listdir(killed) == sorted([ID_MAP_FILE, INDEX_FILE])  # uploaded all but the manifest
    assert read_latest(root) == live
    got = IndexReader(root).search(clustered(20, seed=4), 10)
    assert np.array_equal(got.node_ids, expected.node_ids)


def test_bad_warehouse_uris_fail_in_one_line_before_anything_is_written(s3_spark, s3_server):
    missing = "s3a://index-remote-no-such-bucket/warehouse"
    with pytest.raises(HirError, match=r"^--warehouse s3a://index-remote-no-such-bucket/warehouse: bucket "):
        job.build_index(s3_spark, job.BuildConfig(ds=DS, warehouse=missing))
    assert not (s3_server.folder / "index-remote-no-such-bucket").exists()

    with pytest.raises(HirError, match="unknown scheme 'gs://'"):
        job.build_index(s3_spark, job.BuildConfig(ds=DS, warehouse="gs://bucket/warehouse"))


# ------------------------------------------------------------------------------- publish on s3a, no Spark


@pytest.fixture()
def root(s3_server, s3_settings, request) -> str:
    """An empty index root in a bucket of its own (named after the test: buckets live for the session)."""
    digest = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:10]
    name = "".join(c if c.isalnum() else "-" for c in request.node.originalname.lower())[:40].strip("-")
    return entity_root(s3_server.new_bucket(f"ix-{digest}-{name}") + "/warehouse", "item")


def test_publish_uploads_a_complete_version_and_the_reader_verifies_its_copy(root, cache_dir):
    vectors, ids, raw, folder = publish_small(root, "run1")
    assert folder == f"{root}/2026-01-07/run1"
    assert read_latest(root) == "2026-01-07/run1"
    manifest = json.loads(storage.read_text(storage.join(folder, MANIFEST_FILE)))
    assert manifest["files"][INDEX_FILE]["bytes"] == len(storage.read_bytes(storage.join(folder, INDEX_FILE)))
    assert storage.listdir(root) == ["2026-01-07", LATEST]  # no marker, no temp files
    with pytest.raises(HirError, match="already exists: pass a new --run-id"):
        publish_small(root, "run1")

    reader = IndexReader(root)
    assert reader.search(vectors[:20], 1).node_ids[:, 0].tolist() == ids[:20].tolist()
    # A damaged cached copy is caught by the same checks as a damaged version, and names the copy to remove.
    copy = reader.version_dir
    (copy / ID_MAP_FILE).write_bytes(b"x" * (copy / ID_MAP_FILE).stat().st_size)
    with pytest.raises(
        HirError, match=r"id_map.parquet does not match the sha256 .*cached copy .*download again"
    ):
        IndexReader(root)
    storage.remove(copy)
    assert IndexReader(root).raw_ids.tolist() == raw[np.argsort(ids)].tolist()  # downloaded again


def test_an_error_before_the_swap_removes_the_upload_and_keeps_latest(root):
    publish_small(root, "good")

    def crash(version: str):
        assert storage.is_file(storage.join(version, MANIFEST_FILE))  # the upload was complete
        raise RuntimeError("network gone")

    with pytest.raises(RuntimeError, match="network gone"):
        publish_small(root, "failed", ds="2026-01-08", hook=crash)
    assert read_latest(root) == "2026-01-07/good"
    assert storage.listdir(root) == ["2026-01-07", LATEST]
    assert IndexReader(root).manifest["run_id"] == "good"


KILLED_PUBLISH = """
import sys
sys.path.insert(0, {repo!r})
from tests.jobs.test_build_index import publish_small
publish_small({root!r}, "killed", ds="2026-01-08", seed=1)
print("swap happened")
"""


@pytest.mark.parametrize("point", ["before_manifest", "before_swap"])
def test_a_publisher_killed_before_the_pointer_write_leaves_the_previous_version_live(root, s3_server, point):
    vectors, ids, raw, _ = publish_small(root, "good")
    before = IndexReader(root).search(vectors[:10], 5)

    script = KILLED_PUBLISH.format(repo=str(REPO_ROOT), root=root)
    # A process without Spark reaches S3 through the AWS standard environment (storage.S3Settings).
    aws = {
        "AWS_ENDPOINT_URL_S3": s3_server.endpoint,
        "AWS_ACCESS_KEY_ID": s3_server.access_key,
        "AWS_SECRET_ACCESS_KEY": s3_server.secret_key,
        "AWS_REGION": "us-east-1",
    }
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env={**os.environ, **aws, CRASH_ENV: point},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr[-3000:]  # SIGKILL, no cleanup ran
    assert "swap happened" not in proc.stdout

    killed = storage.join(root, "2026-01-08", "killed")
    uploaded = storage.listdir(killed)
    assert uploaded == (
        sorted([ID_MAP_FILE, INDEX_FILE])
        if point == "before_manifest"
        else sorted([ID_MAP_FILE, INDEX_FILE, MANIFEST_FILE])
    )
    assert storage.is_file(storage.join(root, ".tmp-killed"))  # the upload's marker: it never finished
    assert read_latest(root) == "2026-01-07/good"
    after = IndexReader(root).search(vectors[:10], 5)
    assert (
        np.array_equal(after.node_ids, before.node_ids) and after.raw_ids.tolist() == before.raw_ids.tolist()
    )
    if point == "before_swap":  # complete but never live: only a reader asking for its day finds it
        warehouse = storage.parent(storage.parent(root))
        assert open_index(warehouse, "item", "2026-01-08").manifest["run_id"] == "killed"
    else:  # no manifest: not a version at all
        assert [v.relative for v in list_versions(root)] == ["2026-01-07/good"]

    publish_small(root, "next", ds="2026-01-09", keep=3, seed=2)  # the next build publishes normally
    assert read_latest(root) == "2026-01-09/next"
    assert storage.is_dir(killed)  # a young leftover may be a running upload: left alone
    prune(root, keep=3, now=time.time() + STALE_TMP_SECONDS + 60)  # a day later
    assert not storage.exists(storage.join(root, ".tmp-killed"))
    complete = point == "before_swap"  # a complete version nothing names is kept by the keep rule alone
    assert storage.exists(killed) == complete
    assert [v.relative for v in list_versions(root)] == ["2026-01-07/good"] + (
        ["2026-01-08/killed"] if complete else []
    ) + ["2026-01-09/next"]


def test_prune_on_s3a_keeps_the_newest_and_the_live_one_and_sweeps_leftovers(root):
    for i in range(3):
        publish_small(root, f"run{i}", ds=f"2026-01-0{i + 1}", keep=10)
    swap_latest(root, "2026-01-01/run0")  # a rollback to the oldest version
    publish_small(root, "run3", ds="2026-01-04", keep=10, hook=lambda _: None)
    swap_latest(root, "2026-01-01/run0")
    # Leftovers: an upload killed a day ago (marker and files, no manifest), one running now, and a folder a
    # killed prune left without its manifest.
    now = time.time()
    for run_id, started in (("stale", now - STALE_TMP_SECONDS - 60), ("running", now - 60)):
        marker = {
            "version": f"2026-01-05/{run_id}",
            "started_at": dt.datetime.fromtimestamp(started, dt.UTC).isoformat(),
        }
        storage.write_text(storage.join(root, f".tmp-{run_id}"), json.dumps(marker))
        storage.write_bytes(storage.join(root, "2026-01-05", run_id, INDEX_FILE), b"partial")
    storage.write_bytes(storage.join(root, "2026-01-03", "half-deleted", ID_MAP_FILE), b"rest")

    removed = prune(root, keep=2)
    assert sorted(removed) == sorted(
        [".tmp-stale", "2026-01-02/run1", "2026-01-03/half-deleted", "2026-01-05/stale"]
    )
    assert [v.relative for v in list_versions(root)] == [
        "2026-01-01/run0",
        "2026-01-03/run2",
        "2026-01-04/run3",
    ]
    assert not storage.exists(storage.join(root, "2026-01-02"))  # the emptied day folder goes too
    assert storage.listdir(storage.join(root, "2026-01-05")) == ["running"]
    assert storage.listdir(storage.join(root, "2026-01-03")) == ["run2"]
    assert IndexReader(root).manifest["run_id"] == "run0"

    storage.remove(storage.join(root, ".tmp-running"))
    publish_small(root, "run4", ds="2026-01-06", keep=1)  # a normal build: keeps only itself
    assert [v.relative for v in list_versions(root)] == ["2026-01-06/run4"]
    assert storage.listdir(root) == ["2026-01-06", LATEST]
