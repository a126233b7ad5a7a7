"""What Airflow makes of conf/airflow, as JSON: run with .venv-airflow's python by
tests/conf/test_airflow_dag.py (the project's .venv has no Airflow, and must not need one).

    .venv-airflow/bin/python tests/conf/airflow_dag_report.py conf/airflow report.json < request.json

request.json: {"ds": "2026-01-07", "scenarios": {"name": {"ENV_VAR": "value", ...}, ...}}. The DAG reads its
switches and params from the environment when it is parsed, so each scenario parses the folder afresh with
its variables (and no other HIR_ ones), through DagBag as the DAG processor does, then round-trips each DAG
through the serialization the scheduler reads. Per scenario: import errors, captured warnings, and per DAG its
schedule (the first two scheduled runs from ds on: when each starts and the ds it gets) and its tasks in
topological order, each with its command and working folder rendered for ds.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys

import pendulum
from airflow.dag_processing.dagbag import DagBag
from airflow.serialization.serialized_objects import DagSerialization
from airflow.timetables.base import TimeRestriction


def seconds(delta: dt.timedelta | None) -> float | None:
    return None if delta is None else delta.total_seconds()


def scheduled_runs(timetable, ds: str, count: int = 2) -> list[dict]:
    """The first `count` scheduled runs from ds's midnight (UTC) on, as the scheduler would create them."""
    restriction = TimeRestriction(earliest=pendulum.parse(ds), latest=None, catchup=True)
    runs, last_interval = [], None
    for _ in range(count):
        info = timetable.next_dagrun_info(last_automated_data_interval=last_interval, restriction=restriction)
        runs.append({"run_after": info.run_after.isoformat(), "ds": info.logical_date.strftime("%Y-%m-%d")})
        last_interval = info.data_interval
    return runs


def task_report(task, sdk_task, ds: str) -> dict:
    """`task` as the scheduler sees it (deserialized), its templates rendered from the DAG file's task, as a
    worker renders them."""
    context = {"ds": ds, "params": dict(sdk_task.params)}
    return {
        "task_id": task.task_id,
        "upstream": sorted(task.upstream_task_ids),
        "operator": task.task_type,
        "owner": task.owner,
        "retries": task.retries,
        "retry_delay_s": seconds(task.retry_delay),
        "retry_exponential_backoff": float(task.retry_exponential_backoff),
        "execution_timeout_s": seconds(task.execution_timeout),
        "depends_on_past": task.depends_on_past,
        "bash_command": task.bash_command,
        "command": sdk_task.render_template(sdk_task.bash_command, context),
        "cwd": sdk_task.render_template(sdk_task.cwd, context),
    }


def dag_report(dag, ds: str) -> dict:
    scheduled = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    return {
        "schedule": scheduled.timetable.summary,
        "timetable": type(scheduled.timetable).__name__,
        "scheduled_runs": scheduled_runs(scheduled.timetable, ds),
        "catchup": scheduled.catchup,
        "max_active_runs": scheduled.max_active_runs,
        "tasks": [
            task_report(task, dag.get_task(task.task_id), ds)
            for task in scheduled.task_group.topological_sort()
        ],
    }


def parse(dag_folder: str, env: dict[str, str], ds: str) -> dict:
    for name in [name for name in os.environ if name.startswith("HIR_")]:
        del os.environ[name]
    os.environ.update(env)
    bag = DagBag(dag_folder=dag_folder)
    return {
        "import_errors": bag.import_errors,
        "warnings": {path: list(found) for path, found in bag.captured_warnings.items()},
        "dags": {dag_id: dag_report(dag, ds) for dag_id, dag in bag.dags.items()},
    }


def main(argv: list[str]) -> None:
    dag_folder, out = argv
    request = json.load(sys.stdin)
    report = {name: parse(dag_folder, env, request["ds"]) for name, env in request["scenarios"].items()}
    with open(out, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1:])
