"""Warehouses on an object store: the same jobs on `s3a://` (a real S3 server, s3proxy) write what they write on a
local warehouse; bad URIs fail in one line before anything is written; the day lock holds on the store."""

from __future__ import annotations

import datetime as dt
import io
import json
import time
from contextlib import redirect_stderr
from pathlib import Path

import pytest

from hir_model import storage
from hir_model.errors import HirError
from jobs import pipeline
from jobs.common.args import run_job
from jobs.common.delta import read_table
from jobs.ingest_events import IngestConfig, ingest
from schemas.tables import EVENTS, INGEST_REJECTS
from tests.jobs.test_ingest_events import TAOBAO


def rows(spark, spec, warehouse, *drop: str) -> list[tuple]:
    return sorted(map(tuple, read_table(spark, spec, warehouse).drop(*drop).collect()), key=repr)


def test_ingest_reads_its_input_from_s3a_and_hdfs_into_such_warehouses_as_it_does_locally(
    s3_spark, s3_server, hdfs_cluster, tmp_path
) -> None:
    spark = s3_spark
    local_input = tmp_path / "tb.csv"
    local_input.write_text(TAOBAO)
    local = str(tmp_path / "warehouse")
    ingest(
        spark,
        IngestConfig(source="taobao", inputs=(str(local_input),), warehouse=local, max_reject_fraction=1.0),
    )
    # The rejects name their input file and their run (a hash of it): the same rows apart from those.
    kept = ("input_file", "run_id")
    for root in (s3_server.new_bucket("ingest"), f"{hdfs_cluster}/ingest"):
        remote_input, remote = f"{root}/raw/tb.csv", f"{root}/warehouse"
        storage.write_text(remote_input, TAOBAO)
        ingest(
            spark,
            IngestConfig(source="taobao", inputs=(remote_input,), warehouse=remote, max_reject_fraction=1.0),
        )

        assert storage.is_dir(f"{remote}/events/_delta_log")  # the table is there, not in a local folder
        assert rows(spark, EVENTS, remote) == rows(spark, EVENTS, local) != []
        assert rows(spark, INGEST_REJECTS, remote, *kept) == rows(spark, INGEST_REJECTS, local, *kept) != []
        files = {r["input_file"] for r in read_table(spark, INGEST_REJECTS, remote).collect()}
        assert files == {remote_input}, files
    assert not Path("s3a:").exists() and not Path("hdfs:").exists()

    # A ranking team without Spark reads the same table with delta-rs and the same settings.
    from deltalake import DeltaTable

    remote = "s3a://ingest/warehouse"
    table = DeltaTable(f"{remote}/events", storage_options=storage.s3_settings().deltalake_options())
    read = table.to_pandas()
    local_items = sorted(str(r["item_id"]) for r in read_table(spark, EVENTS, local).collect())
    assert sorted(read["item_id"].astype(str)) == local_items


def one_line_failure(main, argv: list[str]) -> str:
    err = io.StringIO()
    with redirect_stderr(err):
        code = run_job(main, argv)
    text = err.getvalue().strip()
    assert code == 2 and len(text.splitlines()) == 1, text
    return text


def test_bad_warehouse_uris_fail_in_one_line_before_anything_is_written(s3_spark, s3_server) -> None:
    argv = ["--ds", "2026-01-07", "--source", "synthetic", "--warehouse"]
    assert "unknown scheme 'gs://'" in one_line_failure(pipeline.main, [*argv, "gs://bucket/wh"])
    assert "use s3a://" in one_line_failure(pipeline.main, [*argv, "s3://bucket/wh"])
    missing = one_line_failure(pipeline.main, [*argv, "s3a://no-such-bucket/wh"])
    assert "--warehouse s3a://no-such-bucket/wh: bucket 'no-such-bucket' does not exist" in missing
    assert not (s3_server.folder / "no-such-bucket").exists()

    storage.configure(
        storage.S3Settings.from_hadoop({**s3_server.hadoop_conf(), "fs.s3a.secret.key": "wrong"})
    )
    bucket = s3_server.new_bucket("refused")
    assert "access denied" in one_line_failure(pipeline.main, [*argv, f"{bucket}/wh"])
    assert list((s3_server.folder / "refused").iterdir()) == []


def test_the_day_lock_holds_on_an_object_store(s3_server, s3_settings) -> None:
    warehouse = s3_server.new_bucket("locks") + "/wh"
    day = dt.date(2026, 1, 7)
    with pipeline.day_lock(warehouse, day):
        with pytest.raises(HirError, match=r"another pipeline run for 2026-01-07 \(.+:\d+\) holds"):
            with pipeline.day_lock(warehouse, day):
                pass
        with pipeline.day_lock(warehouse, day + dt.timedelta(days=1)):  # another day runs alongside
            pass
    with pipeline.day_lock(warehouse, day):  # released at the end
        pass
    lock = storage.join(warehouse, pipeline.LINEAGE_DIR, "2026-01-07.lock")
    assert not storage.exists(lock)
    # A killed run's lock: refused while young, taken over once stale.
    storage.write_text(lock, json.dumps({"owner": "dead:1", "token": "x", "since": time.time()}))
    with pytest.raises(HirError, match="dead:1"):
        with pipeline.day_lock(warehouse, day):
            pass
    stale = time.time() - pipeline.REMOTE_LOCK_STALE_SECONDS - 1
    storage.write_text(lock, json.dumps({"owner": "dead:1", "token": "x", "since": stale}))
    with pipeline.day_lock(warehouse, day):
        assert json.loads(storage.read_text(lock))["owner"] != "dead:1"
    assert not storage.exists(lock)
