"""Faults a daily run meets, on the sampling job submitted the production way (`spark-submit`, local
master): the driver SIGKILLed while it writes the day's partition, and two runs of the same day at once; plus
the mapping of Delta's commit conflicts to one line.

The rest of the fault suite lives beside the code it guards: losing an executor mid-stage on a standalone
cluster (tests/cluster/test_standalone_cluster.py), a killed index publish
(tests/jobs/test_build_index.py::test_a_build_killed_before_the_swap_leaves_latest_valid), malformed input
files (tests/jobs/test_ingest_fuzz.py) and tampered checkpoints (tests/hir_model/test_checkpoint.py).
"""

from __future__ import annotations

import datetime as dt
import re
import shutil
import textwrap
import time
from pathlib import Path

import pytest
from chispa import assert_df_equality
from delta.exceptions import ConcurrentAppendException
from pyspark.sql import functions as F

from jobs import build_graph
from jobs import sample_neighbourhoods as sample_job
from jobs.common.delta import concurrent_write_is_an_error, read_table, table_version
from jobs.common.errors import HirError
from jobs.ingest_events import IngestConfig, ingest
from jobs.sample_neighbourhoods import SampleConfig, sample_neighbourhoods
from jobs.sources.synthetic import SyntheticSpec
from schemas.tables import EDGES, NEIGHBOURHOODS, NODES
from tests.cluster.standalone import finish, job_script, kill_group, start_submit, submit_command

DS = dt.date(2026, 1, 7)
DAY = f"ds = DATE'{DS.isoformat()}'"
SYNTHETIC = SyntheticSpec(users=150, items=300, events=2000, seed=5)
# Several write tasks on two cores, so a kill can land between the first part file and the commit.
LOCAL_CONF = {
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.adaptive.coalescePartitions.enabled": "false",
}
MASTER = "local[2]"


@pytest.fixture(scope="module")
def graph_warehouse(spark, tmp_path_factory) -> Path:
    """A small synthetic day's graph with a previous sample of the day (seed 1), built once; each test works
    on a copy, as a daily rerun finds it."""
    warehouse = tmp_path_factory.mktemp("faults") / "warehouse"
    ingest(spark, IngestConfig(source="synthetic", warehouse=str(warehouse), synthetic=SYNTHETIC))
    flags = ["--ds", DS.isoformat(), "--warehouse", str(warehouse)]
    assert build_graph.main(flags) == 0
    assert sample_job.main([*flags, "--seed", "1"]) == 0
    return warehouse


def copy_of(warehouse: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(warehouse, tmp_path / "warehouse"))


def undisturbed(spark, warehouse: Path, seed: int = 0):
    """The day's rows a clean run with this seed writes, computed directly from the graph."""
    nodes = read_table(spark, NODES, warehouse).where(DAY)
    edges = read_table(spark, EDGES, warehouse).where(DAY)
    cfg = SampleConfig(ds=DS, warehouse=str(warehouse), seed=seed)
    return sample_neighbourhoods(nodes, edges, cfg).withColumn("ds", F.lit(DS))


def assert_day_equals(spark, warehouse: Path, expected) -> None:
    day = read_table(spark, NEIGHBOURHOODS, warehouse).where(DAY)
    assert day.count() == day.select("node_id").distinct().count()  # never a duplicated target
    assert_df_equality(
        day,
        expected.select(*day.columns),
        ignore_row_order=True,
        ignore_nullable=True,
        ignore_metadata=True,
    )


def commits(table: Path) -> list[str]:
    return sorted(p.name for p in (table / "_delta_log").glob("*.json"))


@pytest.mark.slow
def test_a_driver_killed_mid_write_leaves_the_previous_version(spark, graph_warehouse, tmp_path):
    warehouse = copy_of(graph_warehouse, tmp_path)
    flags = ["--ds", DS.isoformat(), "--warehouse", str(warehouse)]
    table = warehouse / NEIGHBOURHOODS.name
    day_dir = table / f"ds={DS.isoformat()}"
    version = table_version(spark, NEIGHBOURHOODS, warehouse)
    previous = read_table(spark, NEIGHBOURHOODS, warehouse, version).where(DAY)
    old_files, old_commits = set(day_dir.glob("*.parquet")), commits(table)

    command = submit_command(
        MASTER, job_script("sample_neighbourhoods"), [*flags, "--seed", "0"], conf=LOCAL_CONF
    )
    running = start_submit(command, cwd=tmp_path)
    proc = running.proc
    try:
        while proc.poll() is None and not set(day_dir.glob("*.parquet")) - old_files:
            time.sleep(0.005)
        kill_group(proc)  # driver JVM and Python driver together: no shutdown hook, no cleanup
        done = finish(running, timeout=60)
    finally:
        kill_group(proc)
    written = set(day_dir.glob("*.parquet")) - old_files
    assert done.returncode == -9, "the job ended before it was killed:\n" + done.stdout[-3000:]
    assert written, "killed before any part file was written"
    assert commits(table) == old_commits, "the kill came after the commit"

    # The table is still at its previous version, readable, with the previous day and nothing of the new one.
    assert table_version(spark, NEIGHBOURHOODS, warehouse) == version
    now = read_table(spark, NEIGHBOURHOODS, warehouse).where(DAY)
    assert now.count() == previous.count()
    assert_df_equality(now, previous, ignore_row_order=True)
    live = {Path(f).name for f in now.inputFiles()}
    assert not {f.name for f in written} & live  # the half-written files stay invisible orphans
    print(
        f"\nkilled after {done.seconds:.1f} s with {len(written)} part file(s) written and no commit; "
        f"table still at version {version} with {previous.count()} rows"
    )

    assert sample_job.main([*flags, "--seed", "0"]) == 0  # the rerun completes the day
    assert table_version(spark, NEIGHBOURHOODS, warehouse) == version + 1
    assert_day_equals(spark, warehouse, undisturbed(spark, warehouse))


# Runs the job with its write held until the other run reaches its write too: both Delta transactions read the
# day's files before either commits, the overlap a scheduler produces when it starts the same day twice.
TOGETHER = """
import sys
import time
from pathlib import Path

from pyspark.sql.readwriter import DataFrameWriter

barrier, name = Path(sys.argv.pop(1)), sys.argv.pop(1)
save = DataFrameWriter.save


def save_together(self, *args, **kwargs):
    (barrier / name).touch()
    deadline = time.monotonic() + 300
    while len(list(barrier.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    return save(self, *args, **kwargs)


DataFrameWriter.save = save_together

from jobs.common.args import run_job
from jobs.sample_neighbourhoods import main

sys.exit(run_job(main))
"""


@pytest.mark.slow
def test_two_runs_of_one_day_at_once_never_duplicate(spark, graph_warehouse, tmp_path):
    warehouse = copy_of(graph_warehouse, tmp_path)
    flags = ["--ds", DS.isoformat(), "--warehouse", str(warehouse)]
    script, barrier = tmp_path / "together.py", tmp_path / "barrier"
    script.write_text(textwrap.dedent(TOGETHER))
    barrier.mkdir()

    started = [
        start_submit(
            submit_command(MASTER, script, [str(barrier), name, *flags], conf=LOCAL_CONF), tmp_path, name
        )
        for name in ("first", "second")
    ]
    try:
        runs = [finish(running) for running in started]
    finally:
        for running in started:
            kill_group(running.proc)

    failed = [run for run in runs if run.returncode != 0]
    for run in runs:
        output = run.stdout + run.stderr
        assert "Traceback" not in output, output[-4000:]
    # Both transactions read the day at the same version; each replaces its files, so Delta must reject the
    # second commit (the first one added files to the day it read): exactly one run wins.
    assert len(failed) == 1, [r.stdout[-2000:] for r in runs]
    (loser,) = failed
    errors = [line for line in (loser.stdout + loser.stderr).splitlines() if line.startswith("error: ")]
    assert loser.returncode == 2 and len(errors) == 1, loser.stdout[-3000:]
    assert re.fullmatch(
        r"error: table neighbourhoods at \S+: concurrent write, rerun the job \(\w+Exception: .+\)", errors[0]
    ), errors[0]
    print(f"\ntwo runs at once: exit codes {[r.returncode for r in runs]}; the loser said: {errors[0]}")
    assert_day_equals(spark, warehouse, undisturbed(spark, warehouse))


# ----------------------------------------------------------------------------------- conflict message


# Delta 4.4's own texts (the first from a real conflict of test_two_runs_of_one_day_at_once_never_duplicate).
APPEND = (
    "[DELTA_CONCURRENT_APPEND.WITH_PARTITION_HINT] ConcurrentAppendException: Transaction conflict detected. "
    "a concurrent WRITE added data to table delta.`file:/wh/neighbourhoods` committed at version 2. The "
    "concurrent operation modified data in the partition [ds=2026-01-07] that should have been read by this "
    "operation. Please retry the operation. Refer to "
    "https://docs.delta.io/latest/concurrency-control.html for more information."
    '\nConflicting commit: {"timestamp":1}'
)
DELETE_READ = (
    "An error occurred while calling o91.save.\n: io.delta.exceptions.ConcurrentDeleteReadException: "
    "[DELTA_CONCURRENT_DELETE_READ] This transaction attempted to read one or more files that were deleted "
    "(for example part-00000.parquet in partition [ds=2026-01-07]) by a concurrent update. Please try the "
    "operation again.\n\tat io.delta.Foo(Foo.scala:1)"
)


class FakeJavaError(Exception):
    """What pyspark raises for a Java exception it has no Python class for: the Java exception's text."""


@pytest.mark.parametrize(
    "raised, kind, says",
    [
        (ConcurrentAppendException(APPEND), "ConcurrentAppendException", "a concurrent WRITE added data"),
        (FakeJavaError(DELETE_READ), "ConcurrentDeleteReadException", "files that were deleted"),
    ],
    ids=["captured", "java-text"],
)
def test_a_delta_commit_conflict_is_one_line_naming_the_table(raised, kind, says, tmp_path):
    with pytest.raises(HirError) as caught, concurrent_write_is_an_error(NEIGHBOURHOODS, tmp_path / "wh"):
        raise raised
    message = str(caught.value)
    table = (tmp_path / "wh").resolve() / "neighbourhoods"
    assert message.startswith(
        f"table neighbourhoods at {table}: concurrent write, rerun the job ({kind}: "
    ), message
    assert says in message and "\n" not in message and "[DELTA_" not in message and "Refer to" not in message
    assert message.endswith(".)")


def test_other_write_errors_pass_through_unchanged(tmp_path):
    with pytest.raises(ValueError, match="disk full"), concurrent_write_is_an_error(NEIGHBOURHOODS, tmp_path):
        raise ValueError("disk full")
