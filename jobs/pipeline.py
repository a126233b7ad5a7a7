"""Run every stage of a day in order, resuming from the first stage whose outputs are missing or stale.

    hir pipeline --ds 2026-01-07 --warehouse warehouse/synthetic --source synthetic --config conf/pipeline/demo.toml
    hir pipeline --ds 2017-12-03 --warehouse warehouse/taobao --source taobao \\
        --input ../shared/data/taobao_userbehavior/UserBehavior_user_complete.csv
    hir pipeline --ds 2026-01-07 --warehouse warehouse/synthetic --stage-args train="--epochs 3 --dim 32"
    hir pipeline --ds 2026-01-07 --warehouse warehouse/synthetic --from-stage train --until-stage embed --force
    hir pipeline --ds 2026-01-07 --warehouse warehouse/rees46 --evaluate \\
        --stage-args evaluate="--protocol leave_last_conversion_out"
    hir pipeline --ds-from 2026-01-01 --ds-to 2026-01-07 --warehouse warehouse/synthetic --source synthetic

Scheduled daily, for yesterday's day (cron; Airflow: conf/airflow/hir_daily.py, one task per stage):

    0 3 * * * cd /opt/hir && .venv/bin/spark-submit --jars .jars/delta-spark_4.0_2.13-4.4.0.jar,.jars/delta-storage-4.4.0.jar jobs/pipeline.py --ds $(date -u -d yesterday +\\%F) --warehouse /data/hir/warehouse --config /etc/hir/pipeline.toml

Stages, in order: ingest (only with --source), build-graph, sample-neighbourhoods, enrich, train (warm-started from
the model day ds-1's record names, when it has one), embed, drift (against the previous day embedded; its
--max-drift stops the day before build-index), build-index, evaluate (opt-in: --evaluate or an [evaluate] section
in --config). --ds-from/--ds-to runs a backfill: the days in order, resumable (`run_backfill`). Each stage runs
through its own job's `config_from_args`, so every job flag is reachable and validated by the job itself: the
pipeline adds `--ds` and `--warehouse` (ingest gets `--source` and `--warehouse`: it ingests every day of its
input, pass --ds to it to reject other days; evaluate gets `--warehouse` and `--ds` only if its parser has one),
embed gets `--model` with the version the train stage wrote, and the rest comes from, in this order (a later value
of a flag wins):

* `--config FILE`, a TOML table per stage: `flag = value` pairs (`epochs = 3` -> `--epochs 3`, `no-progress =
  true` -> `--no-progress`, false leaves the flag out, a list gives several values) and/or `args = ["--epochs",
  "3"]`, passed as written. Sections of stages that do not run (ingest without --source) are ignored;
* `--stage-args STAGE="--flag value ..."` (repeatable, shlex-split);
* with --source, any flag the pipeline itself does not know goes to ingest: `--source synthetic --users 60`.

Every stage's flags are checked before the first stage runs, so a typo in the last stage's flags costs nothing.

Lineage and resume: after a stage succeeds, `<warehouse>/_pipeline/<ds>.json` (replaced atomically) records per
stage its config fingerprint (sha256 of the job's parsed config), its argv, the Delta versions of the tables it
read (ingest: path, size and mtime of its input files), the versions of the tables it wrote, its non-Delta output
(train: the model version folder; build-index: the index version LATEST names), rows, report line and seconds.
A stage is fresh, and skipped, when its record's fingerprint and input versions equal the current ones, the
tables it wrote are still at the recorded versions and its model or index is still there (and live). The first
stage that is not fresh runs, and so does every selected stage after it; `--force` runs them all. A stage that
fails loses its record, so the next run starts there. Versions are per table, not per day: a run of another day
that rewrites a shared table (events, edges ...) makes this day's later stages stale too, which reruns them
(never serves stale data). One run per warehouse and day at a time (a lock file beside the record).

Output: a line per stage as it starts, with the run's elapsed time and an estimate of what remains (`[4/7] enrich
... (no record of a run for this day) | elapsed 1m05s, about 3m20s left`), and as it ends (`[4/7] enrich done in
12.3s: ...` or `skipped (fresh: ...)`), then a table of stage, status, rows and seconds. A failing stage stops the run: a job's
one-line error becomes `error: stage <name>: <message>` and exit 2; a job's own failed check (ingest or graph
counts that do not reconcile, a collapsed training) exits 1 like the job would; any other exception propagates
after naming the stage.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fcntl
import hashlib
import importlib
import json
import os
import shlex
import socket
import sys
import time
import tomllib
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TextIO

from hir_model import storage
from jobs.common.args import JobArgumentParser, add_warehouse_flag, parse_ds, run_job
from jobs.common.code import code_version
from jobs.common.delta import table_exists, table_version
from jobs.common.errors import HirError
from jobs.ingest_events import SOURCES
from schemas.tables import (
    BOM_TOKENS,
    BOM_VOCAB,
    EDGES,
    EMBEDDINGS,
    ENTITIES,
    ENTITY_CONTENT,
    EVAL_METRICS,
    EVENTS,
    INGEST_REJECTS,
    NEIGHBOURHOODS,
    NODES,
    REPRESENTATION_DRIFT,
    SYNTHETIC_TRUTH,
    TableSpec,
)

LINEAGE_DIR = "_pipeline"  # under the warehouse: one lineage record per day, <ds>.json
# A remote day lock older than this belongs to a killed run (a day takes minutes to hours, not a day).
REMOTE_LOCK_STALE_SECONDS = 24 * 3600
LINEAGE_FORMAT = 1
PREVIOUS_MODEL = "train of ds-1"  # key of the model the day before trained, beside the day's own artifacts


# -- the stages ----------------------------------------------------------------------------------------------


def _no_problem(report: Any) -> str | None:
    return None


def _no_artifact(cfg: Any, report: Any) -> str | None:
    return None


def _intact(artifact: str) -> str | None:
    return None


def _never_superseded(artifact: str) -> bool:
    return False


def _no_files(cfg: Any) -> list[str]:
    return []


@dataclass(frozen=True)
class Stage:
    """One job of the pipeline: how to run it, what it reads and writes, and how to tell its outputs still stand."""

    name: str
    module: str  # the job module; imported when the stage is planned (evaluate may not be installed)
    reads: tuple[TableSpec, ...]
    writes: tuple[TableSpec, ...]
    run: Callable[[Any, ModuleType, Any], Any]  # (spark, job module, job config) -> the job's report
    summary: Callable[[Any], tuple[int | None, str, str]]  # report -> (rows, what the rows are, one line)
    problem: Callable[[Any], str | None] = _no_problem  # the job's own failed check (its main exits 1)
    artifact: Callable[[Any, Any], str | None] = _no_artifact  # (config, report) -> non-Delta output
    artifact_gone: Callable[[str], str | None] = (
        _intact  # artifact -> why it no longer stands, None if it does
    )
    # artifact -> a later day's run replaced it as it should (a backfill's finished day is still done)
    artifact_superseded: Callable[[str], bool] = _never_superseded
    input_files: Callable[[Any], list[str]] = (
        _no_files  # config -> files read (ingest reads files, not tables)
    )
    daily: bool = True  # gets --ds (ingest reads whole files; evaluate only when its parser has --ds)
    opt_in: bool = False
    check_early: bool = (
        True  # its flags are checked before the first stage runs (else once the warehouse exists)
    )
    also_runs: tuple[str, ...] = ()  # modules it runs without importing them by name (evaluate: the stages)

    def job(self) -> ModuleType:
        try:
            return importlib.import_module(self.module)
        except ImportError as err:
            raise HirError(f"stage {self.name}: cannot import {self.module} ({err})") from None

    def config(self, argv: Sequence[str]) -> Any:
        return self.job().config_from_args(list(argv))

    def code(self) -> str:
        """The hash of the source the stage runs (jobs.common.code): a change to it makes the stage stale."""
        return code_version(self.module, *self.also_runs)


def _ingest(spark, job, cfg):
    return job.ingest(spark, cfg)


def _ingest_files(cfg) -> list[str]:
    return [*cfg.inputs, *([cfg.mapping] if cfg.mapping else [])]


def _build_graph(spark, job, cfg):
    return job.build_graph(spark, cfg)


def _sample(spark, job, cfg):
    return job.sample_day(spark, cfg)


def _sample_summary(stats: dict[str, dict[str, float]]) -> tuple[int | None, str, str]:
    line = "; ".join(
        f"{node_type}: {s['rows']} rows, {s['mean_tokens']} tokens on average, {s['with_deep']} with a "
        "deep-funnel token"
        for node_type, s in sorted(stats.items())
    )
    return sum(int(s["rows"]) for s in stats.values()), "neighbourhoods", line


def _enrich(spark, job, cfg):
    return job.enrich(spark, cfg)


def _train(spark, job, cfg):
    return job.train(cfg, job.resolve_inputs(spark, cfg))


def _model_gone(artifact: str) -> str | None:
    return None if storage.is_file(storage.join(artifact, "weights.pt")) else f"model {artifact} is gone"


def _embed(spark, job, cfg):
    return job.embed(spark, cfg)


def _drift(spark, job, cfg):
    return job.measure(spark, cfg)


def _build_index(spark, job, cfg):
    return job.build_index(spark, cfg)


def _live_index(artifact: str) -> tuple[str, str | None]:
    """The LATEST pointer beside the index version's day folder, and the `day/version` it names (None if none)."""
    from jobs.index.publish import LATEST

    pointer = storage.join(storage.parent(storage.parent(artifact)), LATEST)
    return pointer, storage.read_text(pointer).strip() if storage.is_file(pointer) else None


def _index_gone(artifact: str) -> str | None:
    """The recorded index version must still exist and still be the one LATEST names."""
    from jobs.index.publish import MANIFEST_FILE

    if not storage.is_file(storage.join(artifact, MANIFEST_FILE)):
        return f"index version {artifact} is gone"
    pointer, live = _live_index(artifact)
    named = f"{storage.name(storage.parent(artifact))}/{storage.name(artifact)}"
    if live != named:
        return f"{pointer} now points to {live}, not {named}"
    return None


def _index_superseded(artifact: str) -> bool:
    """LATEST names a version of a later day than the recorded one's: the next days of a backfill published over
    it (and `--keep-versions` may have pruned it). Its day is still done; rerunning it would point LATEST back."""
    _, live = _live_index(artifact)
    return (live or "").split("/")[0] > storage.name(storage.parent(artifact))  # ISO days sort as dates


def _report_gone(artifact: str) -> str | None:
    return None if storage.exists(artifact) else f"report {artifact} is gone"


def _evaluate(spark, job, cfg):
    return job.evaluate(spark, cfg)


def _count(value: Any) -> int | None:
    if isinstance(value, int):
        return value
    return len(value) if hasattr(value, "__len__") else None


STAGES: tuple[Stage, ...] = (
    Stage(
        "ingest",
        "jobs.ingest_events",
        reads=(),
        writes=(EVENTS, ENTITIES, INGEST_REJECTS, SYNTHETIC_TRUTH),
        run=_ingest,
        summary=lambda r: (r.events, "events", r.line()),
        problem=lambda r: None if r.reconciles else r.line(),
        input_files=_ingest_files,
        daily=False,
    ),
    Stage(
        "build-graph",
        "jobs.build_graph",
        reads=(EVENTS, ENTITIES),
        writes=(NODES, EDGES),
        run=_build_graph,
        summary=lambda r: (sum(r.edges.values()), "edges", r.line()),
        problem=lambda r: None if r.reconciles else r.line(),
    ),
    Stage(
        "sample-neighbourhoods",
        "jobs.sample_neighbourhoods",
        reads=(NODES, EDGES),
        writes=(NEIGHBOURHOODS,),
        run=_sample,
        summary=_sample_summary,
    ),
    Stage(
        "enrich",
        "jobs.enrich_entities",
        reads=(NODES, ENTITIES),
        writes=(ENTITY_CONTENT,),
        run=_enrich,
        summary=lambda r: (
            r.nodes,
            "nodes",
            f"{r.nodes} nodes with text, {r.embedded} embedded ({r.texts} distinct texts), {r.unchanged} unchanged",
        ),
    ),
    Stage(
        "train",
        "jobs.train_encoder",
        reads=(NEIGHBOURHOODS, EDGES, ENTITY_CONTENT),
        writes=(),
        run=_train,
        summary=lambda r: (r.summary["rows"], "rows", r.line()),
        problem=lambda r: f"model {r.version} COLLAPSED: {r.collapse_detail}" if r.failed else None,
        artifact=lambda cfg, r: storage.normalise(r.path),
        artifact_gone=_model_gone,
    ),
    Stage(
        "embed",
        "jobs.embed_entities",
        reads=(NEIGHBOURHOODS, ENTITY_CONTENT, NODES, ENTITIES),
        writes=(EMBEDDINGS, BOM_TOKENS, BOM_VOCAB),
        run=_embed,
        summary=lambda r: (
            r.entities,
            "entities",
            f"{r.entities} entities with model {r.model_version}; versions {r.versions}",
        ),
    ),
    Stage(
        "drift",
        "jobs.measure_drift",
        reads=(EMBEDDINGS, BOM_TOKENS, NEIGHBOURHOODS),
        writes=(REPRESENTATION_DRIFT,),
        run=_drift,
        summary=lambda r: (len(r.rows), "drift rows", r.line()),
        problem=lambda r: r.problem,  # over --max-drift: the day stops here, before its index is published
        artifact=lambda cfg, r: storage.normalise(r.report_path) if r.report_path else None,
        artifact_gone=_report_gone,
    ),
    Stage(
        "build-index",
        "jobs.build_index",
        reads=(EMBEDDINGS,),
        writes=(),
        run=_build_index,
        summary=lambda r: (r.manifest["count"], "vectors", r.line()),
        artifact=lambda cfg, r: storage.normalise(r.version_dir),
        artifact_gone=_index_gone,
        artifact_superseded=_index_superseded,
    ),
    Stage(
        "evaluate",
        "jobs.evaluate",
        # It splits events/entities and builds everything else in its own history warehouse (with its own
        # lineage), so these two are all it reads here.
        reads=(EVENTS, ENTITIES),
        writes=(EVAL_METRICS,),
        run=_evaluate,
        summary=lambda r: (_count(getattr(r, "rows", None)), "metrics", r.line()),
        artifact=lambda cfg, r: storage.normalise(r.report_path) if getattr(r, "report_path", None) else None,
        artifact_gone=_report_gone,
        daily=False,  # decided from its parser: see stage_argv
        opt_in=True,
        check_early=False,  # its flags check that the warehouse exists, which ingest may not have created yet
        also_runs=(  # the day's stages, run on the history warehouse
            "jobs.build_graph",
            "jobs.sample_neighbourhoods",
            "jobs.enrich_entities",
            "jobs.train_encoder",
            "jobs.embed_entities",
            "jobs.build_index",
        ),
    ),
)
STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)
BY_NAME: dict[str, Stage] = {s.name: s for s in STAGES}


# -- flags ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PipelineConfig:
    ds: dt.date  # the day; a backfill's first day
    warehouse: str = "warehouse"
    source: str | None = None  # None: no ingest, the day's events are in the warehouse already
    stage_args: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # config file, then command line
    from_stage: str | None = None
    until_stage: str | None = None
    force: bool = False
    evaluate: bool = False
    ds_to: dt.date | None = None  # a backfill's last day (--ds-from ds --ds-to ds_to); None: one day

    @property
    def days(self) -> list[dt.date]:
        last = self.ds_to or self.ds
        return [self.ds + dt.timedelta(days=i) for i in range((last - self.ds).days + 1)]


def stage_name(value: str, flag: str) -> str:
    if value not in BY_NAME:
        raise HirError(f"{flag}: unknown stage '{value}' (choose from {', '.join(STAGE_NAMES)})")
    return value


def build_parser() -> JobArgumentParser:
    # No abbreviations: flags the pipeline does not know go to ingest, and must not match a pipeline flag's prefix.
    p = JobArgumentParser(prog="hir pipeline", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    days = p.add_mutually_exclusive_group(required=True)
    days.add_argument(
        "--ds",
        type=parse_ds,
        help="Day to build (YYYY-MM-DD): every daily stage gets it, and the lineage record is per day.",
    )
    days.add_argument(
        "--ds-from",
        type=parse_ds,
        metavar="DS",
        help="Backfill: first day of a range built day by day in order (with --ds-to), each day warm-starting "
        "from the one before. A rerun resumes where the last one stopped (done days are fresh and skipped).",
    )
    p.add_argument("--ds-to", type=parse_ds, metavar="DS", help="Backfill: last day of the range, included.")
    add_warehouse_flag(p)
    p.add_argument(
        "--source",
        choices=SOURCES,
        help="Ingest first with this adapter (any other `hir ingest` flag may follow, e.g. --input). Default: "
        "no ingest, since a daily run usually finds the day's events already landed by the ingest job.",
    )
    p.add_argument(
        "--config",
        help="TOML file with a table of flags per stage (see the module docstring); default none: every job's "
        "own defaults, which are sized for real runs.",
    )
    p.add_argument(
        "--stage-args",
        action="append",
        default=[],
        metavar='STAGE="FLAGS"',
        help="Extra flags for one stage, shlex-split, after those of --config (a later value wins); repeatable. "
        'E.g. train="--epochs 3 --dim 32".',
    )
    p.add_argument(
        "--from-stage",
        metavar="STAGE",
        help=f"First stage to consider, one of {', '.join(STAGE_NAMES)}. Default the first: earlier ones are "
        "neither run nor checked, so start later only when they are known to be done.",
    )
    p.add_argument(
        "--until-stage",
        metavar="STAGE",
        help="Last stage to consider. Default the last enabled one: a daily run builds everything.",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="Run every selected stage even when its lineage says it is fresh. Off by default: a rerun resumes "
        "where the last one stopped. (train still reuses a model with the same flags, inputs and code.)",
    )
    p.add_argument(
        "--evaluate",
        action="store_true",
        help="Also run the evaluation (also on when --config has an [evaluate] section). Off by default: it "
        "retrains the model and its ablations on a history split, several times the cost of the day itself.",
    )
    return p


def config_args(path: str) -> dict[str, tuple[str, ...]]:
    """A --config TOML file -> per stage argv: `[train] epochs = 3` -> {'train': ('--epochs', '3')}."""
    try:
        with open(path, "rb") as handle:
            doc = tomllib.load(handle)
    except FileNotFoundError:
        raise HirError(f"--config: file not found: {path}") from None
    except tomllib.TOMLDecodeError as err:
        raise HirError(f"--config {path}: not valid TOML ({err})") from None
    out: dict[str, tuple[str, ...]] = {}
    for section, table in doc.items():
        if not isinstance(table, dict):
            raise HirError(
                f"--config {path}: '{section}' must be a [stage] table, one of {', '.join(STAGE_NAMES)}"
            )
        if section not in BY_NAME:
            raise HirError(
                f"--config {path}: unknown stage [{section}] (choose from {', '.join(STAGE_NAMES)})"
            )
        argv: list[str] = []
        for key, value in table.items():
            if key == "args":
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise HirError(f"--config {path}: [{section}] args must be a list of strings")
                argv += value
            elif isinstance(value, bool):
                argv += [f"--{key}"] if value else []
            elif isinstance(value, list):
                argv += [f"--{key}", *(str(v) for v in value)]
            elif isinstance(value, str | int | float):
                argv += [f"--{key}", str(value)]
            else:
                raise HirError(
                    f"--config {path}: [{section}] {key} must be a string, number, boolean or list"
                )
        out[section] = tuple(argv)
    return out


def parse_stage_args(values: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """['train=--epochs 3', ...] -> {'train': ('--epochs', '3')}; repeats of a stage add up in order."""
    out: dict[str, tuple[str, ...]] = {}
    for value in values:
        name, sep, flags = value.partition("=")
        if not sep:
            raise HirError(f"--stage-args '{value}': expected STAGE=\"--flag value ...\"")
        stage_name(name, "--stage-args")
        try:
            out[name] = (*out.get(name, ()), *shlex.split(flags))
        except ValueError as err:
            raise HirError(f"--stage-args {name}: {err}") from None
    return out


def config_from_args(argv: Sequence[str] | None) -> PipelineConfig:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and args.source is None:
        parser.error(f"unrecognized arguments: {' '.join(rest)} (flags for ingest need --source)")
    for flag in ("from_stage", "until_stage"):
        if getattr(args, flag) is not None:
            stage_name(getattr(args, flag), "--" + flag.replace("_", "-"))
    from_file = config_args(args.config) if args.config else {}
    from_cli = parse_stage_args(args.stage_args)
    stage_args = {name: (*from_file.get(name, ()), *from_cli.get(name, ())) for name in STAGE_NAMES}
    stage_args["ingest"] = (*stage_args["ingest"], *rest)
    if (args.ds_from is None) != (args.ds_to is None):
        raise HirError("--ds-from and --ds-to go together (or give one day with --ds)")
    if args.ds_from is not None and args.ds_to < args.ds_from:
        raise HirError(f"--ds-to {args.ds_to} is before --ds-from {args.ds_from}")
    cfg = PipelineConfig(
        ds=args.ds or args.ds_from,
        ds_to=args.ds_to if args.ds_from is not None and args.ds_to != args.ds_from else None,
        warehouse=args.warehouse,
        source=args.source,
        stage_args={name: flags for name, flags in stage_args.items() if flags},
        from_stage=args.from_stage,
        until_stage=args.until_stage,
        force=args.force,
        evaluate=args.evaluate or "evaluate" in from_file,
    )
    for name in from_cli:
        if not enabled(BY_NAME[name], cfg):
            raise HirError(f"--stage-args {name}: {why_disabled(BY_NAME[name])}")
    plan(cfg)  # every stage's flags, checked before Spark starts
    return cfg


# -- planning: which stages, with which flags ----------------------------------------------------------------


def enabled(stage: Stage, cfg: PipelineConfig) -> bool:
    if stage.name == "ingest":
        return cfg.source is not None
    return cfg.evaluate if stage.opt_in else True


def why_disabled(stage: Stage) -> str:
    if stage.name == "ingest":
        return "ingest runs only with --source"
    return f"{stage.name} is opt-in: pass --evaluate (or give --config an [{stage.name}] section)"


def selected(cfg: PipelineConfig) -> list[Stage]:
    """The enabled stages from --from-stage to --until-stage, in pipeline order."""
    for flag, name in (("--from-stage", cfg.from_stage), ("--until-stage", cfg.until_stage)):
        if name is not None and not enabled(BY_NAME[stage_name(name, flag)], cfg):
            raise HirError(f"{flag} {name}: {why_disabled(BY_NAME[name])}")
    first = STAGE_NAMES.index(cfg.from_stage) if cfg.from_stage else 0
    last = STAGE_NAMES.index(cfg.until_stage) if cfg.until_stage else len(STAGES) - 1
    if first > last:
        raise HirError(f"--from-stage {cfg.from_stage} comes after --until-stage {cfg.until_stage}")
    return [s for s in STAGES[first : last + 1] if enabled(s, cfg)]


def _sets(flags: Sequence[str], flag: str) -> bool:
    return any(token == flag or token.startswith(flag + "=") for token in flags)


def _takes_ds(stage: Stage, job: ModuleType) -> bool:
    if stage.daily:
        return True
    parser = getattr(job, "build_parser", None)
    return stage.name != "ingest" and parser is not None and "--ds" in parser()._option_string_actions


def stage_argv(stage: Stage, cfg: PipelineConfig, artifacts: Mapping[str, str | None]) -> list[str]:
    """The stage's flags with the pipeline's own appended last, so they win over any abbreviation of them."""
    extra = list(cfg.stage_args.get(stage.name, ()))
    job = stage.job()
    owned = ["--warehouse"] + (["--source"] if stage.name == "ingest" else [])
    owned += ["--ds"] if _takes_ds(stage, job) else []
    for flag in owned:
        if _sets(extra, flag):
            raise HirError(
                f"stage {stage.name}: {flag} is set by the pipeline (its own {flag} flag), not per stage"
            )
    injected: list[str] = []
    if stage.name == "embed" and artifacts.get("train") and not _sets(extra, "--model"):
        injected += ["--model", artifacts["train"]]  # the version train wrote, not merely the newest folder
    if stage.name == "train" and artifacts.get(PREVIOUS_MODEL) and not _sets(extra, "--warm-start"):
        injected += ["--warm-start", artifacts[PREVIOUS_MODEL]]  # day ds-1's model: the day continues it
    if stage.name == "ingest":
        injected += ["--source", cfg.source]
    if "--ds" in owned:
        injected += ["--ds", cfg.ds.isoformat()]
    return [*extra, *injected, "--warehouse", cfg.warehouse]


def plan(cfg: PipelineConfig) -> list[Stage]:
    """The selected stages, each one's flags parsed by its own job (a bad flag fails here, naming the stage)."""
    stages = selected(cfg)
    if not stages:
        raise HirError("no stage selected: check --from-stage/--until-stage")
    for stage in stages:
        if stage.check_early or storage.is_dir(cfg.warehouse):
            argv = stage_argv(stage, cfg, {})
            try:
                stage.config(argv)
            except HirError as err:
                raise HirError(f"stage {stage.name}: {err}") from None
        else:
            stage.job()  # at least importable
    return stages


# -- lineage -------------------------------------------------------------------------------------------------


def fingerprint(job_cfg: Any) -> str:
    """sha256 of the job's parsed config: flag order, `--x=1` vs `--x 1` and defaults spelled out do not matter."""
    values = dataclasses.asdict(job_cfg) if dataclasses.is_dataclass(job_cfg) else vars(job_cfg)
    text = json.dumps(values, sort_keys=True, default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def file_stamps(paths: Sequence[str]) -> dict[str, list[int] | None]:
    """'file:<absolute path>' -> [size, mtime_ns] of every file (folders walked); None for what cannot be read."""
    stamps: dict[str, list[int] | None] = {}
    for given in paths:
        if not storage.on_this_machine(given):  # a remote input is named, not stamped
            stamps[f"file:{given}"] = None
            continue
        path = storage.local_path(given)
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        if not files:
            stamps[f"file:{path}"] = None
        for f in files:
            stat = f.stat()
            stamps[f"file:{f}"] = [stat.st_size, stat.st_mtime_ns]
    return stamps


def table_versions(spark, specs: Sequence[TableSpec], warehouse: str) -> dict[str, int | None]:
    """Current Delta version of each table, None where it does not exist."""
    return {
        s.name: table_version(spark, s, warehouse) if table_exists(spark, s, warehouse) else None
        for s in specs
    }


def lineage_path(warehouse: str, ds: dt.date) -> str:
    return storage.join(warehouse, LINEAGE_DIR, f"{ds.isoformat()}.json")


def read_lineage(warehouse: str, ds: dt.date) -> dict[str, dict[str, Any]]:
    """The stage records of a day ({} when the day never ran); a damaged file is a one-line error."""
    path = lineage_path(warehouse, ds)
    try:
        doc = json.loads(storage.read_text(path))
    except FileNotFoundError:
        return {}
    except ValueError:
        doc = None
    try:
        return dict(doc["stages"])
    except (ValueError, KeyError, TypeError):
        raise HirError(
            f"lineage record {path} is damaged: delete it to rerun every stage of the day"
        ) from None


def write_lineage(warehouse: str, ds: dt.date, stages: Mapping[str, dict[str, Any]]) -> None:
    """Replace the day's record atomically (`storage.write_text`: a local temp file and os.replace, one PUT on an
    object store): a kill leaves the old record."""
    doc = {
        "format": LINEAGE_FORMAT,
        "ds": ds.isoformat(),
        "stages": {n: stages[n] for n in STAGE_NAMES if n in stages},
    }
    storage.write_text(lineage_path(warehouse, ds), json.dumps(doc, indent=2, sort_keys=False) + "\n")


@contextlib.contextmanager
def day_lock(warehouse: str, ds: dt.date) -> Iterator[None]:
    """One pipeline run per warehouse and day: a second one fails at once rather than racing on the tables."""
    path = lineage_path(warehouse, ds).removesuffix(".json") + ".lock"
    if not storage.is_local(path):
        with remote_day_lock(path, ds):
            yield
        return
    path = storage.local_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise HirError(f"another pipeline run for {ds} holds {path}") from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def remote_day_lock(path: str, ds: dt.date) -> Iterator[None]:
    """The day lock on an object store or HDFS: a lock object naming its holder, made when absent and removed at
    the end. pyarrow cannot send S3's conditional put, so two runs starting within the same second can both take
    it: the lock stops a scheduled run from overlapping a run in progress, not a deliberate race (Delta's own
    rule on S3 is one writing cluster per table; see the README). A killed run leaves the object: after
    REMOTE_LOCK_STALE_SECONDS it is taken over, before that the error names it so an operator can delete it."""
    holder = {
        "owner": f"{socket.gethostname()}:{os.getpid()}",
        "token": uuid.uuid4().hex,
        "since": time.time(),
    }
    try:
        found = json.loads(storage.read_text(path))
    except FileNotFoundError:
        found = None
    except ValueError:
        found = {"owner": "unreadable", "since": 0.0}
    if found is not None and time.time() - float(found.get("since", 0.0)) < REMOTE_LOCK_STALE_SECONDS:
        raise HirError(
            f"another pipeline run for {ds} ({found.get('owner')}) holds {path}; if that run is dead, delete it"
        )
    storage.write_text(path, json.dumps(holder))
    try:
        yield
    finally:
        try:
            if json.loads(storage.read_text(path)).get("token") == holder["token"]:
                storage.remove(path)
        except (FileNotFoundError, ValueError):
            pass


def previous_day_model(warehouse: str, ds: dt.date) -> str | None:
    """The model version day ds-1's train stage recorded, if it is still there: the day's warm start."""
    try:
        record = read_lineage(warehouse, ds - dt.timedelta(days=1)).get("train") or {}
    except HirError:  # a damaged record of the day before: a cold start, not a failed day
        return None
    artifact = record.get("artifact")
    return artifact if artifact and _model_gone(artifact) is None else None


@contextlib.contextmanager
def days_locked(warehouse: str, days: Sequence[dt.date]) -> Iterator[None]:
    """Hold the lock of every day of a backfill for the whole run: an overlapping backfill or a daily run of one
    of its days fails at once, naming the day, and a run of other days goes on."""
    with contextlib.ExitStack() as stack:
        for day in days:
            stack.enter_context(day_lock(warehouse, day))
        yield


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def staleness(
    stage: Stage, record: dict | None, print_: str, code: str, inputs: dict, outputs: dict
) -> str | None:
    """Why the stage must run (None: fresh). `print_` is the job config's fingerprint, `code` its code version."""
    if record is None:
        return "no record of a run for this day"
    if record.get("fingerprint") != print_:
        return "its flags changed"
    if record.get("code") != code:
        return f"its code changed ({record.get('code')} -> {code})"
    recorded_in = record.get("inputs", {})
    for name, now in _plain(inputs).items():
        if now is None and name.startswith("file:"):
            return f"input {name[5:]} cannot be checked (missing or not a local file)"
        if recorded_in.get(name, "absent") != now:
            return f"input {name} changed ({recorded_in.get(name)} -> {now})"
    recorded_out = record.get("outputs", {})
    for name, now in _plain(outputs).items():
        if recorded_out.get(name, "absent") != now:
            return f"output {name} was rewritten since ({recorded_out.get(name)} -> {now})"
    artifact = record.get("artifact")
    if artifact:
        return stage.artifact_gone(artifact)
    return None


def _fresh_note(record: dict) -> str:
    versions = ", ".join(f"{k}={v}" for k, v in record.get("outputs", {}).items() if v is not None)
    parts = [f"outputs at versions {versions}"] if versions else []
    if record.get("artifact"):
        parts.append(f"output {record['artifact']}")
    return "fresh: " + ("; ".join(parts) or "inputs unchanged")


# -- progress ------------------------------------------------------------------------------------------------

# Relative cost of each stage on a first run, when no lineage record has its time yet: the stages' seconds in
# `make demo` on the 2-core box, summed over its three datasets, over build-graph's (2026-12-01: ingest 59 s,
# build-graph 43, sampling 30, enrich 166 before texts were deduplicated, train 239, embed 50, index 7, evaluate
# 534). Only ratios matter: the estimate scales them by what the stages that ran so far took.
FIRST_RUN_COST: dict[str, float] = {
    "ingest": 1.4,
    "build-graph": 1.0,
    "sample-neighbourhoods": 0.7,
    "enrich": 1.5,
    "train": 5.5,
    "embed": 1.2,
    "drift": 0.3,
    "build-index": 0.2,
    "evaluate": 12.0,
}


def earlier_seconds(warehouse: str, ds: dt.date) -> dict[str, float]:
    """Per stage, the seconds of its newest recorded run on another day of this warehouse (unreadable skipped)."""
    folder = storage.join(warehouse, LINEAGE_DIR)
    out: dict[str, float] = {}
    for name in storage.listdir(folder):
        if not name.endswith(".json") or name == f"{ds.isoformat()}.json":
            continue
        try:
            stages = json.loads(storage.read_text(storage.join(folder, name)))["stages"]
        except (ValueError, KeyError, TypeError, OSError):
            continue
        out.update({n: float(r["seconds"]) for n, r in stages.items() if "seconds" in r})
    return out


def estimate_left(
    left: Sequence[str], recorded: Mapping[str, float], ran: Mapping[str, float]
) -> float | None:
    """Seconds the stages in `left` will take: each one's recorded time, else its first-run cost scaled by what
    the stages that ran took against their costs. None when a stage has neither (nothing ran yet)."""
    ran_cost = sum(FIRST_RUN_COST.get(n, 1.0) for n in ran)
    rate = sum(ran.values()) / ran_cost if ran_cost else None
    total = 0.0
    for name in left:
        if name in recorded:
            total += recorded[name]
        elif rate is not None:
            total += FIRST_RUN_COST.get(name, 1.0) * rate
        else:
            return None
    return total


def hms(seconds: float) -> str:
    """65.2 -> '1m05s'; 3723 -> '1h02m03s'."""
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def progress_note(elapsed: float, left: float | None) -> str:
    estimate = f"about {hms(left)} left" if left is not None else "time left unknown until a stage has run"
    return f"elapsed {hms(elapsed)}, {estimate}"


# -- the run -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageResult:
    name: str
    status: str  # ran | skipped | failed | not run
    seconds: float = 0.0
    report: Any = None  # the job's report object (None unless it ran)
    line: str = ""  # the report's line (a skipped stage: the recorded one)
    rows: int | None = None
    rows_of: str = ""
    reason: str = ""  # why it ran, or why it was skipped

    @classmethod
    def skipped(cls, name: str, record: Mapping[str, Any], reason: str) -> StageResult:
        """A stage not run: its line and rows come from its lineage record."""
        return cls(
            name,
            "skipped",
            line=record.get("line", ""),
            rows=record.get("rows"),
            rows_of=record.get("rows_of", ""),
            reason=reason,
        )


@dataclass(frozen=True)
class PipelineReport:
    ds: dt.date
    warehouse: str
    stages: tuple[StageResult, ...]
    seconds: float

    def status(self) -> dict[str, str]:
        return {s.name: s.status for s in self.stages}

    def result(self, name: str) -> StageResult:
        return next(s for s in self.stages if s.name == name)

    @property
    def ok(self) -> bool:
        return all(s.status in ("ran", "skipped") for s in self.stages)

    def table(self) -> str:
        counts = {k: sum(s.status == k for s in self.stages) for k in ("ran", "skipped", "failed")}
        lines = [
            f"pipeline {self.ds} ({self.warehouse}): {counts['ran']} ran, {counts['skipped']} skipped, "
            f"{counts['failed']} failed in {self.seconds:.1f}s",
            f"  {'stage':<22} {'status':<8} {'rows':>24} {'seconds':>8}",
        ]
        for s in self.stages:
            rows = f"{s.rows} {s.rows_of}" if s.rows is not None else "-"
            lines.append(f"  {s.name:<22} {s.status:<8} {rows:>24} {s.seconds:>8.1f}")
        return "\n".join(lines)


class StageFailed(HirError):
    """A stage stopped the run; `exit_code` is what the job's own main would return, `report` what ran so far."""

    def __init__(self, stage: str, message: str, exit_code: int, report: PipelineReport):
        super().__init__(f"stage {stage}: {message}")
        self.stage, self.exit_code, self.report = stage, exit_code, report


def run_pipeline(spark, cfg: PipelineConfig, *, out: TextIO | None = None) -> PipelineReport:
    """Run the selected stages of the day in order, skipping fresh ones; raise StageFailed when one fails."""
    with day_lock(cfg.warehouse, cfg.ds):
        return _run_day(spark, cfg, out or sys.stdout)


def run_backfill(spark, cfg: PipelineConfig, *, out: TextIO | None = None) -> list[PipelineReport]:
    """Run every day from cfg.ds to cfg.ds_to in order, each like `run_pipeline`, holding all their locks. A rerun
    resumes: the days an earlier run finished are skipped (`done_day`), the first unfinished one continues from its
    first stale stage. Ingest (with --source) runs on the first day only: it reads whole files. The first failing
    day stops the backfill (its successors would warm-start from a model it did not train); StageFailed names
    it."""
    out = out or sys.stdout
    reports: list[PipelineReport] = []
    with days_locked(cfg.warehouse, cfg.days):
        for index, day in enumerate(cfg.days):
            tag = f"== backfill day {index + 1}/{len(cfg.days)}: {day}"
            day_cfg = dataclasses.replace(cfg, ds=day, ds_to=None, source=cfg.source if index == 0 else None)
            done = None if cfg.force else done_day(day_cfg)
            if done is not None:
                print(
                    f"{tag}: done (every stage recorded with these flags and code), skipped",
                    file=out,
                    flush=True,
                )
                reports.append(done)
                continue
            print(tag, file=out, flush=True)
            reports.append(_run_day(spark, day_cfg, out))
    ran = sum(any(s.status == "ran" for s in r.stages) for r in reports)
    print(
        f"backfill {cfg.ds} .. {cfg.ds_to}: {len(reports)} days, {ran} with stages run, "
        f"{len(reports) - ran} fresh, in {hms(sum(r.seconds for r in reports))}",
        file=out,
        flush=True,
    )
    return reports


def done_day(cfg: PipelineConfig) -> PipelineReport | None:
    """A backfill's day that an earlier run of it finished: every selected stage has a record with the flags and
    code this run would use, and its model or index is still there. Its report (all skipped), else None.

    Table versions are not compared, unlike a single day's freshness: the later days of the backfill rewrite the
    shared tables (their own partitions of nodes, edges ...), which would make every finished day stale and a
    resumed backfill rebuild all of them. For the same reason an index that a later day's publish replaced (LATEST
    moved on, the version perhaps pruned) still counts. `--force` rebuilds every day."""
    records = read_lineage(cfg.warehouse, cfg.ds)
    artifacts = {name: rec.get("artifact") for name, rec in records.items()}
    artifacts[PREVIOUS_MODEL] = previous_day_model(cfg.warehouse, cfg.ds)
    results = []
    for stage in selected(cfg):
        record = records.get(stage.name)
        if record is None:
            return None
        try:
            print_ = fingerprint(stage.config(stage_argv(stage, cfg, artifacts)))
        except HirError:
            return None  # _run_day reports it
        if record.get("fingerprint") != print_ or record.get("code") != stage.code():
            return None
        artifact = record.get("artifact")
        if artifact and stage.artifact_gone(artifact) is not None and not stage.artifact_superseded(artifact):
            return None
        results.append(StageResult.skipped(stage.name, record, "done in an earlier run of the backfill"))
    return PipelineReport(cfg.ds, cfg.warehouse, tuple(results), 0.0)


def _run_day(spark, cfg: PipelineConfig, out: TextIO) -> PipelineReport:
    """run_pipeline's body, under the day's lock (held by the caller)."""
    stages = plan(cfg)
    started = time.perf_counter()
    results: list[StageResult] = []

    def emit(text: str) -> None:
        print(text, file=out, flush=True)

    def report_so_far() -> PipelineReport:
        done = {r.name for r in results}
        rest = tuple(StageResult(s.name, "not run") for s in stages if s.name not in done)
        return PipelineReport(
            cfg.ds, cfg.warehouse, (*results, *rest), round(time.perf_counter() - started, 3)
        )

    records = read_lineage(cfg.warehouse, cfg.ds)
    artifacts = {name: rec.get("artifact") for name, rec in records.items()}
    artifacts[PREVIOUS_MODEL] = previous_day_model(cfg.warehouse, cfg.ds)
    recorded = {
        **earlier_seconds(cfg.warehouse, cfg.ds),
        **{n: float(r["seconds"]) for n, r in records.items() if "seconds" in r},
    }
    ran_seconds: dict[str, float] = {}
    rerun_from: str | None = None  # the first stage that ran: every later one runs too
    for position, stage in enumerate(stages, 1):
        tag = f"[{position}/{len(stages)}] {stage.name}"
        argv = stage_argv(stage, cfg, artifacts)
        job = stage.job()
        try:
            job_cfg = stage.config(argv)
        except HirError as err:
            results.append(StageResult(stage.name, "failed", reason=str(err)))
            raise StageFailed(stage.name, str(err), 2, _summarised(report_so_far(), emit)) from None
        print_ = fingerprint(job_cfg)
        code = stage.code()
        inputs = {
            **table_versions(spark, stage.reads, cfg.warehouse),
            **file_stamps(stage.input_files(job_cfg)),
        }
        record = records.get(stage.name)
        if cfg.force:
            reason = "--force"
        elif rerun_from is not None:
            reason = f"runs after {rerun_from}"
        else:
            reason = staleness(
                stage, record, print_, code, inputs, table_versions(spark, stage.writes, cfg.warehouse)
            )
        if reason is None:
            note = _fresh_note(record)
            emit(f"{tag} skipped ({note})")
            results.append(StageResult.skipped(stage.name, record, note))
            continue

        left = estimate_left([s.name for s in stages[position - 1 :]], recorded, ran_seconds)
        emit(f"{tag} ... ({reason}) | {progress_note(time.perf_counter() - started, left)}")
        clock = time.perf_counter()
        try:
            report = stage.run(spark, job, job_cfg)
            problem = stage.problem(report)
        except HirError as err:
            _forget(cfg, records, stage)
            results.append(
                StageResult(stage.name, "failed", round(time.perf_counter() - clock, 3), reason=str(err))
            )
            raise StageFailed(stage.name, str(err), 2, _summarised(report_so_far(), emit)) from None
        except BaseException as err:
            _forget(cfg, records, stage)
            results.append(
                StageResult(stage.name, "failed", round(time.perf_counter() - clock, 3), reason=repr(err))
            )
            _summarised(report_so_far(), emit)
            print(
                f"error: stage {stage.name} failed with {type(err).__name__} (traceback below)",
                file=sys.stderr,
            )
            raise
        seconds = round(time.perf_counter() - clock, 3)
        rows, rows_of, line = stage.summary(report)
        if problem is not None:
            _forget(cfg, records, stage)
            results.append(StageResult(stage.name, "failed", seconds, report, line, rows, rows_of, problem))
            emit(f"{tag} failed after {seconds:.1f}s: {line}")
            raise StageFailed(stage.name, problem, 1, _summarised(report_so_far(), emit))
        artifact = stage.artifact(job_cfg, report)
        artifacts[stage.name] = artifact
        records[stage.name] = {
            "fingerprint": print_,
            "code": code,
            "argv": argv,
            "inputs": _plain(inputs),
            "outputs": table_versions(spark, stage.writes, cfg.warehouse),
            "artifact": artifact,
            "rows": rows,
            "rows_of": rows_of,
            "line": line,
            "seconds": seconds,
            "finished_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        }
        write_lineage(cfg.warehouse, cfg.ds, records)
        rerun_from = rerun_from or stage.name
        ran_seconds[stage.name] = seconds
        emit(f"{tag} done in {seconds:.1f}s: {line}")
        results.append(StageResult(stage.name, "ran", seconds, report, line, rows, rows_of, reason))
    return _summarised(report_so_far(), emit)


def _forget(cfg: PipelineConfig, records: dict[str, dict], stage: Stage) -> None:
    """A failed stage is never fresh: drop its record so the next run starts there."""
    if records.pop(stage.name, None) is not None:
        write_lineage(cfg.warehouse, cfg.ds, records)


def _summarised(report: PipelineReport, emit: Callable[[str], None]) -> PipelineReport:
    emit(report.table())
    return report


def main(argv: Sequence[str] | None = None) -> int:
    cfg = config_from_args(argv)
    from jobs.common.spark import get_spark

    spark = get_spark(
        f"hir-pipeline-{cfg.ds}" + (f"-{cfg.ds_to}" if cfg.ds_to else ""),
        places={"--warehouse": cfg.warehouse},
    )
    try:
        if cfg.ds_to is not None:
            run_backfill(spark, cfg)
        else:
            run_pipeline(spark, cfg)
    except StageFailed as failed:
        print(f"error: {failed}", file=sys.stderr)
        return failed.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(run_job(main))
