"""Which FAISS index to build for n vectors of dimension d within a memory budget: the documented rule.

The rule follows the faiss wiki "Guidelines to choose an index"
(https://github.com/facebookresearch/faiss/wiki/Guidelines-to-choose-an-index) and autofaiss's
`get_optimal_index_keys_v2` / `get_optimal_nb_clusters` / `get_optimal_quantization` (criteo/autofaiss,
autofaiss/external/optimize.py), with two changes for a daily batch job: HNSW stops at HNSW_MAX_VECTORS because
its graph cannot be built in Spark shards and merged, and every tier is checked against the memory budget.

    n < FLAT_MAX_VECTORS                       Flat                       exact, nothing to tune
    n < HNSW_MAX_VECTORS, full precision fits  HNSW32                     tune efSearch
    full precision fits                        IVF{nlist}[_HNSW32],Flat   tune nprobe; shardable
    otherwise                                  OPQ{m}_{d'},IVF{nlist}[_HNSW32],PQ{m}x8np, largest m that fits

PQ codes are trained without polysemous codes ("np"): that training is only needed for Hamming-threshold search,
which the reader does not use, and it multiplies training time several times over.

Every index is searched with inner product (faiss.METRIC_INNER_PRODUCT): the embeddings are L2-normalised, so
inner product is cosine similarity, the score the encoder's retrieval loss optimises.

Estimates count the bytes the loaded index holds in RAM (vectors or codes, 8-byte ids, graph links, centroids),
which is what a serving process pays; see `estimate_bytes`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jobs.common.errors import HirError

# Brute force over 10k vectors is ~1M multiply-adds per query (well under a millisecond) and exact; autofaiss
# switches at 1k, but exact answers are worth a sub-millisecond search.
FLAT_MAX_VECTORS = 10_000
# HNSW gives the best speed/recall when it fits (faiss wiki: "If memory is not a concern, HNSW"), but its build is
# a sequential graph insertion that Spark cannot shard and merge, and at ~0.5M vectors it already costs minutes
# on a small driver while IVF-Flat trains on a sample and adds in one pass.
HNSW_MAX_VECTORS = 500_000
HNSW_M = 32  # faiss wiki: 4 <= M <= 64; 32 is autofaiss's cap and the usual serving choice.
# faiss warns below 39 training points per centroid; the wiki asks for 30 to 256 per list. k-means is the costliest
# step of a single-node build and linear in its points, and a slightly coarser clustering only costs a slightly
# larger nprobe, which the recall tuning finds: train just above faiss's minimum (autofaiss uses 100).
MIN_TRAIN_POINTS_PER_LIST = 39
TRAIN_POINTS_PER_LIST = 40
# Cap on training vectors (they sit in driver memory next to the data): 40 per list for up to 25k lists.
MAX_TRAIN_VECTORS = 1_000_000
# A coarse quantizer of >= 4096 centroids costs as much to scan as the lists it selects at small nprobe: search
# the centroids with HNSW instead (wiki: IVF65536_HNSW32 from 1M vectors; autofaiss: HNSW32 above 1000 lists).
HNSW_QUANTIZER_MIN_LISTS = 4096
MAX_LISTS = (
    2**18
)  # wiki's largest recommended IVF (262144, for 10M-100M vectors); training cost grows with it.
# PQ code sizes tried from best to smallest (autofaiss's list without the sizes above d/2: at one dimension per
# sub-quantizer PQ is a slower scalar quantizer).
PQ_CODE_BYTES = (128, 96, 64, 48, 32, 24, 16, 12, 8, 4)
# 8-bit PQ codebooks have 256 centroids per sub-quantizer: below ~39 x 256 points they cannot be trained well.
PQ_MIN_VECTORS = 10_000
ID_BYTES = 8  # int64 node id per vector, in the inverted lists or the IDMap


@dataclass(frozen=True)
class IndexChoice:
    """A faiss factory string with the search parameter to tune and the estimated resident size."""

    factory: str
    search_param: str | None  # "nprobe", "efSearch" or None (exact)
    estimated_bytes: int
    reason: str


def nb_lists(n: int) -> int:
    """IVF lists: the power of two closest to 4*sqrt(n) (wiki: between 4 and 16 sqrt(n); autofaiss's first pick),
    lowered so that every list gets MIN_TRAIN_POINTS_PER_LIST training points."""
    nlist = 2 ** round(math.log2(max(1.0, 4 * math.sqrt(n))))
    trainable = 2 ** int(math.log2(max(1, n // MIN_TRAIN_POINTS_PER_LIST)))
    return int(max(1, min(nlist, trainable, MAX_LISTS)))


def coarse(nlist: int) -> str:
    return f"IVF{nlist}_HNSW{HNSW_M}" if nlist >= HNSW_QUANTIZER_MIN_LISTS else f"IVF{nlist}"


def estimate_bytes(kind: str, n: int, d: int, *, nlist: int = 0, pq_bytes: int = 0) -> int:
    """Resident bytes of an index of `kind` in flat, hnsw, ivf_flat, ivf_pq."""
    centroids = nlist * 4 * d + (nlist * 2 * HNSW_M * 4 if nlist >= HNSW_QUANTIZER_MIN_LISTS else 0)
    if kind == "flat":
        return n * (4 * d + ID_BYTES)
    if kind == "hnsw":
        # Level 0 stores 2*M int32 links per vector, upper levels add ~1/M of that; plus level and offset arrays.
        links = int(2 * HNSW_M * 4 * (1 + 1 / HNSW_M))
        return n * (4 * d + ID_BYTES + links + 12)
    if kind == "ivf_flat":
        return n * (4 * d + ID_BYTES) + centroids
    if kind == "ivf_pq":
        # codes + ids, coarse centroids, the OPQ rotation (d x d floats) and 256 PQ centroids per dimension.
        return n * (pq_bytes + ID_BYTES) + centroids + 4 * d * d + 256 * 4 * d
    raise ValueError(f"unknown index kind {kind}")


def choose_factory(n: int, dim: int, memory_budget_bytes: int) -> IndexChoice:
    """The index for `n` L2-normalised vectors of dimension `dim` whose resident size fits `memory_budget_bytes`.

    Raises HirError when even the smallest product-quantised index does not fit.
    """
    if n <= 0 or dim <= 0:
        raise HirError(f"cannot choose an index for {n} vectors of dimension {dim}")
    budget = memory_budget_bytes
    flat = estimate_bytes("flat", n, dim)
    if n < FLAT_MAX_VECTORS and flat <= budget:
        return IndexChoice(
            "Flat", None, flat, f"{n} < {FLAT_MAX_VECTORS} vectors: exact search is fast enough"
        )
    hnsw = estimate_bytes("hnsw", n, dim)
    if n < HNSW_MAX_VECTORS and hnsw <= budget:
        return IndexChoice(
            f"HNSW{HNSW_M}",
            "efSearch",
            hnsw,
            f"{n} < {HNSW_MAX_VECTORS} vectors and the graph fits the budget: HNSW is fastest at high recall",
        )
    nlist = nb_lists(n)
    ivf_flat = estimate_bytes("ivf_flat", n, dim, nlist=nlist)
    if ivf_flat <= budget:
        return IndexChoice(
            f"{coarse(nlist)},Flat",
            "nprobe",
            ivf_flat,
            f"full-precision vectors fit the budget; IVF with {nlist} lists (~4 sqrt(n)) builds in shards",
        )
    if n < PQ_MIN_VECTORS:
        raise HirError(
            f"memory budget {format_bytes(budget)} is below the {format_bytes(flat)} that {n} vectors of "
            f"dimension {dim} need uncompressed, and too few vectors to train product quantisation"
        )
    for m in PQ_CODE_BYTES:
        if m > dim // 2:
            continue
        size = estimate_bytes("ivf_pq", n, dim, nlist=nlist, pq_bytes=m)
        if size <= budget:
            d_out = m * (dim // m)  # OPQ rotates into a multiple of m dimensions, at most d
            return IndexChoice(
                f"OPQ{m}_{d_out},{coarse(nlist)},PQ{m}x8np",
                "nprobe",
                size,
                f"full precision needs {format_bytes(ivf_flat)} > budget: {m}-byte OPQ+PQ codes, the largest "
                "that fit",
            )
    smallest = estimate_bytes("ivf_pq", n, dim, nlist=nlist, pq_bytes=PQ_CODE_BYTES[-1])
    raise HirError(
        f"memory budget {format_bytes(budget)} is too small for {n} vectors of dimension {dim}: even "
        f"{PQ_CODE_BYTES[-1]}-byte PQ codes need {format_bytes(smallest)}; raise --memory-budget"
    )


def parse_bytes(value: str) -> int:
    """A size such as 4GiB, 512M, 1.5G or a plain byte count (binary multiples)."""
    text = value.strip().upper().removesuffix("B").removesuffix("I")
    units = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    try:
        if text and text[-1] in units:
            size = int(float(text[:-1]) * units[text[-1]])
        else:
            size = int(text)
    except ValueError:
        raise ValueError(f"not a size: '{value}' (use e.g. 4GiB, 512M or a byte count)") from None
    if size <= 0:
        raise ValueError(f"size must be positive, got '{value}'")
    return size


def format_bytes(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"
