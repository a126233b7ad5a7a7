"""Shared fixtures: one local SparkSession for the whole test run, temporary warehouses, the real data folder."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    """`../shared/data` beside the checkout (override with HIR_SHARED_DATA)."""
    return Path(os.environ.get("HIR_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


def pytest_collection_modifyitems(config, items) -> None:
    """Test files with slow (end-to-end) tests first, each file's tests in their own order. `make test` runs two
    pytest-xdist workers that take whole files in this order (`--dist loadfile --no-loadscope-reorder`): the long
    files start at once and the short ones fill in around them, so both workers finish together instead of one
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


@dataclass(frozen=True)
class S3Server:
    """A real S3 server (s3proxy on a folder, fetched by `make setup`) and the settings that reach it."""

    endpoint: str
    access_key: str
    secret_key: str
    folder: Path

    def hadoop_conf(self) -> dict[str, str]:
        """The S3A settings a Spark job needs (as `spark.hadoop.` confs they are the same keys)."""
        return {
            "fs.s3a.endpoint": self.endpoint,
            "fs.s3a.access.key": self.access_key,
            "fs.s3a.secret.key": self.secret_key,
            "fs.s3a.path.style.access": "true",
            "fs.s3a.endpoint.region": "us-east-1",
            "fs.s3a.connection.ssl.enabled": "false",
        }

    def new_bucket(self, name: str) -> str:
        """Create a bucket (s3proxy's filesystem backend keeps one folder per bucket) and return s3a://name."""
        (self.folder / name).mkdir()
        return f"s3a://{name}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> S3Server:
    """s3proxy with its filesystem-nio2 backend (4.1.0: 2.6 lists directory markers without a Size, which delta-rs
    refuses), started once per test process on a free port; the newest jar in .jars/ when several are there."""
    from jobs.common.spark import jars_dir

    jars = sorted(jars_dir().glob("s3proxy-*-jar-with-dependencies.jar"))
    if not jars:
        pytest.fail(f"s3proxy jar not found in {jars_dir()}: run `make setup`")
    root = tmp_path_factory.mktemp("s3")
    folder = root / "buckets"
    folder.mkdir()
    port = _free_port()
    server = S3Server(f"http://127.0.0.1:{port}", "hir-test-key", "hir-test-secret", folder)
    (root / "s3proxy.conf").write_text(
        "\n".join(
            [
                f"s3proxy.endpoint={server.endpoint}",
                "s3proxy.authorization=aws-v2-or-v4",
                f"s3proxy.identity={server.access_key}",
                f"s3proxy.credential={server.secret_key}",
                "jclouds.provider=filesystem-nio2",
                f"jclouds.identity={server.access_key}",
                f"jclouds.credential={server.secret_key}",
                f"jclouds.filesystem.basedir={folder}",
                "",
            ]
        )
    )
    log = open(root / "s3proxy.log", "w")
    process = subprocess.Popen(
        ["java", "-jar", str(jars[-1]), "--properties", str(root / "s3proxy.conf")], stdout=log, stderr=log
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"s3proxy did not start: {(root / 's3proxy.log').read_text()[-2000:]}")
            time.sleep(0.2)
    yield server
    process.terminate()
    process.wait(timeout=30)
    log.close()


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
    """A real HDFS mini cluster (hadoop-client-minicluster 3.4.1, fetched by `make setup`, with pyspark's own
    Hadoop jars), started once per test process; returns its `hdfs://127.0.0.1:<port>` root."""
    import pyspark

    from jobs.common.spark import jars_dir

    jars = sorted(jars_dir().glob("hadoop-client-minicluster-*.jar"))
    if not jars:
        pytest.fail(f"hadoop-client-minicluster jar not found in {jars_dir()}: run `make setup`")
    root = tmp_path_factory.mktemp("hdfs")
    classpath = os.pathsep.join([str(jars[-1]), str(Path(pyspark.__file__).parent / "jars" / "*")])
    source = Path(__file__).parent / "cluster" / "MiniHdfs.java"
    log_path = root / "minihdfs.log"
    log = open(log_path, "w")
    process = subprocess.Popen(
        ["java", "-cp", classpath, str(source), str(root / "base"), str(_free_port())],
        stdout=log,
        stderr=log,
    )
    deadline = time.monotonic() + 180
    while "READY hdfs://" not in log_path.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"HDFS mini cluster did not start: {log_path.read_text()[-2000:]}")
        time.sleep(0.5)
    url = log_path.read_text().split("READY ", 1)[1].split()[0]
    yield url
    process.terminate()
    process.wait(timeout=60)
    log.close()
