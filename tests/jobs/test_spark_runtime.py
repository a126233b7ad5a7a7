"""The SparkSession factory: Delta enabled, UTC, the local JVM's collector, version check."""

from __future__ import annotations

import pytest

from jobs.common.errors import HirError
from jobs.common.spark import check_versions


def test_session_has_delta_and_utc(spark):
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert "DeltaSparkSessionExtension" in spark.conf.get("spark.sql.extensions")


def test_a_local_session_runs_the_throughput_collector(spark):
    # The option reached the JVM that was started, not only the conf: its collectors are Parallel GC's.
    beans = spark._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    assert {bean.getName() for bean in beans} == {"PS Scavenge", "PS MarkSweep"}


def test_version_mismatch_is_a_clear_error():
    check_versions("4.0.5", ["delta-spark_4.0_2.13-4.4.0.jar", "delta-storage-4.4.0.jar"])
    with pytest.raises(HirError, match="built for Spark 3.5 but Spark 4.0.5 is running"):
        check_versions("4.0.5", ["delta-spark_3.5_2.13-3.3.0.jar"])
    with pytest.raises(HirError, match="Spark 4.1.0 is not supported"):
        check_versions("4.1.0", [])
