"""`hir`: one subcommand per job. `hir <command> --help` shows a job's flags."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from jobs.common.args import run_job

# Subcommand -> job module (each has main(argv) -> int).
COMMANDS: dict[str, str] = {
    "ingest": "jobs.ingest_events",
    "build-graph": "jobs.build_graph",
    "sample-neighbourhoods": "jobs.sample_neighbourhoods",
    "enrich": "jobs.enrich_entities",
    "train": "jobs.train_encoder",
    "embed": "jobs.embed_entities",
    "drift": "jobs.measure_drift",
    "build-index": "jobs.build_index",
    "pipeline": "jobs.pipeline",
    "evaluate": "jobs.evaluate",
    "query": "jobs.query_index",
    "sql": "jobs.sql",
}


def usage() -> str:
    lines = ["usage: hir <command> [flags]   (hir <command> --help for its flags)", "", "commands:"]
    for name, module in COMMANDS.items():
        doc = (importlib.import_module(module).__doc__ or "").strip().splitlines()[0]
        lines.append(f"  {name:<22} {doc}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"error: unknown command '{command}' (choose from {', '.join(COMMANDS)})", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[command])
    return run_job(module.main, rest)


if __name__ == "__main__":
    sys.exit(main())
