"""Airflow DAG `hir_daily`: the HIR pipeline's day, one task per stage of `hir pipeline` (jobs/pipeline.py).

Install: copy or symlink this file into the Airflow dags folder, and give the scheduler, the DAG processor and
the workers these environment variables. They are read when the file is parsed; each but the switches becomes
a DAG param of the same meaning, which a manual trigger may override.

    HIR_HOME          the checkout on the workers, with its .venv and .jars (`make setup`); default /opt/hir.
                      Every task runs in this folder, so relative paths below are relative to it.
    HIR_WAREHOUSE     --warehouse; default $HIR_HOME/warehouse
    HIR_CONFIG        --config TOML file (a table of flags per stage); default none: the jobs' own defaults
    HIR_SPARK_SUBMIT  default `spark-submit` (from PATH); e.g. /opt/hir/.venv/bin/spark-submit
    HIR_SPARK_ARGS    spark-submit's own flags; default the two Delta jars that `make setup` fetches,
                      `--jars .jars/delta-spark_4.0_2.13-4.4.0.jar,.jars/delta-storage-4.4.0.jar`
                      (add --master, --py-files ... for a cluster: README "Running on a cluster")
    HIR_AIRFLOW_INGEST=1    adds the ingest task (default 0: the day's events reach the warehouse otherwise)
    HIR_SOURCE        ingest's --source (required when HIR_AIRFLOW_INGEST=1)
    HIR_INGEST_ARGS   ingest's other flags, e.g. `--input /data/landing/events.csv`; default none
    HIR_AIRFLOW_EVALUATE=1  adds the evaluate task (default 0: it retrains on a history split, several times
                      the cost of the day itself)

Values are pasted into the command unquoted (HIR_SPARK_ARGS and HIR_INGEST_ARGS are split into words on
purpose), so paths must not contain spaces. The switches decide which tasks exist: they take effect when the
file is next parsed, not per run, and a value other than 0 or 1 is an import error rather than a guess.

Why one task per stage: each task is the pipeline command restricted to its own stage (`--from-stage S
--until-stage S`). The pipeline's lineage record, `<warehouse>/_pipeline/<ds>.json`, carries what one stage
hands to the next (embed gets the model version that train wrote), so splitting the run loses nothing, and
Airflow shows, retries and times out each stage on its own: a retry reruns its stage, not the day, and
clearing a task whose stage is still fresh (same flags, inputs and code) is a no-op (`hir pipeline ...
--force` by hand rebuilds one). Each task is a spark-submit of its own, so it pays a JVM start-up (seconds)
that the one-command run pays once. The stage list is written out below because the DAG must parse without
the project's packages; tests/conf/test_airflow_dag.py checks it against jobs.pipeline.STAGE_NAMES.

Scheduling: daily at 03:00 UTC, for the day before. The timetable is CronDataIntervalTimetable, so `{{ ds }}`
is the start of the run's data interval: the run that starts on 2026-01-08 at 03:00 builds 2026-01-07, like
the README's cron line (a bare cron string would, in Airflow 3, give ds = the day the run starts on, three
hours into it). One run at a time and no catch-up: each day warm-starts from the previous day's model, so days
run in order, and train waits for the previous run's train to have succeeded (depends_on_past). Backfill
earlier days in order with `airflow backfill create --dag-id hir_daily --from-date 2026-01-01 --to-date
2026-01-07 --max-active-runs 1` (Airflow 3: a backfill does not take the DAG's max_active_runs; Airflow 2:
`airflow dags backfill hir_daily -s ... -e ...`) or, outside Airflow, `hir pipeline --ds-from A --ds-to B`.
No sensors: a stage whose inputs are missing fails with its one-line error (`error: stage build-graph: ...`),
and the retries give late data two more chances.
"""

from __future__ import annotations

import datetime as dt
import os

import pendulum

try:  # Airflow 3
    from airflow.providers.standard.operators.bash import BashOperator
    from airflow.sdk import DAG, CronDataIntervalTimetable
except ImportError:  # Airflow 2
    from airflow import DAG
    from airflow.operators.bash import BashOperator
    from airflow.timetables.interval import CronDataIntervalTimetable


def switch(name: str) -> bool:
    """An environment switch, 0 (the default) or 1; anything else stops the parse, rather than guess."""
    value = os.environ.get(name, "0")
    if value not in ("0", "1"):
        raise ValueError(f"{name}={value!r}: set it to 0 or 1")
    return value == "1"


INGEST = switch("HIR_AIRFLOW_INGEST")
EVALUATE = switch("HIR_AIRFLOW_EVALUATE")

HIR_HOME = os.environ.get("HIR_HOME", "/opt/hir")
PARAMS = {
    "hir_home": HIR_HOME,
    "warehouse": os.environ.get("HIR_WAREHOUSE", f"{HIR_HOME}/warehouse"),
    "config": os.environ.get("HIR_CONFIG", ""),
    "spark_submit": os.environ.get("HIR_SPARK_SUBMIT", "spark-submit"),
    # Relative to HIR_HOME, where every task runs; the Makefile's DELTA_VERSION.
    "spark_args": os.environ.get(
        "HIR_SPARK_ARGS", "--jars .jars/delta-spark_4.0_2.13-4.4.0.jar,.jars/delta-storage-4.4.0.jar"
    ),
    "source": os.environ.get("HIR_SOURCE", ""),
    "ingest_args": os.environ.get("HIR_INGEST_ARGS", ""),
}
if INGEST and not PARAMS["source"]:
    raise ValueError("HIR_AIRFLOW_INGEST=1 needs HIR_SOURCE (ingest's --source, e.g. taobao)")

# The pipeline's stages in its order (jobs.pipeline.STAGE_NAMES); ingest and evaluate only when switched on.
STAGES = [
    *(["ingest"] if INGEST else []),
    "build-graph",
    "sample-neighbourhoods",
    "enrich",
    "train",
    "embed",
    "drift",
    "build-index",
    *(["evaluate"] if EVALUATE else []),
]

PIPELINE_COMMAND = (
    "{{ params.spark_submit }} {{ params.spark_args }} {{ params.hir_home }}/jobs/pipeline.py"
    " --ds {{ ds }} --warehouse {{ params.warehouse }}"
    "{% if params.config %} --config {{ params.config }}{% endif %}"
)
# Flags a stage needs beyond the day's: the pipeline runs ingest only with --source, evaluate only with
# --evaluate (any flag the pipeline does not know goes to ingest).
STAGE_FLAGS = {
    "ingest": " --source {{ params.source }} {{ params.ingest_args }}",
    "evaluate": " --evaluate",
}


def stage_command(stage: str) -> str:
    """The pipeline command restricted to one stage, as a Jinja template."""
    return f"{PIPELINE_COMMAND} --from-stage {stage} --until-stage {stage}{STAGE_FLAGS.get(stage, '')}"


DEFAULT_ARGS = {
    "owner": "hir",
    "depends_on_past": False,
    # A stage that fails loses its lineage record, so a retry reruns just that stage: the first 10-20 minutes
    # after the failure, the second 20-40 (the delay doubles; Airflow adds a jitter of up to as much again).
    "retries": 2,
    "retry_delay": dt.timedelta(minutes=10),
    "retry_exponential_backoff": True,  # a bool in Airflow 2; in 3.1+ a multiplier, which True sets to 2
    "max_retry_delay": dt.timedelta(hours=1),
    # A day's train stops on its own (early stopping, --epochs at most); 6 hours is for a stage that hangs.
    "execution_timeout": dt.timedelta(hours=6),
}

with DAG(
    dag_id="hir_daily",
    description="HIR pipeline: yesterday's graph, samples, model, embeddings, drift and indexes",
    doc_md=__doc__,
    schedule=CronDataIntervalTimetable("0 3 * * *", timezone="UTC"),
    start_date=pendulum.datetime(2026, 12, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    params=PARAMS,
    tags=["hir"],
) as dag:
    upstream = None
    for stage in STAGES:
        task = BashOperator(
            task_id=stage,
            bash_command=stage_command(stage),
            cwd="{{ params.hir_home }}",
            # The warm start needs the previous day's model, so a day's training waits for the last one's.
            depends_on_past=stage == "train",
            # Drift over --max-drift is a verdict on the day's model, not a transient fault: a retry repeats it.
            retries=0 if stage == "drift" else DEFAULT_ARGS["retries"],
        )
        if upstream is not None:
            upstream >> task
        upstream = task
