"""Training loop: the next-period retrieval objective on the served network, regularised by cross-view
distillation.

One step on a RetrievalBatch (hir_model.pairs):
    users, positive items, uniform negatives --full view--> student --> mixed-negative softmax (hir_model.objective)
    users, negatives --sparse view--> student --head--> student logits   (gradients)
    users, negatives --full view----> teacher --head--> teacher logits   (EMA of the student, no gradients)
    users, items, negatives, served users --> anchor's embeddings (yesterday's student, warm starts only: computed
                                              once per run by anchor_rows, looked up by row each step)
    loss = retrieval_weight * retrieval + distill_weight * DINO(student | teacher)
           + stability_weight * mean(1 - cos(student, anchor))

The stability term is function-space anchoring (Learning without Forgetting, Li & Hoiem 2016; TwHIN warm-starts
for the same reason): a warm-started run learns the new day, but an entity whose neighbourhood did not change keeps
about the embedding yesterday's model gave it, so the rankers trained on yesterday's features and the token ids
(hir_model.quantiser, seeded from yesterday's codebooks) keep their meaning. It anchors outputs, not weights: the
network is free to move where the served embeddings do not notice.

The **student** is what gets served (`embed`, hir_model.checkpoint.load_model): the network and the view the
retrieval objective trains are the ones the embedding job runs, so every edge type of a served row, deep ones
included, gets gradients. The teacher exists for the self-supervised term only (its ablation measures it).
Model selection: the job validates after each epoch and `record_validation` keeps the best student, which
`restore_best` puts back before the model is written.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hir_model import storage
from hir_model.batch import TokenBatch, sparse_view
from hir_model.checkpoint import load_weights, read_config, read_metrics, write_model_dir
from hir_model.config import ModelConfig, TrainConfig
from hir_model.distillation import (
    DINOHead,
    collapse_report,
    cosine_schedule,
    distillation_loss,
    ema_update,
    teacher_temp_schedule,
    update_center,
)
from hir_model.encoder import HIREncoder
from hir_model.objective import batch_loss
from hir_model.pairs import PairBatches, RetrievalBatch
from hir_model.quantiser import ResidualQuantiser

Loader = Iterable[RetrievalBatch]


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def densify_sparse_grads(params: list[nn.Parameter]) -> None:
    """Replace each sparse gradient (the id table's: encoder.TokenFeatures) by its dense sum, once per step, so
    clipping and AdamW see the gradient a dense table would have had, at the cost of one dense table instead of
    one per lookup."""
    for param in params:
        if param.grad is not None and param.grad.is_sparse:
            param.grad = param.grad.to_dense()


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
        self.best: dict[str, Any] | None = None  # record_validation: metric, step, student weights
        self.anchor: HIREncoder | None = None  # warm starts: the continued model, frozen (stability term)
        # The anchor's embeddings of a loader's input and served user rows (anchor_rows), and that loader
        self.anchored: tuple[Tensor, Tensor] | None = None
        self._anchored_for: PairBatches | None = None

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

    def train_step(self, batch: RetrievalBatch) -> dict[str, Any]:
        """One optimisation step on a batch of next-period pairs; returns the step's metrics (JSON-ready)."""
        cfg, tc = self.model_config, self.train_config
        batch = batch.to(self.device)
        step = self.step
        lr, momentum, teacher_temp = self.lr_at(step), self.momentum_at(step), self.teacher_temp_at(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

        self.student.train()
        self.student_head.train()
        # Retrieval trains the served network on the served view: every token a served row holds, deep ones too.
        users = self.student(batch.users)  # (B, D)
        items = self.student(batch.items)  # (B, D)
        negatives = (  # (M, D); a corpus without items (tests, odd days) gives in-batch negatives only
            self.student(batch.negatives)
            if batch.negatives.batch_size
            else users.new_zeros(0, users.shape[1])
        )
        retrieval = batch_loss(batch, users, items, negatives, cfg.retrieval_temp)
        report: dict[str, Any] = {}
        distill = retrieval.new_zeros(())
        if cfg.distill_weight > 0:
            distill, report = self._distillation(batch, teacher_temp)
        stability = retrieval.new_zeros(())
        if self.anchor is not None:  # set only for warm starts with stability_weight > 0
            stability = self._stability(batch, (users, items, negatives))
        loss = (
            cfg.distill_weight * distill + cfg.retrieval_weight * retrieval + cfg.stability_weight * stability
        )

        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        densify_sparse_grads(params)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, tc.grad_clip)
        self.optimizer.step()
        ema_update(self.teacher, self.student, momentum)
        ema_update(self.teacher_head, self.student_head, momentum)
        self.step += 1
        metrics = {
            "step": self.step,
            "loss": float(loss.detach()),
            "distill": float(distill.detach()),
            "retrieval": float(retrieval.detach()),
            "stability": float(stability.detach()),
            "pairs": batch.users.batch_size,
            "negatives": batch.negatives.batch_size,
            "grad_norm": float(grad_norm),
            "lr": lr,
            "momentum": momentum,
            "teacher_temp": teacher_temp,
            "embedding_std": float(users.detach().std(dim=0).mean()),
            **report,
        }
        self.history.append(metrics)
        return metrics

    def _stability(self, batch: RetrievalBatch, embedded: tuple[Tensor, ...]) -> Tensor:
        """Mean 1 - cosine between the student's embeddings of the step's rows (users, positives, uniform corpus
        items: already computed for retrieval; the served user rows drawn for the term) and the anchor's of the
        same rows, on the full view, looked up in the tables anchor_rows computed once: the anchor is frozen, so
        a row's embedding by it never changes. Running it every step made a warm step 1.30x a cold one; the
        lookups leave 1.10x, the student's pass over the served users (bench/train_step.py)."""
        if self.anchored is None or batch.input_rows is None:
            raise ValueError(
                "a warm start's stability term reads the continued model's embeddings of the loader's rows: "
                "train with fit(PairBatches) or call anchor_rows(loader) first"
            )
        inputs, served = self.anchored
        student, anchored = [torch.cat(embedded)], [inputs[batch.input_rows]]
        if batch.anchor_users is not None and batch.served_rows is not None and batch.anchor_users.batch_size:
            student.append(self.student(batch.anchor_users))
            anchored.append(served[batch.served_rows])
        return (1.0 - F.cosine_similarity(torch.cat(student), torch.cat(anchored), dim=-1)).mean()

    def _distillation(self, batch: RetrievalBatch, teacher_temp: float) -> tuple[Tensor, dict[str, Any]]:
        """DINO between the student's sparse view and the EMA teacher's full view, on the batch's users and some of
        its uniform corpus items (so every kind of served row is regularised, not only converted items)."""
        cfg = self.model_config
        # A quarter as many corpus items as users: the term regularises every kind of row at a fraction of the
        # cost of a second pass over all negatives (bench/train_step.py).
        corpus = batch.negatives.select(
            torch.arange(min(batch.negatives.batch_size, batch.users.batch_size // 4))
        )
        rows = tuple(r for r in (batch.users, corpus) if r.batch_size)
        with torch.no_grad():
            teacher_logits = [self.teacher_head(self.teacher(r)) for r in rows]
        temps = (cfg.student_temp, teacher_temp)
        losses = [
            distillation_loss(
                self.student_head(self.student(sparse_view(r, self.view_generator, cfg.token_dropout))),
                t,
                self.center,
                *temps,
            )
            for r, t in zip(rows, teacher_logits, strict=True)
        ]
        distill = sum(losses) / len(losses)
        logits = torch.cat(teacher_logits)
        probs = F.softmax((logits - self.center) / teacher_temp, dim=-1)
        report = collapse_report(
            probs,
            float(distill.detach()),
            cfg.num_prototypes,
            warmed_up=self.step >= cfg.teacher_temp_warmup_steps,
        )
        self.center = update_center(self.center, logits, cfg.center_momentum)
        return distill, report

    def fit(
        self,
        loader: Loader,
        steps: int | None = None,
        on_metrics: Callable[[dict[str, Any]], None] | None = None,
        checkpoint_root: str | Path | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> list[dict[str, Any]]:
        """Train for `steps` more steps (default: up to train_config.steps), until the loader runs out, or until
        `stop()` says so (checked after each step's checkpoint).

        With `checkpoint_root` (a path or URI) and train_config.checkpoint_every > 0, saves `<root>/step-NNNNNNNN`
        every N steps.
        """
        remaining = steps if steps is not None else self.train_config.steps - self.step
        every = self.train_config.checkpoint_every
        done: list[dict[str, Any]] = []
        if remaining <= 0:
            return done
        if self.anchor is not None and isinstance(loader, PairBatches) and loader is not self._anchored_for:
            self.anchor_rows(loader)
        for batch in loader:
            metrics = self.train_step(batch)
            done.append(metrics)
            if on_metrics is not None:
                on_metrics(metrics)
            if checkpoint_root is not None and every > 0 and self.step % every == 0:
                self.save(storage.join(checkpoint_root, f"step-{self.step:08d}"))
            if len(done) >= remaining or (stop is not None and stop()):
                break
        return done

    @torch.no_grad()
    def anchor_rows(self, loader: PairBatches) -> None:
        """Embed the loader's rows by the anchor once (a warm start's stability term looks them up; `fit` calls
        this for a PairBatches loader). Memory: (input rows + served rows) x dim floats."""
        if self.anchor is None:
            raise ValueError("no anchor: anchor_rows is for warm starts with stability_weight > 0")
        self.anchored = loader.embed_rows(lambda rows: self.anchor(rows.to(self.device)))
        self._anchored_for = loader

    @torch.no_grad()
    def embed(self, batch: TokenBatch) -> Tensor:
        """Serving embeddings (B, dim): the student, which the retrieval objective trains, on the full view."""
        self.student.eval()
        return self.student(batch.to(self.device))

    # -- model selection -----------------------------------------------------------------------------------

    def record_validation(self, metric: float) -> bool:
        """Keep the student of the best validation metric so far; True when this one is the best."""
        if self.best is not None and metric <= self.best["metric"]:
            return False
        student = {k: v.detach().clone().cpu() for k, v in self.student.state_dict().items()}
        self.best = {"metric": float(metric), "step": self.step, "student": student}
        return True

    def restore_best(self) -> None:
        """Load the best validated student back (what gets served); no-op without a validation."""
        if self.best is not None:
            self.student.load_state_dict(self.best["student"])

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
            "best": self.best,
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
    ) -> Path | str:
        """Write a new model version directory, local or remote (refuses to overwrite one)."""
        config = {"model": self.model_config.to_dict(), "train": self.train_config.to_dict()}
        return write_model_dir(model_dir, self.state(), config, self.history, lineage, quantiser)

    def warm_start(self, model_dir: str | Path) -> None:
        """Continue from another model version (yesterday's): its networks, AdamW moments and DINO centre, under
        this run's schedules (the step counter starts at 0, so the lr warm-up and decay span this run). The
        architecture must match; a mismatch is a ValueError naming the first differing tensor."""
        state = load_weights(model_dir, map_location=self.device)
        for name in ("student", "teacher", "student_head", "teacher_head"):
            try:
                getattr(self, name).load_state_dict(state[name])
            except RuntimeError as err:
                reason = " ".join(str(err).split())[:300]
                raise ValueError(
                    f"{storage.name(model_dir)} has another architecture ({name}: {reason})"
                ) from None
        decay = [group["weight_decay"] for group in self.optimizer.param_groups]
        self.optimizer.load_state_dict(state["optimizer"])
        for group, weight_decay in zip(self.optimizer.param_groups, decay, strict=True):
            group["weight_decay"] = weight_decay  # this run's settings, the moments of the last one
        self.center = state["center"].to(self.device)
        self._anchor_on(state["student"])

    def anchor_to(self, model_dir: str | Path) -> None:
        """Anchor the stability term to a model version's student (what `warm_start` does; a resumed warm-started
        run calls it again, since checkpoints do not carry the anchor: the version it names is immutable)."""
        if self.model_config.stability_weight > 0:
            self._anchor_on(load_weights(model_dir, map_location=self.device)["student"])

    def _anchor_on(self, student_state: dict[str, Tensor]) -> None:
        """A frozen copy of the student holding `student_state`; none when the stability term is off (weight 0),
        so a warm start without it keeps no second network in memory."""
        if self.model_config.stability_weight <= 0:
            return
        anchor = copy.deepcopy(self.student)
        anchor.load_state_dict(student_state)
        self.anchor = anchor.eval().requires_grad_(False)
        self.anchored, self._anchored_for = None, None  # another anchor: its tables are computed anew

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
        trainer.best = state.get("best")
        rng = state["rng"]
        torch.set_rng_state(rng["torch"].cpu())
        if rng["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([s.cpu() for s in rng["cuda"]])
        trainer.view_generator.set_state(rng["view_generator"].cpu())
        trainer.history = read_metrics(model_dir)
        return trainer
