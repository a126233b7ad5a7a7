"""Rows per second of the Spark embedding UDF against a plain PyTorch loop over the same rows, side by side.

    .venv/bin/python bench/embed_throughput.py                   # 20k rows, Arrow batch sizes 256..8192
    .venv/bin/python bench/embed_throughput.py --rows 100000 --device cuda

The model is the default HIR encoder with random weights (throughput does not depend on training) and a small
quantiser; rows are random neighbourhood trees of the sampler's default shape (64 tokens). The plain loop runs
`udfs.embed.embed_frame` on one pandas frame in the same process; the UDF path runs the same function through
`mapInPandas` on local Spark, including Arrow transfer and Python worker start-up. Target: UDF >= 0.8 x plain.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hir_model.batch import batch_from_columns  # noqa: E402
from hir_model.config import ModelConfig, TrainConfig  # noqa: E402
from hir_model.quantiser import ResidualQuantiser  # noqa: E402
from hir_model.trainer import Trainer  # noqa: E402
from udfs.embed import OUTPUT_SCHEMA, TOKEN_COLUMNS, EmbedSpec, choose_device, embed_frame, embed_partitions  # noqa: E402


def random_rows(n: int, max_tokens: int, seed: int) -> pd.DataFrame:
    """Random trees: 6-20 hop-1 tokens under the target, up to 2 hop-2 tokens under each, then padding."""
    rng = np.random.default_rng(seed)
    cols: dict[str, list] = {c: [] for c in TOKEN_COLUMNS}
    for _ in range(n):
        hop1 = int(rng.integers(6, 21))
        parents = [-1] + [0] * hop1
        hops = [0] + [1] * hop1
        for p in range(1, hop1 + 1):
            for _ in range(int(rng.integers(0, 3))):
                if len(parents) < max_tokens:
                    parents.append(p)
                    hops.append(2)
        real = len(parents)
        pad = max_tokens - real
        cols["num_tokens"].append(real)
        cols["token_node_id"].append(
            np.concatenate([rng.integers(1, 1 << 40, real), np.zeros(pad, np.int64)])
        )
        cols["token_node_type"].append(np.array([1] + [2] * (real - 1) + [0] * pad, np.int32))
        cols["token_edge_type"].append(np.array([1] + [2] * (real - 1) + [0] * pad, np.int32))
        cols["token_hop"].append(np.array(hops + [0] * pad, np.int32))
        cols["token_parent_pos"].append(np.array(parents + [-1] * pad, np.int32))
        cols["token_recency"].append(
            np.concatenate([rng.integers(0, 16, real), np.zeros(pad, np.int64)]).astype(np.int32)
        )
        cols["token_weight"].append(np.concatenate([rng.random(real), np.zeros(pad)]).astype(np.float32))
        cols["token_is_deep"].append(np.zeros(max_tokens, bool))
    pdf = pd.DataFrame(cols)
    pdf.insert(0, "node_id", np.arange(1, n + 1, dtype=np.int64))
    pdf.insert(1, "node_type", "user")
    pdf.insert(2, "raw_id", [f"u{i}" for i in range(1, n + 1)])
    return pdf


def make_model(root: Path, device: str) -> Path:
    cfg = ModelConfig(content_dim=0)
    trainer = Trainer(cfg, TrainConfig(seed=0), device=device)
    sample = random_rows(512, cfg.max_tokens, seed=1)
    emb = trainer.embed(batch_from_columns({c: sample[c].to_numpy() for c in TOKEN_COLUMNS}))
    quantiser = ResidualQuantiser(levels=3, codes_per_level=16, seed=0).fit(emb.cpu())
    return trainer.save(root / "bench-model", quantiser=quantiser)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--arrow-batch-sizes", default="256,1024,4096,8192")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from jobs.common.spark import get_spark

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_model(Path(tmp), args.device)
        pdf = random_rows(args.rows, 64, seed=2)
        spec = EmbedSpec(model_dir=str(model_dir), batch_size=args.batch_size, device=args.device)

        from udfs.embed import load_for_worker

        device = choose_device(args.device)
        model, content = load_for_worker(spec.model_dir, (), str(device))
        embed_frame(pdf.iloc[:64], model, content, device, spec)  # warm-up
        started = time.perf_counter()
        for start in range(0, len(pdf), args.batch_size):
            embed_frame(pdf.iloc[start : start + args.batch_size], model, content, device, spec)
        plain = len(pdf) / (time.perf_counter() - started)

        spark = get_spark("bench-embed", shuffle_partitions=2, ui=False)
        frame = spark.createDataFrame(pdf).repartition(spark.sparkContext.defaultParallelism).cache()
        frame.count()
        print(f"rows {args.rows}, device {device}, torch threads {torch.get_num_threads()}")
        print(f"{'path':<28}{'rows/s':>10}{'ratio':>8}")
        print(f"{'plain torch loop':<28}{plain:>10.0f}{1.0:>8.2f}")
        for size in (int(s) for s in args.arrow_batch_sizes.split(",")):
            spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(size))
            out = frame.mapInPandas(embed_partitions(spec), OUTPUT_SCHEMA)
            out.write.format("noop").mode("overwrite").save()  # warm the Python workers' model cache
            started = time.perf_counter()
            out.write.format("noop").mode("overwrite").save()
            rate = len(pdf) / (time.perf_counter() - started)
            print(f"{'spark udf, arrow ' + str(size):<28}{rate:>10.0f}{rate / plain:>8.2f}")


if __name__ == "__main__":
    main()
