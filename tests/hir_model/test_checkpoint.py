from __future__ import annotations

import json
import os
import pickle
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

from hir_model.checkpoint import load_model, load_weights, read_metrics, write_model_dir
from hir_model.config import ModelConfig, TrainConfig
from hir_model.pairs import PairBatches, make_next_period_pairs
from hir_model.quantiser import ResidualQuantiser
from hir_model.synthetic import make_synthetic, synthetic_batches, synthetic_rows
from hir_model.trainer import Trainer

TRAIN = TrainConfig(lr=2e-3, steps=6, batch_size=32, warmup_steps=2, seed=11)


class NotAWeight:
    """Any custom class: a weights-only unpickler must refuse it."""


@pytest.fixture(scope="module")
def data():
    return make_synthetic(
        num_users=64,
        num_parents=2,
        clusters_per_parent=2,
        items_per_cluster=8,
        views_per_user=(2, 5),
        max_tokens=16,
        seed=5,
    )


def batches(data, steps: int, seed: int = 0) -> list:
    return list(synthetic_batches(data, batch_size=32, steps=steps, seed=seed))


def test_model_dir_round_trips_with_weights_only(tmp_path: Path, tiny_config: ModelConfig, data) -> None:
    trainer = Trainer(tiny_config, TRAIN, device="cpu")
    trainer.fit(batches(data, 2))
    embeddings = trainer.embed(data.users)
    quantiser = ResidualQuantiser(levels=2, codes_per_level=4).fit(embeddings)
    model_dir = trainer.save(tmp_path / "v1", quantiser=quantiser, lineage={"neighbourhoods": 3})
    assert sorted(p.name for p in model_dir.iterdir()) == [
        "config.json",
        "lineage.json",
        "metrics.jsonl",
        "quantiser.pt",
        "weights.pt",
    ]
    raw = torch.load(model_dir / "weights.pt", weights_only=True)  # loads without trusting pickle
    assert raw["step"] == 2 and raw["format"] == "hir-weights"
    assert json.loads((model_dir / "lineage.json").read_text()) == {"neighbourhoods": 3}
    assert [m["step"] for m in read_metrics(model_dir)] == [1, 2]
    loaded = load_model(model_dir)
    torch.testing.assert_close(loaded.encoder(data.users), embeddings)  # serving encoder = the student
    assert loaded.version == "v1" and loaded.config == tiny_config
    assert torch.equal(loaded.quantiser.encode(embeddings), quantiser.encode(embeddings))


def test_a_pickle_with_code_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    model_dir = write_model_dir(tmp_path / "v1", {"step": 1}, {})
    torch.save({"step": 1, "payload": NotAWeight()}, model_dir / "weights.pt")
    with pytest.raises(ValueError, match=r"checkpoint .*weights.pt is not a weights-only HIR checkpoint"):
        load_weights(model_dir)


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_tampered_and_foreign_files_are_refused(tmp_path: Path) -> None:
    model_dir = write_model_dir(tmp_path / "v1", {"student": OrderedDict(w=torch.ones(2))}, {})
    weights = model_dir / "weights.pt"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])  # truncated on copy
    with pytest.raises(ValueError, match="is not a weights-only HIR checkpoint"):
        load_weights(model_dir)
    weights.write_bytes(pickle.dumps({"step": 1}))  # a plain pickle, not a torch zip
    with pytest.raises(ValueError, match="is not a weights-only HIR checkpoint"):
        load_weights(weights)
    torch.save({"state_dict": torch.ones(1)}, weights)  # a valid torch file that is not ours
    with pytest.raises(ValueError, match="no 'hir-weights' format marker"):
        load_weights(weights)
    with pytest.raises(FileNotFoundError):
        load_weights(tmp_path / "missing")


def test_an_existing_version_is_never_overwritten(tmp_path: Path) -> None:
    write_model_dir(tmp_path / "v1", {"step": 1}, {"model": "first"})
    with pytest.raises(FileExistsError, match="model version .*v1 already exists"):
        write_model_dir(tmp_path / "v1", {"step": 2}, {"model": "second"})
    assert json.loads((tmp_path / "v1" / "config.json").read_text()) == {"model": "first"}


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        write_model_dir(tmp_path / "v1", {"step": 1}, {"not json": object()})
    assert os.listdir(tmp_path) == []


def test_resume_continues_exactly_like_an_uninterrupted_run(
    tmp_path: Path, tiny_config: ModelConfig, data
) -> None:
    # dropout on, so the restored global RNG state matters as much as the view generator's
    config = ModelConfig.from_dict({**tiny_config.to_dict(), "dropout": 0.1})
    steps = batches(data, 6, seed=3)
    uninterrupted = Trainer(config, TRAIN, device="cpu")
    uninterrupted.fit(steps)

    first_half = Trainer(config, TRAIN, device="cpu")
    first_half.fit(steps[:3])
    first_half.save(tmp_path / "step-3")
    torch.manual_seed(999)  # whatever happens in between must not matter
    resumed = Trainer.resume(tmp_path / "step-3", device="cpu")
    assert resumed.step == 3
    resumed.fit(steps[3:])

    assert resumed.step == uninterrupted.step == 6
    for name in ("student", "teacher", "student_head", "teacher_head"):
        expected, actual = getattr(uninterrupted, name).state_dict(), getattr(resumed, name).state_dict()
        for key in expected:
            assert torch.equal(actual[key], expected[key]), f"{name}.{key}"
    torch.testing.assert_close(resumed.center, uninterrupted.center, rtol=0, atol=1e-6)
    assert [m["loss"] for m in resumed.history] == pytest.approx([m["loss"] for m in uninterrupted.history])


def yesterdays_model(folder: Path, config: ModelConfig, data) -> Trainer:
    """Four steps of training, saved to `folder`: the model a warm start continues."""
    yesterday = Trainer(config, TRAIN, device="cpu")
    yesterday.fit(batches(data, 4, seed=1))
    yesterday.save(folder)
    return yesterday


def test_a_warm_start_continues_yesterdays_networks_and_moments_under_a_new_schedule(
    tmp_path: Path, tiny_config: ModelConfig, data
) -> None:
    yesterday = yesterdays_model(tmp_path / "yesterday", tiny_config, data)
    shorter = TrainConfig(lr=1e-3, steps=2, batch_size=32, warmup_steps=1, seed=12, weight_decay=0.01)
    today = Trainer(tiny_config, shorter, device="cpu")
    today.warm_start(tmp_path / "yesterday")
    assert today.step == 0  # this run's schedules start over
    for name in ("student", "teacher", "student_head", "teacher_head"):
        for key, value in getattr(yesterday, name).state_dict().items():
            assert torch.equal(getattr(today, name).state_dict()[key], value), f"{name}.{key}"
    torch.testing.assert_close(today.center, yesterday.center)
    moments = today.optimizer.state_dict()["state"]
    assert moments and all(int(s["step"]) == 4 for s in moments.values())  # AdamW's moments carried over
    assert [g["weight_decay"] for g in today.optimizer.param_groups] == [0.01, 0.0]
    torch.testing.assert_close(today.embed(data.users), yesterday.embed(data.users))
    today.fit(batches(data, 2, seed=2))
    assert today.history[0]["lr"] == pytest.approx(1e-3)  # warm-up of one step: this run's peak at once

    wider = ModelConfig.from_dict({**tiny_config.to_dict(), "dim": 16})
    with pytest.raises(ValueError, match="another architecture"):
        Trainer(wider, shorter, device="cpu").warm_start(tmp_path / "yesterday")


def test_the_stability_term_holds_a_warm_started_model_near_the_one_it_continues(
    tmp_path: Path, tiny_config: ModelConfig, data
) -> None:
    yesterday = yesterdays_model(tmp_path / "yesterday", tiny_config, data)
    before = yesterday.embed(data.users)
    eager = TrainConfig(lr=1e-2, steps=8, batch_size=32, warmup_steps=1, seed=12)
    today = synthetic_batches(data, batch_size=32, steps=8, seed=2)

    def cosine_to_yesterday(weight: float) -> tuple[float, Trainer]:
        config = ModelConfig.from_dict({**tiny_config.to_dict(), "stability_weight": weight})
        trainer = Trainer(config, eager, device="cpu")
        trainer.warm_start(tmp_path / "yesterday")
        trainer.fit(today)
        return float(torch.nn.functional.cosine_similarity(trainer.embed(data.users), before).mean()), trainer

    free, free_trainer = cosine_to_yesterday(0.0)
    held, held_trainer = cosine_to_yesterday(50.0)
    assert free < 0.95  # the day moves an unanchored model
    assert held > free + 0.5 * (1.0 - free)  # the anchor takes back at least half of the drift
    assert all(m["stability"] == 0.0 for m in free_trainer.history)  # weight 0: the term is off
    assert max(m["stability"] for m in held_trainer.history) > 0.0
    with pytest.raises(ValueError, match="stability_weight"):
        ModelConfig.from_dict({**tiny_config.to_dict(), "stability_weight": -1.0})


def test_the_stability_term_reads_the_continued_models_embedding_of_each_row_of_the_step(
    tmp_path: Path, tiny_config: ModelConfig, data
) -> None:
    yesterday_model = yesterdays_model(tmp_path / "yesterday", tiny_config, data)
    config = ModelConfig.from_dict({**tiny_config.to_dict(), "stability_weight": 1.0})
    trainer = Trainer(config, TRAIN, device="cpu")
    trainer.warm_start(tmp_path / "yesterday")
    loader = synthetic_batches(data, batch_size=32, steps=3, seed=2, anchor_users=8)
    batch = next(iter(loader))
    with pytest.raises(ValueError, match="anchor_rows"):  # a batch alone cannot say what the rows were
        trainer.train_step(batch)
    trainer.anchor_rows(loader)
    # What the term should be: yesterday's student run on the step's own rows (no tables), against today's
    # student before the step, which the warm start made equal to it: every cosine 1, the term 0.
    rows = (batch.users, batch.items, batch.negatives, batch.anchor_users)
    yesterday = torch.cat([yesterday_model.embed(r) for r in rows])
    inputs, served = trainer.anchored
    looked_up = torch.cat([inputs[batch.input_rows], served[batch.served_rows]])
    torch.testing.assert_close(looked_up, yesterday, rtol=1e-4, atol=1e-5)
    assert trainer.train_step(batch)["stability"] == pytest.approx(0.0, abs=1e-5)
    # Fixed chunks of rows sorted by length: any chunk size gives the same tables, up to float rounding
    small = loader.embed_rows(yesterday_model.embed, chunk=7)
    for table, other in zip(trainer.anchored, small, strict=True):
        torch.testing.assert_close(table, other, rtol=1e-4, atol=1e-5)
    assert not served[torch.from_numpy(loader.user_corpus)].eq(0).all(dim=1).any()  # every user row embedded


def test_served_user_rows_in_the_stability_term_hold_the_idle_users_that_no_pair_trains(
    tmp_path: Path, tiny_config: ModelConfig, data
) -> None:
    yesterday = yesterdays_model(tmp_path / "yesterday", tiny_config, data)
    inputs, served = synthetic_rows(data)
    users = data.users.node_id[:, 0].numpy()
    active = users[: len(users) // 4]  # today only a quarter of the users convert; the rest are idle
    per_user = data.user_conversions.shape[1]
    items = data.items.node_id[data.user_conversions[: len(active)].reshape(-1), 0].numpy()
    pairs = make_next_period_pairs(inputs, np.repeat(active, per_user), items, np.ones(len(items)))
    idle = torch.from_numpy(~np.isin(users, active))
    before = yesterday.embed(data.users)[idle]
    config = ModelConfig.from_dict({**tiny_config.to_dict(), "stability_weight": 10.0})
    eager = TrainConfig(lr=1e-2, steps=8, batch_size=16, warmup_steps=1, seed=12)

    def idle_cosine(anchor_users: int) -> float:
        trainer = Trainer(config, eager, device="cpu")
        trainer.warm_start(tmp_path / "yesterday")
        trainer.fit(PairBatches(inputs, served, pairs, 16, 16, 8, seed=3, anchor_users=anchor_users))
        return float(torch.nn.functional.cosine_similarity(trainer.embed(data.users)[idle], before).mean())

    without, held = idle_cosine(0), idle_cosine(32)
    assert without < 0.98  # the idle users drift with the network although their rows did not change
    assert held > without + 0.15 * (1.0 - without)  # holding their served rows takes back part of it
