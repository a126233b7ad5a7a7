"""Embed stage: the UDF equals the model run directly, one embedding and full bag per entity, vocab, rerun."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from pyspark.sql import functions as F

from hir_model.batch import batch_from_columns
from hir_model.checkpoint import load_model
from hir_model.config import ModelConfig, TrainConfig
from hir_model.pairs import RetrievalBatch
from hir_model.quantiser import ResidualQuantiser
from hir_model.trainer import Trainer
from jobs.common.delta import read_table, write_table
from jobs.common.errors import HirError
from jobs.embed_entities import EmbedConfig, check_not_collapsed, config_from_args, embed, resolve_model_dir
from schemas.codes import EDGE_TYPES, NODE_TYPES
from schemas.tables import BOM_TOKENS, BOM_VOCAB, EMBEDDINGS, ENTITIES, NEIGHBOURHOODS, NODES
from udfs.embed import TOKEN_COLUMNS

DS = dt.date(2026, 1, 7)
L = 8  # max tokens of the tiny sampler
LEVELS, CODES, TOP_N = 2, 4, 2


def neighbourhood(node_id: int, node_type: str, items: list[int], cats: list[int]) -> dict:
    """Target, hop-1 neighbours (items of a user / users of an item), one hop-2 category under the first."""
    tok = [(node_id, NODE_TYPES[node_type], EDGE_TYPES["self"], 0, -1, 0, 0.0, False)]
    edge = "user_view_item" if node_type == "user" else "item_viewed_by_user"
    kind = NODE_TYPES["item" if node_type == "user" else "user"]
    for i in items:
        tok.append((i, kind, EDGE_TYPES[edge], 1, 0, 1, 1.0, False))
    for c in cats:
        tok.append((c, NODE_TYPES["category"], EDGE_TYPES["item_in_category"], 2, 1, 0, 1.0, False))
    n = len(tok)
    tok += [(0, 0, 0, 0, -1, 0, 0.0, False)] * (L - n)
    names = ("node_id", "node_type", "edge_type", "hop", "parent_pos", "recency", "weight", "is_deep")
    row = {f"token_{name}": list(col) for name, col in zip(names, zip(*tok, strict=True), strict=True)}
    row.update(
        node_id=node_id,
        node_type=node_type,
        raw_id=f"{node_type}{node_id}",
        source="synthetic",
        num_tokens=n,
        num_hop1=len(items),
        sample_seed=0,
        ds=DS,
    )
    return row


def rows() -> list[dict]:
    out = []
    for u in range(1, 25):
        cluster = u % 3
        items = [100 + cluster * 10 + k for k in range(3)]
        out.append(neighbourhood(u, "user", items, [900 + cluster]))
    for i in range(100, 130):
        out.append(neighbourhood(i, "item", [1 + (i % 7)], [900 + (i - 100) // 10]))
    return out


@pytest.fixture(scope="module")
def day(spark, tmp_path_factory):
    warehouse = tmp_path_factory.mktemp("embed") / "warehouse"
    frame = spark.createDataFrame(
        [tuple(r[c] for c in NEIGHBOURHOODS.columns) for r in rows()], NEIGHBOURHOODS.schema
    )
    write_table(frame, NEIGHBOURHOODS, warehouse, None)
    nodes = [(i, "synthetic", "item", f"item{i}", 1, DS) for i in range(100, 130)]
    write_table(spark.createDataFrame(nodes, NODES.schema), NODES, warehouse, None)
    entities = [
        (
            "synthetic",
            "item",
            f"item{i}",
            str(900 + (i - 100) // 10),
            f"topic.sub{(i - 100) // 10}",
            "acme",
            9.0,
            None,
            dt.datetime(2026, 1, 6),
            DS,
        )
        for i in range(100, 130)
    ]
    write_table(spark.createDataFrame(entities, ENTITIES.schema), ENTITIES, warehouse, None)
    # A tiny trained model: a few steps are enough, this test is about plumbing, not quality.
    cfg = ModelConfig(
        id_buckets=1024,
        dim=16,
        heads=2,
        layers=1,
        max_tokens=L,
        content_dim=0,
        num_prototypes=8,
        head_hidden=32,
        head_bottleneck=8,
    )
    trainer = Trainer(cfg, TrainConfig(batch_size=8, seed=1), device="cpu")
    pdf = frame.toPandas()
    batch = batch_from_columns({c: pdf[c].to_numpy() for c in TOKEN_COLUMNS})
    trainer.train_step(  # one step, so the weights are not the initial ones
        RetrievalBatch(
            users=batch.select(torch.arange(8)),
            items=batch.select(torch.arange(8, 16)),
            negatives=batch.select(torch.arange(16, 20)),
            positive_log_q=torch.zeros(8),
            negative_log_q=torch.zeros(4),
            in_batch_mask=torch.zeros(8, 8, dtype=torch.bool),
            negative_mask=torch.zeros(8, 4, dtype=torch.bool),
            weights=torch.ones(8),
        )
    )
    quantiser = ResidualQuantiser(levels=LEVELS, codes_per_level=CODES, seed=0).fit(trainer.embed(batch))
    model_dir = trainer.save(warehouse / "models" / "v1", quantiser=quantiser)
    report = embed(spark, EmbedConfig(ds=DS, warehouse=str(warehouse), top_n=TOP_N, batch_size=16))
    return warehouse, model_dir, pdf, report


def test_udf_equals_the_model_run_directly(spark, day):
    warehouse, model_dir, pdf, _ = day
    model = load_model(model_dir)
    with torch.inference_mode():
        direct = model.encoder(batch_from_columns({c: pdf[c].to_numpy() for c in TOKEN_COLUMNS})).numpy()
    got = {
        r["node_id"]: np.array(r["vector"], np.float32)
        for r in read_table(spark, EMBEDDINGS, warehouse).collect()
    }
    table = np.stack([got[n] for n in pdf["node_id"]])
    # fp32 on both sides; only the batch split differs (16 vs all rows), which changes reduction order.
    np.testing.assert_allclose(table, direct, atol=1e-5)
    assert np.allclose(np.linalg.norm(table, axis=1), 1.0, atol=1e-5)


def test_every_entity_has_one_embedding_and_a_full_normalised_bag(spark, day):
    warehouse, _, pdf, report = day
    emb = read_table(spark, EMBEDDINGS, warehouse)
    assert report.entities == len(pdf) == emb.count() == emb.select("node_id").distinct().count()
    tokens = read_table(spark, BOM_TOKENS, warehouse)
    per_entity = tokens.groupBy("node_id").count().select("count").distinct().collect()
    assert [r[0] for r in per_entity] == [LEVELS * TOP_N]
    sums = tokens.groupBy("node_id", "bom_level").agg(F.sum("weight").alias("s")).collect()
    assert all(abs(r["s"] - 1.0) < 1e-5 for r in sums)
    # the rank-1 tokens spell the entity's exact path
    top = tokens.where("rank = 1").groupBy("node_id", "path").agg(F.max("token").alias("deepest")).collect()
    assert all(r["deepest"] == f"L{LEVELS - 1}:{r['path']}" for r in top)


def test_vocab_has_parents_sizes_and_readable_labels(spark, day):
    warehouse = day[0]
    vocab = {r["token"]: r for r in read_table(spark, BOM_VOCAB, warehouse).collect()}
    tokens = read_table(spark, BOM_TOKENS, warehouse)
    assert set(vocab) == {r[0] for r in tokens.select("token").distinct().collect()}
    for token, row in vocab.items():
        if row["bom_level"] > 0:
            assert row["parent_token"] in vocab, token
    level0 = [r for r in vocab.values() if r["bom_level"] == 0]
    assert sum(r["size"] for r in level0) == len(rows())  # every entity sits under exactly one level-0 token
    labelled = [r["label"] for r in vocab.values() if r["size"] > 0]
    assert any("sub" in label or "brand acme" in label for label in labelled)


def test_rerun_replaces_the_day(spark, day):
    warehouse = day[0]
    before = read_table(spark, BOM_TOKENS, warehouse).count()
    embed(spark, EmbedConfig(ds=DS, warehouse=str(warehouse), top_n=TOP_N, batch_size=16))
    assert read_table(spark, EMBEDDINGS, warehouse).count() == len(rows())
    assert read_table(spark, BOM_TOKENS, warehouse).count() == before


def test_bad_flags_and_missing_model(tmp_path):
    with pytest.raises(HirError, match="must be positive"):
        config_from_args(["--ds", "2026-01-07", "--top-n", "0"])
    with pytest.raises(HirError, match="must be positive"):
        config_from_args(["--ds", "2026-01-07", "--temperature", "0"])
    assert config_from_args(["--ds", "2026-01-07", "--temperature", "auto"]).temperature is None
    with pytest.raises(HirError, match="no trained model under"):
        resolve_model_dir(str(tmp_path), None)
    with pytest.raises(HirError, match="has no weights.pt"):
        resolve_model_dir(str(tmp_path), str(tmp_path))


def test_collapsed_model_is_refused(day, tmp_path):
    import shutil

    model_dir = tmp_path / "collapsed"
    shutil.copytree(day[1], model_dir)
    with open(model_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"summary": True, "collapsed": True}) + "\n")
    with pytest.raises(HirError, match="collapsed in training"):
        check_not_collapsed(model_dir, allow=False)
    check_not_collapsed(model_dir, allow=True)
    check_not_collapsed(day[1], allow=False)
    # The flag reaches the config (it used to be parsed and dropped).
    from jobs.embed_entities import config_from_args

    assert config_from_args(["--ds", "2026-01-07", "--allow-collapsed"]).allow_collapsed is True
    assert config_from_args(["--ds", "2026-01-07"]).allow_collapsed is False


def _model_like(day, folder: Path, **changes) -> Path:
    """A copy of the fixture's model directory whose config.json says `changes` (weights are never reached)."""
    import shutil

    shutil.copytree(day[1], folder)
    config = json.loads((folder / "config.json").read_text())
    config["model"].update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_rows_longer_than_the_model_and_missing_content_are_refused_before_spark_runs_it(
    spark, day, tmp_path
):
    warehouse = day[0]
    short = _model_like(day, tmp_path / "short", max_tokens=L - 1)
    with pytest.raises(HirError, match=f"rows hold {L} tokens, model short takes at most {L - 1}"):
        embed(spark, EmbedConfig(ds=DS, warehouse=str(warehouse), model=str(short)))
    with_content = _model_like(day, tmp_path / "content", content_dim=4, use_content=True)
    with pytest.raises(HirError, match="trained with content vectors but .* has no entity_content"):
        embed(spark, EmbedConfig(ds=DS, warehouse=str(warehouse), model=str(with_content)))


def test_next_day_keeps_yesterdays_paths_within_the_stickiness_margin(spark, day, tmp_path):
    """Day 2 is embedded by a model whose quantiser renamed every code (j -> j + 1 mod K) and says its ids were
    aligned to day 1's tokens. With no hysteresis every path follows the renaming; with a margin no distance
    exceeds, every entity keeps day 1's path, read from day 1's bom_tokens through the join the job adds."""
    import shutil

    from hir_model.checkpoint import QUANTISER_FILE, load_quantiser

    warehouse = tmp_path / "warehouse"
    shutil.copytree(day[0], warehouse)
    next_day = DS + dt.timedelta(days=1)
    frame = spark.createDataFrame(
        [tuple(next_day if c == "ds" else r[c] for c in NEIGHBOURHOODS.columns) for r in rows()],
        NEIGHBOURHOODS.schema,
    )
    write_table(frame, NEIGHBOURHOODS, warehouse, f"ds = DATE'{next_day}'")
    model = warehouse / "models" / "v2"
    shutil.copytree(day[1], model)
    load_quantiser(day[1]).permuted([(torch.arange(CODES) + 1) % CODES] * LEVELS).save(model / QUANTISER_FILE)
    with open(model / "metrics.jsonl", "a") as f:
        summary = {"summary": True, "quantiser": {"alignment": {"previous": f"{DS}/v1"}}}
        f.write(json.dumps(summary) + "\n")

    def paths(ds):
        tokens = read_table(spark, BOM_TOKENS, warehouse).where(
            (F.col("ds") == F.lit(ds)) & (F.col("rank") == 1)
        )
        return {r["node_id"]: [int(c) for c in r["path"].split(".")] for r in tokens.collect()}

    yesterday = paths(DS)
    assert len(yesterday) == len(rows())
    for stickiness, expected in ((0.0, lambda p: [(c + 1) % CODES for c in p]), (1e9, lambda p: p)):
        cfg = EmbedConfig(
            ds=next_day,
            warehouse=str(warehouse),
            model=str(model),
            top_n=TOP_N,
            batch_size=16,
            stickiness=stickiness,
        )
        embed(spark, cfg)
        assert paths(next_day) == {node: expected(path) for node, path in yesterday.items()}, stickiness
    with pytest.raises(HirError, match="--stickiness must be 0 or more"):
        config_from_args(["--ds", "2026-01-07", "--stickiness", "-1"])
