"""One training step on CPU: steps/s and pairs/s of Trainer.train_step, against a plain forward-backward of the same
student on the same rows, measured side by side.

    .venv/bin/python bench/train_step.py                       # demo.toml's sizes (dim 64, 2 heads, 128 pairs, 256 negatives)
    .venv/bin/python bench/train_step.py --threads 1 --negatives 128 --max-tokens 64

The rows are the planted-interest synthetic day (hir_model.synthetic) with users' histories as long as the
sampler's user budget makes them on real data. Each measurement is the median of --repeats steps after --warmup
steps:

* `plain`: student forward of users, items and negatives + the retrieval loss + backward + AdamW step;
* `retrieval`: Trainer.train_step with distillation off (what `plain` does, plus the batch's bookkeeping);
* `full`: Trainer.train_step as trained (retrieval + cross-view distillation);
* `full dense`: `full` with a dense gradient for the id table, as before 2026-12-07: each lookup zeroes and adds a
  whole id_buckets x dim gradient, where the sparse one (the default) adds the rows it read and makes the sum
  dense once before AdamW (`full` / `full dense` is what that saves);
* `warm`: `full` on a warm start, with the stability term (the continued model's embeddings of the step's rows,
  looked up in the tables Trainer.anchor_rows computes once per run: what a day-to-day run adds);
* `warm+users`: `warm` with the served user rows the train job adds to the term (--anchor-users per step, as the
  job a quarter of the batch size by default): a student forward of each.

Until 2026-12-07 the stability term ran the continued model on the step's rows every step: `warm` 291.5 and
`warm+users` 326.5 ms/step against `full` 250.3 (1.16x and 1.30x), on the shared 2-core box. The last line
prints what the one pass over every row costs instead.

The ratio column is each against `plain`: what the trainer adds to the unavoidable work.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--negatives", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--id-buckets", type=int, default=65536, help="demo.toml's; hir train's default is 262144")
    p.add_argument(
        "--anchor-users", type=int, default=None, help="served user rows per warm step (batch size / 4)"
    )
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args()

    import torch

    from hir_model.config import ModelConfig, TrainConfig
    from hir_model.objective import batch_loss
    from hir_model.synthetic import make_synthetic, synthetic_batches
    from hir_model.trainer import Trainer, densify_sparse_grads

    torch.set_num_threads(args.threads)
    data = make_synthetic(num_users=1000, views_per_user=(20, 40), max_tokens=args.max_tokens, seed=0)
    steps = args.warmup + args.repeats
    loader = synthetic_batches(data, args.batch_size, steps, seed=0, negatives=args.negatives)
    batches = list(loader)
    model = ModelConfig(
        id_buckets=args.id_buckets,
        dim=args.dim,
        heads=args.heads,
        max_tokens=args.max_tokens,
        content_dim=0,
        num_prototypes=64,
    )
    train = TrainConfig(steps=steps, batch_size=args.batch_size, warmup_steps=1)
    widths = statistics.mean(b.users.max_tokens for b in batches)
    anchor_users = args.batch_size // 4 if args.anchor_users is None else args.anchor_users
    users_loader = synthetic_batches(
        data, args.batch_size, steps, seed=0, negatives=args.negatives, anchor_users=anchor_users
    )
    with_users = list(users_loader)

    plain_trainer = Trainer(dataclasses.replace(model, distill_weight=0.0), train, device="cpu")
    student, optimizer = plain_trainer.student, plain_trainer.optimizer

    def plain(batch) -> None:
        student.train()
        users, items, negatives = student(batch.users), student(batch.items), student(batch.negatives)
        loss = batch_loss(batch, users, items, negatives, model.retrieval_temp)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        densify_sparse_grads([p for g in optimizer.param_groups for p in g["params"]])
        optimizer.step()

    full = Trainer(model, train, device="cpu")
    dense = Trainer(model, train, device="cpu")
    dense.student.features.id_embedding.sparse = False  # the id table as it was before 2026-12-07
    with tempfile.TemporaryDirectory() as folder:
        Trainer(model, train, device="cpu").save(Path(folder) / "yesterday")
        warm, warm_users = (
            Trainer(dataclasses.replace(model, stability_weight=1.0), train, device="cpu") for _ in range(2)
        )
        warm.warm_start(Path(folder) / "yesterday")
        warm_users.warm_start(Path(folder) / "yesterday")
    warm.anchor_rows(loader)
    started = time.perf_counter()
    warm_users.anchor_rows(users_loader)  # once per run: the continued model's embedding of every row
    anchor_seconds = time.perf_counter() - started
    # name: (step, its batches). Run side by side, one step of each in turn per batch, so a change in the
    # machine's speed during the run touches every row alike.
    runs = {
        "plain": (plain, batches),
        "retrieval": (
            Trainer(dataclasses.replace(model, distill_weight=0.0), train, device="cpu").train_step,
            batches,
        ),
        "full": (full.train_step, batches),
        "full dense": (dense.train_step, batches),
        "warm": (warm.train_step, batches),
        "warm+users": (warm_users.train_step, with_users),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for i in range(steps):
        for name, (step, rows) in runs.items():
            started = time.perf_counter()
            step(rows[i])
            if i >= args.warmup:
                times[name].append(time.perf_counter() - started)
    results = {name: statistics.median(seconds) for name, seconds in times.items()}

    print(
        f"train step on CPU, {args.threads} threads: {args.batch_size} pairs + {args.negatives} negatives, "
        f"user rows {widths:.0f} tokens wide, dim {args.dim}"
    )
    print(f"{'step':<11} {'ms/step':>9} {'steps/s':>8} {'pairs/s':>8} {'x plain':>8}")
    for name, seconds in results.items():
        print(
            f"{name:<11} {1000 * seconds:9.1f} {1 / seconds:8.2f} {args.batch_size / seconds:8.0f} "
            f"{seconds / results['plain']:8.2f}"
        )
    rows = len(users_loader.inputs) + len(users_loader.user_corpus)
    print(
        f"warm starts, once per run: the continued model's embeddings of {rows} rows in {anchor_seconds:.2f} s "
        f"({anchor_seconds / results['full']:.1f} full steps)"
    )


if __name__ == "__main__":
    main()
