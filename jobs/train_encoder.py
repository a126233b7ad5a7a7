"""Train the HIR encoder on a day's neighbourhoods and write a versioned model directory.

    hir train --ds 2026-01-07 --warehouse warehouse/synthetic
    hir train --ds 2026-01-07 --warehouse warehouse/synthetic --epochs 3 --batch-size 256 --dim 64 --loader pyarrow
    hir train --ds 2026-01-07 --warehouse warehouse/synthetic --version 2026-01-07-nightly --resume
    spark-submit --jars .jars/delta-spark_4.0_2.13-4.4.0.jar,.jars/delta-storage-4.4.0.jar \
      jobs/train_encoder.py --ds 2017-12-03 --warehouse warehouse/taobao --device cuda

Inputs, each pinned to one Delta version (default: the latest) and recorded in the model's lineage:
`neighbourhoods` (the day's partition), `edges` (the day's cart/purchase edges are the retrieval positives, its
item_in_category edges the labels of the purity metric) and `entity_content` (content vectors, when the table
exists). Spark only resolves the snapshot to its exact Parquet files (refusing tables with deletion vectors, which
raw Parquet reads would undo) and collects the positives; the rows reach PyTorch through petastorm
(`--loader petastorm`, default) or pyarrow (`--loader pyarrow`), which give identical batches (hir_model.data).

Training: every next-period engagement (user, item) after a training cut-off trains the retrieval objective (mixed
negatives, logQ correction) on the graph as it stood before the cut-off (jobs.train.next_period, hir_model.pairs);
the end of that period, held out by time, chooses the stopping epoch (hir_model.selection); the cross-view
distillation regularises the same rows. A stderr progress line, a JSON-lines metrics log in the run folder
(`<model-dir>/.runs/<version>/metrics.jsonl`; in the local cache when --model-dir is remote), checkpoints every
--checkpoint-every steps there, and `--resume` continuing the last checkpoint exactly. After training the residual quantiser (BoM codebooks) is fitted on the
teacher embeddings of the day's entities; its usage/entropy/collision metrics and the purity of the items' level-0
codes against their categories go into the last line of metrics.jsonl (`"summary": true`).

Day to day: `--warm-start previous|<version>|<folder>` continues a model's networks, AdamW state and DINO centre
for `--warm-epochs` (a quarter of --epochs by default), validating the continued model before the first step and
stopping after `--warm-patience` validations without a better one (--patience by default), and keeps the
continued model's codebooks while they fit the day within --codebook-tolerance of a refit (else the refit anchored
closest to them within it); whatever the start, the day's codes are renamed to the ids the latest
earlier day's `bom_tokens` gave the same entities (jobs.train.continuity), so token ids keep their meaning.

Output: `<model-dir>/<version>/` (weights.pt loadable with torch.load(weights_only=True), config.json,
quantiser.pt, metrics.jsonl, lineage.json), written atomically on a path, s3a:// or hdfs:// (hir_model.checkpoint);
an existing version is never overwritten. The
default version name hashes the flags, the input versions and the code version (a hash of the source of this job
and every project module it imports: jobs.common.code), so a rerun of the same training
finds its model and does nothing; a name given with --version that exists is refused. A run whose distillation
collapsed (loss stuck at ln K, one prototype for everything) is still written, for diagnosis, but reported as
COLLAPSED with exit code 1.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from hir_model import storage
from hir_model.checkpoint import ModelPath, load_quantiser, model_path, version_exists, write_model_dir
from hir_model.config import ModelConfig, TrainConfig
from hir_model.data import NeighbourhoodRows, make_reader, read_content, read_neighbourhoods
from hir_model.pairs import PairBatches, make_next_period_pairs, stack_periods, training_view
from hir_model.selection import Validation
from hir_model.verdict import day_verdict, embed_day
from jobs.common.args import (
    JobArgumentParser,
    add_warehouse_flag,
    parse_ds,
    parse_place,
    parse_stage_weights,
    run_job,
)
from jobs.common.code import code_version as source_version
from jobs.common.errors import HirError
from jobs.common.stage import StageLog
from jobs.train.codebooks import DEFAULT_CODEBOOK_TOLERANCE, quantise_day
from jobs.train.continuity import WARM_NONE, model_day, resolve_warm_start
from jobs.train.inputs import TrainingInputs, resolve_inputs
from jobs.train.next_period import parse_cutoff
from jobs.train.run import (
    RUNS_DIR,
    EpochSelection,
    Progress,
    TrainReport,
    fit_logged,
    refuse_existing,
    resolve_device,
    start_or_resume,
)

# Loss weight of a next-period engagement by its deepest stage: deep ones count most (see --positive-weights).
POSITIVE_WEIGHTS: dict[str, float] = {"view": 0.2, "favourite": 1.0, "cart": 3.0, "purchase": 5.0}
# Half the cores: the Spark driver JVM shares the machine, and on a 2-core box 2 torch threads ran a training step
# 8x slower than 1 (6.3 s vs 0.8 s, measured on the shared 2-core CI box).
DEFAULT_THREADS = max(1, (os.cpu_count() or 2) // 2)
# Synthetic day 2 of a warm backfill (docs/experiments.md, "Day to day"): weight 0 / 2 / 10 kept unchanged items at a
# median cosine of 0.731 / 0.905 / 0.974 to yesterday, validation recall@50 0.450 / 0.400 / 0.424.
DEFAULT_STABILITY = 10.0
# A warm start's budget, as a share of --epochs: it continues a trained model (--warm-epochs overrides).
WARM_EPOCHS_SHARE = 0.25
# Validations without a better one before a run stops, cold or warm. Chosen on validation histories alone
# (2026-12-08, bench/patience_replay.py, docs/experiments.md "Patience"): on 22 distinct cold runs of three datasets
# that waited 6 (the last `make demo`'s models and the experiments since 2026-12-06), stopping after 3 would have
# served the same best-validated model on all 22 in 0.62-0.82x the steps; after 2 it missed the best on three. On
# the ten warm days of the 2026-12-07 chains 3 served the same model too, and 2 missed it on two.
PATIENCE = 3


@dataclass(frozen=True)
class TrainJobConfig:
    ds: dt.date
    warehouse: str = "warehouse"
    model_root: str | None = None  # default <warehouse>/models
    version: str | None = None  # default: ds + hash of config and inputs
    neighbourhoods_version: int | None = None
    edges_version: int | None = None
    content_version: int | None = None
    use_content: bool = True
    use_attention_bias: bool = True  # ablation: False => no edge/hop/recency attention biases
    use_distillation: bool = True  # ablation: False => retrieval objective only (no teacher-student term)
    steps: int | None = None  # default: epochs x batches per epoch
    epochs: int = 20  # at most; training stops earlier when the validation recall stops improving
    patience: int = PATIENCE  # validations without a better validation recall@50 before stopping
    validate_every: int = 0  # validate every this many steps inside longer epochs; 0: at epoch ends only
    validation_share: float = 0.1  # the next period's last events, held out to choose the stopping epoch
    train_cutoff: dt.datetime | None = (
        None  # naive UTC; None: the last next_period_share of the window after it
    )
    next_period_share: float = 0.2
    train_periods: int = 1  # next periods learnt from: the last one and train_periods - 1 before it
    negatives: int = 256  # uniform corpus negatives per step
    positive_weights: tuple[tuple[str, float], ...] = tuple(POSITIVE_WEIGHTS.items())  # stage -> weight
    batch_size: int = TrainConfig.batch_size
    lr: float = TrainConfig.lr
    retrieval_temp: float = ModelConfig.retrieval_temp  # the retrieval softmax's temperature on cosine scores
    seed: int = 0
    checkpoint_every: int | None = None  # default: a tenth of the run
    resume: bool = False
    loader: str = "petastorm"
    device: str = "auto"
    threads: int = DEFAULT_THREADS
    dim: int = ModelConfig.dim
    layers: int = ModelConfig.layers
    heads: int = ModelConfig.heads
    prototypes: int = ModelConfig.num_prototypes
    id_buckets: int = ModelConfig.id_buckets
    levels: int = 3
    codes_per_level: int | None = None  # default: min(256, sqrt(entities))
    codebook_tolerance: float = DEFAULT_CODEBOOK_TOLERANCE  # keep yesterday's codebooks (warm)
    progress: bool | None = None  # default: when stderr is a terminal, a live line; else a line every 5%
    allow_collapsed: bool = False  # a collapsed run is a result (the evaluation's ablations), not a failure
    warm_start: str | None = None  # a model version folder to continue from (resolved); None: cold start
    warm_epochs: int | None = None  # epochs of a warm-started run; default a quarter of `epochs`
    warm_patience: int | None = None  # patience of a warm-started run; default `patience`
    stability_weight: float = DEFAULT_STABILITY  # warm starts: pull towards the continued model's embeddings
    align_tokens: bool = (
        True  # rename the day's codes to the ids yesterday's bom_tokens gave the same entities
    )

    @property
    def budget_epochs(self) -> int:
        """Epochs this run may take: a warm start continues a trained model, so it gets a smaller budget (a share
        of --epochs rounded up, at least 1, unless told)."""
        if self.warm_start is None:
            return self.epochs
        return self.warm_epochs or max(1, math.ceil(self.epochs * WARM_EPOCHS_SHARE))

    @property
    def run_patience(self) -> int:
        """Validations without a better one before this run stops: --patience, or a warm start's own when told."""
        if self.warm_start is None:
            return self.patience
        return self.warm_patience or self.patience

    @property
    def models(self) -> ModelPath:
        return model_root(self.warehouse, self.model_root)

    def fingerprint(self) -> dict[str, Any]:
        """What decides the trained weights (not where they are written, how they are read, or on which device)."""
        keep = (
            "ds",
            "use_content",
            "use_attention_bias",
            "use_distillation",
            "steps",
            "epochs",
            "patience",
            "validate_every",
            "validation_share",
            "train_cutoff",
            "next_period_share",
            "train_periods",
            "negatives",
            "positive_weights",
            "batch_size",
            "lr",
            "retrieval_temp",
            "seed",
            "dim",
            "layers",
            "heads",
            "prototypes",
            "id_buckets",
            "levels",
            "codes_per_level",
            "codebook_tolerance",
            "warm_epochs",
            "warm_patience",
            "align_tokens",
        )
        values = asdict(self)
        dated = ("ds", "train_cutoff")
        out = {k: str(values[k]) if k in dated and values[k] is not None else values[k] for k in keep}
        # The version folder's name says which model was continued (its name hashes that model's own inputs);
        # where it lies does not change the weights.
        out["warm_start"] = storage.name(self.warm_start) if self.warm_start else None
        out["stability_weight"] = self.stability_weight if self.warm_start else None  # no anchor when cold
        return out


# -- flags ---------------------------------------------------------------------------------------------------


def _non_negative(value: str) -> int:
    number = int(value)
    if number < 0:
        raise ValueError
    return number


_non_negative.__name__ = "non-negative integer"


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError
    return number


_positive.__name__ = "positive integer"


def build_parser() -> JobArgumentParser:
    p = JobArgumentParser(prog="hir train", description=__doc__.split("\n\n")[0])
    p.add_argument("--ds", type=parse_ds, required=True, help="Day to train on (YYYY-MM-DD).")
    add_warehouse_flag(p)
    p.add_argument(
        "--model-dir",
        type=parse_place,
        help="Root of the model versions (a path, s3a:// or hdfs://). Default <warehouse>/models: models sit beside the tables they were "
        "trained on, and the embed stage finds them without another flag.",
    )
    p.add_argument(
        "--version",
        help="Name of the model version. Default <ds>-<hash of flags, input table versions and code version>: "
        "a rerun of the same training finds its model and is a no-op (or continues with --resume), any change "
        "gets a new name. A name given here that exists is refused: versions are never overwritten.",
    )
    g = p.add_argument_group("inputs (Delta versions; default: the latest, recorded in the lineage)")
    g.add_argument(
        "--neighbourhoods-version", type=_non_negative, help="Version of `neighbourhoods` to read."
    )
    g.add_argument("--edges-version", type=_non_negative, help="Version of `edges` (positives, categories).")
    g.add_argument("--content-version", type=_non_negative, help="Version of `entity_content`.")
    g.add_argument(
        "--no-content",
        action="store_true",
        help="Ignore entity_content (ablation). By default content vectors are used whenever the table exists.",
    )
    g.add_argument(
        "--no-attention-bias",
        action="store_true",
        help="Drop the learned edge-type/hop/recency attention biases (ablation; the tree mask stays). On by "
        "default: the bias is what lets a purchase edge count for more than a view.",
    )
    g.add_argument(
        "--no-distillation",
        action="store_true",
        help="Train the retrieval objective alone, without the teacher-student cross-view term (ablation). On "
        "by default: distillation is what trains the entities that have no conversion of their own.",
    )
    g = p.add_argument_group("training")
    length = g.add_mutually_exclusive_group()
    length.add_argument(
        "--epochs",
        type=_positive,
        default=20,
        help="At most this many passes over the next-period pairs (default 20). Training stops earlier, after "
        "--patience validations without a better validation recall@50, and serves the best validated network.",
    )
    length.add_argument("--steps", type=_positive, help="At most this many steps instead of --epochs.")
    g.add_argument(
        "--patience",
        type=_positive,
        default=PATIENCE,
        help="Validations without a better validation recall@50 (the held-out engagements among their users' top 50 "
        f"of the whole corpus) before training stops (default {PATIENCE}: replayed on the validation histories of 22 "
        "cold and 10 warm runs of three datasets, 3 served the same model as 6 on every one, 2 missed it on five).",
    )
    g.add_argument(
        "--validate-every",
        type=_non_negative,
        default=0,
        metavar="STEPS",
        help="Also validate inside an epoch longer than STEPS steps, at evenly spaced steps at most STEPS apart "
        "(default 0: at each epoch's end only). With several --train-periods an epoch is several times longer "
        "while validation recall peaks after about as many pairs, so per-epoch patience waits several times too "
        "long; the best validated step, not the best epoch, is served.",
    )
    g.add_argument(
        "--validation-share",
        type=float,
        default=0.1,
        help="Share of the next period's funnel events, at its end, held out by time to choose the stopping epoch "
        "(default 0.1: every user's engagements after that validation cut-off, predicted from the user's rows "
        "before it; 0 trains every epoch on the whole period). The day's own data, never an evaluation's targets.",
    )
    g.add_argument(
        "--train-cutoff",
        default="auto",
        help="Instant inside the day's window that splits input events (before) from the positives to predict "
        "(at or after), ISO with a zone. Default auto: the last --next-period-share of the window's events.",
    )
    g.add_argument(
        "--next-period-share",
        type=float,
        default=0.2,
        help="With --train-cutoff auto: share of the window's funnel events after the cut-off (default 0.2).",
    )
    g.add_argument(
        "--train-periods",
        type=_positive,
        default=1,
        help="Periods to learn from (default 1: the one after the cut-off). N adds up to N - 1 periods before it, "
        "each as long in funnel events, each predicted from the graph as it stood at its own start: more "
        "positives from the same window, as a sequence model learns from every position of a history. Each "
        "period samples the graph once more on Spark.",
    )
    g.add_argument(
        "--negatives",
        type=_non_negative,
        default=256,
        help="Items drawn uniformly from the whole corpus per step, beside the in-batch negatives, each with "
        "its logQ correction (default 256; PinnerFormer's mixed negatives).",
    )
    g.add_argument(
        "--positive-weights",
        default=",".join(f"{k}={v:g}" for k, v in POSITIVE_WEIGHTS.items()),
        help="Loss weight of a next-period engagement by its deepest stage (default view=0.2, favourite=1, cart=3, "
        "purchase=5: the representation is judged on carts and purchases, and views outnumber them ten to one).",
    )
    g.add_argument(
        "--batch-size",
        type=_positive,
        default=TrainConfig.batch_size,
        help=f"Next-period pairs per step (default {TrainConfig.batch_size}): the other pairs' items are in-batch "
        "negatives, so bigger is better while memory allows.",
    )
    g.add_argument(
        "--lr",
        type=float,
        default=TrainConfig.lr,
        help=f"Peak AdamW learning rate (default {TrainConfig.lr:g}: DINO's 5e-4, with warm-up and cosine decay).",
    )
    g.add_argument(
        "--retrieval-temp",
        type=float,
        default=ModelConfig.retrieval_temp,
        metavar="T",
        help=f"Temperature of the retrieval softmax over cosine scores (default {ModelConfig.retrieval_temp:g}). "
        "The lower it is, the further the training loss can fall on pairs already ranked first: at 0.05 a "
        "day's pairs were memorised (loss near 0) while validation recall fell after the first epoch; 0.1 "
        "raised the best validation recall on two demo datasets of three (docs/experiments.md).",
    )
    g.add_argument(
        "--seed",
        type=int,
        default=0,
        help="Seeds weight init, dropout, the student views, the batch order and the quantiser: same seed, "
        "same inputs, same model.",
    )
    g.add_argument(
        "--checkpoint-every",
        type=_non_negative,
        help="Save a resumable checkpoint every N steps; 0 = never. Default: a tenth of the run, so a kill "
        "loses at most 10%% of the work (only the latest checkpoint is kept).",
    )
    g.add_argument(
        "--resume",
        action="store_true",
        help="Continue this version's interrupted run from its latest checkpoint; the result equals an "
        "uninterrupted run. Without it an interrupted run of the same version is discarded and restarted.",
    )
    g = p.add_argument_group("day to day (warm starts and stable tokens)")
    g.add_argument(
        "--warm-start",
        default=WARM_NONE,
        metavar="MODEL",
        help="Continue from a model's weights, AdamW state and DINO centre instead of a random init: 'previous' "
        "(the newest model of the latest earlier day under --model-dir; a cold start, with a note, when there is "
        "none), a version name under --model-dir, or a model version folder. Default none (cold). `hir pipeline` "
        "passes the model of day ds-1 when its record has one: yesterday's embedding axes carry over, so "
        "features that ranking models learned on stay meaningful.",
    )
    g.add_argument(
        "--warm-epochs",
        type=_positive,
        help="Epochs of a warm-started run, at most (default a quarter of --epochs, at least 1): the model "
        "starts trained, so a day's new data needs a fraction of a cold run. The continued model is validated "
        "before its first step, so the day serves it unchanged when no epoch beats it. A cold start ignores it "
        "(and trains for --epochs): a backfill passes the same flags to every day, and its first one starts cold.",
    )
    g.add_argument(
        "--warm-patience",
        type=_positive,
        help="Validations without a better one before a warm-started run stops (default --patience). A cold "
        "start ignores it (and waits --patience).",
    )
    g.add_argument(
        "--stability-weight",
        type=float,
        default=DEFAULT_STABILITY,
        metavar="W",
        help="Warm starts: weight of the stability term, 1 - cosine between each trained row's embedding and the "
        f"continued model's (default {DEFAULT_STABILITY:g}; 0 turns it off). It keeps the embeddings of "
        "entities whose neighbourhood did not change where yesterday's consumers learned them, while the day's "
        "new data still moves the rest.",
    )
    g.add_argument(
        "--no-align-tokens",
        dest="align_tokens",
        action="store_false",
        help="Keep the quantiser's own code ids. By default the day's codes are renamed to the ids that the "
        "latest earlier day's bom_tokens gave the most of the same entities (maximum-weight matching per level), "
        "so a token id keeps its meaning from day to day, warm start or cold.",
    )
    g = p.add_argument_group("execution")
    g.add_argument(
        "--loader",
        choices=("petastorm", "pyarrow"),
        default=None,
        help="Parquet reader feeding PyTorch: petastorm (the default on a local warehouse) or pyarrow (identical "
        "batches; the default on s3a:// and hdfs://, which petastorm 0.12 reads only through fsspec's s3fs, not "
        "installed here).",
    )
    g.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto: the GPU when torch sees one (flex attention), else the CPU (SDPA path, same maths).",
    )
    g.add_argument(
        "--threads",
        type=_positive,
        default=DEFAULT_THREADS,
        help=f"torch intra-op threads on CPU. Default half the cores ({DEFAULT_THREADS} here): the Spark driver "
        "JVM shares the machine, and on a 2-core box 2 threads ran a step 8x slower than 1 (6.3 s vs 0.8 s).",
    )
    g = p.add_argument_group("model and quantiser sizes")
    g.add_argument(
        "--dim",
        type=_positive,
        default=ModelConfig.dim,
        help="Embedding size (default 128: FAISS/retrieval).",
    )
    g.add_argument(
        "--layers",
        type=_positive,
        default=ModelConfig.layers,
        help="Transformer layers (default 2: the tree has two hops).",
    )
    g.add_argument(
        "--heads",
        type=_positive,
        default=ModelConfig.heads,
        help="Attention heads (default 4: 32 dims each).",
    )
    g.add_argument(
        "--prototypes",
        type=_positive,
        default=ModelConfig.num_prototypes,
        help="DINO prototypes K (default 1024: a few times the fine interests expected). ln K is the loss of a "
        "collapsed run.",
    )
    g.add_argument(
        "--id-buckets",
        type=_positive,
        default=ModelConfig.id_buckets,
        help="Hash buckets of the id embedding (default 2^18: millions of ids with two hashes).",
    )
    g.add_argument(
        "--levels",
        type=_positive,
        default=3,
        help="BoM quantiser levels, coarse to fine (default 3, as RQ-VAE/TIGER semantic ids).",
    )
    g.add_argument(
        "--codes-per-level",
        type=_positive,
        help="Codes per level. Default min(256, sqrt(entities of the day)): level 0 then has about sqrt(N) "
        "members per code, readable as an interest, and 256 (RQ-VAE/TIGER) caps it for large days.",
    )
    g.add_argument(
        "--codebook-tolerance",
        type=float,
        default=DEFAULT_CODEBOOK_TOLERANCE,
        metavar="T",
        help="Warm starts: keep the continued model's codebooks (and so every token's meaning) while their "
        "reconstruction error on the day's embeddings is at most T times that of the day's own refit (default "
        f"{DEFAULT_CODEBOOK_TOLERANCE:g}); past it, the refit whose centroids are pulled hardest toward "
        "yesterday's while within T (else a plain refit from them), renamed to yesterday's ids. 1: no worse "
        "than a refit.",
    )
    g.add_argument(
        "--allow-collapsed",
        action="store_true",
        help="Report a collapsed run but exit 0 (the model is written either way). Off by default: a daily run "
        "must not publish a collapsed model; the evaluation sets it, since a collapsed ablation is a result.",
    )
    g.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        help="Force the live progress line on or off (default: on when stderr is a terminal, else a line every "
        "5%% of the run).",
    )
    return p


def config_from_args(argv: Sequence[str] | None) -> TrainJobConfig:
    args = build_parser().parse_args(argv)
    if not args.lr >= 0:
        raise HirError("--lr must be >= 0")
    if not 0 < args.retrieval_temp < math.inf:  # also refuses nan
        raise HirError(f"--retrieval-temp must be a positive number, got {args.retrieval_temp}")
    if args.dim % args.heads:
        raise HirError(f"--dim {args.dim} must be divisible by --heads {args.heads}")
    if args.id_buckets < 2:
        raise HirError("--id-buckets must be >= 2")
    if args.prototypes < 2:
        raise HirError("--prototypes must be >= 2")
    if not args.codebook_tolerance >= 1:  # also refuses nan
        raise HirError(f"--codebook-tolerance must be 1 or more, got {args.codebook_tolerance}")
    if args.codes_per_level is not None and args.codes_per_level < 2:
        raise HirError("--codes-per-level must be >= 2")
    if not 0.0 <= args.validation_share < 1.0:
        raise HirError("--validation-share must be in [0, 1)")
    if not 0.0 < args.next_period_share < 1.0:
        raise HirError("--next-period-share must be in (0, 1)")
    if args.batch_size < 2:
        raise HirError("--batch-size must be 2 or more (the other pairs are the in-batch negatives)")
    train_cutoff = parse_cutoff(args.train_cutoff)
    if args.version is not None and (not args.version or "/" in args.version or args.version.startswith(".")):
        raise HirError(f"--version '{args.version}' must be a plain folder name")
    if not args.stability_weight >= 0:  # also refuses nan
        raise HirError(f"--stability-weight must be 0 or more, got {args.stability_weight}")
    warm = resolve_warm_start(args.warm_start, model_root(args.warehouse, args.model_dir), args.ds)
    return TrainJobConfig(
        ds=args.ds,
        warehouse=args.warehouse,
        model_root=args.model_dir,
        version=args.version,
        neighbourhoods_version=args.neighbourhoods_version,
        edges_version=args.edges_version,
        content_version=args.content_version,
        use_content=not args.no_content,
        use_attention_bias=not args.no_attention_bias,
        use_distillation=not args.no_distillation,
        steps=args.steps,
        epochs=args.epochs,
        patience=args.patience,
        validate_every=args.validate_every,
        validation_share=args.validation_share,
        train_cutoff=train_cutoff,
        next_period_share=args.next_period_share,
        train_periods=args.train_periods,
        negatives=args.negatives,
        positive_weights=tuple(parse_stage_weights(args.positive_weights, "--positive-weights").items()),
        batch_size=args.batch_size,
        lr=args.lr,
        retrieval_temp=args.retrieval_temp,
        seed=args.seed,
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
        loader=args.loader or ("petastorm" if storage.on_this_machine(args.warehouse) else "pyarrow"),
        device=args.device,
        threads=args.threads,
        dim=args.dim,
        layers=args.layers,
        heads=args.heads,
        prototypes=args.prototypes,
        id_buckets=args.id_buckets,
        levels=args.levels,
        codes_per_level=args.codes_per_level,
        codebook_tolerance=args.codebook_tolerance,
        progress=args.progress,
        allow_collapsed=args.allow_collapsed,
        warm_start=str(warm) if warm else None,
        warm_epochs=args.warm_epochs if warm else None,
        warm_patience=args.warm_patience if warm else None,
        stability_weight=args.stability_weight,
        align_tokens=args.align_tokens,
    )


# -- training (no Spark) -------------------------------------------------------------------------------------


def model_root(warehouse: str, model_dir: str | None) -> ModelPath:
    """--model-dir, or `<warehouse>/models`: a local Path or a remote URI."""
    return model_path(model_dir or storage.join(warehouse, "models"))


def code_version() -> str:
    """The hash of the source this job runs (jobs.common.code): model code counts, the README does not."""
    return source_version("jobs.train_encoder")


def default_version(cfg: TrainJobConfig, inputs: TrainingInputs, code: str) -> str:
    key = json.dumps([cfg.fingerprint(), inputs.versions(), code], sort_keys=True)
    return f"{cfg.ds}-{hashlib.sha1(key.encode()).hexdigest()[:8]}"


def build_configs(
    cfg: TrainJobConfig, rows: NeighbourhoodRows, content_dim: int, steps: int
) -> tuple[ModelConfig, TrainConfig]:
    """Model and optimiser settings: sizes from the flags, token length and content size from the data, and
    warm-ups scaled to the run's length (none for the teacher of a warm start: it is trained already)."""
    model = ModelConfig(
        id_buckets=cfg.id_buckets,
        dim=cfg.dim,
        heads=cfg.heads,
        layers=cfg.layers,
        max_tokens=rows.max_tokens,
        content_dim=content_dim,
        use_content=content_dim > 0,
        use_attention_bias=cfg.use_attention_bias,
        distill_weight=ModelConfig.distill_weight if cfg.use_distillation else 0.0,
        num_prototypes=cfg.prototypes,
        # DINO warms the teacher temperature up over 30% of training (30 of 100 epochs); 1000 steps at most.
        teacher_temp_warmup_steps=(
            0 if cfg.warm_start else min(ModelConfig.teacher_temp_warmup_steps, max(1, steps * 3 // 10))
        ),
        # The teacher averages about the last steps/10 students (momentum 1 - 10/steps), DINO's 0.996 at most:
        # at 0.996 a 100-step run serves a teacher still 2/3 its random init (0.996^100). Measured on the synthetic
        # day (3000 rows, 520 steps): item level-0 purity 0.44 with this rule vs 0.20 with 0.996 (chance 0.10).
        ema_momentum_base=min(ModelConfig.ema_momentum_base, max(0.0, 1.0 - 10.0 / steps)),
        stability_weight=cfg.stability_weight if cfg.warm_start else 0.0,
        retrieval_temp=cfg.retrieval_temp,
    )
    train = TrainConfig(
        lr=cfg.lr,
        steps=steps,
        batch_size=cfg.batch_size,
        # Linear lr warm-up over 10% of a short run, TrainConfig's 100 steps at most.
        warmup_steps=min(TrainConfig.warmup_steps, max(1, steps // 10)),
        seed=cfg.seed,
        checkpoint_every=cfg.checkpoint_every if cfg.checkpoint_every is not None else max(1, steps // 10),
    )
    return model, train


def train(cfg: TrainJobConfig, inputs: TrainingInputs) -> TrainReport:
    """Read the snapshot files, train, fit the quantiser, write the model version. No Spark."""
    started = time.perf_counter()
    code = code_version()
    version = cfg.version or default_version(cfg, inputs, code)
    final = model_path(storage.join(cfg.models, version))
    if cfg.version is None and version_exists(final):
        # The derived name covers flags, input versions and code: this model is what the run would train, so a
        # rerun is a no-op (DESIGN: deterministic). A version named with --version is never reused or replaced.
        return TrainReport.of_existing(final, cfg.allow_collapsed)
    refuse_existing(final)
    device = resolve_device(cfg.device)
    torch.set_num_threads(cfg.threads)
    log = StageLog("train", {"version": version, "loader": cfg.loader, "device": str(device)})

    reader = make_reader(cfg.loader)
    try:
        rows = read_neighbourhoods(reader, inputs.neighbourhoods.files)
        content = read_content(reader, inputs.content.files) if inputs.content else None
    except ValueError as err:
        raise HirError(f"neighbourhoods version {inputs.neighbourhoods.version}: {err}") from None
    if len(rows) != inputs.neighbourhoods.rows:  # nothing lost between Delta and the reader
        raise HirError(
            f"{cfg.loader} read {len(rows)} rows from the snapshot files, Delta counts "
            f"{inputs.neighbourhoods.rows}"
        )
    if len(rows) < 2:
        raise HirError(f"neighbourhoods for ds {cfg.ds} has {len(rows)} row; training needs at least 2")
    period = inputs.next_period
    view = training_view(period.inputs, rows)  # both ends and the negatives as they stood before the cut-off
    pairs = make_next_period_pairs(view, period.user_ids, period.item_ids, period.weights)
    if len(pairs) < 2:
        raise HirError(
            f"only {len(pairs)} next-period engagements after the training cut-off {period.lineage['cutoff']} have "
            "a user with earlier history and an item of the day; move --train-cutoff earlier"
        )
    stacked = stack_periods(
        view,
        pairs,
        [(training_view(p.inputs, rows), p.user_ids, p.item_ids, p.weights) for p in period.earlier],
    )
    validation_pairs, validation = None, None
    if held := period.validation:
        held_view = training_view(held.inputs, rows)
        validation_pairs = make_next_period_pairs(held_view, held.user_ids, held.item_ids, held.weights)
        validation = Validation(held_view, validation_pairs) if validation_pairs else None
    # The pair layout (and so batches per epoch) does not depend on the step count, only on rows and pairs.
    layout = PairBatches(
        stacked.rows, rows, stacked.pairs, cfg.batch_size, cfg.negatives, 0, cfg.seed, corpus=stacked.corpus
    )
    steps = cfg.steps or cfg.budget_epochs * layout.batches_per_epoch
    model_config, train_config = build_configs(cfg, rows, content.content_dim if content else 0, steps)

    run_dir = storage.join(cfg.models, RUNS_DIR, version)
    run_key = {
        "fingerprint": cfg.fingerprint(),
        "inputs": inputs.versions(),
        "model": model_config.to_dict(),
        "train": train_config.to_dict(),
    }
    trainer, resumed_from = start_or_resume(cfg.resume, version, run_dir, run_key, device)
    selection = EpochSelection(
        validation, content, layout.batches_per_epoch, cfg.run_patience, cfg.validate_every
    )
    continued: dict[str, Any] = {}  # a warm start's validation of the model it continues, before any step
    if cfg.warm_start and resumed_from is None:
        try:
            trainer.warm_start(cfg.warm_start)
        except ValueError as err:
            raise HirError(f"--warm-start: {err}; pass --warm-start none for a cold start") from None
        selection.after_step(trainer, continued)  # the continued model is the one to beat (step 0 validates)
    elif cfg.warm_start:
        trainer.anchor_to(cfg.warm_start)  # checkpoints do not hold the anchor; the continued version does
    loader = PairBatches(
        stacked.rows,
        rows,
        stacked.pairs,
        cfg.batch_size,
        cfg.negatives,
        steps,
        cfg.seed,
        content=content,
        start_step=trainer.step,
        # The stability term's served user rows (a quarter of the batch's pairs): they hold the idle users too,
        # whose rows no pair trains. On Taobao 2017-12-03 they lifted unchanged users' median cosine to yesterday
        # from 0.894 to 0.958 and their level-0 tokens kept from 0.577 to 0.923.
        anchor_users=cfg.batch_size // 4 if trainer.anchor is not None else 0,
        corpus=stacked.corpus,
    )
    fit_logged(trainer, loader, run_dir, Progress(version, steps, trainer.step, cfg.progress), selection)
    trainer.restore_best()

    embeddings, winners = embed_day(trainer, rows, content)
    verdict = day_verdict(
        trainer.history, embeddings, winners, model_config.num_prototypes, cfg.use_distillation
    )
    quantiser, quantiser_metrics = quantise_day(
        embeddings,
        rows,
        inputs,
        cfg.levels,
        cfg.codes_per_level,
        cfg.seed,
        load_quantiser(cfg.warm_start) if cfg.warm_start else None,
        cfg.codebook_tolerance,
    )
    window = trainer.history[-max(1, len(trainer.history) // 10) :]
    seconds = round(time.perf_counter() - started, 3)
    summary = {
        "summary": True,
        "steps": trainer.step,
        "epochs": round(trainer.step / layout.batches_per_epoch, 3),
        "warm_start": storage.name(cfg.warm_start) if cfg.warm_start else None,
        "rows": len(rows),
        "rows_by_type": {t: int((rows.node_type == t).sum()) for t in sorted(set(rows.node_type.tolist()))},
        "pairs": len(stacked.pairs),
        "pairs_by_period": list(stacked.pairs_by_period),
        "validation_pairs": len(validation_pairs) if validation_pairs else 0,
        "validation_users": int(len(np.unique(validation_pairs.user_id))) if validation_pairs else 0,
        "pairs_missing_rows": stacked.pairs.missing,
        "pairs_by_weight": {
            str(w): int(n) for w, n in zip(*np.unique(stacked.pairs.weight, return_counts=True), strict=True)
        },
        "next_period": period.lineage,
        "best_validation": (
            {"recall_at_50": trainer.best["metric"], "step": trainer.best["step"]} if trainer.best else None
        ),
        "continued_validation": continued.get("validation_recall_at_50"),
        "final_loss": sum(m["loss"] for m in window) / len(window),
        "final_distill": sum(m["distill"] for m in window) / len(window),
        "final_retrieval": sum(m["retrieval"] for m in window) / len(window),
        "final_stability": sum(m.get("stability", 0.0) for m in window) / len(window),
        "ln_k": math.log(model_config.num_prototypes),
        "collapsed": verdict.collapsed,
        "collapse_detail": verdict.detail,
        "day_prototype_usage": verdict.prototype_usage,
        "day_embedding_std": verdict.embedding_std,
        "quantiser": quantiser_metrics,
        "seconds": seconds,
    }
    lineage = {
        "model_version": version,
        "ds": str(cfg.ds),
        "inputs": {
            "neighbourhoods": inputs.neighbourhoods.lineage(),
            "edges": inputs.edges,
            "next_period": period.lineage,
            "entity_content": inputs.content.lineage() if inputs.content else None,
        },
        "code_version": code,
        "seed": cfg.seed,
        "loader": cfg.loader,
        "device": str(device),
        "torch_version": torch.__version__,
        "resumed_from_step": resumed_from,
        "warm_start": (
            {
                "version": storage.name(cfg.warm_start),
                "path": cfg.warm_start,
                "ds": str(model_day(cfg.warm_start)),
            }
            if cfg.warm_start
            else None
        ),
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    config = {
        "model": model_config.to_dict(),
        "train": train_config.to_dict(),
        "quantiser": {k: quantiser_metrics[k] for k in ("levels", "codes_per_level", "fit_rows")},
        "job": {k: str(v) if isinstance(v, dt.date) else v for k, v in asdict(cfg).items()},
    }
    try:
        path = write_model_dir(
            final, trainer.state(), config, trainer.history + [summary], lineage, quantiser
        )
    except FileExistsError as err:
        raise HirError(str(err)) from None
    with contextlib.suppress(OSError, HirError):  # the version is written: a leftover work folder is harmless
        storage.remove(run_dir)
    log.counts.update(
        rows_in=len(rows),
        pairs=len(stacked.pairs),
        steps=trainer.step,
        collapsed=verdict.collapsed,
        model=str(path),
    )
    log.emit()
    return TrainReport(
        version,
        path,
        trainer.step,
        seconds,
        verdict.collapsed,
        verdict.detail,
        summary,
        collapse_allowed=cfg.allow_collapsed,
    )


def main(argv: Sequence[str] | None = None) -> int:
    cfg = config_from_args(argv)
    if cfg.version:  # a named version that exists is refused before any Spark work
        refuse_existing(model_path(storage.join(cfg.models, cfg.version)))
    from jobs.common.spark import get_spark

    spark = get_spark("hir-train")
    inputs = resolve_inputs(spark, cfg)
    report = train(cfg, inputs)
    print(report.line())
    if report.collapsed:
        print(f"COLLAPSED: {report.collapse_detail}", file=sys.stderr)
    if report.failed:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run_job(main))
