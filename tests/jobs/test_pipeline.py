"""hir pipeline: every stage of a day in order; a rerun skips what its lineage shows fresh and reruns exactly from
the first stale stage on; a failing stage stops the run naming itself; bad flags fail in one line, writing nothing.

The end-to-end tests share one warehouse (Spark is slow on the CI box): the module fixture runs the whole day
once, and each test then changes one thing and measures the versions before and after its own rerun.
"""

from __future__ import annotations

import io
import json
import posixpath
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from hir_model import storage
from jobs import pipeline
from jobs.common.args import run_job
from jobs.common.delta import read_table, table_exists, table_version
from jobs.pipeline import config_from_args, lineage_path, run_pipeline
from schemas.tables import (
    BOM_TOKENS,
    BOM_VOCAB,
    EDGES,
    EMBEDDINGS,
    ENTITIES,
    ENTITY_CONTENT,
    EVENTS,
    INGEST_REJECTS,
    NEIGHBOURHOODS,
    NODES,
)

DS = "2026-01-07"  # the synthetic source's last day (a week from 2026-01-01)
DAY_STAGES = (
    "ingest",
    "build-graph",
    "sample-neighbourhoods",
    "enrich",
    "train",
    "embed",
    "drift",
    "build-index",
)
TABLES = (
    EVENTS,
    ENTITIES,
    INGEST_REJECTS,
    NODES,
    EDGES,
    NEIGHBOURHOODS,
    ENTITY_CONTENT,
    EMBEDDINGS,
    BOM_TOKENS,
    BOM_VOCAB,
)


# Tiny sizes: the day trains in 3 steps. The config mixes both TOML forms (flag = value, args = [...]). One epoch
# leaves no stopping epoch to choose, so no validation period is held out: that saves a second sampling of the
# graph per training, in every test built on this day (tests/jobs/test_train_encoder.py covers the validation).
def tiny_config(users: int = 60, items: int = 120, events: int = 3000) -> str:
    """The tiny day's pipeline config for a synthetic source of this size (bench/driver_gc.py runs a larger one)."""
    return f"""
[ingest]
users = {users}
items = {items}
events = {events}

[enrich]
encoder = "hashing:32"

[train]
args = ["--epochs", "1", "--batch-size", "64"]
dim = 16
heads = 2
prototypes = 16
id-buckets = 4096
loader = "pyarrow"
no-progress = true
validation-share = 0.0
"""


CONFIG = tiny_config()


# Another graph decay than the default: a rewrite of the day's edges.
HALF_LIFE = "build-graph=--half-life-days 3"


def day_argv(warehouse: Path, config: Path, *extra: str) -> list[str]:
    return [
        "--ds",
        DS,
        "--warehouse",
        str(warehouse),
        "--source",
        "synthetic",
        "--config",
        str(config),
        *extra,
    ]


def run(spark, warehouse: Path, config: Path, *extra: str) -> tuple[pipeline.PipelineReport, str]:
    out = io.StringIO()
    report = run_pipeline(spark, config_from_args(day_argv(warehouse, config, *extra)), out=out)
    return report, out.getvalue()


def versions(spark, warehouse: Path) -> dict[str, int | None]:
    return {
        t.name: table_version(spark, t, warehouse) if table_exists(spark, t, warehouse) else None
        for t in TABLES
    }


def models(warehouse: Path) -> list[Path]:
    return sorted(p for p in (warehouse / "models").iterdir() if not p.name.startswith("."))


def latest(warehouse: Path) -> str:
    return (warehouse / "indexes" / "item" / "LATEST").read_text().strip()


def records(warehouse: Path) -> dict[str, dict]:
    return json.loads(Path(lineage_path(str(warehouse), pipeline.parse_ds(DS))).read_text())["stages"]


def statuses(report: pipeline.PipelineReport) -> dict[str, str]:
    return report.status()


@pytest.fixture(scope="module")
def day(spark, tmp_path_factory):
    folder = tmp_path_factory.mktemp("pipeline")
    warehouse, config = folder / "warehouse", folder / "pipeline.toml"
    config.write_text(CONFIG)
    report, text = run(spark, warehouse, config)
    return SimpleNamespace(
        warehouse=warehouse, config=config, report=report, text=text, versions=versions(spark, warehouse)
    )


# -- end to end ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_full_run_writes_every_output_and_lists_every_stage_as_ran(spark, day) -> None:
    assert list(statuses(day.report).items()) == [(name, "ran") for name in DAY_STAGES]
    assert all(v is not None for v in day.versions.values()), day.versions
    (model,) = models(day.warehouse)
    assert (model / "weights.pt").is_file()
    recorded = records(day.warehouse)
    assert list(recorded) == list(DAY_STAGES)
    # embed used the model train wrote, passed explicitly; LATEST names the version build-index recorded.
    embed_argv = recorded["embed"]["argv"]
    assert (
        embed_argv[embed_argv.index("--model") + 1] == str(model.resolve()) == recorded["train"]["artifact"]
    )
    assert recorded["build-index"]["artifact"].endswith(latest(day.warehouse))
    assert recorded["build-graph"]["inputs"] == {
        "events": day.versions["events"],
        "entities": day.versions["entities"],
    }
    assert recorded["build-graph"]["outputs"] == {
        "nodes": day.versions["nodes"],
        "edges": day.versions["edges"],
    }
    # Rows in the summary are the jobs' own counts.
    embedded = read_table(spark, EMBEDDINGS, day.warehouse).where(f"ds = DATE'{DS}'").count()
    assert day.report.result("embed").rows == embedded > 0
    assert day.report.result("ingest").rows == day.report.result("ingest").report.events > 0
    assert "[1/8] ingest ... (no record of a run for this day)" in day.text
    for position, name in enumerate(DAY_STAGES, 1):
        assert (f"[{position}/8] {name} ... (runs after ingest)" in day.text) is (position > 1)
        assert f"[{position}/8] {name} done in " in day.text
    summary = day.text[day.text.index("pipeline 2026-01-07") :].splitlines()
    assert summary[0].split(":")[1].startswith(" 8 ran, 0 skipped, 0 failed")
    assert [row.split()[:2] for row in summary[2:]] == [[name, "ran"] for name in DAY_STAGES]
    assert not list(Path(lineage_path(str(day.warehouse), pipeline.parse_ds(DS))).parent.glob(".*tmp*"))


def scrubbed(value, *warehouses: str):
    """A lineage or config with what differs between two warehouses by design taken out: the warehouse's own
    location, Parquet file names, timings and creation times."""
    if isinstance(value, dict):
        return {
            k: scrubbed(v, *warehouses)
            for k, v in value.items()
            if k not in ("files", "created_at", "seconds", "warehouse")
        }
    if isinstance(value, list):
        return [scrubbed(v, *warehouses) for v in value]
    if isinstance(value, str):
        for warehouse in warehouses:
            value = value.replace(warehouse, "<warehouse>")
    return value


@pytest.mark.slow
def test_the_same_day_on_an_s3a_warehouse_writes_the_same_tables_lineage_model_and_index(
    s3_spark, s3_server, day
) -> None:
    """Every stage against a real S3 server (s3proxy): what the local day wrote, apart from where it is."""
    remote = s3_server.new_bucket("pipeline-day") + "/warehouse"
    report, text = run(s3_spark, remote, day.config)
    assert list(statuses(report).items()) == [(name, "ran") for name in DAY_STAGES], text[-3000:]
    assert versions(s3_spark, remote) == day.versions
    for spec in TABLES:
        drop = [c for c in ("input_file", "run_id") if c in spec.columns]
        ours = sorted(map(tuple, read_table(s3_spark, spec, remote).drop(*drop).collect()), key=repr)
        local = sorted(map(tuple, read_table(s3_spark, spec, day.warehouse).drop(*drop).collect()), key=repr)
        assert ours == local, spec.name

    # Lineage: the same stages, table versions and fingerprints of everything but the place; artifacts at the
    # same place under each warehouse.
    remote_records = json.loads(storage.read_text(lineage_path(remote, pipeline.parse_ds(DS))))["stages"]
    local_records = records(day.warehouse)
    assert list(remote_records) == list(local_records)
    local_root = str(day.warehouse.resolve())
    for name, record in remote_records.items():
        assert (
            record["inputs"] == local_records[name]["inputs"]
            and record["outputs"] == local_records[name]["outputs"]
        )
        if local_records[name].get("artifact"):
            ours, theirs = record["artifact"].removeprefix(remote), local_records[name]["artifact"]
            theirs = theirs.removeprefix(local_root)
            if name == "build-index":
                # An index version is named by the time and run that built it; the day's folder is the same.
                ours, theirs = posixpath.dirname(ours), posixpath.dirname(theirs)
            assert ours == theirs, name
    live = storage.read_text(storage.join(remote, "indexes", "item", "LATEST")).strip()
    assert remote_records["build-index"]["artifact"].endswith(live)

    # The model version: the same name (flags, input versions, code), files and weights; its lineage and config
    # the same apart from where the warehouse is.
    (model,) = models(day.warehouse)
    version = storage.join(remote, "models", model.name)
    assert storage.listdir(version) == sorted(p.name for p in model.iterdir())
    assert storage.read_bytes(storage.join(version, "weights.pt")) == (model / "weights.pt").read_bytes()
    for name in ("lineage.json", "config.json"):
        ours = json.loads(storage.read_text(storage.join(version, name)))
        theirs = json.loads((model / name).read_text())
        assert scrubbed(ours, remote) == scrubbed(theirs, local_root, str(day.warehouse)), name

    # The index: LATEST names a version whose manifest matches the local one on everything but time and place.
    ours = json.loads(storage.read_text(storage.join(remote, "indexes", "item", live, "manifest.json")))
    local = json.loads(
        (day.warehouse / "indexes" / "item" / latest(day.warehouse) / "manifest.json").read_text()
    )
    for key in (
        "count",
        "dim",
        "factory",
        "metric",
        "model_version",
        "search_params",
        "source_table_version",
    ):
        if key in local:
            assert ours[key] == local[key], key
    assert not Path("s3a:").exists()


@pytest.mark.slow
def test_an_identical_rerun_skips_every_stage_and_writes_nothing(spark, day) -> None:
    before, model_count, live = (
        versions(spark, day.warehouse),
        len(models(day.warehouse)),
        latest(day.warehouse),
    )
    report, text = run(spark, day.warehouse, day.config)
    assert list(statuses(report).values()) == ["skipped"] * 8
    assert versions(spark, day.warehouse) == before
    assert len(models(day.warehouse)) == model_count
    assert latest(day.warehouse) == live
    assert (
        f"[3/8] sample-neighbourhoods skipped (fresh: outputs at versions neighbourhoods={before['neighbourhoods']})"
        in text
    )
    assert report.result("ingest").rows == day.report.result("ingest").rows  # rows come from the record


@pytest.mark.slow
def test_deleting_the_model_reruns_train_and_every_stage_after_it(spark, day) -> None:
    before, live = versions(spark, day.warehouse), latest(day.warehouse)
    (model,) = models(day.warehouse)
    shutil.rmtree(model)
    report, text = run(spark, day.warehouse, day.config)
    assert statuses(report) == dict(zip(DAY_STAGES, ["skipped"] * 4 + ["ran"] * 4, strict=True))
    assert f"[5/8] train ... (model {model.resolve()} is gone)" in text
    assert "[6/8] embed ... (runs after train)" in text
    after = versions(spark, day.warehouse)
    upstream = ("events", "entities", "nodes", "edges", "neighbourhoods", "entity_content")
    assert {t: after[t] for t in upstream} == {t: before[t] for t in upstream}
    assert after["embeddings"] == before["embeddings"] + 1
    (rebuilt,) = models(day.warehouse)  # the same name again: same flags, inputs and code
    assert (rebuilt / "weights.pt").is_file() and records(day.warehouse)["train"]["artifact"] == str(
        rebuilt.resolve()
    )
    assert latest(day.warehouse) != live


@pytest.mark.slow
def test_a_failing_stage_stops_the_run_and_names_itself(spark, day, capsys) -> None:
    before, live, newest = versions(spark, day.warehouse), latest(day.warehouse), models(day.warehouse)[-1]
    # train would write the version named here, which exists: the job refuses (versions are immutable).
    rc = pipeline.main(day_argv(day.warehouse, day.config, "--stage-args", f"train=--version {newest.name}"))
    out, err = capsys.readouterr()
    assert rc == 2
    assert err.strip().splitlines()[-1].startswith(f"error: stage train: model version {newest}")
    assert "[5/8] train ... (its flags changed)" in out
    assert "embed ..." not in out and "drift ..." not in out and "build-index ..." not in out
    assert [row.split()[:2] for row in out.splitlines()[-4:]] == [
        ["train", "failed"],
        ["embed", "not"],
        ["drift", "not"],
        ["build-index", "not"],
    ]
    assert versions(spark, day.warehouse) == before
    assert latest(day.warehouse) == live
    assert "train" not in records(day.warehouse)  # a failed stage is never fresh: the next run starts there


@pytest.mark.slow
def test_rewritten_edges_rerun_exactly_the_stages_after_build_graph(spark, day) -> None:
    half_life = HALF_LIFE
    before, model_count = versions(spark, day.warehouse), len(models(day.warehouse))
    # Rewrite the day's graph with another decay through the pipeline, that stage alone.
    graph_only, _ = run(
        spark, day.warehouse, day.config, "--from-stage", "build-graph", "--until-stage", "build-graph",
        "--stage-args", half_life,
    )  # fmt: skip
    assert statuses(graph_only) == {"build-graph": "ran"}
    rewritten = versions(spark, day.warehouse)
    assert rewritten["edges"] == before["edges"] + 1
    assert rewritten["neighbourhoods"] == before["neighbourhoods"]
    # The rerun with the same flags: ingest and build-graph are fresh, everything reading the new graph is not.
    report, text = run(spark, day.warehouse, day.config, "--stage-args", half_life)
    assert statuses(report) == dict(zip(DAY_STAGES, ["skipped"] * 2 + ["ran"] * 6, strict=True))
    assert (
        f"[3/8] sample-neighbourhoods ... (input nodes changed ({before['nodes']} -> {rewritten['nodes']}))"
        in text
    )
    after = versions(spark, day.warehouse)
    assert (after["events"], after["edges"]) == (before["events"], rewritten["edges"])
    assert after["neighbourhoods"] == before["neighbourhoods"] + 1
    assert len(models(day.warehouse)) == model_count + 1  # new input versions: a new model version
    recorded = records(day.warehouse)
    assert (
        recorded["embed"]["argv"][recorded["embed"]["argv"].index("--model") + 1]
        == recorded["train"]["artifact"]
    )


@pytest.mark.slow
def test_a_model_code_change_reruns_train_and_after_it_and_nothing_before(spark, day, monkeypatch) -> None:
    from jobs.common import code

    # Settle the day on one set of flags first (a no-op after the previous test, which left these flags).
    run(spark, day.warehouse, day.config, "--stage-args", HALF_LIFE)
    real = code._source
    monkeypatch.setattr(
        code, "_source", lambda m: real(m) + "\n# an edit\n" if m == "hir_model.encoder" else real(m)
    )
    before, model_count = versions(spark, day.warehouse), len(models(day.warehouse))
    recorded_code = records(day.warehouse)["train"]["code"]
    report, text = run(spark, day.warehouse, day.config, "--stage-args", HALF_LIFE)
    assert statuses(report) == dict(zip(DAY_STAGES, ["skipped"] * 4 + ["ran"] * 4, strict=True))
    assert f"[5/8] train ... (its code changed ({recorded_code} -> src:" in text
    after = versions(spark, day.warehouse)
    upstream = ("events", "entities", "nodes", "edges", "neighbourhoods", "entity_content")
    assert {t: after[t] for t in upstream} == {t: before[t] for t in upstream}
    assert len(models(day.warehouse)) == model_count + 1  # the model's name hashes the code: a new version
    assert records(day.warehouse)["train"]["code"] != recorded_code


# -- progress ------------------------------------------------------------------------------------------------


def test_time_left_uses_recorded_seconds_then_scales_first_run_costs() -> None:
    recorded = {"embed": 30.0, "build-index": 5.0}
    assert pipeline.estimate_left(["embed", "build-index"], recorded, {}) == 35.0
    assert (
        pipeline.estimate_left(["train", "embed"], recorded, {}) is None
    )  # nothing ran, no record for train
    # build-graph took 20 s at cost 1: train (cost 4) is estimated at 80 s.
    cost = pipeline.FIRST_RUN_COST
    ran = {"build-graph": 20.0}
    expected = 20.0 / cost["build-graph"] * cost["train"] + 30.0
    assert pipeline.estimate_left(["train", "embed"], recorded, ran) == pytest.approx(expected)
    assert [pipeline.hms(s) for s in (4.4, 65.2, 3723)] == ["4s", "1m05s", "1h02m03s"]


@pytest.mark.slow
def test_each_started_stage_prints_elapsed_and_time_left(day) -> None:
    lines = [line for line in day.text.splitlines() if " ... (" in line]
    assert len(lines) == len(DAY_STAGES)
    assert all(" | elapsed " in line for line in lines)
    assert lines[0].endswith("time left unknown until a stage has run")  # a first run: nothing to go by
    assert all(line.rsplit(", ", 1)[1].startswith("about ") for line in lines[1:])


# -- failures that need no data ------------------------------------------------------------------------------


def test_a_missing_input_table_fails_its_stage_and_nothing_after_it_runs(spark, tmp_path, capsys) -> None:
    warehouse = tmp_path / "warehouse"
    rc = pipeline.main(
        ["--ds", DS, "--warehouse", str(warehouse), "--from-stage", "build-graph", "--until-stage", "enrich"]
    )
    out, err = capsys.readouterr()
    assert rc == 2
    assert (
        err.strip()
        == f"error: stage build-graph: table events not found at {(warehouse / 'events').resolve()}: run the stage that writes it"
    )
    assert "[1/3] build-graph ... (no record" in out and "sample-neighbourhoods ..." not in out
    assert not any(table_exists(spark, t, warehouse) for t in (NODES, EDGES, NEIGHBOURHOODS, ENTITY_CONTENT))
    assert not Path(lineage_path(str(warehouse), pipeline.parse_ds(DS))).exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--ds", "2026-1-7"],
            "hir pipeline: argument --ds: --ds must be a date as YYYY-MM-DD, got '2026-1-7'",
        ),
        (["--from-stage", "graph"], "--from-stage: unknown stage 'graph' (choose from ingest, build-graph"),
        (["--stage-args", "index=--seed 1"], "--stage-args: unknown stage 'index'"),
        (["--stage-args", "train=--lr -1"], "stage train: --lr must be >= 0"),
        (["--stage-args", "embed=--ds 2026-01-01"], "stage embed: --ds is set by the pipeline"),
        (
            ["--from-stage", "train", "--until-stage", "enrich"],
            "--from-stage train comes after --until-stage enrich",
        ),
        (["--until-stage", "evaluate"], "--until-stage evaluate: evaluate is opt-in"),
        (
            ["--users", "60"],
            "hir pipeline: unrecognized arguments: --users 60 (flags for ingest need --source)",
        ),
        (["--source", "synthetic", "--users", "0"], "stage ingest: --users, --items, --events"),
        (
            ["--source", "synthetic", "--input", "x.csv"],
            "stage ingest: --source synthetic generates its events",
        ),
    ],
)
def test_flag_errors_are_one_line_and_write_nothing(tmp_path, capsys, extra, message) -> None:
    warehouse = tmp_path / "warehouse"
    # A later --ds replaces the first: argparse keeps the last value of a flag.
    assert run_job(pipeline.main, ["--ds", DS, "--warehouse", str(warehouse), *extra]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("error: " + message), err
    assert not warehouse.exists()


def test_config_file_tables_become_each_stage_flags(tmp_path) -> None:
    config = tmp_path / "p.toml"
    config.write_text(
        '[ingest]\ninput = ["a.csv", "b.csv"]\nmax-reject-fraction = 0.1\n'
        '[train]\nargs = ["--epochs", "2"]\nno-content = true\nresume = false\nlr = 2e-3\n'
    )
    assert pipeline.config_args(str(config)) == {
        "ingest": ("--input", "a.csv", "b.csv", "--max-reject-fraction", "0.1"),
        "train": ("--epochs", "2", "--no-content", "--lr", "0.002"),
    }
    # A warehouse that does not exist yet (a ./warehouse left by `make demo` would have evaluate's flags checked).
    warehouse = str(tmp_path / "wh")
    cfg = config_from_args(
        ["--ds", DS, "--warehouse", warehouse, "--config", str(config), "--stage-args", "train=--epochs 3",
         "--evaluate"]
    )  # fmt: skip
    assert cfg.stage_args["train"][-2:] == ("--epochs", "3")  # the command line comes last, so it wins
    assert pipeline.stage_argv(pipeline.BY_NAME["train"], cfg, {})[-4:] == [
        "--ds",
        DS,
        "--warehouse",
        warehouse,
    ]
    config.write_text("[graph]\nlookback-days = 3\n")
    with pytest.raises(pipeline.HirError, match=r"unknown stage \[graph\]"):
        pipeline.config_args(str(config))


def test_an_input_file_that_changed_makes_ingest_stale(tmp_path) -> None:
    events = tmp_path / "events.csv"
    events.write_text("1,2,3\n")
    ingest = pipeline.BY_NAME["ingest"]
    stamps = pipeline.file_stamps([str(events)])
    record = {"fingerprint": "f", "code": "src:1", "inputs": stamps, "outputs": {"events": 4}}
    assert pipeline.staleness(ingest, record, "f", "src:1", stamps, {"events": 4}) is None
    assert pipeline.staleness(ingest, record, "f", "src:1", stamps, {"events": 5}) == (
        "output events was rewritten since (4 -> 5)"
    )
    assert pipeline.staleness(ingest, record, "g", "src:1", stamps, {"events": 4}) == "its flags changed"
    assert pipeline.staleness(ingest, record, "f", "src:2", stamps, {"events": 4}) == (
        "its code changed (src:1 -> src:2)"
    )
    events.write_text("1,2,3\n4,5,6\n")
    reason = pipeline.staleness(
        ingest, record, "f", "src:1", pipeline.file_stamps([str(events)]), {"events": 4}
    )
    assert reason is not None and reason.startswith(f"input file:{events.resolve()} changed")
