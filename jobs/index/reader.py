"""Load a published index and search it: the API a serving process calls. Needs faiss, numpy and pyarrow only.

    from jobs.index.reader import IndexReader, open_index
    reader = open_index("warehouse", "item")               # the version LATEST names
    reader = IndexReader("warehouse/indexes/item")          # same thing, by folder
    reader = open_index("s3a://bucket/warehouse", "item")  # a remote warehouse (s3a://, hdfs://)
    raw_ids, node_ids, scores = reader.search(user_vectors, k=20)   # (nq, k) arrays each

A remote version is downloaded once to the local cache (HIR_CACHE_DIR, default ~/.cache/hir) under a key made of
its manifest's sha256, and faiss opens the copy; a local version is opened in place. Without Spark, the S3
settings come from the AWS environment (AWS_ENDPOINT_URL_S3, AWS_ACCESS_KEY_ID, ...; see hir_model.storage).

The reader checks what it loads before it serves anything: the manifest parses and has every field, the files
have the sizes (and, with verify=True, the sha256) the manifest recorded, and the index's count, dimension and
metric match it. Any mismatch is a one-line HirError naming the file, never a half-working index. The manifest's
search parameters (nprobe / efSearch, tuned at build time to the recall target) are applied on load.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import NamedTuple

import faiss
import numpy as np

from hir_model import storage
from jobs.common.errors import HirError
from jobs.index.publish import (
    FORMAT_VERSION,
    ID_MAP_FILE,
    INDEX_FILE,
    LATEST,
    MANIFEST_FILE,
    entity_root,
    list_versions,
    read_latest,
    sha256_of,
)

# faiss's 'no result' id (node ids are signed hashes; -1 is never one, the build refuses it).
NO_ID = -1
# Field -> type every manifest must have for a reader to trust the version.
REQUIRED_FIELDS: dict[str, type] = {
    "format_version": int,
    "entity_type": str,
    "ds": str,
    "factory": str,
    "metric": str,
    "dimension": int,
    "count": int,
    "search_params": dict,
    "model_version": str,
    "files": dict,
}


class SearchResult(NamedTuple):
    raw_ids: np.ndarray  # (nq, k) object: raw id strings, None where fewer than k neighbours were found
    node_ids: np.ndarray  # (nq, k) int64: node ids (signed), -1 where fewer than k neighbours were found
    scores: np.ndarray  # (nq, k) float32: inner product (cosine for L2-normalised vectors), best first


def parse_manifest(data: bytes, path: str) -> dict:
    """A manifest's bytes, validated; `path` names it in errors."""
    try:
        manifest = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise HirError(f"{path} is corrupt: not valid JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise HirError(f"{path} is corrupt: expected a JSON object")
    for name, kind in REQUIRED_FIELDS.items():
        if name not in manifest:
            raise HirError(f"{path} is corrupt: field '{name}' is missing")
        if not isinstance(manifest[name], kind):
            raise HirError(f"{path} is corrupt: field '{name}' should be {kind.__name__}")
    if manifest["format_version"] > FORMAT_VERSION:
        raise HirError(
            f"{path} has format_version {manifest['format_version']}; this reader knows up to "
            f"{FORMAT_VERSION}: upgrade the reader"
        )
    for name in (INDEX_FILE, ID_MAP_FILE):
        entry = manifest["files"].get(name)
        if not isinstance(entry, dict) or not {"bytes", "sha256"} <= entry.keys():
            raise HirError(f"{path} is corrupt: no bytes/sha256 entry for {name} under 'files'")
    return manifest


def read_manifest(version: str | Path) -> bytes:
    """The manifest's bytes of a version folder (path or URI); a missing one is a clear error."""
    path = storage.join(version, MANIFEST_FILE)
    try:
        return storage.read_bytes(path)
    except FileNotFoundError:
        raise HirError(
            f"{path} is missing: {version} is not a complete index version (was its build killed?)"
        ) from None


def load_manifest(version: str | Path) -> dict:
    """The version's manifest, validated; a missing, unparsable or incomplete one is a clear error."""
    return parse_manifest(read_manifest(version), storage.join(version, MANIFEST_FILE))


def resolve_version(path: str | Path) -> str:
    """A version folder as given, or the one an index folder's LATEST names (a path or a URI)."""
    path = storage.normalise(path)
    if storage.is_file(storage.join(path, LATEST)) and not storage.exists(storage.join(path, MANIFEST_FILE)):
        relative = read_latest(path)
        if not storage.is_dir(storage.join(path, relative)):
            raise HirError(f"{storage.join(path, LATEST)} points to {relative}, which does not exist")
        return storage.join(path, relative)
    if any(storage.exists(storage.join(path, name)) for name in (MANIFEST_FILE, INDEX_FILE, ID_MAP_FILE)):
        return path  # a version folder; load_manifest judges it
    if list_versions(path):
        raise HirError(
            f"{storage.join(path, LATEST)} is missing: versions exist under {path} but none was made live"
        )
    raise HirError(f"no index at {path} (no {LATEST}, no {MANIFEST_FILE}): run `hir build-index` first")


class IndexReader:
    """A loaded, verified index version with its id map and tuned search parameters."""

    def __init__(self, path: str | Path, *, verify: bool = True) -> None:
        self.location = resolve_version(path)  # the version folder's path or URI
        data = read_manifest(self.location)
        self.manifest = parse_manifest(data, storage.join(self.location, MANIFEST_FILE))
        # The folder faiss opens: the version itself when local, else a cached copy keyed by the manifest's
        # checksum (a version is never rewritten under its run id, so the key names its content).
        self.version_dir = storage.local_copy(self.location, hashlib.sha256(data).hexdigest())
        copied = self.version_dir / MANIFEST_FILE
        if not copied.is_file() or copied.read_bytes() != data:
            raise self._problem(MANIFEST_FILE, "does not match its copy")
        self._check_files(verify)
        self.index = self._load_index()
        self.node_ids, self.raw_ids = self._load_id_map()
        params = self.manifest["search_params"]
        if params:
            faiss.ParameterSpace().set_index_parameters(
                self.index, ",".join(f"{key}={value}" for key, value in params.items())
            )

    @property
    def dimension(self) -> int:
        return int(self.manifest["dimension"])

    def _problem(self, name: str, problem: str) -> HirError:
        """An error about one file of the version, naming it where it is published (and the cached copy)."""
        remote = storage.join(self.location, name)
        if storage.normalise(self.version_dir) == storage.normalise(self.location):
            return HirError(f"{remote} {problem}")
        return HirError(
            f"{remote} {problem} (in the cached copy {self.version_dir}: remove it to download again)"
        )

    def _check_files(self, verify: bool) -> None:
        for name, recorded in self.manifest["files"].items():
            path = self.version_dir / name
            if not path.is_file():
                raise self._problem(name, "is missing (listed in the manifest)")
            if path.stat().st_size != recorded.get("bytes"):
                raise self._problem(
                    name,
                    f"has {path.stat().st_size} bytes, the manifest recorded {recorded.get('bytes')}: "
                    "corrupt or truncated",
                )
            if verify and sha256_of(path) != recorded.get("sha256"):
                raise self._problem(name, "does not match the sha256 in the manifest: corrupt")

    def _load_index(self) -> faiss.Index:
        path = self.version_dir / INDEX_FILE
        try:
            index = faiss.read_index(str(path))
        except RuntimeError as exc:
            raise HirError(f"cannot read {path}: {str(exc).strip().splitlines()[-1]}") from None
        expected = (self.manifest["count"], self.manifest["dimension"])
        if (index.ntotal, index.d) != expected:
            raise HirError(
                f"{path} holds {index.ntotal} vectors of dimension {index.d}, the manifest says "
                f"{expected[0]} of dimension {expected[1]}"
            )
        if index.metric_type != faiss.METRIC_INNER_PRODUCT or self.manifest["metric"] != "inner_product":
            raise HirError(f"{path} is not an inner-product index (metric {self.manifest['metric']})")
        return index

    def _load_id_map(self) -> tuple[np.ndarray, np.ndarray]:
        import pyarrow.parquet as pq

        path = self.version_dir / ID_MAP_FILE
        try:
            table = pq.read_table(path, columns=["node_id", "raw_id"])
        except Exception as exc:  # pyarrow raises several types for a damaged file
            raise HirError(f"cannot read {path}: {exc}") from None
        node_ids = table.column("node_id").to_numpy().astype(np.int64)
        raw_ids = np.asarray(table.column("raw_id").to_pylist(), dtype=object)
        if len(node_ids) != self.manifest["count"] or np.any(np.diff(node_ids) <= 0):
            raise HirError(f"{path} is not {self.manifest['count']} distinct node ids in ascending order")
        return node_ids, raw_ids

    def raw_ids_of(self, node_ids: np.ndarray) -> np.ndarray:
        """Raw ids for node ids (None for -1 padding or an id outside the map)."""
        node_ids = np.asarray(node_ids, dtype=np.int64)
        pos = np.clip(np.searchsorted(self.node_ids, node_ids), 0, len(self.node_ids) - 1)
        known = (node_ids != NO_ID) & (self.node_ids[pos] == node_ids)
        return np.where(known, self.raw_ids[pos], None)

    def search(self, vectors: np.ndarray, k: int, *, allowed: np.ndarray | None = None) -> SearchResult:
        """Top k per query vector (one vector (d,) or a batch (nq, d)), with raw ids, node ids and scores.

        `allowed` (node ids) restricts the results to a candidate set (e.g. items already live, or one
        market): the index is searched for more neighbours, doubling until every query has k allowed ones or
        the whole index was searched, and the rest is dropped. Rows short of k are padded with NO_ID.
        """
        queries = np.asarray(vectors, dtype=np.float32)
        if queries.ndim == 1:
            queries = queries[None, :]
        if queries.ndim != 2 or queries.shape[1] != self.dimension:
            raise HirError(
                f"query vectors have shape {queries.shape}; this index needs (n, {self.dimension})"
            )
        if k < 1:
            raise HirError(f"k must be at least 1, got {k}")
        if allowed is None:
            scores, node_ids = self.index.search(np.ascontiguousarray(queries), k)
            return SearchResult(self.raw_ids_of(node_ids), node_ids, scores)
        return self._search_allowed(
            np.ascontiguousarray(queries), k, np.unique(np.asarray(allowed, np.int64))
        )

    def _search_allowed(self, queries: np.ndarray, k: int, allowed: np.ndarray) -> SearchResult:
        total = int(self.index.ntotal)
        # The share of the index that is allowed sets the first over-fetch; doubling covers the queries whose
        # neighbourhood is denser in excluded vectors than the average.
        share = max(np.isin(self.node_ids, allowed).mean(), 1.0 / max(total, 1))
        fetch = min(total, max(k, int(np.ceil(k / share * 1.2))))
        while True:
            scores, node_ids = self.index.search(queries, fetch)
            keep = np.isin(node_ids, allowed) & (node_ids != NO_ID)
            if fetch >= total or keep.sum(axis=1).min() >= min(k, len(allowed)):
                break
            fetch = min(total, fetch * 2)
        out_ids = np.full((len(queries), k), NO_ID, dtype=np.int64)
        out_scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
        for row in range(len(queries)):
            chosen = np.flatnonzero(keep[row])[:k]
            out_ids[row, : len(chosen)] = node_ids[row, chosen]
            out_scores[row, : len(chosen)] = scores[row, chosen]
        return SearchResult(self.raw_ids_of(out_ids), out_ids, out_scores)


def open_index(
    warehouse: str | Path, entity_type: str, ds: str | None = None, *, verify: bool = True
) -> IndexReader:
    """The live index of `entity_type`; with `ds`, the live version if it is that day's, else that day's newest."""
    root = entity_root(warehouse, entity_type)
    if ds is None:
        return IndexReader(root, verify=verify)
    live = read_latest(root)
    if live is not None and live.split("/")[0] == ds:
        return IndexReader(storage.join(root, live), verify=verify)
    of_day = [v for v in list_versions(root) if v.relative.split("/")[0] == ds]
    if not of_day:
        raise HirError(f"no {entity_type} index version for ds {ds} under {root}")
    return IndexReader(storage.join(root, of_day[-1].relative), verify=verify)
