"""jobs.train.continuity: which model a day warm-starts from, and the renaming that keeps token ids."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hir_model.quantiser import ResidualQuantiser
from jobs.common.errors import HirError
from jobs.train.continuity import PreviousTokens, align_quantiser, previous_model, resolve_warm_start
from jobs.train_encoder import config_from_args

DS = dt.date(2026, 1, 7)


def fake_model(models: Path, name: str, ds: str) -> Path:
    folder = models / name
    folder.mkdir(parents=True)
    (folder / "weights.pt").write_bytes(b"")
    (folder / "lineage.json").write_text(json.dumps({"ds": ds}))
    return folder


def test_previous_is_the_latest_earlier_days_model_and_cold_without_one(tmp_path: Path, capsys) -> None:
    models = tmp_path / "models"
    assert resolve_warm_start("previous", models, DS) is None
    assert "cold start" in capsys.readouterr().err
    fake_model(models, "2026-01-05-aaaa", "2026-01-05")
    day6 = fake_model(models, "2026-01-06-bbbb", "2026-01-06")
    fake_model(models, "2026-01-07-cccc", "2026-01-07")  # the day itself: never its own warm start
    fake_model(models, ".2026-01-06-tmp", "2026-01-06")  # staging folders are not versions
    assert previous_model(models, DS) == day6
    assert resolve_warm_start("previous", models, DS) == day6
    assert resolve_warm_start("none", models, DS) is None
    assert resolve_warm_start("2026-01-05-aaaa", models, DS) == (models / "2026-01-05-aaaa").resolve()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("2026-01-01-nope", "is not a model version"),
        ("2026-01-07-cccc", "trained for 2026-01-07, not a day before 2026-01-07"),
    ],
)
def test_a_warm_start_that_cannot_be_one_is_refused(tmp_path: Path, value: str, message: str) -> None:
    models = tmp_path / "models"
    fake_model(models, "2026-01-07-cccc", "2026-01-07")
    with pytest.raises(HirError, match=message):
        resolve_warm_start(value, models, DS)


def test_warm_epochs_bound_a_warm_start_and_leave_a_cold_one_alone(tmp_path: Path) -> None:
    # A backfill passes a stage's flags to every day: the first day starts cold with the same --warm-epochs
    flags = ["--ds", str(DS), "--warehouse", str(tmp_path), "--epochs", "20", "--warm-epochs", "2"]
    cold = config_from_args(flags)
    assert cold.warm_start is None and cold.budget_epochs == 20
    day6 = fake_model(tmp_path / "models", "2026-01-06-bbbb", "2026-01-06")
    warm = config_from_args([*flags, "--warm-start", "previous"])
    assert warm.warm_start == str(day6) and warm.budget_epochs == 2
    assert config_from_args(flags[:-2] + ["--warm-start", "previous"]).budget_epochs == 5  # a quarter of 20


def test_patience_is_3_and_a_warm_start_waits_it_unless_told(tmp_path: Path) -> None:
    base = ["--ds", str(DS), "--warehouse", str(tmp_path)]
    assert config_from_args(base).run_patience == 3  # the default, chosen on validation histories
    flags = [*base, "--patience", "5"]
    assert config_from_args([*flags, "--warm-patience", "2"]).run_patience == 5  # cold: --patience
    fake_model(tmp_path / "models", "2026-01-06-bbbb", "2026-01-06")
    warm = [*flags, "--warm-start", "previous"]
    assert config_from_args(warm).run_patience == 5  # warm, untold: --patience
    assert config_from_args([*warm, "--warm-patience", "2"]).run_patience == 2


def test_alignment_renames_todays_codes_to_yesterdays_ids_and_reports_what_was_kept() -> None:
    generator = torch.Generator().manual_seed(0)
    centres = torch.randn(4, 8, generator=generator) * 4
    labels = torch.arange(4).repeat_interleave(10)
    points = centres[labels] + 0.05 * torch.randn(40, 8, generator=generator)
    quantiser = ResidualQuantiser(levels=1, codes_per_level=4, seed=0).fit(points)
    hard = quantiser.encode(points)
    node_id = np.arange(100, 140, dtype=np.int64)
    # Yesterday's ids for the same groups were a rotation of today's; entity 139 was not there yesterday and
    # entity 5 is gone today.
    rotated = (hard[:, 0] + 1) % 4
    previous = PreviousTokens(
        dt.date(2026, 1, 6),
        "v6",
        np.concatenate([[5], node_id[:-1]]),
        np.concatenate([[[2]], rotated[:-1, None].numpy()]),
    )
    renamed_quantiser, renamed, report = align_quantiser(quantiser, hard, node_id, previous)
    assert torch.equal(renamed[:, 0], rotated)
    assert torch.equal(renamed_quantiser.encode(points), renamed)
    assert report["previous"] == "2026-01-06/v6" and report["shared_entities"] == 39
    assert report["code_kept"] == [1.0] and report["code_kept_before_alignment"] == [0.0]
    unchanged = align_quantiser(quantiser, hard, node_id, None)
    assert unchanged[2] == {"previous": None} and torch.equal(unchanged[1], hard)
