"""Flag parsing shared by the jobs: strict dates, existing paths, one-line errors."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Callable, Sequence

from hir_model import storage
from jobs.common.errors import HirError
from schemas.codes import FUNNEL_STAGES


class JobArgumentParser(argparse.ArgumentParser):
    """argparse that raises HirError (one line) instead of printing usage and exiting."""

    def error(self, message: str):  # noqa: D401 - argparse API
        raise HirError(f"{self.prog}: {message}")


def parse_ds(value: str) -> dt.date:
    """A day as YYYY-MM-DD, strictly (argparse `type=`)."""
    try:
        if len(value) != 10:
            raise ValueError
        return dt.date.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--ds must be a date as YYYY-MM-DD, got '{value}'") from None


def add_warehouse_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--warehouse",
        default="warehouse",
        type=parse_place,
        help="Root of the Delta tables, one sub-folder per table: a path, file://, s3a://bucket/prefix or "
        "hdfs://namenode:port/path. Default ./warehouse keeps a local run self-contained and is git-ignored.",
    )


def parse_place(value: str) -> str:
    """A path or a URI the storage layer knows (argparse `type=`): an unknown scheme fails here, in one line,
    before a Spark session starts or anything is written. Reachability is checked once the session's S3/HDFS
    settings are known (`get_spark(..., places=...)`)."""
    storage.scheme(value)
    return value


def run_job(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Run a job's main; a HirError becomes `error: <message>` on stderr and exit code 2."""
    try:
        return main(argv)
    except HirError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def parse_stage_weights(value: str, flag: str) -> dict[str, float]:
    """The value of a stage-weight flag (`flag` names it in errors): 'view=1,favourite=2,cart=3,purchase=5' -> dict; every funnel stage once, each weight positive."""
    weights: dict[str, float] = {}
    for part in value.split(","):
        stage, _, number = part.partition("=")
        stage = stage.strip()
        if stage not in FUNNEL_STAGES or stage in weights:
            raise HirError(f"{flag}: '{part}' does not name a new stage of {', '.join(FUNNEL_STAGES)}")
        try:
            weights[stage] = float(number)
        except ValueError:
            raise HirError(f"{flag}: '{part}' has no number after '='") from None
        if not weights[stage] > 0:
            raise HirError(f"{flag}: weight of {stage} must be positive")
    missing = [s for s in FUNNEL_STAGES if s not in weights]
    if missing:
        raise HirError(f"{flag}: no weight for {', '.join(missing)}")
    return weights
