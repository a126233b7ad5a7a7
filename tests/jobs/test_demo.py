"""`make demo`'s driver: a dataset's own training flags reach both of its trainings, and no other dataset's."""

from __future__ import annotations

import shlex
from pathlib import Path

from jobs.demo import datasets, pipeline_argv
from jobs.pipeline import config_from_args


def evaluation_train_flags(stage_args: dict[str, tuple[str, ...]]) -> list[str]:
    """The flags the evaluation's history model trains with: its `--stage-args train=...` value."""
    evaluate = list(stage_args["evaluate"])
    nested = [arg for arg in evaluate[evaluate.index("--stage-args") + 1 :] if arg.startswith("train=")]
    assert len(nested) == 1, evaluate
    return shlex.split(nested[0].removeprefix("train="))


def test_a_datasets_training_flags_reach_the_days_model_and_the_evaluations(tmp_path) -> None:
    by_name = {d.name: d for d in datasets(Path("../shared/data"))}
    rees46 = config_from_args(pipeline_argv(by_name["rees46"], tmp_path / "rees46")).stage_args
    taobao = config_from_args(pipeline_argv(by_name["taobao"], tmp_path / "taobao")).stage_args
    synthetic = config_from_args(pipeline_argv(by_name["synthetic"], tmp_path / "synthetic")).stage_args
    # demo.toml's [train] comes first for all; a dataset's own flags follow it (the last value of a flag wins).
    assert rees46["train"][-4:] == ("--train-periods", "3", "--dim", "128")
    assert rees46["train"][:-4] == taobao["train"]
    assert evaluation_train_flags(rees46) == [*rees46["train"]]
    assert evaluation_train_flags(taobao) == [*taobao["train"]]
    assert evaluation_train_flags(synthetic) == [*synthetic["train"]]
    assert "--train-periods" not in taobao["train"]
    assert synthetic["train"] == (*taobao["train"], "--train-periods", "3")
    # REES46's --dim comes after demo.toml's, so it is the one its trainings parse.
    dims = [i for i, flag in enumerate(rees46["train"]) if flag == "--dim"]
    assert len(dims) == 2 and rees46["train"][dims[-1] + 1] == "128"
