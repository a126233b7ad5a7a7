"""Atomic publication of index versions and the `LATEST` pointer, on a local folder or a remote warehouse
(s3a://, hdfs://), all through hir_model.storage.

Layout under `<warehouse>/indexes/<entity_type>/`:

    LATEST                      one line: the live version's path relative to this folder, e.g. 2026-01-07/<run_id>
    <ds>/<run_id>/index.faiss   the index (faiss.write_index; ids are node ids)
    <ds>/<run_id>/id_map.parquet  node_id (int64) <-> raw_id (string), sorted by node_id
    <ds>/<run_id>/manifest.json   what the index is and how good it is; written last, with file sizes and sha256
    .tmp-<run_id>               a version being written (never read): locally the folder it is written in, on a
                                remote warehouse a small file naming the version being uploaded and when it began

A version exists once its manifest does: readers follow LATEST only, and never trust a folder without a manifest.

Local warehouse (a path or file://): every file is written into the folder `.tmp-<run_id>` and fsynced, the
folder is renamed to `<ds>/<run_id>` (`os.rename`, atomic on one filesystem: the version appears complete or not
at all), then LATEST is replaced (`storage.write_text`: a temp file, fsync, `os.replace`, fsync the folder; readers
see the old or the new pointer, never a torn one).

Remote warehouse: neither S3 nor pyarrow's HDFS client can rename a folder into place, so the version is built in
a local temporary folder exactly as above, the `.tmp-<run_id>` file is written, the files are uploaded to
`<ds>/<run_id>/` with the manifest last, LATEST is written in one PUT (S3 makes an object visible whole or not at
all; on HDFS storage writes beside it and renames over it), and the `.tmp-<run_id>` file is removed.

Either way a process killed at any point before the pointer write leaves the previous LATEST and the version it
names untouched; what it leaves behind (a `.tmp-*` folder or file, a version folder without its manifest, or a
complete version nothing names) is never read and is pruned later.

Concurrent publishers. pyarrow 14's S3 client cannot send a conditional put (`If-None-Match`/`If-Match`), so the
pointer cannot be compare-and-swapped: versions live under unique run ids and are never overwritten, and LATEST is
last-writer-wins among complete versions. `root_lock` (fcntl) serialises the pointer write and pruning only among
the publishers of one machine; on an object store or HDFS the rule is one publisher per entity type at a time,
which the pipeline's per-day lock gives.
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
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from hir_model import storage
from jobs.common.errors import HirError

INDEX_FILE = "index.faiss"
ID_MAP_FILE = "id_map.parquet"
MANIFEST_FILE = "manifest.json"
LATEST = "LATEST"
FORMAT_VERSION = 1
# Fault injection for the atomicity tests: the build SIGKILLs itself at the named point (before_manifest: the
# data files written, locally in the staging folder, remotely uploaded; before_rename: local only; before_swap).
# Never set in production.
CRASH_ENV = "HIR_INDEX_CRASH_AT"
# A `.tmp-*` leftover older than this is a killed build's (builds take minutes, not a day): pruning removes it
# and, on a remote warehouse, the incomplete version it names; younger ones may belong to a build running now.
STALE_TMP_SECONDS = 24 * 3600
STAGING_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def entity_root(warehouse: str | Path, entity_type: str) -> str:
    """`<warehouse>/indexes/<entity_type>`: an absolute local path, or a URI (s3a://, hdfs://)."""
    return storage.join(warehouse, "indexes", entity_type)


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


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


@contextlib.contextmanager
def root_lock(root: str | Path) -> Iterator[None]:
    """Serialise pointer writes and pruning of one entity type among this machine's publishers: `.lock` in a
    local root, a lock file in the local cache for a remote one (see the module doc for other machines)."""
    if storage.is_local(root):
        lock = storage.local_path(root) / ".lock"
    else:
        key = hashlib.sha256(storage.normalise(root).encode()).hexdigest()[:32]
        lock = storage.cache_root() / "locks" / f"{key}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# ---------------------------------------------------------------------------------------------- pointer


def read_latest(root: str | Path) -> str | None:
    """The live version's relative path, None when nothing was published; a bad pointer is an error."""
    pointer = storage.join(root, LATEST)
    try:
        relative = storage.read_text(pointer).strip()
    except FileNotFoundError:
        return None
    parts = relative.split("/")
    if len(parts) != 2 or not all(_SAFE_NAME.match(p) for p in parts):
        raise HirError(f"{pointer} holds '{relative[:80]}', not '<ds>/<run_id>': the pointer is corrupt")
    return relative


def swap_latest(root: str | Path, relative: str) -> None:
    """Point LATEST at `relative` in one atomic step (storage.write_text: os.replace locally, one PUT on S3)."""
    version = storage.join(root, relative)
    if not storage.is_file(storage.join(version, MANIFEST_FILE)):
        raise HirError(f"cannot point LATEST at {version}: no manifest there")
    storage.write_text(storage.join(root, LATEST), relative + "\n")


# -------------------------------------------------------------------------------------------- versions


@dataclass(frozen=True)
class Version:
    relative: str  # "<ds>/<run_id>"
    published_at: (
        str  # ISO time from the manifest; "" when the manifest is unreadable (such a version sorts first)
    )

    def __lt__(self, other: Version) -> bool:
        return (self.published_at, self.relative) < (other.published_at, other.relative)


def _folders(uri: str) -> list[str]:
    """Names under `uri` that may be a day or a version folder (not LATEST, .lock, .tmp-*, .trash-*)."""
    return [name for name in storage.listdir(uri) if not name.startswith(".") and name != LATEST]


def _scan(root: str | Path) -> tuple[list[Version], list[str]]:
    """(published versions oldest first, folders under a day without a manifest: uploads running or killed)."""
    versions, incomplete = [], []
    for ds in _folders(root):
        for run_id in _folders(storage.join(root, ds)):
            relative = f"{ds}/{run_id}"
            try:
                text = storage.read_text(storage.join(root, relative, MANIFEST_FILE))
            except FileNotFoundError:
                if storage.is_dir(storage.join(root, relative)):
                    incomplete.append(relative)
                continue
            try:
                published = str(json.loads(text)["published_at"])
            except (ValueError, KeyError, TypeError):
                published = ""
            versions.append(Version(relative, published))
    return sorted(versions), incomplete


def list_versions(root: str | Path) -> list[Version]:
    """Published versions (folders with a manifest), oldest first."""
    return _scan(root)[0]


def _remove_version(root: str | Path, relative: str) -> None:
    """Delete a version (or a folder without a manifest), and its day folder once empty. Locally the folder is
    renamed out of sight first, so a half-deleted version never looks like one."""
    version = storage.join(root, relative)
    if storage.is_local(root):
        path = storage.local_path(version)
        trash = path.parent / f"{TRASH_PREFIX}{path.name}-{os.getpid()}"
        os.rename(path, trash)  # out of sight in one step
        shutil.rmtree(trash, ignore_errors=True)
        with contextlib.suppress(OSError):  # not empty: a build renamed a version into it meanwhile
            path.parent.rmdir()
        return
    # One listing and one bulk delete on S3 (a version is three files). A prune killed meanwhile may leave some of
    # them: without the manifest the folder is swept as a leftover, with it the version is old and pruned again.
    storage.remove(version)
    day = storage.parent(version)
    if not storage.listdir(day):
        storage.remove(day)


def _started_at(leftover: str) -> float | None:
    """When a `.tmp-*` leftover was begun: a local staging folder's mtime, a remote marker's recorded time."""
    if storage.is_local(leftover):
        return storage.local_path(leftover).stat().st_mtime
    try:
        return dt.datetime.fromisoformat(json.loads(storage.read_text(leftover))["started_at"]).timestamp()
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None  # unreadable: nobody is writing it (storage writes are atomic), treat it as stale


def _marked_version(leftover: str) -> str | None:
    """The version a remote `.tmp-*` marker names (a local staging folder names none: it is the version)."""
    if storage.is_local(leftover):
        return None
    with contextlib.suppress(FileNotFoundError, ValueError, KeyError, TypeError):
        return str(json.loads(storage.read_text(leftover))["version"])
    return None


def prune(root: str | Path, keep: int, *, now: float | None = None) -> list[str]:
    """Delete all but the `keep` newest versions, never the one LATEST names; also stale `.tmp-*` leftovers and
    version folders without a manifest that no running build claims (a killed upload or prune).

    Returns what was removed, relative to `root`. Call under `root_lock`.
    """
    if keep < 1:
        raise HirError("--keep-versions must be at least 1")
    live = read_latest(root)
    # Folders before markers: a build writes its marker before its first file, so an upload seen here is
    # claimed by a marker listed after it.
    versions, incomplete = _scan(root)
    doomed = [v.relative for v in versions[: max(0, len(versions) - keep)] if v.relative != live]
    for relative in doomed:
        _remove_version(root, relative)

    now = time.time() if now is None else now
    claimed = set()
    for name in storage.listdir(root):
        if not name.startswith(STAGING_PREFIX):
            continue
        leftover = storage.join(root, name)
        started = _started_at(leftover)
        if started is not None and now - started <= STALE_TMP_SECONDS:
            claimed.add(_marked_version(leftover))
            continue
        storage.remove(leftover)
        doomed.append(name)
    for relative in incomplete:
        if relative not in claimed:
            _remove_version(root, relative)
            doomed.append(relative)
    for ds in _folders(root):  # a local prune killed mid-delete
        for name in storage.listdir(storage.join(root, ds)):
            if name.startswith(TRASH_PREFIX):
                storage.remove(storage.join(root, ds, name))
    if storage.is_local(root) and storage.is_dir(root):
        fsync_path(storage.local_path(root))
    return doomed


# --------------------------------------------------------------------------------------------- publish


def _stage(staging: Path, write_files: Callable[[Path], None], manifest: dict, ds: str, run_id: str) -> str:
    """Write and fsync the data files into `staging`; return the manifest (their sizes and sha256 added) as text."""
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
        "published_at": _now(),
    }
    return json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n"


def _place_local(
    root: Path, ds: str, run_id: str, write_files: Callable[[Path], None], manifest: dict
) -> None:
    """Write the version in `.tmp-<run_id>` and rename it into `<ds>/<run_id>` (see the module doc)."""
    final, staging = root / ds / run_id, root / f"{STAGING_PREFIX}{run_id}"
    if staging.exists():
        shutil.rmtree(staging)  # a killed attempt with the same run id
    staging.mkdir(parents=True)
    text = _stage(staging, write_files, manifest, ds, run_id)
    crash_point("before_manifest")
    with open(staging / MANIFEST_FILE, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    fsync_path(staging)
    crash_point("before_rename")
    final.parent.mkdir(parents=True, exist_ok=True)
    os.rename(staging, final)
    fsync_path(final.parent)
    fsync_path(root)


def _upload(root: str, ds: str, run_id: str, write_files: Callable[[Path], None], manifest: dict) -> None:
    """Build the version in a local temporary folder, then upload it to `<ds>/<run_id>/`, the manifest last."""
    final = storage.join(root, ds, run_id)
    storage.remove(final)  # a killed upload with the same run id (a complete one was refused by publish)
    with tempfile.TemporaryDirectory(prefix="hir-index-") as folder:
        text = _stage(Path(folder), write_files, manifest, ds, run_id)
        marker = {"version": f"{ds}/{run_id}", "started_at": _now()}
        storage.write_text(storage.join(root, f"{STAGING_PREFIX}{run_id}"), json.dumps(marker) + "\n")
        storage.upload_tree(folder, final)
    crash_point("before_manifest")
    storage.write_text(storage.join(final, MANIFEST_FILE), text)


def publish(
    root: str | Path,
    ds: str,
    run_id: str,
    write_files: Callable[[Path], None],
    manifest: dict,
    *,
    keep: int,
    before_swap: Callable[[str], None] | None = None,
) -> tuple[str, list[str]]:
    """Publish a version atomically and make it live; return its path or URI and what was pruned.

    `write_files(folder)` writes INDEX_FILE and ID_MAP_FILE into a local staging folder; this function adds sizes
    and checksums to `manifest`, writes it last, puts the version in place (rename, or upload) and swaps LATEST.
    `before_swap(version)` runs after the version is in place and before the swap (a test's fault injection).
    """
    check_name("ds", ds)
    check_name("run id", run_id)
    root = storage.normalise(root)
    relative = f"{ds}/{run_id}"
    final, staging = storage.join(root, relative), storage.join(root, f"{STAGING_PREFIX}{run_id}")
    if storage.is_file(storage.join(final, MANIFEST_FILE)) or (
        storage.is_local(root) and storage.exists(final)
    ):
        raise HirError(f"index version {final} already exists: pass a new --run-id")
    try:
        if storage.is_local(root):
            _place_local(storage.local_path(root), ds, run_id, write_files, manifest)
        else:
            _upload(root, ds, run_id, write_files, manifest)
        crash_point("before_swap")
        if before_swap is not None:
            before_swap(final)
        with root_lock(root):
            swap_latest(root, relative)
            storage.remove(staging)  # the remote marker (a local staging folder was renamed away)
            pruned = prune(root, keep)
    except BaseException:
        # An error (not a kill: a kill runs nothing) cleans up what is not live; LATEST is untouched.
        with contextlib.suppress(Exception):  # never mask the original error
            if read_latest(root) != relative:
                if storage.is_dir(final):
                    _remove_version(root, relative)
                storage.remove(staging)
        raise
    return final, pruned
