"""Build, shard, merge and tune a FAISS index: numpy arrays in, faiss indexes and measurements out. No Spark.

The index stores the graph's int64 node ids as faiss ids (IVF indexes take ids natively; Flat, HNSW and PQ are
wrapped in an IndexIDMap), so a search returns node ids directly and the id map turns them into raw ids.

Sharded build (what the Spark path runs in its tasks): train once, serialize the empty trained index, let every
shard deserialize it and add its vectors (`add_shard`), then merge the shards' inverted lists into the empty
index (`merge_shards`). Every shard shares the trained quantizer, so the merged index holds exactly the lists a
single-node build would, and the same nprobe returns the same neighbours.

GPU: when the faiss build has GPU support and a device is visible, k-means training (the IVF coarse quantizer)
and the exact ground-truth search run on the GPU; the index itself is always built and published as a CPU index,
the form serving loads. GPU k-means rounds differently, so centroids (and recall) agree within tolerance, not
bit for bit.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import faiss
import numpy as np

from jobs.common.errors import HirError
from jobs.index.choose import MAX_TRAIN_VECTORS, PQ_MIN_VECTORS, TRAIN_POINTS_PER_LIST

METRIC = faiss.METRIC_INNER_PRODUCT  # vectors are L2-normalised: inner product is cosine similarity
METRIC_NAME = "inner_product"
RECALL_K = 10
# faiss pads results with id -1 when fewer than k are found. Node ids are signed 64-bit hashes, so any other
# negative value is a real id; -1 itself is refused at build time (`check_ids`).
NO_ID = -1
# Largest value tried for efSearch; past this HNSW is slower than a flat scan of a mid-size set.
MAX_EF_SEARCH = 4096


# ---------------------------------------------------------------------------------------------------- device


def gpu_count() -> int:
    """GPUs faiss can use: 0 on a faiss-cpu build (no StandardGpuResources) or without a CUDA device."""
    if not hasattr(faiss, "StandardGpuResources") or not hasattr(faiss, "get_num_gpus"):
        return 0
    return int(faiss.get_num_gpus())


def resolve_device(requested: str) -> str:
    """'auto' -> 'gpu' when faiss sees one, else 'cpu'; 'gpu' without one is an error."""
    if requested not in ("auto", "cpu", "gpu"):
        raise HirError(f"--device must be auto, cpu or gpu, got '{requested}'")
    available = gpu_count() > 0
    if requested == "gpu" and not available:
        raise HirError(
            "--device gpu: faiss sees no GPU (faiss-cpu build or no CUDA device); use --device cpu"
        )
    if requested == "auto":
        return "gpu" if available else "cpu"
    return requested


# ----------------------------------------------------------------------------------------------------- build


def check_ids(node_ids: np.ndarray) -> None:
    if np.any(node_ids == NO_ID):
        raise HirError("node id -1 is reserved by faiss for 'no result': re-hash that entity's id")


def sample_order(sample_key: np.ndarray, node_ids: np.ndarray) -> np.ndarray:
    """Row order by (sample_key, node_id): the training sample is its head, held-out queries its tail.

    `sample_key` is a hash of the node id (the job uses Spark's xxhash64), so the sample does not depend on how
    the rows arrived and a rerun picks the same vectors.
    """
    return np.lexsort((node_ids, sample_key))


def new_index(factory: str, d: int) -> faiss.Index:
    """An empty index for `factory` with inner-product metric that accepts int64 ids (add_with_ids)."""
    try:
        index = faiss.index_factory(d, factory, METRIC)
    except RuntimeError as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else "rejected"
        raise HirError(f"index factory '{factory}' is not valid for dimension {d}: {reason}") from None
    if faiss.try_extract_index_ivf(index) is None:
        index = faiss.index_factory(d, f"IDMap,{factory}", METRIC)
    return index


def is_ivf(index: faiss.Index) -> bool:
    return faiss.try_extract_index_ivf(index) is not None


def train_index(
    index: faiss.Index, train_vectors: np.ndarray, *, seed: int = 1234, device: str = "cpu"
) -> None:
    """Train on the sample (k-means for IVF lists, OPQ rotation, PQ codebooks); a no-op for Flat and HNSW."""
    if index.is_trained:
        return
    ivf = faiss.try_extract_index_ivf(index)
    gpu_flat = None  # held here: ivf.clustering_index is a raw pointer that does not keep it alive
    if ivf is not None:
        ivf.cp.seed = seed
        if device == "gpu":
            mode = ivf.quantizer_trains_alone  # a char in the SWIG wrapper
            mode = ord(mode) if isinstance(mode, str) else int(mode)
            # mode 2 (HNSW coarse quantizer): k-means runs in L2, then the centroids are added to the HNSW.
            metric = faiss.METRIC_L2 if mode == 2 else ivf.metric_type
            gpu_flat = faiss.index_cpu_to_all_gpus(faiss.IndexFlat(ivf.d, metric))
            ivf.clustering_index = gpu_flat
    try:
        index.train(np.ascontiguousarray(train_vectors, dtype=np.float32))
    finally:
        if ivf is not None:
            ivf.clustering_index = None  # the GPU copy must not be serialized with the index
        del gpu_flat


def add_vectors(index: faiss.Index, vectors: np.ndarray, node_ids: np.ndarray, batch: int = 65_536) -> None:
    """Add in batches so the temporary assignment buffers stay small."""
    for start in range(0, len(vectors), batch):
        index.add_with_ids(
            np.ascontiguousarray(vectors[start : start + batch], dtype=np.float32),
            np.ascontiguousarray(node_ids[start : start + batch], dtype=np.int64),
        )


def serialize(index: faiss.Index) -> bytes:
    return faiss.serialize_index(index).tobytes()


def deserialize(blob: bytes) -> faiss.Index:
    return faiss.deserialize_index(np.frombuffer(blob, dtype=np.uint8))


def merge_shards(empty_trained: bytes, shards: Iterable[bytes]) -> faiss.Index:
    """Merge shard indexes (each the empty trained index plus its vectors) into one, in the order given."""
    merged = deserialize(empty_trained)
    if not is_ivf(merged):
        raise HirError("only IVF indexes can be built in shards and merged (not Flat, HNSW or PQ)")
    for blob in shards:
        faiss.merge_into(merged, deserialize(blob), False)  # keep the shard's ids: they are node ids
    return merged


# ------------------------------------------------------------------------------------------ exact search


def exact_top_k(
    vectors: np.ndarray, node_ids: np.ndarray, queries: np.ndarray, k: int, *, device: str = "cpu"
) -> tuple[np.ndarray, np.ndarray]:
    """(scores, node ids) of the exact inner-product top k; -1 ids pad when there are fewer than k vectors.

    Brute force without building an index (faiss.knn), so the driver holds no second copy of the vectors.
    """
    base = np.ascontiguousarray(vectors, dtype=np.float32)
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    if device == "gpu":
        scores, positions = faiss.knn_gpu(faiss.StandardGpuResources(), queries, base, k, metric=METRIC)
    else:
        scores, positions = faiss.knn(queries, base, k, metric=METRIC)
    ids = np.where(positions >= 0, node_ids[np.clip(positions, 0, None)], NO_ID)
    return scores, ids.astype(np.int64)


def merge_top_k(parts: list[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top k by score over per-shard top-k results (nq, k_i); ties broken by node id for a stable answer."""
    scores = np.concatenate([p[0] for p in parts], axis=1)
    ids = np.concatenate([p[1] for p in parts], axis=1)
    scores = np.where(ids != NO_ID, scores, -np.inf)
    order = np.lexsort((ids, -scores), axis=1)[:, :k]
    top_scores = np.take_along_axis(scores, order, axis=1)
    top_ids = np.take_along_axis(ids, order, axis=1)
    return np.where(np.isfinite(top_scores), top_scores, -np.inf).astype(np.float32), top_ids


def recall_at_k(found: np.ndarray, exact: np.ndarray, k: int = RECALL_K) -> float:
    """Mean over queries of |found top k & exact top k| / |exact top k| (exact ids of -1 are padding)."""
    hits, total = 0, 0
    for got, want in zip(found[:, :k], exact[:, :k], strict=True):
        want_set = {int(i) for i in want if i != NO_ID}
        hits += len(want_set.intersection(int(i) for i in got if i != NO_ID))
        total += len(want_set)
    return hits / total if total else 1.0


# -------------------------------------------------------------------------------------------------- tuning


@dataclass(frozen=True)
class Knob:
    """The search-time parameter that trades speed for recall, with the values tried from fast to exact."""

    name: str | None  # nprobe, efSearch or None
    ladder: tuple[int, ...]
    hnsw_quantizer: bool = False

    def params(self, value: int | None) -> dict[str, int]:
        if self.name is None or value is None:
            return {}
        if self.hnsw_quantizer:
            # The HNSW coarse quantizer must look at least as wide as the lists it is asked for.
            return {"nprobe": value, "quantizer_efSearch": max(2 * value, 16)}
        return {self.name: value}


def powers_of_two(low: int, high: int) -> tuple[int, ...]:
    values, v = [], low
    while v < high:
        values.append(v)
        v *= 2
    return tuple([*values, high])


def search_knob(index: faiss.Index) -> Knob:
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        quantizer = faiss.downcast_index(ivf.quantizer)
        return Knob("nprobe", powers_of_two(1, ivf.nlist), isinstance(quantizer, faiss.IndexHNSW))
    inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexIDMap) else index
    if isinstance(inner, faiss.IndexHNSW):
        return Knob("efSearch", powers_of_two(RECALL_K, MAX_EF_SEARCH))
    return Knob(None, ())


def set_search_params(index: faiss.Index, params: dict[str, int]) -> None:
    if params:
        faiss.ParameterSpace().set_index_parameters(index, ",".join(f"{k}={v}" for k, v in params.items()))


@dataclass(frozen=True)
class Speed:
    qps: float  # batched: queries / wall second of one search call over all queries (best of `repeats`)
    latency_ms_p50: (
        float | None
    )  # one query per call on one thread, as a serving thread runs (None: not measured)
    latency_ms_p99: float | None


def measure_speed(
    index: faiss.Index, queries: np.ndarray, k: int, *, repeats: int = 3, single: int = 200
) -> Speed:
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        index.search(queries, k)
        best = min(best, time.perf_counter() - start)
    singles = []
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)  # a serving thread answers one request at a time, on one core
    try:
        for row in queries[:single]:
            start = time.perf_counter()
            index.search(row[None, :], k)
            singles.append((time.perf_counter() - start) * 1000)
    finally:
        faiss.omp_set_num_threads(threads)
    return Speed(
        qps=len(queries) / max(best, 1e-9),
        latency_ms_p50=float(np.percentile(singles, 50)) if singles else None,
        latency_ms_p99=float(np.percentile(singles, 99)) if singles else None,
    )


@dataclass(frozen=True)
class Tuning:
    params: dict[str, int]  # search parameters to publish (empty for exact indexes)
    recall: float
    reached: bool
    trace: list[dict] = field(default_factory=list)  # every ladder step: params, recall, qps


def tune(
    index: faiss.Index, queries: np.ndarray, exact_ids: np.ndarray, target: float, k: int = RECALL_K
) -> Tuning:
    """Walk the knob's ladder from fastest to widest; stop at the first value whose recall@k reaches `target`.

    Recall is monotone in nprobe and (in practice) efSearch, so the first value that reaches the target is the
    fastest one that does. When none does, the value with the best recall is kept and `reached` is False
    (with lossy codes a wider search can rank more near-ties above true neighbours and lose recall).
    """
    knob = search_knob(index)
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    trace: list[dict] = []
    best: tuple[dict[str, int], float] = ({}, -1.0)
    for value in knob.ladder or (None,):
        params = knob.params(value)
        set_search_params(index, params)
        start = time.perf_counter()
        _, found = index.search(queries, k)
        seconds = time.perf_counter() - start
        recall = recall_at_k(found, exact_ids, k)
        trace.append(
            {**params, "recall": round(recall, 4), "qps": round(len(queries) / max(seconds, 1e-9), 1)}
        )
        if recall > best[1]:
            best = (params, recall)
        if recall >= target:
            return Tuning(params, recall, True, trace)
    set_search_params(index, best[0])
    return Tuning(best[0], best[1], False, trace)


# ---------------------------------------------------------------------------------------------- single node


@dataclass
class Built:
    """A trained, filled index and how it was made."""

    index: faiss.Index
    train_size: int
    seconds: float


def train_size_for(index: faiss.Index, n: int, points_per_list: int, max_train: int) -> int:
    """Training vectors: `points_per_list` per IVF list, and at least PQ_MIN_VECTORS when there are PQ
    codebooks to train; never more than n or `max_train`. 0 for indexes that need no training."""
    if index.is_trained:
        return 0
    ivf = faiss.try_extract_index_ivf(index)
    wanted = points_per_list * ivf.nlist if ivf is not None else 0
    if ivf is None or isinstance(faiss.downcast_index(ivf), faiss.IndexIVFPQ):
        wanted = max(wanted, PQ_MIN_VECTORS)
    return int(min(n, wanted, max_train))


def build_in_memory(
    factory: str,
    vectors: np.ndarray,
    node_ids: np.ndarray,
    sample_key: np.ndarray,
    *,
    points_per_list: int = TRAIN_POINTS_PER_LIST,
    max_train: int = MAX_TRAIN_VECTORS,
    batch: int = 65_536,
    seed: int = 1234,
    device: str = "cpu",
) -> Built:
    """Train on the deterministic sample and add every vector with its node id, in node id order."""
    start = time.perf_counter()
    check_ids(node_ids)
    index = new_index(factory, vectors.shape[1])
    order = sample_order(sample_key, node_ids)
    size = train_size_for(index, len(vectors), points_per_list, max_train)
    if size:
        train_index(index, vectors[order[:size]], seed=seed, device=device)
    by_id = np.argsort(node_ids, kind="stable")
    add_vectors(index, vectors[by_id], node_ids[by_id], batch)
    return Built(index, size, time.perf_counter() - start)


def add_shard(
    empty_trained: bytes,
    vectors: np.ndarray,
    node_ids: np.ndarray,
    queries: np.ndarray,
    k: int = RECALL_K,
    batch: int = 65_536,
) -> tuple[bytes, np.ndarray, np.ndarray]:
    """One shard: the trained empty index plus these vectors (serialized), and their exact top k for `queries`.

    The exact top k lets the driver compute ground truth over all shards without ever holding all vectors.
    """
    check_ids(node_ids)
    index = deserialize(empty_trained)
    by_id = np.argsort(node_ids, kind="stable")
    add_vectors(index, vectors[by_id], node_ids[by_id], batch)
    if len(vectors):
        scores, ids = exact_top_k(vectors, node_ids, queries, k)
    else:
        scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
        ids = np.full((len(queries), k), NO_ID, dtype=np.int64)
    return serialize(index), scores, ids
