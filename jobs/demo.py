"""The `make demo` driver: every stage that exists, on the synthetic source and on the real datasets.

    python -m jobs.demo            # WAREHOUSE (default ./warehouse) and HIR_SHARED_DATA (../shared/data)

Each dataset gets its own warehouse under ./warehouse/<dataset>/. Real datasets are skipped with a note when
their folder is absent.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import time
from pathlib import Path

from jobs.build_graph import GraphConfig, build_graph, format_counts
from jobs.common.args import run_job
from jobs.common.spark import get_spark
from jobs.ingest_events import IngestConfig, ingest
from jobs.sample_neighbourhoods import SampleConfig, sample_day
from jobs.sources.synthetic import SyntheticSpec


def datasets(shared: Path) -> list[tuple[str, IngestConfig | None, str]]:
    """(name, ingest config or None when absent, note)."""
    taobao = shared / "taobao_userbehavior" / "UserBehavior_user_complete.csv"
    rees46 = shared / "rees46_oct2019" / "2019-Oct_head.csv"
    return [
        (
            "synthetic",
            IngestConfig(source="synthetic", synthetic=SyntheticSpec(users=2000, items=5000, events=200_000)),
            "2k users, 5k items, ~200k events with planted interests",
        ),
        (
            "taobao",
            IngestConfig(source="taobao", inputs=(str(taobao),)) if taobao.exists() else None,
            str(taobao),
        ),
        (
            "rees46",
            IngestConfig(source="rees46", inputs=(str(rees46),)) if rees46.exists() else None,
            str(rees46),
        ),
    ]


def graph_and_samples(spark, name: str, warehouse: str, ds: dt.date) -> bool:
    """build-graph then sample-neighbourhoods for the dataset's last day; print counts per node and edge type."""
    started = time.perf_counter()
    graph = build_graph(spark, GraphConfig(ds=ds, warehouse=warehouse))
    print(f"[{name}] graph   {graph.line()}  ({time.perf_counter() - started:.1f}s)")
    print(f"[{name}]   nodes: {format_counts(graph.nodes)}")
    print(f"[{name}]   edges: {format_counts(graph.edges)}")
    started = time.perf_counter()
    samples = sample_day(spark, SampleConfig(ds=ds, warehouse=warehouse))
    for node_type, s in sorted(samples.items()):
        print(
            f"[{name}] sample  {node_type}: {s['rows']} rows, {s['mean_tokens']} tokens on average, "
            f"{s['with_deep']} with a deep-funnel token  ({time.perf_counter() - started:.1f}s)"
        )
    return graph.reconciles


def model_stages(spark, name: str, warehouse: str, ds: dt.date, epochs: int) -> bool:
    """enrich -> train -> embed -> build-index -> one query: the rest of the day's pipeline."""
    from jobs.build_index import build_index
    from jobs.build_index import config_from_args as index_args
    from jobs.embed_entities import EmbedConfig, embed
    from jobs.enrich_entities import EnrichConfig, enrich
    from jobs.index.reader import open_index
    from jobs.query_index import top_k, user_vector
    from jobs.train_encoder import config_from_args as train_args
    from jobs.train_encoder import resolve_inputs, train

    started = time.perf_counter()
    content = enrich(spark, EnrichConfig(ds=ds, warehouse=warehouse))
    print(
        f"[{name}] enrich  {content.nodes} nodes, {content.embedded} embedded  ({time.perf_counter() - started:.1f}s)"
    )
    started = time.perf_counter()
    # Small model settings so the demo trains in minutes on 2 cores; the defaults are for real runs.
    cfg = train_args(
        ["--ds", str(ds), "--warehouse", warehouse, "--epochs", str(epochs), "--batch-size", "128", "--dim", "32",
         "--heads", "2", "--prototypes", "64", "--id-buckets", "65536", "--lr", "2e-3", "--no-progress"]
    )  # fmt: skip
    report = train(cfg, resolve_inputs(spark, cfg))
    print(f"[{name}] train   {report.line()}  ({time.perf_counter() - started:.1f}s)")
    if report.collapsed:
        return False
    started = time.perf_counter()
    embedded = embed(spark, EmbedConfig(ds=ds, warehouse=warehouse))
    print(f"[{name}] embed   {embedded.entities} entities  ({time.perf_counter() - started:.1f}s)")
    started = time.perf_counter()
    index = build_index(spark, index_args(["--ds", str(ds), "--warehouse", warehouse]))
    print(f"[{name}] index   {index.line()}  ({time.perf_counter() - started:.1f}s)")
    user = (
        spark.read.format("delta").load(f"{warehouse}/embeddings")
        .where(f"ds = DATE'{ds}' AND entity_type = 'user'").orderBy("raw_id").select("raw_id").first()
    )  # fmt: skip
    if user is not None:
        reader = open_index(warehouse, "item")
        hits = top_k(reader, user_vector(spark, warehouse, user[0], reader.manifest), 5)
        print(
            f"[{name}] query   user {user[0]} -> "
            + ", ".join(f"{h['raw_id']} ({h['score']:.2f})" for h in hits)
        )
    return True


def main(argv=None) -> int:
    root = Path(os.environ.get("WAREHOUSE", "warehouse"))
    shared = Path(os.environ.get("HIR_SHARED_DATA", "../shared/data"))
    spark = get_spark("hir-demo")
    summary = []
    graphs = []
    for name, cfg, note in datasets(shared):
        if cfg is None:
            print(f"[{name}] skipped: {note} not found")
            continue
        started = time.perf_counter()
        cfg = IngestConfig(**{**cfg.__dict__, "warehouse": str(root / name)})
        report = ingest(spark, cfg)
        print(f"[{name}] ingest  {report.line()}  ({time.perf_counter() - started:.1f}s)")
        summary.append((name, report))
        ds = dt.date.fromisoformat(report.days[-1])
        ok = graph_and_samples(spark, name, cfg.warehouse, ds)
        ok = model_stages(spark, name, cfg.warehouse, ds, epochs=5 if name == "synthetic" else 3) and ok
        graphs.append((name, ok))
    print("\nsummary")
    for name, report in summary:
        print(
            f"  {name:<10} events {report.events:>8}  rejects {report.rejects:>4}  duplicates {report.duplicates:>5}"
            f"  days {len(report.days):>3}  -> {root / name}"
        )
    return 0 if all(r.reconciles for _, r in summary) and all(graphs_ok for _, graphs_ok in graphs) else 1


if __name__ == "__main__":
    sys.exit(run_job(main))
