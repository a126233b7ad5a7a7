"""The index `hir build-index` chooses vs an exact flat index, side by side: build time, QPS, recall@10.

    .venv/bin/python bench/index.py                              # 100k and 1M vectors, dim 128, CPU
    .venv/bin/python bench/index.py --sizes 100000 --queries 500 # quicker
    .venv/bin/python bench/index.py --device gpu                 # GPU faiss: training, exact search, GPU QPS

For each size the script generates L2-normalised vectors with planted hierarchical interests (parent clusters,
child clusters inside them, isotropic noise: the shape of HIR embeddings), and held-out queries from the same
generator (users are not items: no query is in the index). It then

* builds the exact IndexFlatIP and times one batched search of all queries: the baseline QPS and the truth;
* builds the index `choose_factory(n, d, --memory-budget)` picks, exactly as the job does
  (jobs.index.build.build_in_memory: deterministic training sample, batched adds with int64 ids), timed;
* tunes nprobe/efSearch up the job's ladder until recall@10 vs the flat truth reaches --recall-target, and
  times batched searches at that setting (best of 3) and single-query latency.

The speedup column is the chosen index's QPS over the flat index's QPS measured in the same run with the same
threads, so it survives a noisy shared machine better than either number. Target at 1M: recall@10 >= 0.95 at
>= 10x the flat QPS. With --device gpu, k-means and the flat truth run on the GPU and both indexes are also
searched on the GPU (index_cpu_to_all_gpus; HNSW has no GPU form and shows n/a).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import faiss  # noqa: E402
import numpy as np  # noqa: E402

from jobs.index import build  # noqa: E402
from jobs.index.choose import choose_factory, format_bytes, parse_bytes  # noqa: E402

SIZES = (100_000, 1_000_000)


def planted_vectors(n: int, dim: int, *, parents: int, children: int, noise: float, seed: int) -> np.ndarray:
    """Vectors around child centres, which sit around parent centres; L2-normalised, float32.

    Centres come from a fixed seed, so items and queries (different `seed`) share the same interests.
    """
    centres_rng = np.random.default_rng(12345)
    parent_centres = centres_rng.standard_normal((parents, dim)).astype(np.float32)
    child_centres = np.repeat(parent_centres, children, axis=0) + 0.6 * centres_rng.standard_normal(
        (parents * children, dim)
    ).astype(np.float32)
    rng = np.random.default_rng(seed)
    out = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, 100_000):  # chunks keep the temporaries small at 1M x 128
        size = min(100_000, n - start)
        which = rng.integers(0, parents * children, size)
        chunk = child_centres[which] + noise * rng.standard_normal((size, dim)).astype(np.float32)
        out[start : start + size] = chunk / np.linalg.norm(chunk, axis=1, keepdims=True)
    return out


def timed_search(index: faiss.Index, queries: np.ndarray, k: int, repeats: int) -> tuple[float, np.ndarray]:
    """(best QPS over `repeats` batched searches, ids of the last)."""
    best, ids = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        _, ids = index.search(queries, k)
        best = min(best, time.perf_counter() - start)
    return len(queries) / best, ids


def gpu_qps(index: faiss.Index, queries: np.ndarray, params: dict, k: int) -> float | None:
    """QPS of the same index copied to all GPUs, or None when it has no GPU form."""
    try:
        gpu_index = faiss.index_cpu_to_all_gpus(index)
    except (RuntimeError, AttributeError):
        return None
    if params:
        faiss.GpuParameterSpace().set_index_parameters(
            gpu_index, ",".join(f"{a}={b}" for a, b in params.items())
        )
    return timed_search(gpu_index, queries, k, 3)[0]


def run_size(n: int, args: argparse.Namespace, device: str) -> dict:
    k = build.RECALL_K
    shape = {"parents": args.parents, "children": args.children, "noise": args.noise}
    vectors = planted_vectors(n, args.dim, **shape, seed=1)
    queries = planted_vectors(args.queries, args.dim, **shape, seed=2)
    node_ids = np.arange(n, dtype=np.int64) * 7919 - n  # signed, distinct, like hashed node ids
    sample_key = (node_ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)).astype(np.int64)

    start = time.perf_counter()
    flat = faiss.IndexFlatIP(args.dim)
    flat.add(vectors)
    flat_build = time.perf_counter() - start
    start = time.perf_counter()
    flat_qps, exact_pos = timed_search(flat, queries, k, 1)
    if time.perf_counter() - start < 10:  # a second pass where cheap: the first one warms caches and threads
        flat_qps = max(flat_qps, timed_search(flat, queries, k, 1)[0])
    exact_ids = node_ids[exact_pos]

    choice = choose_factory(n, args.dim, args.memory_budget)
    factory = args.index_factory or choice.factory
    built = build.build_in_memory(factory, vectors, node_ids, sample_key, device=device)
    tuning = build.tune(built.index, queries, exact_ids, args.recall_target)
    build.set_search_params(built.index, tuning.params)
    qps, found = timed_search(built.index, queries, k, 3)
    speed = build.measure_speed(built.index, queries, k, repeats=1, single=200)
    row = {
        "n": n,
        "dim": args.dim,
        "factory": factory,
        "estimated_bytes": choice.estimated_bytes if not args.index_factory else None,
        "train_size": built.train_size,
        "build_s": round(built.seconds, 1),
        "flat_build_s": round(flat_build, 1),
        "params": tuning.params,
        "recall_at_10": round(build.recall_at_k(found, exact_ids, k), 4),
        "reached": tuning.reached,
        "qps": round(qps, 1),
        "flat_qps": round(flat_qps, 1),
        "speedup": round(qps / flat_qps, 1),
        "latency_ms_p50": round(speed.latency_ms_p50, 3),
        "tuning": tuning.trace,
        "device": device,
    }
    if device == "gpu":
        gpu_flat = gpu_qps(flat, queries, {}, k)
        gpu_index = gpu_qps(built.index, queries, tuning.params, k)
        row.update(gpu_flat_qps=gpu_flat, gpu_qps=gpu_index)
        row["gpu_speedup"] = round(gpu_index / gpu_flat, 1) if gpu_flat and gpu_index else None
    return row


def table(rows: list[dict]) -> str:
    head = (
        "| n | index | build s | search params | recall@10 | QPS | flat QPS | speedup | p50 ms |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        params = ",".join(f"{a}={b}" for a, b in r["params"].items()) or "exact"
        lines.append(
            f"| {r['n']:,} | {r['factory']} | {r['build_s']} | {params} | {r['recall_at_10']:.3f} | "
            f"{r['qps']:,.0f} | {r['flat_qps']:,.0f} | {r['speedup']}x | {r['latency_ms_p50']} |"
        )
        if r.get("gpu_speedup") is not None or r["device"] == "gpu":
            lines.append(
                f"|  | on GPU | | | | {r.get('gpu_qps')} | {r.get('gpu_flat_qps')} | {r.get('gpu_speedup')}x | |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="Vector counts to run.")
    p.add_argument("--dim", type=int, default=128, help="Embedding dimension (HIR's default width).")
    p.add_argument("--queries", type=int, default=1000, help="Held-out queries (the job's default).")
    p.add_argument("--parents", type=int, default=100, help="Planted parent interests.")
    p.add_argument(
        "--children", type=int, default=100, help="Child interests per parent (10k leaf interests)."
    )
    p.add_argument(
        "--noise",
        type=float,
        default=1.0,
        help="Per-dimension noise around a child centre (child offsets are 0.6, parents 1.0). At 1.0 IVF with "
        "one list per leaf interest needs nprobe ~8 for 0.95: hard enough not to flatter the index.",
    )
    p.add_argument("--memory-budget", type=parse_bytes, default=4 * 2**30, help="As the job's flag.")
    p.add_argument("--recall-target", type=float, default=0.95, help="As the job's flag.")
    p.add_argument("--index-factory", help="Override the chosen index (as the job's flag).")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="cpu", help="faiss device.")
    p.add_argument("--threads", type=int, default=0, help="faiss OpenMP threads (0: all cores).")
    p.add_argument("--json", help="Also write the rows to this JSON file.")
    args = p.parse_args(argv)

    device = build.resolve_device(args.device)
    if args.threads:
        faiss.omp_set_num_threads(args.threads)
    print(
        f"faiss {faiss.__version__}, {faiss.omp_get_max_threads()} threads, device {device} "
        f"(GPUs visible to faiss: {build.gpu_count()}), budget {format_bytes(args.memory_budget)}",
        flush=True,
    )
    rows = []
    for n in args.sizes:
        start = time.perf_counter()
        row = run_size(n, args, device)
        rows.append(row)
        print(json.dumps({**row, "wall_s": round(time.perf_counter() - start, 1)}), flush=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
