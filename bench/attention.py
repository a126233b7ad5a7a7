"""Flex vs SDPA (dense additive mask) for one HierarchicalAttention layer: time and peak memory by tree length.

    .venv/bin/python bench/attention.py                      # CPU, lengths 64..1024, forward only
    .venv/bin/python bench/attention.py --backward           # + backward (SDPA only on CPU: flex has none there)
    .venv/bin/python bench/attention.py --device cuda        # compiled flex vs SDPA, torch.cuda.max_memory_allocated

One measured call = build the layout (flex: block mask; SDPA: dense (B, L, L) visibility) + the attention forward
(+ backward), on random trees with padding (hir_model.synthetic.random_tree_batch). Both backends compute the same
thing (tests/hir_model/test_attention.py checks it); the ratio column is flex / sdpa measured in the same run.

CPU peak memory: each (backend, length) runs in a fresh subprocess, and the figure is the process's peak RSS
(getrusage) minus its RSS just before the first call, so it covers the masks, scores and outputs of the call.
On CPU, flex runs eager, which materialises the scores: expect no memory gain there. The memory win is the fused
kernel that torch.compile builds on CUDA.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

LENGTHS = (64, 128, 256, 512, 1024)


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def measure(backend: str, length: int, args: argparse.Namespace) -> dict[str, float]:
    """Median ms per call and peak memory (MB) for one backend and tree length, in this process."""
    import torch

    from hir_model.attention import HierarchicalAttention, build_layout
    from hir_model.synthetic import random_tree_batch
    from schemas.codes import NUM_EDGE_TYPES

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    batch = random_tree_batch(args.batch, length, seed=length, min_tokens=length // 2).to(device)
    attention = HierarchicalAttention(args.dim, args.heads, NUM_EDGE_TYPES, 2, 16).to(device)
    with torch.no_grad():
        attention.edge_hop_bias.normal_()
        attention.recency_bias.normal_()
    x = torch.randn(args.batch, length, args.dim, device=device, requires_grad=args.backward)
    train = args.backward and not (backend == "flex" and device.type == "cpu")

    def call() -> None:
        with torch.set_grad_enabled(train):
            layout = build_layout(batch, backend, True, NUM_EDGE_TYPES, 2, 16)
            out = attention(x, layout)
            if train:
                out.sum().backward()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    # A tiny call first: flex's first use imports its machinery (~200 MB of RSS) that is no per-call cost.
    tiny = random_tree_batch(1, 8, seed=0).to(device)
    with torch.no_grad():
        attention(
            torch.randn(1, 8, args.dim, device=device),
            build_layout(tiny, backend, True, NUM_EDGE_TYPES, 2, 16),
        )
    rss_before = _rss_mb()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        allocated_before = torch.cuda.memory_allocated()
    call()  # warm-up at full size (and compilation on CUDA); its peak counts, it is one real call
    sync()
    times = []
    budget_end = time.perf_counter() + args.seconds
    while len(times) < args.min_repeats or (time.perf_counter() < budget_end and len(times) < 50):
        started = time.perf_counter()
        call()
        sync()
        times.append((time.perf_counter() - started) * 1e3)
    if device.type == "cuda":
        peak_mb = (torch.cuda.max_memory_allocated() - allocated_before) / 2**20
    else:
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - rss_before
    return {"ms": statistics.median(times), "peak_mb": max(peak_mb, 0.0), "backward": train}


def run_isolated(backend: str, length: int, args: argparse.Namespace) -> dict[str, float]:
    """measure() in a fresh interpreter, so peak RSS belongs to this configuration alone."""
    command = [sys.executable, __file__, "--worker", backend, str(length)] + _shared_flags(args)
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return {"ms": float("nan"), "peak_mb": float("nan"), "backward": False, "error": tail}
    return json.loads(result.stdout.strip().splitlines()[-1])


def _shared_flags(args: argparse.Namespace) -> list[str]:
    flags = [
        "--device",
        args.device,
        "--batch",
        str(args.batch),
        "--heads",
        str(args.heads),
        "--dim",
        str(args.dim),
    ]
    flags += [
        "--threads",
        str(args.threads),
        "--seconds",
        str(args.seconds),
        "--min-repeats",
        str(args.min_repeats),
    ]
    return flags + (["--backward"] if args.backward else [])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--device", default="cpu", help="cpu or cuda; cuda compiles flex (the production path)"
    )
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="tree lengths L to measure")
    parser.add_argument(
        "--batch", type=int, default=8, help="trees per batch; modest so L=1024 fits a laptop"
    )
    parser.add_argument("--heads", type=int, default=4, help="attention heads (model default)")
    parser.add_argument("--dim", type=int, default=128, help="model dim (model default)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads; 1 gives stable numbers on shared boxes"
    )
    parser.add_argument(
        "--seconds", type=float, default=1.0, help="time budget per measurement after warm-up"
    )
    parser.add_argument(
        "--min-repeats", type=int, default=3, help="timed calls at least, whatever the budget"
    )
    parser.add_argument("--backward", action="store_true", help="time forward + backward (SDPA only on CPU)")
    parser.add_argument("--worker", nargs=2, metavar=("BACKEND", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        backend, length = args.worker
        print(json.dumps(measure(backend, int(length), args)))
        return

    lengths = [int(v) for v in args.lengths.split(",")]
    mode = "forward+backward" if args.backward else "forward"
    print(
        f"device={args.device} batch={args.batch} heads={args.heads} dim={args.dim} threads={args.threads} {mode}"
    )
    header = f"{'L':>6} {'sdpa ms':>10} {'flex ms':>10} {'flex/sdpa':>10} {'sdpa MB':>10} {'flex MB':>10} {'flex/sdpa':>10}"
    print(header)
    print("-" * len(header))
    notes = set()
    for length in lengths:
        sdpa, flex = run_isolated("sdpa", length, args), run_isolated("flex", length, args)
        for name, result in (("sdpa", sdpa), ("flex", flex)):
            if "error" in result:
                notes.add(f"{name} failed: {result['error']}")
        if args.backward and not flex["backward"] and "error" not in flex:
            notes.add("flex on CPU has no backward in this torch: its column is forward only")
        print(
            f"{length:>6} {sdpa['ms']:>10.2f} {flex['ms']:>10.2f} {flex['ms'] / sdpa['ms']:>10.2f} "
            f"{sdpa['peak_mb']:>10.1f} {flex['peak_mb']:>10.1f} {flex['peak_mb'] / max(sdpa['peak_mb'], 1e-9):>10.2f}"
        )
    for note in sorted(notes):
        print(f"note: {note}")


if __name__ == "__main__":
    main()
