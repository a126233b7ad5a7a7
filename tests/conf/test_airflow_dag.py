"""conf/airflow/hir_daily.py as Airflow loads it: one BashOperator per pipeline stage, chained in the
pipeline's order, each the pipeline command restricted to its own stage for the run's day.

Airflow lives in .venv-airflow (`make setup`), never in the project's .venv: tests/conf/airflow_dag_report.py
parses the DAG there with Airflow's DagBag, in a subprocess, and what it reports is checked here against
jobs.pipeline's own stage names and flag parser. No Spark starts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from jobs import pipeline
from jobs.common.spark import delta_jars
from tests.conftest import REPO_ROOT

AIRFLOW_VENV = REPO_ROOT / ".venv-airflow"
DAG_FOLDER = REPO_ROOT / "conf" / "airflow"
REPORT_SCRIPT = Path(__file__).with_name("airflow_dag_report.py")
DS = "2026-01-07"  # the day each command is rendered for

# The environment the DAG is parsed with, per scenario (no other HIR_ variable is set).
EVERYTHING = {
    "HIR_AIRFLOW_INGEST": "1",
    "HIR_AIRFLOW_EVALUATE": "1",
    "HIR_HOME": "/srv/hir",
    "HIR_WAREHOUSE": "/data/hir/warehouse",
    "HIR_CONFIG": "/etc/hir/pipeline.toml",
    "HIR_SPARK_SUBMIT": "/srv/hir/.venv/bin/spark-submit",
    "HIR_SPARK_ARGS": "--master yarn --jars /srv/hir/.jars/delta.jar",
    "HIR_SOURCE": "synthetic",
    "HIR_INGEST_ARGS": "--users 60 --days 2",
}
SCENARIOS = {
    "defaults": {},
    "everything": EVERYTHING,
    "bad_switch": {"HIR_AIRFLOW_EVALUATE": "yes"},
    "ingest_without_source": {"HIR_AIRFLOW_INGEST": "1"},
}
DEFAULT_HOME = "/opt/hir"


@pytest.fixture(scope="module")
def parsed(tmp_path_factory) -> dict:
    """Every scenario's report, from one Airflow process (importing Airflow is most of its 3 seconds)."""
    if not (AIRFLOW_VENV / ".installed").exists():
        pytest.fail(
            f"{AIRFLOW_VENV} is missing: `make setup` builds it (Airflow, from conf/airflow/requirements.txt)"
        )
    home = tmp_path_factory.mktemp("airflow_home")
    env = {name: value for name, value in os.environ.items() if not name.startswith(("AIRFLOW", "HIR_"))}
    env |= {
        "AIRFLOW_HOME": str(home),  # its config and logs; DagBag needs no database, so none is created
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAG_FOLDER),
        "PYTHONDONTWRITEBYTECODE": "1",  # no __pycache__ beside the DAG
    }
    out = home / "report.json"
    done = subprocess.run(
        [str(AIRFLOW_VENV / "bin" / "python"), str(REPORT_SCRIPT), str(DAG_FOLDER), str(out)],
        input=json.dumps({"ds": DS, "scenarios": SCENARIOS}),
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{REPORT_SCRIPT.name} failed:\n{done.stdout}\n{done.stderr}"
    return json.loads(out.read_text())


def hir_daily(parsed: dict, scenario: str) -> dict:
    report = parsed[scenario]
    assert report["import_errors"] == {}
    assert report["warnings"] == {}  # e.g. a deprecated import path
    assert list(report["dags"]) == ["hir_daily"]
    return report["dags"]["hir_daily"]


def pipeline_stages(ingest: bool, evaluate: bool) -> list[str]:
    """jobs.pipeline's stages in its order, by its own rule for which run: ingest with a source, evaluate
    when asked."""
    cfg = pipeline.PipelineConfig(
        ds=dt.date.fromisoformat(DS), source="synthetic" if ingest else None, evaluate=evaluate
    )
    return [name for name in pipeline.STAGE_NAMES if pipeline.enabled(pipeline.BY_NAME[name], cfg)]


def split_command(command: str) -> tuple[list[str], argparse.Namespace, list[str]]:
    """A rendered command as (its tokens up to the pipeline script, the pipeline's flags as its own parser
    reads them, the flags that parser does not know, which the pipeline passes on to ingest)."""
    tokens = shlex.split(command)
    script = next(i for i, token in enumerate(tokens) if token.endswith("/jobs/pipeline.py"))
    args, rest = pipeline.build_parser().parse_known_args(tokens[script + 1 :])
    return tokens[: script + 1], args, rest


@pytest.mark.parametrize(
    "scenario, ingest, evaluate", [("defaults", False, False), ("everything", True, True)]
)
def test_one_task_per_enabled_stage_chained_in_pipeline_order(parsed, scenario, ingest, evaluate) -> None:
    tasks = hir_daily(parsed, scenario)["tasks"]  # in Airflow's topological order
    stages = pipeline_stages(ingest, evaluate)
    assert [task["task_id"] for task in tasks] == stages
    assert [task["upstream"] for task in tasks] == [[], *[[stage] for stage in stages[:-1]]]
    assert {task["operator"] for task in tasks} == {"BashOperator"}


@pytest.mark.parametrize("scenario", ["defaults", "everything"])
def test_each_task_runs_the_pipeline_for_its_own_stage_of_the_runs_day(parsed, scenario) -> None:
    env = SCENARIOS[scenario]
    home = env.get("HIR_HOME", DEFAULT_HOME)
    for task in hir_daily(parsed, scenario)["tasks"]:
        stage = task["task_id"]
        assert "{{ ds }}" in task["bash_command"], stage  # the day comes from the run, not from parse time
        head, args, rest = split_command(task["command"])
        observed = {
            "spark-submit": head[0],
            "script": head[-1],
            "cwd": task["cwd"],
            "ds": args.ds,
            "stages": (args.from_stage, args.until_stage),
            "warehouse": args.warehouse,
            "config": args.config,
            "source": args.source,
            "to ingest": rest,
            "evaluate": args.evaluate,
        }
        assert observed == {
            "spark-submit": env.get("HIR_SPARK_SUBMIT", "spark-submit"),
            "script": f"{home}/jobs/pipeline.py",
            "cwd": home,  # where the default --jars paths, relative to HIR_HOME, resolve
            "ds": dt.date.fromisoformat(DS),
            "stages": (stage, stage),
            "warehouse": env.get("HIR_WAREHOUSE", f"{home}/warehouse"),
            "config": env.get("HIR_CONFIG"),
            "source": env["HIR_SOURCE"] if stage == "ingest" else None,
            "to ingest": shlex.split(env["HIR_INGEST_ARGS"]) if stage == "ingest" else [],
            "evaluate": stage == "evaluate",
        }, stage
        if "HIR_SPARK_ARGS" in env:
            assert head[1:-1] == shlex.split(env["HIR_SPARK_ARGS"]), stage


def test_default_spark_args_pass_the_delta_jars_that_make_setup_fetches(parsed) -> None:
    head, _, _ = split_command(hir_daily(parsed, "defaults")["tasks"][0]["command"])
    assert head[1] == "--jars" and len(head) == 4
    fetched = [str(jar.relative_to(REPO_ROOT)) for jar in delta_jars()]  # relative: tasks run in HIR_HOME
    assert sorted(head[2].split(",")) == sorted(fetched)


def test_runs_daily_at_three_utc_for_the_day_before_one_day_at_a_time(parsed) -> None:
    dag = hir_daily(parsed, "defaults")
    assert dag["schedule"] == "0 3 * * *"
    # The run's ds: the run that starts at 03:00 on the 8th builds the 7th, a complete day, like the README's
    # cron line (a cron string alone would give, in Airflow 3, ds = the day the run starts, three hours in).
    assert dag["scheduled_runs"] == [
        {"run_after": "2026-01-08T03:00:00+00:00", "ds": "2026-01-07"},
        {"run_after": "2026-01-09T03:00:00+00:00", "ds": "2026-01-08"},
    ]
    # Each day warm-starts from the previous day's model: days in order, one at a time, no automatic catch-up.
    assert dag["catchup"] is False
    assert dag["max_active_runs"] == 1


def test_every_task_retries_with_backoff_and_times_out_and_train_waits_for_the_last_days(parsed) -> None:
    tasks = hir_daily(parsed, "everything")["tasks"]
    for task in tasks:
        # drift's failure is a verdict on the day's model: retrying repeats it
        assert task["retries"] == (0 if task["task_id"] == "drift" else 2), task["task_id"]
        assert task["retry_delay_s"] > 0, task["task_id"]
        # The multiplier the scheduler reads (Airflow 3.1+; True reads as 2.0): 0 or 1 is a constant delay.
        assert task["retry_exponential_backoff"] > 1, task["task_id"]
        assert task["execution_timeout_s"], task["task_id"]
    assert [task["task_id"] for task in tasks if task["depends_on_past"]] == ["train"]


@pytest.mark.parametrize(
    "scenario, message",
    [
        ("bad_switch", "HIR_AIRFLOW_EVALUATE='yes': set it to 0 or 1"),
        ("ingest_without_source", "HIR_AIRFLOW_INGEST=1 needs HIR_SOURCE"),
    ],
)
def test_a_wrong_switch_is_an_import_error_not_a_silently_missing_task(parsed, scenario, message) -> None:
    report = parsed[scenario]
    assert report["dags"] == {}
    assert [message in error for error in report["import_errors"].values()] == [True]
