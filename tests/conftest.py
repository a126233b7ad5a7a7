"""Shared fixtures: one local SparkSession for the whole test run, temporary warehouses, the real data folder."""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

import pytest

from tests.servers import S3Server, start_hdfs, start_s3proxy

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    """`../shared/data` beside the checkout (override with HIR_SHARED_DATA)."""
    return Path(os.environ.get("HIR_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


def pytest_collection_modifyitems(config, items) -> None:
    """Test files with slow (end-to-end) tests first, each file's tests in their own order. `make test` runs three
    pytest-xdist workers that take whole files in this order (`--dist loadfile --no-loadscope-reorder`): the long
    files start at once and the short ones fill in around them, so the workers finish together instead of one
    running a cluster test alone at the end."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: keeps the order within each group


# Seconds and files per pytest-xdist worker, summed on the controller from the reports the workers send back.
_WORKER_SECONDS: dict[str, float] = defaultdict(float)
_WORKER_FILES: dict[str, list[str]] = defaultdict(list)


def pytest_runtest_logreport(report) -> None:
    worker = getattr(getattr(report, "node", None), "gateway", None)
    if worker is None:  # not under xdist, or inside a worker
        return
    _WORKER_SECONDS[worker.id] += report.duration
    file = report.nodeid.split("::")[0]
    if file not in _WORKER_FILES[worker.id]:
        _WORKER_FILES[worker.id].append(file)


def pytest_terminal_summary(terminalreporter) -> None:
    """How busy each worker was, and with which files in which order: `make test`'s wall time is the busiest
    worker's, so this says whether a slow run needs less work or a better order."""
    if not _WORKER_SECONDS:
        return
    terminalreporter.section("seconds per worker")
    for worker in sorted(_WORKER_SECONDS):
        files = ", ".join(Path(f).stem.removeprefix("test_") for f in _WORKER_FILES[worker])
        terminalreporter.write_line(f"{worker}: {_WORKER_SECONDS[worker]:.0f}s in tests: {files}")


@pytest.fixture(scope="session")
def spark():
    from jobs.common.spark import get_spark

    session = get_spark("hir-tests", shuffle_partitions=2, ui=False)
    yield session
    session.stop()


@pytest.fixture()
def warehouse(tmp_path: Path) -> Path:
    return tmp_path / "warehouse"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    folder = shared_data_dir()
    if not folder.is_dir():
        pytest.fail(f"real datasets not found at {folder} (set HIR_SHARED_DATA)")
    return folder


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> S3Server:
    """A real S3 server (s3proxy, tests/servers.py) started once per test process."""
    try:
        server = start_s3proxy(tmp_path_factory.mktemp("s3"))
    except RuntimeError as err:
        pytest.fail(str(err))
    yield server
    server.stop()


@pytest.fixture()
def s3_settings(s3_server):
    """The Python side's storage layer pointed at the test S3 server for one test (restored after it)."""
    from hir_model import storage

    before = storage._settings
    storage.configure(storage.S3Settings.from_hadoop(s3_server.hadoop_conf()))
    yield storage.s3_settings()
    storage.configure(before)


@pytest.fixture()
def s3_spark(spark, s3_server, s3_settings):
    """The shared SparkSession with its S3A connector pointed at the test S3 server, as `--conf
    spark.hadoop.fs.s3a.*` would (FileSystem instances are cached per bucket, so the settings reach new buckets)."""
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in s3_server.hadoop_conf().items():
        conf.set(key, value)
    return spark


@pytest.fixture(scope="session")
def hdfs_cluster(tmp_path_factory) -> str:
    """A real HDFS mini cluster (tests/servers.py) started once per test process: its hdfs://127.0.0.1:<port>."""
    try:
        cluster = start_hdfs(tmp_path_factory.mktemp("hdfs"))
    except RuntimeError as err:
        pytest.fail(str(err))
    yield cluster.url
    cluster.stop()
