"""The one SparkSession factory, used by every job and by the tests.

Local runs (`hir ...`, `python jobs/x.py`, tests) get `local[*]` with the Delta jars that `make setup` fetched into
`.jars/`. Under `spark-submit` the master, jars and confs given on the command line win: this factory only fills
in what was not set.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from hir_model import storage
from jobs.common.errors import HirError

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# The Spark line the pinned Delta jar is built for; the jar's artifact name carries it (delta-spark_4.0_2.13).
SUPPORTED_SPARK_LINE = "4.0"

_DELTA_CONFS = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}

_DEFAULT_CONFS = {
    # Every timestamp is an instant; sources declare their own zone for `ds`, so the session works in UTC.
    "spark.sql.session.timeZone": "UTC",
    # Small data on one machine: the default 200 shuffle partitions would make hundreds of tiny tasks and files.
    "spark.sql.shuffle.partitions": "8",
    "spark.default.parallelism": "8",
    "spark.sql.adaptive.enabled": "true",
    # Arrow moves batches to the pandas UDFs and to pandas without row-by-row pickling.
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # A write must match the declared schema exactly (jobs.common.delta enforces it); never evolve silently.
    "spark.databricks.delta.schema.autoMerge.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # Delta rebuilds table state from its log with this many tasks (default 50, sized for huge logs). Our tables
    # get one commit per day, so a handful of tasks is faster everywhere (Delta's own test base uses 2).
    "spark.databricks.delta.snapshotPartitions": "4",
}


# JVM options of a local run's driver (it is the executor too); HIR_DRIVER_JAVA_OPTIONS replaces them.
LOCAL_DRIVER_JAVA_OPTIONS = "-XX:+UseParallelGC"


def jars_dir() -> Path:
    return Path(os.environ.get("HIR_JARS_DIR", PROJECT_ROOT / ".jars"))


def delta_jars() -> list[Path]:
    """The Delta jars fetched by `make setup` (delta-spark and delta-storage)."""
    folder = jars_dir()
    jars = sorted(folder.glob("delta-*.jar")) if folder.is_dir() else []
    if not any(j.name.startswith("delta-spark_") for j in jars) or not any(
        j.name.startswith("delta-storage-") for j in jars
    ):
        raise HirError(
            f"Delta jars not found in {folder}: run `make setup` (or pass them with spark-submit --jars)"
        )
    return jars


def s3a_jars() -> list[Path]:
    """Hadoop's S3A connector and the AWS SDK bundle it needs, when `make setup` fetched them (else [])."""
    folder = jars_dir()
    if not folder.is_dir():
        return []
    jars = sorted(folder.glob("hadoop-aws-*.jar")) + sorted(folder.glob("bundle-*.jar"))
    return jars if len(jars) == 2 else []


def check_versions(spark_version: str, jar_names: list[str]) -> None:
    """Fail with one line when the running Spark and the Delta jar were built for different Spark lines."""
    line = ".".join(spark_version.split(".")[:2])
    for name in jar_names:
        m = re.match(r"delta-spark_(\d+\.\d+)_2\.13-([\d.]+)\.jar$", name)
        if m and m.group(1) != line:
            raise HirError(
                f"Delta jar {name} is built for Spark {m.group(1)} but Spark {spark_version} is running"
            )
    if line != SUPPORTED_SPARK_LINE:
        raise HirError(
            f"Spark {spark_version} is not supported: this release pins Spark {SUPPORTED_SPARK_LINE}.x"
        )


def get_spark(
    app_name: str = "hir",
    *,
    shuffle_partitions: int | None = None,
    ui: bool = True,
    extra_conf: dict[str, str] | None = None,
    places: Mapping[str, str | Path] | None = None,
):
    """Return the active SparkSession, creating it with Delta enabled if needed. `places` ({flag: URI}, e.g.
    {"--warehouse": ...}) are checked reachable with the session's storage settings before the job writes
    anything: a missing bucket, refused credentials or a silent endpoint is one line, not a stack trace."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is None:
        active = _new_session(app_name, shuffle_partitions, ui, extra_conf)
    for flag, uri in (places or {}).items():
        storage.check_reachable(uri, flag)
    return active


def _new_session(app_name: str, shuffle_partitions: int | None, ui: bool, extra_conf: dict[str, str] | None):
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    # spark-submit starts the JVM first and hands the Python driver its gateway port; --master/--conf/--jars
    # are that JVM's system properties, which SparkConf() only sees once connected to it (unconnected, it is an
    # empty Python-side conf, and the local defaults below would override the cluster's master).
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    if under_submit:
        SparkContext._ensure_initialized()
    given = SparkConf()  # holds spark-submit's --master/--conf/--jars when launched that way
    builder = SparkSession.builder.appName(app_name)
    if not under_submit:
        # Python workers (pandas UDFs) must run the driver's interpreter, i.e. the project's virtualenv,
        # not whatever `python3` is first on PATH.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = builder.master(os.environ.get("HIR_SPARK_MASTER", "local[*]"))
        builder = builder.config("spark.driver.memory", os.environ.get("HIR_DRIVER_MEMORY", "4g"))
        # A local run is one JVM doing batch work: the throughput collector spends less CPU than G1 (JDK 17's
        # default) on its short-lived garbage: 0.85 of G1's wall and CPU time on a synthetic pipeline day
        # (bench/driver_gc.py, 2026-12-07).
        java_options = os.environ.get("HIR_DRIVER_JAVA_OPTIONS", LOCAL_DRIVER_JAVA_OPTIONS)
        if java_options and not given.contains("spark.driver.extraJavaOptions"):
            builder = builder.config("spark.driver.extraJavaOptions", java_options)
    jar_names: list[str] = []
    if not given.contains("spark.jars") or "delta-spark" not in given.get("spark.jars", ""):
        jars = delta_jars()
        jar_names = [j.name for j in jars]
        builder = builder.config("spark.jars", ",".join(str(j) for j in jars))
    else:
        jar_names = [Path(p).name for p in given.get("spark.jars").split(",")]
    s3a = s3a_jars()
    if s3a and not under_submit and not given.contains("spark.driver.extraClassPath"):
        # On the class path, not in spark.jars: spark.jars would copy the 558 MB SDK bundle into every session's
        # work folder. Local and standalone executors on this machine read the same files.
        classpath = os.pathsep.join(str(j) for j in s3a)
        builder = builder.config("spark.driver.extraClassPath", classpath)
        builder = builder.config("spark.executor.extraClassPath", classpath)
    for key, value in {**_DEFAULT_CONFS, **_DELTA_CONFS}.items():
        if key in _DELTA_CONFS or not given.contains(key):
            builder = builder.config(key, value)
    if shuffle_partitions is not None:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    if not ui:
        builder = builder.config("spark.ui.enabled", "false")
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)

    import pyspark

    check_versions(pyspark.__version__, jar_names)
    spark = builder.getOrCreate()
    # Model versions, lineage, indexes and reports reach s3a:// with the S3A settings the tables use.
    storage.configure_from_hadoop(spark.sparkContext._jsc.hadoopConfiguration(), spark.sparkContext._gateway)
    level = os.environ.get("HIR_SPARK_LOG_LEVEL", "WARN")
    spark.sparkContext.setLogLevel(level)
    _quiet_query_context_logs(level)
    return spark


def _quiet_query_context_logs(level: str) -> None:
    """pyspark 4 logs every analysis error as a multi-line JSON record before raising it; jobs report errors as
    one line themselves, so keep that record only when debugging (HIR_SPARK_LOG_LEVEL=INFO or DEBUG)."""
    from pyspark.logger import PySparkLogger

    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).disabled = level.upper() not in ("INFO", "DEBUG", "ALL")
