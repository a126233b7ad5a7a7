"""Deep-funnel evaluation: HIR against baselines on the same users, candidates and split; `eval_metrics` + report.

    hir evaluate --warehouse warehouse/taobao --protocol temporal --cutoff 2017-12-02T00:00:00+08:00
    hir evaluate --warehouse warehouse/rees46 --protocol leave_last_conversion_out
    hir evaluate --warehouse warehouse/rees46 --protocol leave_last_conversion_out \\
        --stage-args train="--epochs 3 --dim 32 --heads 2 --prototypes 64" --bootstrap 1000

The job splits the warehouse's `events` (jobs.eval.split: temporal cut-off, or each user's last conversion held
out), writes the history (and the catalog as of its end) into a warehouse of its own, `<warehouse>/eval/
<protocol>/`, and runs the pipeline there for the history's last day: graph, samples, content, HIR and its three
ablations (no attention bias, no distillation, no content), embeddings, the published item index: through `hir
pipeline` with its own lineage there, so a rerun on an unchanged split reuses every fresh stage and model. Nothing at
or after a user's cut-off is in that warehouse, so no stage can see a target.

Then, for every user with history and a deep-funnel target, each method ranks the top 100 items of two
candidate sets: `graph` (items with interactions in the history; targets restricted to them) and `catalog`
(also the items first seen after the cut-off, known by attributes only). Methods: `hir` (through the published
index), `hir_no_bias`, `hir_no_distill`, `hir_no_content`, `popularity`, `co_visitation`, `als` (tuned on a
validation split cut from the history), `category_popularity`, `content_only`. Metrics: Recall, NDCG, HitRate
@ 10/20/50/100 with bootstrap 95% CIs over users, on slices `all`, `no_prior_conversion` (users without a cart
or purchase in their history), `new_interest` (targets the user never interacted with) and `repeat`.

The ranking task (`--task ranking`, or `both`, the default) then trains LightGBM lambdarank rankers with and
without HIR's embedding and Bag-of-Meaning features over the union of the generators' top lists, on user-disjoint
folds, and reports each ranker's NDCG/Recall/AUC and the paired lift of the HIR rankers over `base`
(jobs.eval.ranking, jobs.eval.features).

Writes `eval_metrics` (replacing this dataset's and protocol's rows of the day, of the tasks run) in the warehouse, and a report
(`<warehouse>/reports/<protocol>/<ds>/report.md` with SVG plots), and prints a table of @50 results.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from hir_model import checkpoint, storage
from jobs.common.args import JobArgumentParser, add_warehouse_flag, parse_place, run_job
from jobs.common.delta import read_table, sql_in, table_exists, table_path, write_table
from jobs.common.errors import HirError
from jobs.common.spark import get_spark
from jobs.common.stage import StageLog
from jobs.eval import baselines as bl
from jobs.eval.features import BASE_GENERATORS as RANKING_BASE_GENERATORS
from jobs.eval.metrics import DEFAULT_KS, UserMetrics, paired_bootstrap_diff, per_user_metrics, summarise
from jobs.eval.report import DIFF_METRICS
from jobs.eval.split import PROTOCOLS, Split, last_conversion_split, temporal_split
from schemas.tables import (
    BOM_TOKENS,
    EMBEDDINGS,
    ENTITIES,
    ENTITY_CONTENT,
    EVAL_METRICS,
    EVENTS,
    NEIGHBOURHOODS,
)

# name -> the `hir train` flag that makes it (the full model has none).
HIR_VARIANTS: dict[str, tuple[str, ...]] = {
    "hir": (),
    "hir_no_bias": ("--no-attention-bias",),
    "hir_no_distill": ("--no-distillation",),
    "hir_no_content": ("--no-content",),
}
BASELINES = ("popularity", "co_visitation", "als", "category_popularity", "content_only")
METHODS = (*HIR_VARIANTS, *BASELINES)
CANDIDATE_SETS = ("graph", "catalog")
SLICES = ("all", "no_prior_conversion", "new_interest", "repeat")
TASKS = ("retrieval", "ranking")
# Each generator's top 50 joins the ranking candidates: 5 generators, up to 250 per user.
RANKING_CANDIDATES = 50
STAGES_WITH_ARGS = ("build-graph", "sample-neighbourhoods", "enrich", "train", "embed", "build-index")
TUNE_K = 50  # ALS is tuned on NDCG@50, the headline metric of the report


@dataclass(frozen=True)
class EvalConfig:
    warehouse: str
    protocol: str
    cutoff: dt.datetime | None = None
    dataset: str | None = None  # default: the warehouse folder's name
    methods: tuple[str, ...] = METHODS
    ks: tuple[int, ...] = DEFAULT_KS
    bootstrap: int = 1000
    seed: int = 0
    stage_args: dict[str, tuple[str, ...]] = field(default_factory=dict)
    report_dir: str | None = None
    tasks: tuple[str, ...] = TASKS
    ranking_candidates: int = RANKING_CANDIDATES
    als_grid: dict[str, tuple[float, ...]] = field(default_factory=lambda: dict(bl.ALS_GRID))

    @property
    def name(self) -> str:
        return self.dataset or storage.name(storage.normalise(self.warehouse))

    @property
    def history_warehouse(self) -> str:
        return storage.join(self.warehouse, "eval", self.protocol)


@dataclass
class EvalReport:
    dataset: str
    protocol: str
    ds: dt.date
    model_version: str
    rows: list[dict]
    context: dict
    report_path: str
    seconds: float = 0.0
    version: int | None = None
    history_stages: dict[str, str] = field(default_factory=dict)  # history pipeline: stage -> ran/skipped
    models: dict[str, str] = field(default_factory=dict)  # HIR variant -> model version

    def value(self, method: str, candidates: str, slice_: str, metric: str, k: int) -> dict | None:
        for row in self.rows:
            if (row["method"], row["candidates"], row["slice"], row["metric"], row["k"]) == (
                method,
                candidates,
                slice_,
                metric,
                k,
            ):
                return row
        return None

    def line(self) -> str:
        best = self.value("hir", "catalog", "all", "ndcg", 50)
        ndcg = f"hir catalog NDCG@50 {best['value']:.4f}" if best else "no hir rows"
        return (
            f"evaluate {self.dataset}/{self.protocol} {self.ds}: {self.context['users']} users, "
            f"{self.context['targets']} targets, {len(self.rows)} metric rows; {ndcg}; report {self.report_path}"
        )


def parse_stage_args(values: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """['train=--epochs 3 --dim 32', ...] -> {'train': ('--epochs', '3', '--dim', '32')}, history stages only."""
    from jobs.pipeline import parse_stage_args as pipeline_stage_args

    out = pipeline_stage_args(values)
    for stage in out:
        if stage not in STAGES_WITH_ARGS:
            raise HirError(f"--stage-args {stage}: the evaluation runs only {', '.join(STAGES_WITH_ARGS)}")
    return out


def parse_cutoff(value: str) -> dt.datetime:
    try:
        cutoff = dt.datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--cutoff must be an ISO date-time, got '{value}'") from None
    if cutoff.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"--cutoff '{value}' needs a time zone, e.g. 2017-12-02T00:00:00+08:00"
        )
    return cutoff


def parse_als_grid(value: str) -> dict[str, tuple[float, ...]]:
    """'rank=16,64;regParam=0.01,0.1;alpha=1,10' -> the ALS grid (every key of ALS_GRID, each a value list)."""
    grid: dict[str, tuple[float, ...]] = {}
    for part in value.split(";"):
        key, _, values = part.partition("=")
        try:
            grid[key.strip()] = tuple(float(v) for v in values.split(","))
        except ValueError:
            raise HirError(f"--als-grid: '{part}' is not NAME=number,number...") from None
    if set(grid) != set(bl.ALS_GRID) or any(not v for v in grid.values()):
        raise HirError(f"--als-grid needs values for exactly {', '.join(bl.ALS_GRID)}, got '{value}'")
    return grid


def build_parser() -> JobArgumentParser:
    p = JobArgumentParser(prog="hir evaluate", description=__doc__.split("\n\n")[0])
    add_warehouse_flag(p)
    p.add_argument(
        "--protocol",
        required=True,
        choices=PROTOCOLS,
        help="temporal: one global cut-off (logs spanning days); leave_last_conversion_out: each user's last "
        "cart/purchase held out (logs too short for a global cut-off).",
    )
    p.add_argument(
        "--cutoff",
        type=parse_cutoff,
        help="temporal only: the cut-off instant with its zone (ISO 8601). Everything is built from events "
        "before it; targets are the cart/purchase pairs at or after it.",
    )
    p.add_argument(
        "--dataset", help="Name in eval_metrics and the report. Default: the warehouse folder's name."
    )
    p.add_argument(
        "--methods",
        default=",".join(METHODS),
        help="Comma list of methods to run. Default: all of them; the report compares only what ran.",
    )
    p.add_argument(
        "--ks",
        default=",".join(str(k) for k in DEFAULT_KS),
        help="Cut-offs K. Default 10,20,50,100: from a first screen to a retrieval stage's candidate list.",
    )
    p.add_argument(
        "--bootstrap",
        type=int,
        default=1000,
        help="Bootstrap resamples of the users for the 95%% CIs. 1000 gives stable 2.5/97.5 percentiles.",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="Seed of the bootstrap (the models use their own flags)."
    )
    p.add_argument(
        "--stage-args",
        action="append",
        default=[],
        metavar='STAGE="FLAGS"',
        help='Extra flags for a stage run on the history (repeatable), e.g. train="--epochs 3 --dim 32". The '
        "HIR ablations get the same train flags plus their own switch.",
    )
    p.add_argument(
        "--als-grid",
        default=";".join(f"{k}={','.join(str(v) for v in vs)}" for k, vs in bl.ALS_GRID.items()),
        help="ALS grid searched on the validation split cut from the history (never the targets). Default: ranks "
        "16/64, regParam 0.01/0.1, alpha 1/10 (the ranges of Hu et al. 2008 and Spark's defaults).",
    )
    p.add_argument(
        "--task",
        choices=("retrieval", "ranking", "both"),
        default="both",
        help="retrieval: each method's own top K against the targets; ranking: LightGBM lambdarank rankers with "
        "and without HIR's embedding and token features over the union of the generators' top lists, on "
        "user-disjoint folds (jobs.eval.ranking); both (default). Each task replaces only its own rows.",
    )
    p.add_argument(
        "--ranking-candidates",
        type=int,
        default=RANKING_CANDIDATES,
        help="Ranking task: each generator's top N joins the candidates (co-visitation, ALS, popularity, "
        "category popularity, HIR). Default 50: a retrieval stage's usual list per source.",
    )
    p.add_argument(
        "--report-dir",
        type=parse_place,
        help="Report folder (path or URI). Default <warehouse>/reports/<protocol>/<ds>.",
    )
    return p


def config_from_args(argv: Sequence[str] | None) -> EvalConfig:
    a = build_parser().parse_args(argv)
    if a.protocol == "temporal" and a.cutoff is None:
        raise HirError("--protocol temporal needs --cutoff")
    if a.protocol != "temporal" and a.cutoff is not None:
        raise HirError(f"--cutoff applies to the temporal protocol only, not {a.protocol}")
    methods = tuple(m.strip() for m in a.methods.split(",") if m.strip())
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise HirError(
            f"--methods: unknown {', '.join(unknown) or '(empty)'} (choose from {', '.join(METHODS)})"
        )
    try:
        ks = tuple(sorted({int(k) for k in a.ks.split(",")}))
    except ValueError:
        raise HirError(f"--ks must be a comma list of integers, got '{a.ks}'") from None
    if not ks or ks[0] < 1:
        raise HirError("--ks must be positive integers")
    if a.bootstrap < 1:
        raise HirError("--bootstrap must be at least 1")
    tasks = TASKS if a.task == "both" else (a.task,)
    if "ranking" in tasks:
        if a.ranking_candidates < 1:
            raise HirError("--ranking-candidates must be at least 1")
        if "hir" not in methods or not set(methods) & set(RANKING_BASE_GENERATORS):
            raise HirError(
                "--task ranking needs hir and at least one of "
                f"{', '.join(RANKING_BASE_GENERATORS)} in --methods (its candidates and base features)"
            )
    if storage.on_this_machine(a.warehouse) and not storage.local_path(a.warehouse).is_dir():
        raise HirError(
            f"warehouse not found: {a.warehouse}"
        )  # a remote one: checked when Spark has its settings
    cfg = EvalConfig(
        warehouse=a.warehouse,
        protocol=a.protocol,
        cutoff=a.cutoff,
        dataset=a.dataset,
        methods=methods,
        ks=ks,
        bootstrap=a.bootstrap,
        seed=a.seed,
        stage_args=parse_stage_args(a.stage_args),
        report_dir=a.report_dir,
        tasks=tasks,
        ranking_candidates=a.ranking_candidates,
        als_grid=parse_als_grid(a.als_grid),
    )
    if "'" in cfg.name:  # it is quoted into eval_metrics' replaceWhere: refuse before any work, not after
        raise HirError(f"dataset name {cfg.name!r} may not contain a quote")
    return cfg


# -- the split and the history warehouse ------------------------------------------------------------------------


def make_split(spark: SparkSession, cfg: EvalConfig) -> Split:
    events = read_table(spark, EVENTS, cfg.warehouse)
    entities = read_table(spark, ENTITIES, cfg.warehouse)
    if cfg.protocol == "temporal":
        return temporal_split(events, entities, cfg.cutoff)
    return last_conversion_split(events, entities)


def write_history(spark: SparkSession, split: Split, cfg: EvalConfig) -> dict[str, int]:
    """The history warehouse's `events` and `entities`; rewritten only when the split changed, so that the
    history pipeline's lineage finds its inputs at the same versions and skips what is fresh."""
    from delta.tables import DeltaTable

    source_version = (
        DeltaTable.forPath(spark, table_path(cfg.warehouse, EVENTS)).history(1).first()["version"]
    )
    key = json.dumps({"protocol": cfg.protocol, "cutoff": split.cutoff, "events_version": source_version})
    target = cfg.history_warehouse
    versions = {}
    for spec, frame in ((EVENTS, split.history), (ENTITIES, split.catalog)):
        if table_exists(spark, spec, target):
            last = DeltaTable.forPath(spark, table_path(target, spec)).history(1).first()
            if last["userMetadata"] == key:
                versions[spec.name] = last["version"]
                continue
        versions[spec.name] = write_table(frame, spec, target, None, user_metadata=key)
    if table_exists(spark, ENTITY_CONTENT, cfg.warehouse) and not table_exists(spark, ENTITY_CONTENT, target):
        # Seed the content vectors: enrich re-embeds only the texts that differ (keyed by node id and text
        # hash), so the language model does not run again over an unchanged catalog.
        write_table(read_table(spark, ENTITY_CONTENT, cfg.warehouse), ENTITY_CONTENT, target, None)
    return versions


class _Prefixed:
    """A text stream that prefixes every line, so the history pipeline's progress reads apart from the day's."""

    def __init__(self, prefix: str, stream):
        self.prefix, self.stream, self.at_start = prefix, stream, True

    def write(self, text: str) -> int:
        for piece in text.splitlines(keepends=True):
            self.stream.write((self.prefix if self.at_start else "") + piece)
            self.at_start = piece.endswith("\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def history_train_flags(cfg: EvalConfig) -> list[str]:
    """The train flags of every HIR variant on the history (an ablation adds its own switch)."""
    return [*cfg.stage_args.get("train", ()), "--no-progress", "--allow-collapsed"]


def history_pipeline_argv(cfg: EvalConfig, ds: dt.date, variants: Sequence[str]) -> list[str]:
    """`hir pipeline` flags for the history warehouse: the day's stages up to the item index (up to the content
    when the full model is not evaluated), with the evaluation's --stage-args. A collapsed model is a result
    here, not a failure: train and embed get --allow-collapsed."""
    stage_args = {stage: list(flags) for stage, flags in cfg.stage_args.items()}
    stage_args["train"] = history_train_flags(cfg)
    stage_args["embed"] = [*stage_args.get("embed", []), "--allow-collapsed"]
    until = "build-index" if "hir" in variants else "enrich"
    argv = ["--ds", str(ds), "--warehouse", cfg.history_warehouse, "--until-stage", until]
    for stage, flags in stage_args.items():
        argv += ["--stage-args", f"{stage}={shlex.join(flags)}"]
    return argv


def run_history_pipeline(spark: SparkSession, cfg: EvalConfig, ds: dt.date, variants: Sequence[str]) -> dict:
    """graph -> samples -> content -> HIR -> embeddings -> item index on the history, through `hir pipeline` and
    its lineage in the history warehouse: a rerun on an unchanged split skips every fresh stage (a stage whose
    flags, inputs or code changed reruns, and every stage after it). The ablations train beside it through the
    train job, whose derived model version (flags, input versions, code) makes an unchanged one a no-op."""
    from jobs import pipeline, train_encoder

    wh = cfg.history_warehouse
    try:
        history = pipeline.run_pipeline(
            spark,
            pipeline.config_from_args(history_pipeline_argv(cfg, ds, variants)),
            out=_Prefixed("[evaluate: history] ", sys.stdout),
        )
    except pipeline.StageFailed as failed:
        raise HirError(f"history pipeline: {failed}") from None
    timings = {s.name: s.seconds for s in history.stages if s.status == "ran"}
    models = {}
    if "hir" in variants:
        trained = history.result("train")
        models["hir"] = (
            trained.report
            if trained.report is not None
            else train_encoder.TrainReport.of_existing(
                checkpoint.model_path(pipeline.read_lineage(wh, ds)["train"]["artifact"]),
                collapse_allowed=True,
            )
        )
    # The ablations: the full model's train flags (as the history pipeline passed them) plus their own switch.
    flags = ["--ds", str(ds), "--warehouse", wh, *history_train_flags(cfg)]
    for name in variants:
        if name == "hir":
            continue
        train_cfg = train_encoder.config_from_args([*flags, *HIR_VARIANTS[name]])
        started = time.perf_counter()
        models[name] = train_encoder.train(train_cfg, train_encoder.resolve_inputs(spark, train_cfg))
        timings[f"train {name}"] = round(time.perf_counter() - started, 1)
        state = "reused (fresh)" if models[name].reused else f"trained in {timings[f'train {name}']}s"
        print(f"[evaluate] {name}: model {models[name].version} {state}", flush=True)
    for name, report in models.items():
        if report.collapsed:
            # Still evaluated (a collapsed variant is a result of the ablation), and flagged in the report.
            print(
                f"[evaluate] warning: {name} collapsed in training ({report.collapse_detail})",
                file=sys.stderr,
            )
    return {"models": models, "timings": timings, "stages": history.status()}


# -- what is evaluated -------------------------------------------------------------------------------------------


@dataclass
class EvalData:
    """Driver-side view of the split: node ids throughout (users and items hash (source, type, raw id))."""

    users: np.ndarray  # evaluated users
    targets: dict[int, set[int]]  # user -> target items (all candidates)
    seen: dict[int, set[int]]  # user -> items interacted with in the history
    converted: set[int]  # users with a cart/purchase in the history
    graph_items: np.ndarray
    catalog_items: np.ndarray
    new_items: set[int]  # catalog items without history interactions


def collect_eval_data(spark: SparkSession, split: Split, ui: DataFrame) -> EvalData:
    targets_df = split.targets.select(bl.user_node().alias("user"), bl.item_node().alias("item"))
    targets_pd = targets_df.toPandas()
    ui_pd = ui.select("user", "item", "deep").toPandas()
    catalog = split.catalog.where(F.col("entity_type") == "item").select(
        bl.item_node("entity_id").alias("item")
    )
    catalog_items = np.unique(
        np.concatenate([catalog.toPandas()["item"].to_numpy(np.int64), targets_pd["item"].to_numpy(np.int64)])
    )
    graph_items = np.unique(ui_pd["item"].to_numpy(np.int64))
    targets: dict[int, set[int]] = {}
    for user, item in zip(targets_pd["user"].tolist(), targets_pd["item"].tolist(), strict=True):
        targets.setdefault(user, set()).add(item)
    seen: dict[int, set[int]] = {}
    for user, item in zip(ui_pd["user"].tolist(), ui_pd["item"].tolist(), strict=True):
        seen.setdefault(user, set()).add(item)
    converted = set(ui_pd.loc[ui_pd["deep"] > 0, "user"].tolist())
    users = np.array(sorted(u for u in targets if u in seen), dtype=np.int64)
    return EvalData(
        users=users,
        targets={u: targets[u] for u in users.tolist()},
        seen=seen,
        converted=converted,
        graph_items=graph_items,
        catalog_items=catalog_items,
        new_items=set(catalog_items.tolist()) - set(graph_items.tolist()),
    )


def slice_targets(data: EvalData, candidates: str, slice_: str) -> dict[int, set[int]]:
    """Targets per user for one (candidate set, slice); users left with no target are not in the slice."""
    allowed = set(data.graph_items.tolist()) if candidates == "graph" else None
    out = {}
    for user, items in data.targets.items():
        if slice_ == "no_prior_conversion" and user in data.converted:
            continue
        kept = items if allowed is None else items & allowed
        if slice_ == "new_interest":
            kept = kept - data.seen.get(user, set())
        elif slice_ == "repeat":
            kept = kept & data.seen.get(user, set())
        if kept:
            out[user] = kept
    return out


# -- rankings ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TopK:
    """One method's top k per user over one candidate set: item ids best first, and the scores it ranked by
    (the ranking task's generator features)."""

    items: dict[int, np.ndarray] = field(default_factory=dict)
    scores: dict[int, np.ndarray] = field(default_factory=dict)


def collect_ranking(ranking: DataFrame) -> TopK:
    pdf = ranking.select("user", "item", "rank", "score").toPandas().sort_values(["user", "rank"])
    groups = [(int(u), g) for u, g in pdf.groupby("user", sort=False)]
    return TopK(
        {u: g["item"].to_numpy(np.int64) for u, g in groups},
        {u: g["score"].to_numpy(np.float64) for u, g in groups},
    )


def exact_top_k(
    user_ids: np.ndarray, user_vectors: np.ndarray, item_ids: np.ndarray, item_vectors: np.ndarray, k: int
) -> TopK:
    """Exact inner-product top k (FAISS flat): the reference search for the ablations and content-only."""
    import faiss

    index = faiss.IndexFlatIP(item_vectors.shape[1])
    index.add(np.ascontiguousarray(item_vectors, dtype=np.float32))
    scores, positions = index.search(
        np.ascontiguousarray(user_vectors, dtype=np.float32), min(k, len(item_ids))
    )
    out = TopK()
    for user, row, score in zip(user_ids.tolist(), positions, scores, strict=True):
        out.items[int(user)] = item_ids[row[row >= 0]]
        out.scores[int(user)] = score[row >= 0].astype(np.float64)
    return out


def vectors_of(pdf: pd.DataFrame, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ids found, their vectors) for the wanted node ids, in the order of `ids`."""
    by_id = dict(zip(pdf["node_id"].tolist(), pdf["vector"].tolist(), strict=True))
    found = np.array([i for i in ids.tolist() if i in by_id], dtype=np.int64)
    matrix = (
        np.stack([np.asarray(by_id[i], np.float32) for i in found.tolist()])
        if len(found)
        else np.zeros((0, 1), np.float32)
    )
    return found, matrix


def variant_embeddings(
    spark: SparkSession, cfg: EvalConfig, ds: dt.date, model_dir: Path | str
) -> pd.DataFrame:
    """(node_id, node_type, vector) of the day's neighbourhoods under an ablation model, through the same
    pandas UDF as `hir embed` (nothing is written: the published tables belong to the full model)."""
    from jobs.embed_entities import served_content
    from udfs.embed import OUTPUT_SCHEMA, EmbedSpec, embed_partitions

    rows = read_table(spark, NEIGHBOURHOODS, cfg.history_warehouse).where(F.col("ds") == F.lit(ds))
    content_files, _ = served_content(spark, cfg.history_warehouse, model_dir)
    spec = EmbedSpec(model_dir=storage.normalise(model_dir), content_files=content_files)
    return (
        rows.mapInPandas(embed_partitions(spec), OUTPUT_SCHEMA)
        .select("node_id", "node_type", "vector")
        .toPandas()
    )


def published_embeddings(spark: SparkSession, cfg: EvalConfig, ds: dt.date):
    """(index reader, the embeddings it was built from: node_id, node_type, vector) of the full model."""
    from jobs.index.reader import open_index

    reader = open_index(cfg.history_warehouse, "item", str(ds))
    version = reader.manifest.get("source", {}).get("delta_version")
    published = (
        read_table(spark, EMBEDDINGS, cfg.history_warehouse, version)
        .where((F.col("ds") == F.lit(ds)) & (F.col("model_version") == reader.manifest["model_version"]))
        .select("node_id", F.col("entity_type").alias("node_type"), "vector")
    )
    return reader, published


def hir_rankings(data: EvalData, k: int, context: dict, reader, published: DataFrame) -> dict[str, TopK]:
    """The full model's published embeddings (published_embeddings) ranked by the same exact search as its
    ablations; the published item index is checked against it separately (context["hir_index_recall"]: its share
    of the exact catalog top k)."""
    from jobs.index.reader import NO_ID

    published = published.where(F.col("node_type").isin("user", "item")).toPandas()
    found, matrix = vectors_of(published[published["node_type"] == "user"], data.users)
    exact = embedding_rankings(found, matrix, published[published["node_type"] == "item"], data, k)
    _, node_ids, _ = reader.search(matrix, k, allowed=data.catalog_items)
    shares = [
        len(set(row[row != NO_ID].tolist()) & set(exact["catalog"].items[int(u)].tolist()))
        / max(len(exact["catalog"].items[int(u)]), 1)
        for u, row in zip(found.tolist(), node_ids, strict=True)
    ]
    context["hir_index_recall"] = (k, float(np.mean(shares)) if shares else float("nan"))
    return exact


def embedding_rankings(
    user_ids: np.ndarray, user_matrix: np.ndarray, items_pdf: pd.DataFrame, data: EvalData, k: int
) -> dict[str, TopK]:
    """Exact top k of the users' vectors over each candidate set's item vectors."""
    out = {}
    for candidates, pool in (("graph", data.graph_items), ("catalog", data.catalog_items)):
        item_ids, item_matrix = vectors_of(items_pdf, pool)
        out[candidates] = (
            exact_top_k(user_ids, user_matrix, item_ids, item_matrix, k) if len(item_ids) else TopK()
        )
    return out


def content_rankings(spark, cfg: EvalConfig, ui: DataFrame, data: EvalData, k: int) -> dict[str, TopK]:
    content = (
        read_table(spark, ENTITY_CONTENT, cfg.history_warehouse)
        .where("node_type = 'item'")
        .select("node_id", "vector")
        .toPandas()
    )
    vectors = {
        int(n): np.asarray(v, np.float32)
        for n, v in zip(content["node_id"].tolist(), content["vector"].tolist(), strict=True)
    }
    ui_pd = ui.select("user", "item", "weight").toPandas()
    profiles = bl.weighted_profiles(
        ui_pd["user"].to_numpy(), ui_pd["item"].to_numpy(), ui_pd["weight"].to_numpy(), data.users, vectors
    )
    return embedding_rankings(data.users, profiles, content, data, k)


def spark_rankings(
    spark, cfg: EvalConfig, split: Split, ui: DataFrame, data: EvalData, methods, k: int, context: dict
) -> dict[str, dict[str, TopK]]:
    """The Spark baselines, each over both candidate sets."""
    users = spark.createDataFrame(pd.DataFrame({"user": data.users}))
    pools = {
        "graph": spark.createDataFrame(pd.DataFrame({"item": data.graph_items})),
        "catalog": spark.createDataFrame(pd.DataFrame({"item": data.catalog_items})),
    }
    attributes = split.catalog.where(F.col("entity_type") == "item").select(
        bl.item_node("entity_id").alias("item"), F.col("category_id").alias("category"), F.col("brand")
    )
    out: dict[str, dict[str, TopK]] = {}
    if "popularity" in methods:
        out["popularity"] = {
            c: collect_ranking(bl.popularity(ui, users, pool, k)) for c, pool in pools.items()
        }
    if "co_visitation" in methods:
        out["co_visitation"] = {
            c: collect_ranking(bl.co_visitation(ui, users, pool, k)) for c, pool in pools.items()
        }
    if "category_popularity" in methods:
        out["category_popularity"] = {
            c: collect_ranking(bl.category_popularity(ui, users, pool, attributes, k))
            for c, pool in pools.items()
        }
    if "als" in methods:
        choice = tune_als_on_history(spark, cfg, split, pools["graph"], k)
        context["als"] = choice
        fitted = bl.als_fit(ui, choice.params)
        ranked = collect_ranking(bl.als_rank(fitted, users, pools["graph"], k))
        out["als"] = {"graph": ranked, "catalog": ranked}  # ALS cannot score an item it never saw
    return out


def tune_als_on_history(spark, cfg: EvalConfig, split: Split, graph_pool: DataFrame, k: int) -> bl.AlsChoice:
    """ALS's grid scored on a validation split of the history itself (same protocol, one step earlier)."""
    history = split.history
    if cfg.protocol == "temporal":
        last_day = history.where(F.col("ds") == F.lit(split.history_ds)).agg(F.min("event_time")).first()[0]
        inner = temporal_split(history, split.catalog, last_day.replace(tzinfo=dt.UTC))
    else:
        inner = last_conversion_split(history, split.catalog)
    train_ui = bl.interactions(inner.history).cache()
    validation = inner.targets.select(bl.user_node().alias("user"), bl.item_node().alias("item")).toPandas()
    truth: dict[int, set[int]] = {}
    for user, item in zip(validation["user"].tolist(), validation["item"].tolist(), strict=True):
        truth.setdefault(user, set()).add(item)
    val_users = spark.createDataFrame(pd.DataFrame({"user": np.array(sorted(truth), dtype=np.int64)}))

    def score(ranking: DataFrame) -> float:
        metrics = per_user_metrics(collect_ranking(ranking).items, truth, ks=(TUNE_K,))
        values = metrics.values[f"ndcg@{TUNE_K}"]
        return float(values.mean()) if len(values) else float("nan")

    if not truth:
        raise HirError("ALS tuning: the history has no validation conversions (no deep events to hold out)")
    return bl.tune_als(train_ui, val_users, graph_pool, score, k, grid=cfg.als_grid)


# -- the ranking task --------------------------------------------------------------------------------------------


@dataclass
class RankingOutcome:
    rows: list[dict]
    importance: dict[str, dict[str, float]]  # ranker -> feature group -> share of gain
    context: dict[str, object]


def ranking_task(
    spark: SparkSession,
    cfg: EvalConfig,
    split: Split,
    ui: DataFrame,
    data: EvalData,
    rankings: dict[str, dict[str, TopK]],
    ds: dt.date,
    model_version: str,
    published: DataFrame,
) -> RankingOutcome:
    """Rankers with and without HIR's features over the union of the generators' catalog top lists
    (jobs.eval.ranking); features from the history and the history pipeline's tables (jobs.eval.features).
    model_version, published: the served model and its embeddings (published_embeddings)."""
    from jobs.eval import features as fx
    from jobs.eval import ranking as rk

    generators = [g for g in fx.GENERATORS if g in rankings]
    tokens = read_table(spark, BOM_TOKENS, cfg.history_warehouse).where(
        (F.col("ds") == F.lit(ds)) & (F.col("model_version") == model_version)
    )

    def vectors_for(ids: np.ndarray) -> dict[int, np.ndarray]:
        wanted = spark.createDataFrame(pd.DataFrame({"node_id": ids}))
        pdf = published.join(wanted, "node_id", "left_semi").toPandas()
        return {
            int(n): np.asarray(v, np.float32)
            for n, v in zip(pdf["node_id"].tolist(), pdf["vector"].tolist(), strict=True)
        }

    frame, groups, attributes = fx.ranking_frame(
        spark,
        {g: (rankings[g]["catalog"].items, rankings[g]["catalog"].scores) for g in generators},
        data.users,
        data.targets,
        cfg.ranking_candidates,
        history=split.history,
        ui=ui,
        catalog=split.catalog,
        tokens=tokens,
        vectors_for=vectors_for,
    )
    folds_of = rk.user_folds(data.users.tolist(), rk.FOLDS, cfg.seed)
    runs = {
        name: rk.fit_ranker(
            frame, name, [f for g in ranker_groups for f in groups[g]], folds_of, seed=cfg.seed
        )
        for name, ranker_groups in rk.RANKERS.items()
    }
    truth_by_slice = {s: slice_targets(data, "catalog", s) for s in SLICES}
    rows = rk.ranking_rows(
        frame,
        runs,
        truth_by_slice,
        ks=cfg.ks,
        per_generator=cfg.ranking_candidates,
        samples=cfg.bootstrap,
        seed=cfg.seed,
    )
    purity = level0_purity(tokens, attributes)
    if purity is not None:
        rows.append(
            {
                "task": "ranking",
                "method": "hir_tokens",
                "candidates": "union",
                "slice": "all",
                "metric": "level0_purity",
                "k": 0,
                "value": purity[0],
                "ci_low": float("nan"),
                "ci_high": float("nan"),
                "num_users": 0,
            }
        )
    sizes = frame.groupby("user").size()
    context = {
        "generators": ", ".join(generators),
        "candidates per user (mean, max)": f"{sizes.mean():.1f}, {int(sizes.max())}",
        "candidate rows, with a target": f"{len(frame)}, {int(frame['label'].sum())}",
        "folds (users each)": f"{rk.FOLDS} ({', '.join(str(len(p.test_users)) for p in runs['base'].plans)})",
        "boosting rounds kept per fold": "; ".join(f"{n} {run.rounds}" for n, run in runs.items()),
        "features": f"{sum(len(v) for v in groups.values())} in {len(groups)} groups",
    }
    if purity is not None:
        context["level-0 token purity against categories (items)"] = f"{purity[0]:.3f} over {purity[1]} items"
    importance = {name: rk.group_importance(run, groups) for name, run in runs.items()}
    return RankingOutcome(rows, importance, context)


def level0_purity(tokens: DataFrame, attributes: DataFrame) -> tuple[float, int] | None:
    """(share of items whose category is the majority category of their level-0 token, items), or None."""
    from hir_model.quantiser import purity

    pairs = (
        tokens.where((F.col("entity_type") == "item") & (F.col("bom_level") == 0) & (F.col("rank") == 1))
        .select(F.col("node_id").alias("item"), "token")
        .join(attributes.where(F.col("category").isNotNull()), "item")
        .select("token", "category")
        .toPandas()
    )
    if pairs.empty:
        return None
    import torch

    codes = torch.as_tensor(pd.factorize(pairs["token"])[0])
    labels = torch.as_tensor(pd.factorize(pairs["category"])[0])
    return purity(codes, labels), len(pairs)


# -- the job -----------------------------------------------------------------------------------------------------


def metric_rows(rankings: dict[str, dict[str, TopK]], data: EvalData, cfg: EvalConfig) -> list[dict]:
    """Each method's metrics with bootstrap CIs per candidate set, slice and K; then HIR minus each baseline."""
    rows = []
    for candidates in CANDIDATE_SETS:
        for slice_ in SLICES:
            truth = slice_targets(data, candidates, slice_)
            if not truth:
                continue
            per_method = {}
            for method, by_pool in rankings.items():
                per_user = per_user_metrics(by_pool.get(candidates, TopK()).items, truth, ks=cfg.ks)
                per_method[method] = per_user
                for row in summarise(per_user, samples=cfg.bootstrap, seed=cfg.seed):
                    rows.append({"method": method, "candidates": candidates, "slice": slice_, **row})
            rows += [
                {"candidates": candidates, "slice": slice_, **row} for row in hir_differences(per_method, cfg)
            ]
    return rows


def hir_differences(per_method: dict[str, UserMetrics], cfg: EvalConfig) -> list[dict]:
    """`hir_recall_diff` and `hir_ndcg_diff` rows, one per other method and K: HIR's value minus the method's, with a
    paired bootstrap CI over the same users (every method is scored on one slice's users, in one order). Against a
    baseline it says whether HIR wins; against an ablation (`hir_no_bias`, ...) whether the component it removes
    earns its place."""
    hir = per_method.get("hir")
    if hir is None:
        return []
    rows = []
    for method, metrics in per_method.items():
        if method == "hir":
            continue
        for metric, name in DIFF_METRICS.items():
            for k in sorted(cfg.ks):
                key = f"{metric}@{k}"
                value, low, high = paired_bootstrap_diff(
                    hir.values[key], metrics.values[key], samples=cfg.bootstrap, seed=cfg.seed
                )
                rows.append(
                    {
                        "method": method,
                        "metric": name,
                        "k": int(k),
                        "value": value,
                        "ci_low": low,
                        "ci_high": high,
                        "num_users": len(hir.users),
                    }
                )
    return rows


def token_usage(
    spark: SparkSession, cfg: EvalConfig, ds: dt.date, codes_per_level: int
) -> dict[int, dict[str, float]]:
    """Per BoM level, over the entities' strongest token: share of the level's codes in use, normalised entropy
    of the code distribution (1 = every code equally used), and the share of entities whose path down to this
    level is shared with another entity (collisions: 1 at a coarse level, falling as levels refine)."""
    tokens = read_table(spark, BOM_TOKENS, cfg.history_warehouse).where(
        (F.col("ds") == F.lit(ds)) & (F.col("rank") == 1)
    )
    counts = (
        tokens.select("bom_level", "token", F.element_at(F.split("token", r"\."), -1).alias("code"))
        .groupBy("bom_level", "token", "code")
        .count()
        .toPandas()
    )
    usage = {}
    for level, group in counts.groupby("bom_level"):
        per_code = group.groupby("code")["count"].sum().to_numpy(float)
        share = per_code / per_code.sum()
        entropy = (
            float(-(share * np.log(share)).sum() / np.log(codes_per_level)) if codes_per_level > 1 else 0.0
        )
        shared = group.loc[group["count"] > 1, "count"].sum() / group["count"].sum()
        usage[int(level)] = {
            "codes used (share)": len(per_code) / codes_per_level,
            "normalised entropy": entropy,
            "collision rate": float(shared),
        }
    return usage


def evaluate(spark: SparkSession, cfg: EvalConfig) -> EvalReport:
    from jobs.eval.report import RankingSection, console_table, ranking_console, write_report

    started = time.perf_counter()
    log = StageLog("evaluate", {"dataset": cfg.name, "protocol": cfg.protocol})
    split = make_split(spark, cfg)
    ds = split.history_ds
    history_versions = write_history(spark, split, cfg)
    variants = [m for m in HIR_VARIANTS if m in cfg.methods]
    built = run_history_pipeline(spark, cfg, ds, variants)
    ui = bl.interactions(split.history).cache()
    data = collect_eval_data(spark, split, ui)
    if not len(data.users):
        raise HirError(f"{cfg.protocol}: no user has both history and a deep-funnel target")
    k = max(cfg.ks)
    context: dict = {}
    rankings: dict[str, dict[str, TopK]] = {}
    timings = dict(built["timings"])
    served = None  # (index reader, its embeddings): opened once, for the retrieval and the ranking task
    for name in variants:
        t0 = time.perf_counter()
        if name == "hir":
            served = published_embeddings(spark, cfg, ds)
            rankings[name] = hir_rankings(data, k, context, *served)
        else:
            pdf = variant_embeddings(spark, cfg, ds, built["models"][name].path)
            user_ids, user_matrix = vectors_of(pdf[pdf["node_type"] == "user"], data.users)
            rankings[name] = embedding_rankings(
                user_ids, user_matrix, pdf[pdf["node_type"] == "item"], data, k
            )
        timings[f"rank {name}"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    rankings.update(spark_rankings(spark, cfg, split, ui, data, cfg.methods, k, context))
    timings["rank spark baselines"] = round(time.perf_counter() - t0, 1)
    if "content_only" in cfg.methods:
        rankings["content_only"] = content_rankings(spark, cfg, ui, data, k)
    rankings = {m: rankings[m] for m in METHODS if m in rankings}

    model_version = built["models"]["hir"].version if "hir" in built["models"] else ""
    retrieval = metric_rows(rankings, data, cfg) if "retrieval" in cfg.tasks else []
    ranking = None
    if "ranking" in cfg.tasks:
        t0 = time.perf_counter()
        reader, published = served  # config_from_args: the ranking task runs with hir
        ranking = ranking_task(
            spark, cfg, split, ui, data, rankings, ds, reader.manifest["model_version"], published
        )
        timings["ranking task"] = round(time.perf_counter() - t0, 1)
    labels = {"dataset": cfg.name, "protocol": cfg.protocol, "model_version": model_version}
    retrieval_rows = [{"task": "retrieval", **row, **labels} for row in retrieval]
    ranking_rows = [{**row, **labels} for row in ranking.rows] if ranking else []
    rows = retrieval_rows + ranking_rows
    version = write_metrics(spark, cfg, ds, rows)
    targets_total = sum(len(t) for t in data.targets.values())
    new_targets = sum(len(t & data.new_items) for t in data.targets.values())
    ctx = {
        "dataset": cfg.name,
        "protocol": cfg.protocol,
        "cut-off": split.cutoff,
        "history day (ds)": str(ds),
        "users": len(data.users),
        "users without prior conversion": sum(1 for u in data.users.tolist() if u not in data.converted),
        "targets": targets_total,
        "targets on items new after the cut-off": new_targets,
        "graph items": len(data.graph_items),
        "catalog items": len(data.catalog_items),
        "HIR model": model_version,
        **{f"model {n}": r.version for n, r in built["models"].items() if n != "hir"},
        "history tables": ", ".join(f"{t} v{v}" for t, v in history_versions.items()),
        "history stages": ", ".join(f"{n} {status}" for n, status in built["stages"].items()),
    }
    if "hir_index_recall" in context:
        at, share = context["hir_index_recall"]
        ctx[f"HIR serving recall@{at} (published index vs exact, catalog)"] = f"{share:.3f}"
    if "als" in context:
        choice = context["als"]
        ctx["ALS grid (validation NDCG@50)"] = "; ".join(
            f"rank {int(p['rank'])} reg {p['regParam']} alpha {p['alpha']}: {s:.4f}" for p, s in choice.grid
        )
        ctx["ALS chosen"] = json.dumps(choice.params)
    notes = [
        "Catalog candidates are the items these logs know: each was interacted with by someone, some only after "
        "the cut-off. A real catalog also holds items nobody ever touches, so the catalog set here is richer in "
        "targets than a real one; compare methods only within a candidate set.",
        "ALS and co-visitation only score items seen in the history: on the catalog set they cannot reach new "
        "items by construction. Category-aware popularity, content-only and HIR can.",
        "CIs: percentile bootstrap over users (" + str(cfg.bootstrap) + " resamples).",
        "Stage times (s): " + ", ".join(f"{n} {s}" for n, s in timings.items()),
        *(
            f"**{n} collapsed in training** ({r.collapse_detail}): its rows measure a collapsed model."
            for n, r in built["models"].items()
            if r.collapsed
        ),
    ]
    folder = cfg.report_dir or storage.join(cfg.warehouse, "reports", cfg.protocol, str(ds))
    path = write_report(
        folder,
        retrieval_rows,
        title=f"HIR deep-funnel evaluation: {cfg.name} ({cfg.protocol})",
        context=ctx,
        notes=notes,
        ranking=(RankingSection(ranking_rows, ranking.importance, ranking.context) if ranking else None),
        token_usage=token_usage(
            spark, cfg, ds, int(built["models"]["hir"].summary["quantiser"]["codes_per_level"])
        )
        if "hir" in rankings
        else None,
    )
    if retrieval_rows:
        print(console_table(retrieval_rows, k=50))
    if ranking_rows:
        print(ranking_console(ranking_rows))
    report = EvalReport(
        cfg.name,
        cfg.protocol,
        ds,
        model_version,
        rows,
        ctx,
        path,
        time.perf_counter() - started,
        version,
        history_stages=built["stages"],
        models={n: r.version for n, r in built["models"].items()},
    )
    log.counts.update(
        users=len(data.users), targets=targets_total, rows_out=len(rows), eval_metrics_version=version
    )
    log.emit()
    return report


def write_metrics(spark: SparkSession, cfg: EvalConfig, ds: dt.date, rows: list[dict]) -> int:
    """Replace this dataset's and protocol's rows of the day in `eval_metrics`, of the tasks that ran (a row
    without a task predates tasks and is a retrieval row)."""
    pdf = pd.DataFrame(rows, columns=[c for c in EVAL_METRICS.columns if c != "ds"])
    pdf["k"] = pdf["k"].astype("int32")
    pdf["num_users"] = pdf["num_users"].astype("int64")
    frame = spark.createDataFrame(pdf, StructType([f for f in EVAL_METRICS.schema.fields if f.name != "ds"]))
    frame = frame.withColumn("ds", F.lit(ds))
    task = f"({sql_in('task', list(cfg.tasks))}{' OR task IS NULL' if 'retrieval' in cfg.tasks else ''})"
    where = f"ds = DATE'{ds}' AND dataset = '{cfg.name}' AND protocol = '{cfg.protocol}' AND {task}"
    return write_table(frame, EVAL_METRICS, cfg.warehouse, where)


def main(argv: Sequence[str] | None = None) -> int:
    cfg = config_from_args(argv)
    report = evaluate(get_spark("hir-evaluate", places={"--warehouse": cfg.warehouse}), cfg)
    print(report.line())
    return 0


if __name__ == "__main__":
    sys.exit(run_job(main))
