"""Atomic publication of index versions on a local (POSIX) filesystem, and the `LATEST` pointer.

Layout under `<warehouse>/indexes/<entity_type>/`:

    LATEST                      one line: the live version's path relative to this folder, e.g. 2026-01-07/<run_id>
    <ds>/<run_id>/index.faiss   the index (faiss.write_index; ids are node ids)
    <ds>/<run_id>/id_map.parquet  node_id (int64) <-> raw_id (string), sorted by node_id
    <ds>/<run_id>/manifest.json   what the index is and how good it is; written last, with file sizes and sha256
    .tmp-<run_id>/              a version being written (never read)

The sequence (`publish`): write every file into `.tmp-<run_id>`, fsync each file and the folder, `os.rename` the
folder to `<ds>/<run_id>` (atomic on one filesystem: the version appears complete or not at all), then write
`LATEST.tmp-<run_id>`, fsync and `os.replace` it over `LATEST` (atomic: readers see the old or the new pointer,
never a torn one). A process killed at any point before that `os.replace` leaves the previous `LATEST` and the
version it names untouched; what it leaves behind (a `.tmp-*` folder or an unreferenced version) is never read
and is pruned later.

Object stores (s3://, gs://, abfss://) have no atomic rename or replace: a pointer there needs a conditional
write (S3 `If-Match`/`If-None-Match` on the pointer object, or a Delta table as the pointer). That mechanism is not
implemented; `entity_root` refuses non-local URIs with a message that says so.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from jobs.common.errors import HirError

INDEX_FILE = "index.faiss"
ID_MAP_FILE = "id_map.parquet"
MANIFEST_FILE = "manifest.json"
LATEST = "LATEST"
FORMAT_VERSION = 1
# Fault injection for the atomicity tests: the build SIGKILLs itself at the named point (before_rename,
# before_swap). Never set in production.
CRASH_ENV = "HIR_INDEX_CRASH_AT"
# A `.tmp-*` folder older than this is a killed build's leftover (builds take minutes, not a day): pruning
# removes it; younger ones may belong to a build running right now and are left alone.
STALE_TMP_SECONDS = 24 * 3600
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def entity_root(warehouse: str, entity_type: str) -> Path:
    """`<warehouse>/indexes/<entity_type>` as a local path; a non-local URI is a clear error."""
    parsed = urlparse(str(warehouse))
    if parsed.scheme in ("", "file"):
        local = parsed.path if parsed.scheme == "file" else str(warehouse)
        return Path(local).resolve() / "indexes" / entity_type
    raise HirError(
        f"index publishing needs a local/POSIX filesystem, got '{warehouse}': the LATEST swap relies on atomic "
        f"os.rename/os.replace, which {parsed.scheme}:// does not have (an object store needs a conditional-put "
        "pointer, not implemented); build with a local --warehouse or a mounted path"
    )


def check_name(kind: str, value: str) -> str:
    if not _SAFE_NAME.match(value):
        raise HirError(f"{kind} '{value}' must be letters, digits, '.', '_' or '-' (it names a folder)")
    return value


def fsync_path(path: Path) -> None:
    """Flush a file's or a folder's contents (a folder: its entries) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def crash_point(name: str) -> None:
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


@contextlib.contextmanager
def root_lock(root: Path) -> Iterator[None]:
    """Serialise pointer swaps and pruning of one entity type (two builds finishing at once)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# ---------------------------------------------------------------------------------------------- pointer


def read_latest(root: Path) -> str | None:
    """The live version's relative path, None when nothing was published; a bad pointer is an error."""
    pointer = root / LATEST
    if not pointer.exists():
        return None
    relative = pointer.read_text().strip()
    parts = relative.split("/")
    if len(parts) != 2 or not all(_SAFE_NAME.match(p) for p in parts):
        raise HirError(f"{pointer} holds '{relative[:80]}', not '<ds>/<run_id>': the pointer is corrupt")
    return relative


def swap_latest(root: Path, relative: str) -> None:
    """Point LATEST at `relative` in one atomic step (write a temp file, fsync, os.replace, fsync folder)."""
    if not (root / relative / MANIFEST_FILE).is_file():
        raise HirError(f"cannot point LATEST at {root / relative}: no manifest there")
    staged = root / f"{LATEST}.tmp-{os.getpid()}"
    with open(staged, "w") as handle:
        handle.write(relative + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(staged, root / LATEST)
    fsync_path(root)


# -------------------------------------------------------------------------------------------- versions


@dataclass(frozen=True)
class Version:
    relative: str  # "<ds>/<run_id>"
    published_at: str  # ISO time from the manifest; the folder's mtime when the manifest is unreadable

    def __lt__(self, other: Version) -> bool:
        return (self.published_at, self.relative) < (other.published_at, other.relative)


def list_versions(root: Path) -> list[Version]:
    """Published versions, oldest first."""
    versions = []
    if not root.is_dir():
        return versions
    for ds_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for version_dir in sorted(p for p in ds_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
            try:
                published = json.loads((version_dir / MANIFEST_FILE).read_text())["published_at"]
            except (OSError, ValueError, KeyError, TypeError):
                published = dt.datetime.fromtimestamp(version_dir.stat().st_mtime, dt.UTC).isoformat()
            versions.append(Version(f"{ds_dir.name}/{version_dir.name}", str(published)))
    return sorted(versions)


def _remove(path: Path) -> None:
    """Rename out of sight first, so a half-deleted version never looks like a version."""
    trash = path.parent / f".trash-{path.name}-{os.getpid()}"
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def prune(root: Path, keep: int, *, now: float | None = None) -> list[str]:
    """Delete all but the `keep` newest versions, never the one LATEST names; also stale `.tmp-*` folders.

    Returns the relative paths removed. Call under `root_lock`.
    """
    if keep < 1:
        raise HirError("--keep-versions must be at least 1")
    live = read_latest(root)
    versions = list_versions(root)
    doomed = [v.relative for v in versions[: max(0, len(versions) - keep)] if v.relative != live]
    for relative in doomed:
        _remove(root / relative)
        ds_dir = (root / relative).parent
        if ds_dir.is_dir() and not any(ds_dir.iterdir()):
            ds_dir.rmdir()
    now = time.time() if now is None else now
    for leftover in root.glob(".tmp-*"):
        if leftover.is_dir() and now - leftover.stat().st_mtime > STALE_TMP_SECONDS:
            shutil.rmtree(leftover, ignore_errors=True)
            doomed.append(leftover.name)
    for trash in root.glob("*/.trash-*"):  # a prune killed mid-delete
        shutil.rmtree(trash, ignore_errors=True)
    fsync_path(root)
    return doomed


# --------------------------------------------------------------------------------------------- publish


def _stage(staging: Path, write_files: Callable[[Path], None], manifest: dict, ds: str, run_id: str) -> dict:
    """Write the files, then the manifest (with their sizes and sha256) last, all fsynced."""
    write_files(staging)
    files = {}
    for name in (INDEX_FILE, ID_MAP_FILE):
        path = staging / name
        if not path.is_file():
            raise HirError(f"internal: {name} was not written to {staging}")
        fsync_path(path)
        files[name] = {"bytes": path.stat().st_size, "sha256": sha256_of(path)}
    manifest = {
        **manifest,
        "format_version": FORMAT_VERSION,
        "ds": ds,
        "run_id": run_id,
        "files": files,
        "published_at": dt.datetime.now(dt.UTC).isoformat(timespec="microseconds"),
    }
    with open(staging / MANIFEST_FILE, "w") as handle:
        json.dump(manifest, handle, indent=2, sort_keys=True, default=str)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    fsync_path(staging)
    return manifest


def publish(
    root: Path,
    ds: str,
    run_id: str,
    write_files: Callable[[Path], None],
    manifest: dict,
    *,
    keep: int,
    before_swap: Callable[[Path], None] | None = None,
) -> tuple[Path, list[str]]:
    """Publish a version atomically and make it live; return its folder and the versions pruned.

    `write_files(folder)` writes INDEX_FILE and ID_MAP_FILE into the staging folder; this function adds sizes and
    checksums to `manifest`, writes it last, renames the folder into place and swaps LATEST.
    `before_swap(final_folder)` runs after the rename and before the swap (a test's fault injection).
    """
    check_name("ds", ds)
    check_name("run id", run_id)
    final = root / ds / run_id
    if final.exists():
        raise HirError(f"index version {final} already exists: pass a new --run-id")
    staging = root / f".tmp-{run_id}"
    if staging.exists():
        shutil.rmtree(staging)  # a killed attempt with the same run id
    staging.mkdir(parents=True)
    relative = f"{ds}/{run_id}"
    try:
        _stage(staging, write_files, manifest, ds, run_id)
        crash_point("before_rename")
        final.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staging, final)
        fsync_path(final.parent)
        fsync_path(root)

        crash_point("before_swap")
        if before_swap is not None:
            before_swap(final)
        with root_lock(root):
            swap_latest(root, relative)
            pruned = prune(root, keep)
    except BaseException:
        # An error (not a kill: a kill runs nothing) cleans up what is not live; LATEST is untouched.
        shutil.rmtree(staging, ignore_errors=True)
        with contextlib.suppress(Exception):  # never mask the original error
            if final.is_dir() and read_latest(root) != relative:
                _remove(final)
        raise
    return final, pruned
