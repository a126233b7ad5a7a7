"""A training run's life: its work folder under `<model-dir>/.runs/<version>/` (run key, checkpoints, the live
metrics log), a fresh start or `--resume` from the latest checkpoint, the epoch-end validation that stops it, the
progress line, and the report of the finished run.

The work folder lives where the model root does (a path, s3a://, hdfs://), so a run killed on one machine resumes
on another; each checkpoint is written like a model version (hir_model.checkpoint), so a checkpoint killed while it
was written is ignored. A remote store cannot append, so there the live metrics log is a local file in storage's
cache (`<HIR_CACHE_DIR>/runs/`); the checkpoints carry the steps' metrics either way.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

from hir_model import storage
from hir_model.checkpoint import ModelPath, is_complete, read_metrics, version_exists
from hir_model.config import ModelConfig, TrainConfig
from hir_model.pairs import PairBatches
from hir_model.selection import Validation
from hir_model.trainer import Trainer
from jobs.common.errors import HirError

RUNS_DIR = ".runs"  # under the model root: work folders of runs in progress (checkpoints, live metrics log)


def refuse_existing(model_dir: ModelPath) -> ModelPath:
    if version_exists(model_dir):
        raise HirError(
            f"model version {model_dir} already exists; versions are immutable: pass another --version"
        )
    return model_dir


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise HirError("--device cuda: torch sees no GPU on this machine")
    return torch.device(name)


class Progress:
    """One stderr line: step, share, loss terms, prototype usage, speed, ETA. Live (\\r) on a terminal, else
    printed every 5% of the run so logs stay short."""

    def __init__(self, label: str, total: int, start: int, live: bool | None, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.label, self.total, self.start = label, total, start
        self.live = self.stream.isatty() if live is None else live
        self.every = max(1, total // 20)
        self.started = time.perf_counter()

    def update(self, metrics: dict[str, Any]) -> None:
        step = metrics["step"]
        if not self.live and step % self.every and step != self.total:
            return
        done = step - self.start
        rate = done / max(time.perf_counter() - self.started, 1e-9)
        eta = (self.total - step) / rate if rate > 0 else 0.0
        distill = (
            f"distill {metrics['distill']:.3f} (ln K {metrics['ln_k']:.2f}) usage {metrics['usage']:.2f} "
            if "ln_k" in metrics
            else ""
        )
        stability = f"stability {metrics['stability']:.4f} " if metrics.get("stability") else ""
        validated = (
            f"| validation loss {metrics['validation_loss']:.3f} recall@50 {metrics['validation_recall_at_50']:.3f} "
            if "validation_recall_at_50" in metrics
            else ""
        )
        line = (
            f"[{self.label}] step {step}/{self.total} {100 * step / self.total:3.0f}% | loss {metrics['loss']:.3f} "
            f"{distill}retrieval {metrics['retrieval']:.3f} {stability}{validated}| {rate:.2f} step/s eta {eta:.0f}s"
        )
        if self.live:
            end = "\n" if step == self.total else ""
            print("\r" + line, end=end, file=self.stream, flush=True)
        else:
            print(line, file=self.stream, flush=True)


@dataclass(frozen=True)
class TrainReport:
    version: str
    path: ModelPath
    steps: int
    seconds: float
    collapsed: bool
    collapse_detail: str
    summary: dict[str, Any]
    reused: bool = False  # the derived version existed already: same flags, inputs and code, nothing trained
    collapse_allowed: bool = False  # --allow-collapsed: a collapse is reported, not a failure

    @property
    def failed(self) -> bool:
        return self.collapsed and not self.collapse_allowed

    @classmethod
    def of_existing(cls, path: ModelPath, collapse_allowed: bool = False) -> TrainReport:
        summary = read_metrics(path)[-1]
        return cls(
            storage.name(path),
            path,
            summary["steps"],
            0.0,
            summary["collapsed"],
            summary["collapse_detail"],
            summary,
            True,
            collapse_allowed,
        )

    def line(self) -> str:
        q = self.summary["quantiser"]
        purity_text = (
            f", item level-0 purity {q['item_category_purity']:.3f} (chance {q['item_category_purity_chance']:.3f})"
            if "item_category_purity" in q
            else ""
        )
        state = ("COLLAPSED" if self.collapsed else "ok") + (
            ", existed already: nothing trained" if self.reused else ""
        )
        warm = self.summary.get("warm_start")
        kept = (q.get("alignment") or {}).get("code_kept")
        ratio = q.get("kept_error_ratio")
        pull = q.get("anchor_pull")
        codebooks = (
            f", codebooks {q['codebooks']}"
            + (f" with pull {pull:g} ({q['error_ratio']:.2f}x a refit's error)" if pull is not None else "")
            + f" (yesterday's: {ratio:.2f}x a refit's error)"
            if ratio is not None
            else ""
        )
        continuity = (
            (f", warm from {warm}" if warm else ", cold start")
            + codebooks
            + (f", token ids kept {[None if k is None else round(k, 3) for k in kept]}" if kept else "")
        )
        return (
            f"model {self.version} [{state}]: {self.steps} steps in {self.seconds:.1f}s on "
            f"{self.summary['rows']} rows / {self.summary['pairs']} conversion pairs{continuity}; final loss "
            f"{self.summary['final_loss']:.3f}, distill {self.summary['final_distill']:.3f} (ln K "
            f"{self.summary['ln_k']:.3f}); quantiser {q['levels']}x{q['codes_per_level']} usage "
            f"{[round(u, 3) for u in q['usage']]}, collisions {q['collision_rate']:.3f}{purity_text} -> {self.path}"
        )


CHECKPOINT_PREFIX = "step-"


def _checkpoints(folder: str) -> list[str]:
    """The complete checkpoints in a run's folder, oldest first (a killed checkpoint write has no weights.pt)."""
    names = [n for n in storage.listdir(folder) if n.startswith(CHECKPOINT_PREFIX)]
    return [storage.join(folder, n) for n in names if is_complete(storage.join(folder, n))]


def _prune_checkpoints(folder: str) -> None:
    """Keep the latest complete checkpoint; drop every older step folder, complete or not."""
    complete = _checkpoints(folder)
    if not complete:
        return
    keep = storage.name(complete[-1])
    for name in storage.listdir(folder):
        if name.startswith(CHECKPOINT_PREFIX) and name < keep:
            with contextlib.suppress(OSError):
                storage.remove(storage.join(folder, name))


def start_or_resume(
    resume: bool, version: str, run_dir: str | Path, run_key: dict[str, Any], device: torch.device
) -> tuple[Trainer, int | None]:
    """A fresh trainer in a fresh run folder, or (--resume) the run's latest checkpoint, refusing one that was
    started with other settings. Returns the trainer and the step it resumed from (None when fresh)."""
    checkpoints = storage.join(run_dir, "checkpoints")
    found = _checkpoints(checkpoints)
    latest = found[-1] if found else None
    run_file = storage.join(run_dir, "run.json")
    if resume:
        if latest is None:
            raise HirError(f"--resume: no checkpoint of version {version} under {checkpoints}")
        saved = json.loads(storage.read_text(run_file)) if storage.is_file(run_file) else None
        if saved != json.loads(json.dumps(run_key)):
            raise HirError(
                f"--resume: the run of version {version} was started with other flags or inputs; "
                "resume it with the same ones"
            )
        trainer = Trainer.resume(latest, device=device)
        return trainer, trainer.step
    if storage.exists(run_dir):
        note = f" (last checkpoint {storage.name(latest)})" if latest else ""
        print(
            f"note: discarding an interrupted run of {version}{note}; pass --resume to continue one",
            file=sys.stderr,
        )
        storage.remove(run_dir)
    storage.write_text(run_file, json.dumps(run_key, indent=2, sort_keys=True) + "\n")
    model_config = ModelConfig.from_dict(run_key["model"])
    return Trainer(model_config, TrainConfig.from_dict(run_key["train"]), device=device), None


def live_log(run_dir: str | Path) -> Path:
    """The run's live metrics.jsonl (tail -f): in the run folder when it is local, else a local file in storage's
    cache named after the run folder."""
    if storage.is_local(run_dir):
        return storage.local_path(run_dir) / "metrics.jsonl"
    tag = hashlib.sha256(storage.normalise(run_dir).encode()).hexdigest()[:12]
    return storage.cache_root() / "runs" / f"{storage.name(run_dir)}-{tag}.metrics.jsonl"


@dataclass(frozen=True)
class EpochSelection:
    """Validate at each epoch's end and, in an epoch longer than `every` steps, at evenly spaced steps inside it
    (`every` 0: at epoch ends only); stop after `patience` validations without a better validation recall@50.

    Counting patience in validations rather than epochs keeps the wait after the best model proportionate to the
    pairs seen: with several training periods an epoch is several times longer while validation recall still
    peaks after about the same number of pairs."""

    validation: Validation | None
    content: Any
    steps_per_epoch: int
    patience: int
    every: int = 0

    @property
    def per_epoch(self) -> int:
        """Validations per epoch: evenly spaced at most `every` steps apart, the last one at the epoch's end."""
        if not self.every or self.every >= self.steps_per_epoch:
            return 1
        return math.ceil(self.steps_per_epoch / self.every)

    def validations_through(self, step: int) -> int:
        """How many validations have run after steps 1 .. step: an epoch's j-th runs after its step
        ceil(j * steps_per_epoch / per_epoch). (Floor division makes step -1 count -1, so step 0 validates.)"""
        epochs, position = divmod(step, self.steps_per_epoch)
        return epochs * self.per_epoch + position * self.per_epoch // self.steps_per_epoch

    def validates_at(self, step: int) -> bool:
        """Whether the validation runs after `step` (step 0: a warm start's continued model)."""
        return self.validations_through(step) > self.validations_through(step - 1)

    def after_step(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        if self.validation is None or not self.validates_at(trainer.step):
            return
        score = self.validation.score(trainer.embed, trainer.model_config.retrieval_temp, self.content)
        metrics["validation_loss"] = score["loss"]
        metrics["validation_recall_at_50"] = score["recall"]
        metrics["validation_best"] = trainer.record_validation(score["recall"])

    def should_stop(self, trainer: Trainer) -> bool:
        if self.validation is None or trainer.best is None:
            return False
        return self.validations_after(trainer.best["step"], trainer.step) >= self.patience

    def validations_after(self, start: int, end: int) -> int:
        """How many validations ran after steps start + 1 .. end."""
        return self.validations_through(end) - self.validations_through(start)


def fit_logged(
    trainer: Trainer, loader: PairBatches, run_dir: str | Path, progress: Progress, selection: EpochSelection
) -> None:
    """Train until the loader ends or the selection stops it, appending every step to the run's live
    metrics.jsonl (tail -f) and the progress line, keeping only the latest checkpoint."""
    checkpoints = storage.join(run_dir, "checkpoints")
    every = trainer.train_config.checkpoint_every
    log = live_log(run_dir)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as live:
        for row in trainer.history:  # a resumed run's log starts with the steps it keeps
            live.write(json.dumps(row, sort_keys=True) + "\n")
        live.flush()

        def on_metrics(metrics: dict[str, Any]) -> None:
            selection.after_step(trainer, metrics)
            live.write(json.dumps(metrics, sort_keys=True) + "\n")
            live.flush()
            progress.update(metrics)
            # fit saves this step's checkpoint right after; once the last step saved one, drop the older ones
            # (a listing per checkpoint, not per step: on an object store each is a request).
            if every > 0 and (trainer.step - 1) % every == 0:
                _prune_checkpoints(checkpoints)

        trainer.fit(
            loader,
            on_metrics=on_metrics,
            checkpoint_root=checkpoints,
            stop=lambda: selection.should_stop(trainer),
        )
