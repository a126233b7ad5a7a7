"""The jobs on a real Spark standalone cluster (a master and two 1-core workers on 127.0.0.1, started from
the Spark that pyspark ships), submitted with the README's spark-submit line and `make dist`'s zip (ingest,
build-graph, sample-neighbourhoods and enrich as one `hir pipeline` application, the way a daily run is
submitted): a worker SIGKILLed with its executor in the middle of the sampling stage, and still the tables equal
those of a local-mode run on the same input (task retry over deterministic, hash-keyed sampling).

One cluster and one application serve the module; the finalizer kills every daemon's process group even when a
test fails.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from chispa import assert_df_equality

from jobs.common.delta import read_table
from jobs.pipeline import config_from_args, run_pipeline
from schemas.tables import (
    EDGES,
    ENTITIES,
    ENTITY_CONTENT,
    EVENTS,
    INGEST_REJECTS,
    NEIGHBOURHOODS,
    NODES,
    SYNTHETIC_TRUTH,
)
from tests.cluster.standalone import (
    Running,
    StandaloneCluster,
    Submitted,
    build_dist,
    finish,
    free_port,
    get_json,
    job_script,
    kill_group,
    start_submit,
    submit_command,
)
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow

DS = "2026-01-07"  # the synthetic source's last day (start 2026-01-01, 7 days)
# Small, but every stage still shuffles over several partitions and both executors get tasks.
SYNTHETIC = ["--source", "synthetic", "--users", "200", "--items", "400", "--events", "3000", "--seed", "11"]
# ingest, build-graph, sample-neighbourhoods and enrich, as one `hir pipeline` run: on the cluster one
# application (the way a scheduled daily run is submitted), so the driver and executors start once, not per job.
# enrich runs a pandas UDF on the executors (their Python env).
STAGES = ("ingest", "build-graph", "sample-neighbourhoods", "enrich")
PIPELINE = ["--ds", DS, *SYNTHETIC, "--until-stage", "enrich", "--stage-args", "enrich=--encoder hashing:32"]
TABLES = (EVENTS, ENTITIES, INGEST_REJECTS, SYNTHETIC_TRUTH, NODES, EDGES, NEIGHBOURHOODS, ENTITY_CONTENT)
# Other partition counts than the tests' local session (2): the tables must not depend on the partitioning. Many
# small tasks, so that the kill lands inside a stage, and AQE does not merge them back.
CLUSTER_CONF = {
    "spark.sql.shuffle.partitions": "12",
    "spark.default.parallelism": "3",
    "spark.sql.adaptive.coalescePartitions.enabled": "false",
    "spark.task.maxFailures": "4",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    standalone = StandaloneCluster(tmp_path_factory.mktemp("standalone"), workers=2, cores=1, memory="1g")
    try:
        yield standalone.start()
    finally:
        standalone.stop()


@pytest.fixture(scope="module")
def dist_zip(tmp_path_factory) -> Path:
    return build_dist(tmp_path_factory.mktemp("dist"))


@dataclass(frozen=True)
class Runs:
    local: Path
    cluster: Path
    submitted: Submitted
    killed_in: dict | None  # the sampling stage worker 0 was killed in (from the driver's REST API)
    failed_tasks: int  # tasks lost with the executor and rerun


def app_stages(ui: str, status: str = "") -> list[dict] | None:
    """The stages of the driver's app from its REST API; None while the UI is not up (or already gone)."""
    try:
        (app,) = get_json(f"{ui}/api/v1/applications", timeout=1)
        return get_json(f"{ui}/api/v1/applications/{app['id']}/stages{status}", timeout=2)
    except (OSError, ValueError):
        return None


def running_stage(ui: str) -> dict | None:
    """An active shuffle-map stage with both executors busy and some tasks done, if there is one. A map stage's
    finished tasks keep their output on the executor that ran them, so killing it loses work whether its task
    is still running (ExecutorLostFailure) or has just finished (the output is resubmitted); a result stage's
    finished tasks are safe with the driver, and a kill between two of its tasks would lose nothing."""
    for stage in app_stages(ui, "?status=active") or []:
        if (
            stage["numTasks"] >= 8
            and stage["numActiveTasks"] >= 2
            and 0 < stage["numCompleteTasks"]
            and stage.get("shuffleWriteRecords", 0) > 0
        ):
            return stage
    return None


def kill_a_worker_while_sampling(cluster, running: Running, ui: str) -> tuple[dict | None, int]:
    """SIGKILL worker 0 (and its executor) once the application's sampling stage runs tasks on both executors;
    then count the tasks lost with it while the driver is up. Tasks that were running on the lost executor count
    as failed in their stage (ExecutorLostFailure); Spark logs them at INFO only, so the count comes from the
    driver's REST API."""
    killed_in, failed_tasks = None, 0
    deadline = time.monotonic() + 1200  # only stops a hung run: the kill point does not depend on time
    while killed_in is None and running.proc.poll() is None and time.monotonic() < deadline:
        printed = running.out.read_text()
        if "sample-neighbourhoods done" in printed:
            break  # the stage ended before both executors were seen busy in it: the fixture's check fails
        if "sample-neighbourhoods ..." in printed:
            killed_in = running_stage(ui)
        if killed_in is None:
            time.sleep(0.05)
    if killed_in is not None:
        cluster.kill_worker(0)
    while running.proc.poll() is None:
        stages = app_stages(ui)
        if stages is not None:
            failed_tasks = max(failed_tasks, sum(s["numFailedTasks"] for s in stages))
        time.sleep(0.2)
    return killed_in, failed_tasks


@pytest.fixture(scope="module")
def runs(spark, cluster, dist_zip, tmp_path_factory) -> Runs:
    """The stages in local mode (in-process, the tests' session) and on the cluster (spark-submit of the
    pipeline job with the README's standalone line), losing a worker in the middle of its sampling stage."""
    root = tmp_path_factory.mktemp("runs")
    local, on_cluster = root / "local", root / "cluster"
    started = time.perf_counter()
    report = run_pipeline(spark, config_from_args([*PIPELINE, "--warehouse", str(local)]), out=io.StringIO())
    local_seconds = time.perf_counter() - started
    assert report.status() == dict.fromkeys(STAGES, "ran")

    ui_port = free_port()
    conf = {**CLUSTER_CONF, "spark.ui.enabled": "true", "spark.ui.port": str(ui_port)}
    command = submit_command(
        cluster.url, job_script("pipeline"), [*PIPELINE, "--warehouse", str(on_cluster)], dist_zip, conf
    )
    running = start_submit(command, cwd=root)
    try:
        killed_in, failed_tasks = kill_a_worker_while_sampling(
            cluster, running, f"http://127.0.0.1:{ui_port}"
        )
        done = finish(running)
    finally:
        kill_group(running.proc)
        cluster.ensure_workers()
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    on_cluster_stages = dict(re.findall(r"\] ([a-z-]+) done in ([0-9.]+)s", done.stdout))
    assert list(on_cluster_stages) == list(STAGES), done.stdout[-3000:]  # every stage ran there, in order

    print(
        "\nwall time, same input: local mode (in-process) vs standalone cluster (2 workers x 1 core, one lost)"
    )
    for stage in report.stages:
        print(
            f"  {stage.name:22s} local {stage.seconds:6.1f} s  cluster {float(on_cluster_stages[stage.name]):6.1f} s"
        )
    print(f"  {'total':22s} local {local_seconds:6.1f} s  spark-submit {done.seconds:6.1f} s")
    return Runs(local, on_cluster, done, killed_in, failed_tasks)


def test_dist_zip_holds_every_module_and_imports_on_its_own(dist_zip):
    packages = ("jobs", "hir_model", "udfs", "schemas")
    wanted = {str(p.relative_to(REPO_ROOT)) for d in packages for p in (REPO_ROOT / d).rglob("*.py")}
    with zipfile.ZipFile(dist_zip) as archive:
        assert wanted <= set(archive.namelist())
    # First on sys.path, as --py-files puts it on executors: the jobs import from the zip, not the checkout.
    probe = "import sys; sys.path.insert(0, sys.argv[1]); import jobs.build_graph as job; print(job.__file__)"
    proc = subprocess.run(
        [sys.executable, "-c", probe, str(dist_zip)], cwd=dist_zip.parent, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(dist_zip / "jobs" / "build_graph.py")


def test_cluster_tables_equal_local_mode(spark, cluster, runs):
    finished = {app["name"] for app in cluster.state()["completedapps"] if app["state"] == "FINISHED"}
    # The app ran on the cluster's executors, not in a local master the session factory picked by itself.
    assert f"hir-pipeline-{DS}" in finished
    for spec in TABLES:
        local = read_table(spark, spec, runs.local)
        on_cluster = read_table(spark, spec, runs.cluster)
        assert on_cluster.count() == local.count(), spec.name
        assert_df_equality(on_cluster, local, ignore_row_order=True)
    assert read_table(spark, NEIGHBOURHOODS, runs.cluster).count() > 0


def test_sampling_survives_losing_a_worker_mid_stage(runs):
    """The application above lost worker 0 and its executor while a sampling stage ran on both; the job retried
    the lost tasks (and recomputed the lost shuffle output), and its tables equal local mode's (test above)."""
    log = runs.submitted.stdout + runs.submitted.stderr
    assert runs.killed_in is not None, "the sampling stage never ran on both executors:\n" + log[-3000:]
    assert "Lost executor" in log, log[-3000:]  # the driver saw the executor go
    killed = runs.killed_in
    print(
        f"\nkilled worker 0 in stage {killed['stageId']} ({killed['numCompleteTasks']}/{killed['numTasks']} "
        f"tasks done, {killed['numActiveTasks']} running); {runs.failed_tasks} task(s) lost with the executor "
        f"and rerun; the application finished in {runs.submitted.seconds:.1f} s"
    )
    assert (
        runs.failed_tasks >= 1
    )  # tasks or map outputs died with the executor: the kill landed inside a stage
