"""Consecutive days as a product: `hir pipeline --ds-from A --ds-to B` runs the days in order, each warm-starting
from the day before, keeping token ids, and measuring its drift; a backfill SIGKILLed in the middle resumes and
ends with the same tables as one that ran through; overlapping runs are refused.

One uninterrupted two-day backfill (module fixture) serves every check; the killed one runs in its own process
(its own JVM), the production way, and resumes in this one. It starts from the warehouse as the uninterrupted run
left it after its first day, so it redoes only the second day (the part it is killed in).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from jobs import pipeline
from jobs.common.delta import read_table
from jobs.common.errors import HirError
from jobs.pipeline import config_from_args, day_lock, done_day, lineage_path, run_backfill
from schemas.tables import (
    BOM_TOKENS,
    BOM_VOCAB,
    EMBEDDINGS,
    ENTITIES,
    EVENTS,
    INGEST_REJECTS,
    REPRESENTATION_DRIFT,
)
from tests.jobs.test_pipeline import CONFIG, TABLES  # the tiny day (60 users, a 16-d model) and its tables

DAY1, DAY2 = dt.date(2026, 1, 6), dt.date(2026, 1, 7)
# Every table a day writes (ingest's aside: it runs once, on the first day).
DAY_TABLES = (*(t for t in TABLES if t not in (EVENTS, ENTITIES, INGEST_REJECTS)), REPRESENTATION_DRIFT)


def backfill_argv(warehouse: Path, config: Path) -> list[str]:
    return [
        "--ds-from",
        DAY1.isoformat(),
        "--ds-to",
        DAY2.isoformat(),
        "--warehouse",
        str(warehouse),
        "--source",
        "synthetic",
        "--config",
        str(config),
    ]


@pytest.fixture(scope="module")
def backfill(spark, tmp_path_factory):
    """The uninterrupted backfill, with a copy of its warehouse as it stood once the first day was done."""
    folder = tmp_path_factory.mktemp("backfill")
    warehouse, config, after_day1 = folder / "warehouse", folder / "pipeline.toml", folder / "after-day1"
    config.write_text(CONFIG)
    run_day = pipeline._run_day

    def run_day_then_copy(spark, cfg, out):
        report = run_day(spark, cfg, out)
        if cfg.ds == DAY1:
            shutil.copytree(warehouse, after_day1, symlinks=True)
        return report

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pipeline, "_run_day", run_day_then_copy)
        reports = run_backfill(spark, config_from_args(backfill_argv(warehouse, config)), out=out)
    return SimpleNamespace(
        folder=folder,
        warehouse=warehouse,
        config=config,
        after_day1=after_day1,
        reports=reports,
        text=out.getvalue(),
    )


def forget_delta_logs(spark) -> None:
    """Drop this JVM's cached Delta logs: the test puts other tables (with the same version numbers) at a path."""
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()


def stage_records(warehouse: Path, ds: dt.date) -> dict:
    return json.loads(Path(lineage_path(str(warehouse), ds)).read_text())["stages"]


@pytest.mark.slow
def test_days_run_in_order_and_each_warm_starts_from_the_day_before(backfill) -> None:
    assert [r.ds for r in backfill.reports] == [DAY1, DAY2]
    assert all(set(r.status().values()) == {"ran"} for r in backfill.reports)
    assert "ingest" in backfill.reports[0].status() and "ingest" not in backfill.reports[1].status()
    first, second = stage_records(backfill.warehouse, DAY1), stage_records(backfill.warehouse, DAY2)
    assert "--warm-start" not in first["train"]["argv"]  # nothing before the first day: a cold start
    argv = second["train"]["argv"]
    assert argv[argv.index("--warm-start") + 1] == first["train"]["artifact"]
    lineage = json.loads((Path(second["train"]["artifact"]) / "lineage.json").read_text())
    assert lineage["warm_start"]["version"] == Path(first["train"]["artifact"]).name
    assert lineage["warm_start"]["ds"] == str(DAY1)
    assert "warm from " + Path(first["train"]["artifact"]).name in second["train"]["line"]
    assert f"backfill {DAY1} .. {DAY2}: 2 days, 2 with stages run, 0 fresh" in backfill.text


@pytest.mark.slow
def test_a_finished_day_stays_done_when_later_days_publish_over_its_index(backfill) -> None:
    # A later day's index moves LATEST on (and --keep-versions prunes old versions): a resumed backfill must still
    # skip the earlier day. Redoing it would point LATEST back and, its tables rewritten, redo every later day: a
    # 7-day backfill killed on day 5 started again from day 1 before this was fixed.
    cfg = config_from_args(backfill_argv(backfill.warehouse, backfill.config))
    day1, day2 = (
        dataclasses.replace(cfg, ds=d, ds_to=None, source=s) for d, s in ((DAY1, cfg.source), (DAY2, None))
    )
    index = Path(stage_records(backfill.warehouse, DAY1)["build-index"]["artifact"])
    assert (index.parent.parent / "LATEST").read_text().startswith(f"{DAY2}/")  # day 2 published over it
    assert set(done_day(day1).status().values()) == {"skipped"}
    assert done_day(day2) is not None
    aside = index.parent.parent / f"pruned-{index.name}"
    index.rename(aside)  # as --keep-versions would have pruned it
    try:
        assert done_day(day1) is not None
    finally:
        aside.rename(index)


@pytest.mark.slow
def test_the_second_day_measures_its_drift_against_the_first(spark, backfill) -> None:
    drift = read_table(spark, REPRESENTATION_DRIFT, backfill.warehouse)
    assert drift.select("ds").distinct().collect() == [(DAY2,)]  # the first day has nothing to compare with
    rows = {(r["entity_type"], r["cohort"]): r for r in drift.collect()}
    embedded = read_table(spark, EMBEDDINGS, backfill.warehouse)
    on = lambda ds: embedded.where(F.col("ds") == F.lit(ds)).select("entity_type", "node_id")  # noqa: E731
    both = {
        r["entity_type"]: r["count"]
        for r in on(DAY2).join(on(DAY1), ["entity_type", "node_id"]).groupBy("entity_type").count().collect()
    }
    assert {t for t, _ in rows} == set(both)
    for entity_type, count in both.items():
        all_, unchanged = rows[(entity_type, "all")], rows.get((entity_type, "unchanged"))
        changed = rows.get((entity_type, "changed"))
        assert all_["entities"] == count
        assert sum(r["entities"] for r in (unchanged, changed) if r) == count
        assert all_["previous_ds"] == DAY1 and -1.0 <= all_["cosine_p50"] <= 1.0
        assert 0.0 <= all_["level0_kept"] <= 1.0 and all_["overlap_sampled"] == min(count, 1000)
    report = (backfill.warehouse / "reports" / "drift" / "report.md").read_text()
    assert f"## {DAY2} (against {DAY1})" in report
    assert (backfill.warehouse / "reports" / "drift" / "drift_cosine.svg").is_file()
    assert stage_records(backfill.warehouse, DAY2)["drift"]["line"].startswith(f"drift {DAY2} vs {DAY1}: ")


@pytest.mark.slow
def test_the_vocabulary_says_which_tokens_continue_retire_or_are_new(spark, backfill) -> None:
    vocab = read_table(spark, BOM_VOCAB, backfill.warehouse)
    day1 = {r["token"]: r for r in vocab.where(F.col("ds") == F.lit(DAY1)).collect()}
    day2 = {r["token"]: r for r in vocab.where(F.col("ds") == F.lit(DAY2)).collect()}
    assert {r["status"] for r in day1.values()} == {"new"}
    live = {t for t, r in day2.items() if r["status"] != "retired"}
    tokens2 = {
        r["token"]
        for r in read_table(spark, BOM_TOKENS, backfill.warehouse)
        .where(F.col("ds") == F.lit(DAY2))
        .select("token")
        .distinct()
        .collect()
    }
    assert live == tokens2  # every token of the day, and only those, is live
    for token, row in day2.items():
        expected = "retired" if token not in tokens2 else ("continued" if token in day1 else "new")
        assert row["status"] == expected, token
        assert row["first_ds"] == (DAY1 if token in day1 else DAY2)
        if expected == "retired":
            assert row["size"] == 0 and row["label"] == day1[token]["label"]
    assert set(day1) - tokens2 == {t for t, r in day2.items() if r["status"] == "retired"}
    assert any(r["status"] == "continued" for r in day2.values())


@pytest.mark.slow
def test_token_ids_are_renamed_to_yesterdays_and_keep_more_of_them(backfill) -> None:
    record = stage_records(backfill.warehouse, DAY2)["train"]
    summary = [
        json.loads(line) for line in (Path(record["artifact"]) / "metrics.jsonl").read_text().splitlines()
    ][-1]
    alignment = summary["quantiser"]["alignment"]
    assert alignment["previous"].startswith(f"{DAY1}/") and alignment["shared_entities"] > 0
    for before, after in zip(alignment["code_kept_before_alignment"], alignment["code_kept"], strict=True):
        assert after >= before  # the matching can only keep more entities on their ids than no renaming
    assert summary["warm_start"] == Path(stage_records(backfill.warehouse, DAY1)["train"]["artifact"]).name
    # The continued model is validated before the first step whenever the day holds a validation split, and a
    # later step is served only if it beat it
    continued, best = summary["continued_validation"], summary["best_validation"]
    assert (continued is None) == (best is None)
    assert best is None or 0.0 <= continued <= best["recall_at_50"]
    # A warm start keeps yesterday's codebooks while they fit the day, else the refit anchored closest to them
    # within the tolerance (1.25), else a plain refit: whichever, said with its error against a refit's
    quantiser = summary["quantiser"]
    assert quantiser["kept_error_ratio"] > 0
    assert (quantiser["codebooks"] == "kept") == (quantiser["kept_error_ratio"] <= 1.25)
    assert quantiser["codebooks"] in ("kept", "anchored", "refitted")
    if quantiser["codebooks"] == "anchored":
        assert quantiser["error_ratio"] <= 1.25 and quantiser["anchor_pull"] > 0


@pytest.mark.slow
def test_a_backfill_killed_in_the_middle_resumes_to_the_same_tables(spark, backfill, tmp_path) -> None:
    # The warehouse as it stood after day 1 goes back to its own path (the flags and the lineage name it, and the
    # models in it, by that path); the uninterrupted one moves aside, to compare with.
    warehouse, finished = backfill.warehouse, backfill.folder / "finished"
    warehouse.rename(finished)
    shutil.copytree(backfill.after_day1, warehouse, symlinks=True)
    forget_delta_logs(spark)
    try:
        command = [sys.executable, "-m", "jobs.pipeline", *backfill_argv(warehouse, backfill.config)]
        with open(tmp_path / "killed.log", "w") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            record = Path(lineage_path(str(warehouse), DAY2))
            try:
                # SIGKILL once the second day has sampled its neighbourhoods: in the middle of its enrich, train
                # or embed. The bound only stops a hung run; the kill point does not depend on time.
                deadline = time.monotonic() + 1800
                while time.monotonic() < deadline and proc.poll() is None:
                    if record.is_file() and "sample-neighbourhoods" in record.read_text():
                        break
                    time.sleep(0.1)
                assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
            finally:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=60)
        killed = (tmp_path / "killed.log").read_text()
        assert "== backfill day 1/2: 2026-01-06: done" in killed, killed[-3000:]  # day 1 was not redone
        assert "drift" not in stage_records(warehouse, DAY2)  # it did stop before the end

        out = io.StringIO()
        reports = run_backfill(spark, config_from_args(backfill_argv(warehouse, backfill.config)), out=out)
        assert set(reports[0].status().values()) == {"skipped"}  # the done day is fresh
        assert reports[1].status()["build-graph"] == "skipped" and reports[1].status()["drift"] == "ran"
        # Same rows as the uninterrupted backfill. Model version names hash the Delta versions of their inputs,
        # which a stage retried after the kill may have bumped, so they are compared as the weights they name:
        # the vectors.
        for spec in DAY_TABLES:
            ours = read_table(spark, spec, warehouse).drop("model_version", "previous_model_version")
            theirs = read_table(spark, spec, finished).drop("model_version", "previous_model_version")
            assert_df_equality(
                ours, theirs, ignore_row_order=True, ignore_nullable=True, ignore_metadata=True
            )
    finally:
        shutil.rmtree(warehouse, ignore_errors=True)
        finished.rename(warehouse)
        forget_delta_logs(spark)


def test_an_overlapping_run_is_refused_naming_the_day(tmp_path) -> None:
    warehouse = tmp_path / "warehouse"
    cfg = config_from_args(
        [
            "--ds-from",
            "2026-01-05",
            "--ds-to",
            "2026-01-07",
            "--warehouse",
            str(warehouse),
            "--source",
            "synthetic",
        ]
    )
    with day_lock(str(warehouse), DAY1):  # a daily run (or another backfill) holds 2026-01-06
        with pytest.raises(HirError, match="another pipeline run for 2026-01-06 holds"):
            run_backfill(None, cfg, out=io.StringIO())
    assert not list((warehouse / "_pipeline").glob("*.json"))  # refused before any day ran


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ds-from", "2026-01-05"], "--ds-from and --ds-to go together"),
        (
            ["--ds-from", "2026-01-07", "--ds-to", "2026-01-05"],
            "--ds-to 2026-01-05 is before --ds-from 2026-01-07",
        ),
    ],
)
def test_bad_ranges_fail_in_one_line(tmp_path, argv: list[str], message: str) -> None:
    with pytest.raises(HirError, match=message):
        config_from_args([*argv, "--warehouse", str(tmp_path / "w")])
