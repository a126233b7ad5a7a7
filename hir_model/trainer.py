"""Training loop: cross-view distillation (EMA teacher on the rich view, student on the sparse view) plus
in-batch retrieval of each user's converted item.

One step:
    users, items --sparse_view--> student --head--> student logits     (gradients)
    users, items ---------------> teacher --head--> teacher logits     (EMA of the student, no gradients)
    loss = distill_weight * DINO(student | teacher) on users and items
         + retrieval_weight * in-batch softmax(student user, student item of the user's conversion)

The retrieval side uses the *student* item embedding (of the item's sparse view) so gradients reach the encoder
from both ends; the sparse view also strips the item's deep-funnel edges, among them the converting user,
which would otherwise make the positive trivially identifiable. Embeddings are served by the *teacher* (as in
DINO): it sees the full neighbourhood and, as an average of recent students, is the steadier network.

A loader is any iterable of (users TokenBatch, pos_items TokenBatch, item_log_pop (B,) tensor), row i of
pos_items being an item user i converted on; a fourth element `is_pair` (B,) bool, when present, marks the rows
that are such pairs, and the other rows then train the distillation only (entities without conversions).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hir_model.batch import TokenBatch, sparse_view
from hir_model.checkpoint import load_weights, read_config, read_metrics, write_model_dir
from hir_model.config import ModelConfig, TrainConfig
from hir_model.distillation import (
    DINOHead,
    collapse_report,
    cosine_schedule,
    distillation_loss,
    ema_update,
    retrieval_loss,
    teacher_temp_schedule,
    update_center,
)
from hir_model.encoder import HIREncoder
from hir_model.quantiser import ResidualQuantiser

Loader = Iterable[tuple[TokenBatch, TokenBatch, Tensor] | tuple[TokenBatch, TokenBatch, Tensor, Tensor]]


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _param_groups(modules: list[nn.Module], weight_decay: float) -> list[dict[str, Any]]:
    """Decay matrices and embedding tables; not biases, norms or the attention bias tables (nanoGPT, DINO)."""
    decay, no_decay = [], []
    for module in modules:
        for name, param in module.named_parameters():
            if param.ndim < 2 or name.endswith("_bias"):
                no_decay.append(param)
            else:
                decay.append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class Trainer:
    """Owns student, teacher, heads, optimiser, centre, step counter and RNG state; see the module docstring."""

    def __init__(
        self, model_config: ModelConfig, train_config: TrainConfig, device: str | torch.device | None = None
    ) -> None:
        self.model_config = model_config
        self.train_config = train_config
        self.device = torch.device(device) if device is not None else default_device()
        # Seeds the global RNG (weight init, dropout); resume() restores it, so reruns are bit-identical.
        torch.manual_seed(train_config.seed)
        cfg = model_config
        self.student = HIREncoder(cfg).to(self.device)
        self.student_head = DINOHead(cfg.dim, cfg.num_prototypes, cfg.head_hidden, cfg.head_bottleneck).to(
            self.device
        )
        # DINO: the teacher starts as a copy of the student and only ever moves by EMA.
        self.teacher = copy.deepcopy(self.student).eval().requires_grad_(False)
        self.teacher_head = copy.deepcopy(self.student_head).eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            _param_groups([self.student, self.student_head], train_config.weight_decay), lr=train_config.lr
        )
        self.center = torch.zeros(cfg.num_prototypes, device=self.device)
        self.step = 0
        # Student-view coin flips come from their own CPU generator: same draws on every device, saved with the model.
        self.view_generator = torch.Generator().manual_seed(train_config.seed + 1)
        self.history: list[dict[str, Any]] = []

    # -- schedules -----------------------------------------------------------------------------------------

    def lr_at(self, step: int) -> float:
        """Linear warm-up, then cosine decay to min_lr (DINO)."""
        tc = self.train_config
        if step < tc.warmup_steps:
            return tc.lr * (step + 1) / tc.warmup_steps
        return cosine_schedule(tc.lr, tc.min_lr, step - tc.warmup_steps, max(tc.steps - tc.warmup_steps, 1))

    def momentum_at(self, step: int) -> float:
        cfg = self.model_config
        return cosine_schedule(cfg.ema_momentum_base, cfg.ema_momentum_final, step, self.train_config.steps)

    def teacher_temp_at(self, step: int) -> float:
        cfg = self.model_config
        return teacher_temp_schedule(
            step, cfg.teacher_temp_warmup, cfg.teacher_temp, cfg.teacher_temp_warmup_steps
        )

    # -- training ------------------------------------------------------------------------------------------

    def train_step(
        self, users: TokenBatch, pos_items: TokenBatch, item_log_pop: Tensor, is_pair: Tensor | None = None
    ) -> dict[str, Any]:
        """One optimisation step; returns the step's metrics (JSON-ready).

        `is_pair` (B,) bool: rows whose pos_items row is a conversion of the user; only those enter the retrieval
        loss (in-batch negatives from the other pairs). Default: every row is a pair.
        """
        cfg, tc = self.model_config, self.train_config
        users, pos_items = users.to(self.device), pos_items.to(self.device)
        item_log_pop = item_log_pop.to(self.device)
        step = self.step
        lr, momentum, teacher_temp = self.lr_at(step), self.momentum_at(step), self.teacher_temp_at(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

        self.student.train()
        self.student_head.train()
        student_users = self.student(sparse_view(users, self.view_generator, cfg.token_dropout))  # (B, D)
        student_items = self.student(sparse_view(pos_items, self.view_generator, cfg.token_dropout))  # (B, D)
        with torch.no_grad():
            teacher_users, teacher_items = self.teacher(users), self.teacher(pos_items)  # rich views
            teacher_logits_users = self.teacher_head(teacher_users)  # (B, K)
            teacher_logits_items = self.teacher_head(teacher_items)

        temps = (cfg.student_temp, teacher_temp)
        distill_users = distillation_loss(
            self.student_head(student_users), teacher_logits_users, self.center, *temps
        )
        distill_items = distillation_loss(
            self.student_head(student_items), teacher_logits_items, self.center, *temps
        )
        distill = (distill_users + distill_items) / 2
        if is_pair is None:
            retrieval = retrieval_loss(
                student_users,
                student_items,
                item_log_pop,
                cfg.retrieval_temp,
                item_ids=pos_items.node_id[:, 0],
            )
            num_pairs = users.batch_size
        else:
            is_pair = is_pair.to(self.device)
            num_pairs = int(is_pair.sum())
            if num_pairs == 0:
                # A batch without conversions has no retrieval term (a cross-entropy over no rows is NaN).
                retrieval = student_users.sum() * 0.0
            else:
                retrieval = retrieval_loss(
                    student_users[is_pair],
                    student_items[is_pair],
                    item_log_pop[is_pair],
                    cfg.retrieval_temp,
                    item_ids=pos_items.node_id[is_pair, 0],
                )
        loss = cfg.distill_weight * distill + cfg.retrieval_weight * retrieval

        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, tc.grad_clip)
        self.optimizer.step()
        ema_update(self.teacher, self.student, momentum)
        ema_update(self.teacher_head, self.student_head, momentum)

        teacher_logits = torch.cat([teacher_logits_users, teacher_logits_items])  # (2B, K)
        teacher_probs = F.softmax((teacher_logits - self.center) / teacher_temp, dim=-1)
        report = collapse_report(
            teacher_probs,
            float(distill.detach()),
            cfg.num_prototypes,
            embeddings=teacher_users,
            warmed_up=step >= cfg.teacher_temp_warmup_steps,
        )
        self.center = update_center(self.center, teacher_logits, cfg.center_momentum)
        self.step += 1
        metrics = {
            "step": self.step,
            "loss": float(loss.detach()),
            "distill": float(distill.detach()),
            "distill_users": float(distill_users.detach()),
            "distill_items": float(distill_items.detach()),
            "retrieval": float(retrieval.detach()),
            "pairs": num_pairs,
            "grad_norm": float(grad_norm),
            "lr": lr,
            "momentum": momentum,
            "teacher_temp": teacher_temp,
            **report,
        }
        self.history.append(metrics)
        return metrics

    def fit(
        self,
        loader: Loader,
        steps: int | None = None,
        on_metrics: Callable[[dict[str, Any]], None] | None = None,
        checkpoint_root: str | Path | None = None,
    ) -> list[dict[str, Any]]:
        """Train for `steps` more steps (default: up to train_config.steps) or until the loader runs out.

        With `checkpoint_root` and train_config.checkpoint_every > 0, saves `<root>/step-NNNNNNNN` every N steps.
        """
        remaining = steps if steps is not None else self.train_config.steps - self.step
        every = self.train_config.checkpoint_every
        done: list[dict[str, Any]] = []
        if remaining <= 0:
            return done
        for batch in loader:
            metrics = self.train_step(*batch)
            done.append(metrics)
            if on_metrics is not None:
                on_metrics(metrics)
            if checkpoint_root is not None and every > 0 and self.step % every == 0:
                self.save(Path(checkpoint_root) / f"step-{self.step:08d}")
            if len(done) >= remaining:
                break
        return done

    @torch.no_grad()
    def embed(self, batch: TokenBatch) -> Tensor:
        """Serving embeddings (B, dim): the teacher on the full view, eval mode."""
        self.teacher.eval()
        return self.teacher(batch.to(self.device))

    # -- persistence ---------------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Everything needed to continue training exactly, as plain tensors and containers."""
        return {
            "student": self.student.state_dict(),
            "teacher": self.teacher.state_dict(),
            "student_head": self.student_head.state_dict(),
            "teacher_head": self.teacher_head.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "center": self.center,
            "step": self.step,
            "rng": {
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
                "view_generator": self.view_generator.get_state(),
            },
        }

    def save(
        self,
        model_dir: str | Path,
        quantiser: ResidualQuantiser | None = None,
        lineage: dict[str, Any] | None = None,
    ) -> Path:
        """Write a new model version directory (refuses to overwrite one)."""
        config = {"model": self.model_config.to_dict(), "train": self.train_config.to_dict()}
        return write_model_dir(model_dir, self.state(), config, self.history, lineage, quantiser)

    @classmethod
    def resume(cls, model_dir: str | Path, device: str | torch.device | None = None) -> Trainer:
        """A trainer in exactly the state `save` wrote: further steps match an uninterrupted run."""
        model_config, train_config = read_config(model_dir)
        trainer = cls(model_config, train_config, device)
        state = load_weights(model_dir, map_location=trainer.device)
        trainer.student.load_state_dict(state["student"])
        trainer.teacher.load_state_dict(state["teacher"])
        trainer.student_head.load_state_dict(state["student_head"])
        trainer.teacher_head.load_state_dict(state["teacher_head"])
        trainer.optimizer.load_state_dict(state["optimizer"])
        trainer.center = state["center"].to(trainer.device)
        trainer.step = int(state["step"])
        rng = state["rng"]
        torch.set_rng_state(rng["torch"].cpu())
        if rng["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([s.cpu() for s in rng["cuda"]])
        trainer.view_generator.set_state(rng["view_generator"].cpu())
        trainer.history = read_metrics(model_dir)
        return trainer
