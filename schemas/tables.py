"""Every Delta table of the pipeline, declared once: columns with docs, partitioning, properties.

Jobs never spell a table's columns themselves: they build a DataFrame and hand it to
`jobs.common.delta.write_table`, which refuses anything that does not match the spec below.
Tables live at `<warehouse>/<name>`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DateType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)


def _col(name: str, dtype: DataType, doc: str, nullable: bool = True) -> StructField:
    return StructField(name, dtype, nullable, metadata={"comment": doc})


@dataclass(frozen=True)
class TableSpec:
    """A table's contract: name, schema (with column docs), partition columns, Delta properties."""

    name: str
    doc: str
    schema: StructType
    partition_by: tuple[str, ...] = ()
    properties: dict[str, str] = field(default_factory=dict)

    @property
    def columns(self) -> list[str]:
        return [f.name for f in self.schema.fields]

    def column_doc(self, column: str) -> str:
        return self.schema[column].metadata.get("comment", "")


DS = _col(
    "ds",
    DateType(),
    "Day of the data (partition); for events, the event date in the source's time zone.",
    False,
)
SOURCE = _col(
    "source", StringType(), "Input adapter that produced the row: taobao, rees46, generic, synthetic.", False
)

# Appends are rare and whole days are replaced; keep a month of history for time travel and lineage.
_DAILY_PROPS = {
    "delta.logRetentionDuration": "interval 30 days",
    "delta.deletedFileRetentionDuration": "interval 7 days",
}

EVENTS = TableSpec(
    name="events",
    doc="Canonical interaction events, one row per source record kept after validation and de-duplication.",
    schema=StructType(
        [
            SOURCE,
            _col("user_id", StringType(), "Raw user id as in the source.", False),
            _col("item_id", StringType(), "Raw item id as in the source.", False),
            _col(
                "event_type",
                StringType(),
                "Raw event type as in the source (pv, buy, view, purchase ...).",
                False,
            ),
            _col(
                "funnel_stage",
                StringType(),
                "Canonical stage: view, favourite, cart, purchase (or removal, kept but unused by the graph).",
                False,
            ),
            _col("event_time", TimestampType(), "When the event happened (stored as UTC instant).", False),
            _col("session_id", StringType(), "Source session id where the source has one."),
            DS,
        ]
    ),
    partition_by=("ds",),
    properties=_DAILY_PROPS,
)

ENTITIES = TableSpec(
    name="entities",
    doc="Item attributes as last observed on day ds (one row per source, item and day).",
    schema=StructType(
        [
            SOURCE,
            _col(
                "entity_type",
                StringType(),
                "Entity type; 'item' for everything the event sources describe.",
                False,
            ),
            _col("entity_id", StringType(), "Raw entity id as in the source.", False),
            _col("category_id", StringType(), "Raw category id (string: REES46 ids exceed 32 bits)."),
            _col("category_code", StringType(), "Dot-separated category taxonomy, coarse to fine (REES46)."),
            _col("brand", StringType(), "Brand / advertiser name, lower case."),
            _col("price", DoubleType(), "Price in source currency; null when missing or not positive."),
            _col("title", StringType(), "Free text title or description where the source has one."),
            _col("last_seen", TimestampType(), "Time of the event whose attributes this row holds.", False),
            DS,
        ]
    ),
    partition_by=("ds",),
    properties=_DAILY_PROPS,
)

INGEST_REJECTS = TableSpec(
    name="ingest_rejects",
    doc="Every input record that did not become an event, with the reason. Nothing is dropped silently.",
    schema=StructType(
        [
            SOURCE,
            _col("input_file", StringType(), "File the record came from.", False),
            _col(
                "record", StringType(), "The raw record as read (text line, or JSON of a Parquet row).", False
            ),
            _col(
                "reason", StringType(), "Why the record was rejected, e.g. 'truncated: 8 of 9 fields'.", False
            ),
            _col("run_id", StringType(), "Ingest run that rejected it.", False),
        ]
    ),
    partition_by=("source",),
)

SYNTHETIC_TRUTH = TableSpec(
    name="synthetic_truth",
    doc="Planted ground truth of the synthetic generator: each user's and item's interest clusters.",
    schema=StructType(
        [
            _col("entity_type", StringType(), "user or item.", False),
            _col("entity_id", StringType(), "Raw id as written to events/entities.", False),
            _col("parent_cluster", IntegerType(), "Coarse planted interest (parent cluster).", False),
            _col(
                "cluster",
                IntegerType(),
                "Fine planted interest: item's cluster, user's primary interest.",
                False,
            ),
            _col(
                "interests",
                ArrayType(IntegerType(), False),
                "All fine clusters a user draws from (items: one).",
                False,
            ),
            _col("seed", LongType(), "Generator seed.", False),
        ]
    ),
)

NODES = TableSpec(
    name="nodes",
    doc=(
        "Graph nodes of day ds (every node with at least one edge in the window). node_id is a 64-bit hash of "
        "(source, node_type, raw_id): stable across days and runs, never 0 (the padding id)."
    ),
    schema=StructType(
        [
            _col(
                "node_id",
                LongType(),
                "xxhash64 of (source, node_type, raw_id); stable across days; 0 is never used (padding).",
                False,
            ),
            _col("source", StringType(), "Source the node comes from; part of the node's key.", False),
            _col("node_type", StringType(), "user, item, advertiser or category.", False),
            _col(
                "raw_id",
                StringType(),
                "Id in the source, for joins back: user_id, item_id, brand (advertiser), category_id (leaf "
                "category) or a category_code prefix such as 'appliances.kitchen' (parent category).",
                False,
            ),
            _col(
                "degree",
                LongType(),
                "Outgoing edges of the node before the degree cap, all edge types together.",
                False,
            ),
            DS,
        ]
    ),
    partition_by=("ds",),
    properties=_DAILY_PROPS,
)

EDGES = TableSpec(
    name="edges",
    doc=(
        "Directed typed edges of day ds over the window [ds - lookback, ds]; every edge has its reverse. At most "
        "degree_cap edges per (src, edge_type) are kept, the heaviest."
    ),
    schema=StructType(
        [
            _col("src", LongType(), "Source node id.", False),
            _col("dst", LongType(), "Destination node id.", False),
            _col("src_type", StringType(), "Source node type.", False),
            _col("dst_type", StringType(), "Destination node type.", False),
            _col("edge_type", StringType(), "Edge type name (schemas.codes.EDGE_TYPES).", False),
            _col(
                "funnel",
                StringType(),
                "'upper' (view, favourite) or 'deep' (cart, purchase) for user-item edges, 'attribute' otherwise.",
                False,
            ),
            _col(
                "weight",
                DoubleType(),
                "User-item: sum over events of stage weight x 0.5^(age days / half-life). Attribute edges: the "
                "same sum over every event of the member side (the item, or all items under the child category).",
                False,
            ),
            _col(
                "event_count",
                LongType(),
                "Events behind the weight (user-item: events of that user, item and stage).",
                False,
            ),
            _col("first_time", TimestampType(), "First event time behind the edge.", False),
            _col("last_time", TimestampType(), "Last event time behind the edge.", False),
            _col(
                "recency_bucket",
                IntegerType(),
                "Days from the last event's day to ds, bucketed: 0-7 one bucket per day, then quarter-octaves "
                "(8: 8-9 days ... 14: 23-26), 15: 27 days or more.",
                False,
            ),
            _col(
                "rank_in_type",
                IntegerType(),
                "Rank of the edge among src's edges of the same edge type, by weight then dst (1 = heaviest).",
                False,
            ),
            DS,
        ]
    ),
    partition_by=("ds",),
    properties=_DAILY_PROPS,
)

_INT_ARRAY = ArrayType(IntegerType(), False)

NEIGHBOURHOODS = TableSpec(
    name="neighbourhoods",
    doc=(
        "Hierarchical neighbourhood sample per target node. Token arrays all have length max_tokens; position 0 is "
        "the target, then hop-1 tokens, then hop-2 tokens; positions >= num_tokens are padding (type code 0)."
    ),
    schema=StructType(
        [
            _col("node_id", LongType(), "Target node id.", False),
            _col("node_type", StringType(), "Target node type.", False),
            _col("raw_id", StringType(), "Target raw id.", False),
            _col("source", StringType(), "Target's source (with raw_id, the key to join back).", False),
            _col(
                "num_tokens", IntegerType(), "Real tokens including the target; the rest is padding.", False
            ),
            _col("num_hop1", IntegerType(), "Hop-1 tokens (positions 1 .. num_hop1).", False),
            _col("token_node_id", ArrayType(LongType(), False), "Node id per token (0 for padding).", False),
            _col(
                "token_node_type",
                _INT_ARRAY,
                "Node type code per token (schemas.codes.NODE_TYPES, 0 = pad).",
                False,
            ),
            _col(
                "token_edge_type",
                _INT_ARRAY,
                "Edge type code linking the token to its parent (1 = self, 0 = pad).",
                False,
            ),
            _col("token_hop", _INT_ARRAY, "0 for the target, 1 or 2 for neighbours, 0 for padding.", False),
            _col(
                "token_parent_pos",
                _INT_ARRAY,
                "Position of the parent token (0 for hop 1, a hop-1 position for hop 2); -1 for target and "
                "padding.",
                False,
            ),
            _col(
                "token_recency",
                _INT_ARRAY,
                "Recency bucket of the edge (edges.recency_bucket: 0 = last event on ds, 15 = 27+ days ago); 0 "
                "for target and padding.",
                False,
            ),
            _col(
                "token_weight",
                ArrayType(FloatType(), False),
                "Edge weight (0 for target and padding).",
                False,
            ),
            _col(
                "token_is_deep", ArrayType(BooleanType(), False), "True when the edge is deep funnel.", False
            ),
            _col(
                "sample_seed",
                LongType(),
                "Seed of the hash-based sampling keys: the same seed and edges give the same sample on any day.",
                False,
            ),
            DS,
        ]
    ),
    partition_by=("ds",),
    properties=_DAILY_PROPS,
)

ENTITY_CONTENT = TableSpec(
    name="entity_content",
    doc="Content embedding per entity from its text/attributes; re-embedded only when the text changes.",
    schema=StructType(
        [
            _col("node_id", LongType(), "Node id of the entity.", False),
            _col("node_type", StringType(), "Entity node type.", False),
            _col("raw_id", StringType(), "Raw id.", False),
            _col("text", StringType(), "Text that was embedded.", False),
            _col("text_hash", StringType(), "sha256 of text; the MERGE key for re-embedding.", False),
            _col("vector", ArrayType(FloatType(), False), "L2-normalised content embedding.", False),
            _col("encoder", StringType(), "Encoder name and version.", False),
            _col("updated_ds", DateType(), "Day the vector was (re)computed.", False),
        ]
    ),
)

EMBEDDINGS = TableSpec(
    name="embeddings",
    doc="Daily universal embeddings (L2-normalised) per entity.",
    schema=StructType(
        [
            _col("entity_type", StringType(), "user, item, advertiser, category.", False),
            _col("node_id", LongType(), "Node id.", False),
            _col("raw_id", StringType(), "Raw id.", False),
            _col("vector", ArrayType(FloatType(), False), "L2-normalised embedding.", False),
            _col("model_version", StringType(), "Model directory version that produced it.", False),
            DS,
        ]
    ),
    partition_by=("ds",),
    properties=_DAILY_PROPS,
)

BOM_TOKENS = TableSpec(
    name="bom_tokens",
    doc="Bag-of-Meaning: per entity, its top tokens per level with soft-assignment weights and its exact path.",
    schema=StructType(
        [
            _col("entity_type", StringType(), "Entity type.", False),
            _col("node_id", LongType(), "Node id.", False),
            _col("raw_id", StringType(), "Raw id.", False),
            _col("bom_level", IntegerType(), "Quantiser level, 0 = coarsest.", False),
            _col("token", StringType(), "Token id, e.g. 'L1:3.17' (level, path of codes).", False),
            _col(
                "weight",
                FloatType(),
                "Soft-assignment weight; weights of an entity's tokens sum to 1 per level.",
                False,
            ),
            _col("rank", IntegerType(), "Rank within the entity's level, 1 = strongest.", False),
            _col("path", StringType(), "Exact semantic id of the entity (hard codes of all levels).", False),
            _col("model_version", StringType(), "Model version.", False),
            DS,
        ]
    ),
    partition_by=("ds",),
    properties=_DAILY_PROPS,
)

BOM_VOCAB = TableSpec(
    name="bom_vocab",
    doc=(
        "Token vocabulary of a day: parent token, member count, a human-readable label, and whether the token is "
        "new, continues from the previous day or retired that day (a retired token's row has size 0 and the "
        "previous day's label)."
    ),
    schema=StructType(
        [
            _col("token", StringType(), "Token id.", False),
            _col("bom_level", IntegerType(), "Quantiser level.", False),
            _col("parent_token", StringType(), "Token one level coarser (null at level 0)."),
            _col("size", LongType(), "Entities whose exact path goes through this token.", False),
            _col(
                "label",
                StringType(),
                "Readable label from members' typical categories/brands/taxonomy words.",
                False,
            ),
            _col(
                "status",
                StringType(),
                "new (no such token the previous day), continued (the previous day had it), or retired (the "
                "previous day had it, this day has not: size 0). NULL on rows written before it existed.",
            ),
            _col(
                "first_ds",
                DateType(),
                "First day the token was in the vocabulary (carried along while it continues). NULL on rows "
                "written before it existed.",
            ),
            _col("model_version", StringType(), "Model version.", False),
            DS,
        ]
    ),
    partition_by=("ds",),
    properties=_DAILY_PROPS,
)

EVAL_METRICS = TableSpec(
    name="eval_metrics",
    doc="Deep-funnel metrics per task, method, slice, candidate set and K, with bootstrap CIs.",
    schema=StructType(
        [
            _col(
                "task",
                StringType(),
                "retrieval (each method's own top K) or ranking (learning-to-rank over the candidate union); "
                "NULL on rows written before tasks existed, which are retrieval rows.",
            ),
            _col("dataset", StringType(), "Dataset name.", False),
            _col("protocol", StringType(), "temporal or leave_last_conversion_out.", False),
            _col("model_version", StringType(), "HIR model version evaluated."),
            _col(
                "method",
                StringType(),
                "retrieval: hir, an ablation or a baseline; ranking: a ranker (base, base+hir_embedding, "
                "base+hir_tokens, base+hir), candidate_union (the candidates' own recall) or hir_tokens.",
                False,
            ),
            _col(
                "candidates", StringType(), "graph, catalog, or union (the ranking task's candidates).", False
            ),
            _col("slice", StringType(), "User/target slice.", False),
            _col(
                "metric",
                StringType(),
                "recall, ndcg, hit_rate; retrieval also hir_recall_diff and hir_ndcg_diff (on a baseline's "
                "method: hir minus that baseline, paired over users); ranking also auc, ndcg_lift and "
                "recall_lift (a ranker minus base, paired over users) and level0_purity (hir_tokens: items' "
                "level-0 token against categories).",
                False,
            ),
            _col("k", IntegerType(), "Cut-off K (0 where a metric has none: auc, level0_purity).", False),
            _col("value", DoubleType(), "Metric value.", False),
            _col("ci_low", DoubleType(), "Bootstrap 95% CI lower bound."),
            _col("ci_high", DoubleType(), "Bootstrap 95% CI upper bound."),
            _col("num_users", LongType(), "Users evaluated in this slice.", False),
            DS,
        ]
    ),
    partition_by=("ds",),
)

REPRESENTATION_DRIFT = TableSpec(
    name="representation_drift",
    doc=(
        "How far a day's representations moved from the previous day's, per entity type and cohort: entities "
        "whose neighbourhood sample holds the same neighbours on both days (unchanged), the others (changed), "
        "and all of them. Entities present on only one day are not counted."
    ),
    schema=StructType(
        [
            _col("entity_type", StringType(), "user, item, advertiser, category.", False),
            _col(
                "cohort",
                StringType(),
                "unchanged (the same neighbour ids on both days), changed, or all.",
                False,
            ),
            _col(
                "previous_ds", DateType(), "The day compared with (the latest earlier day embedded).", False
            ),
            _col("entities", LongType(), "Entities of the type and cohort embedded on both days.", False),
            _col(
                "cosine_mean",
                DoubleType(),
                "Mean cosine between an entity's embedding on ds and on previous_ds (NULL when the dims differ).",
            ),
            _col("cosine_p10", DoubleType(), "10th percentile of that cosine (exact, interpolated)."),
            _col(
                "cosine_p50", DoubleType(), "Median of that cosine; 1 - it is the drift the threshold checks."
            ),
            _col("cosine_p90", DoubleType(), "90th percentile of that cosine."),
            _col(
                "overlap_at_10",
                DoubleType(),
                "Mean share of an entity's 10 nearest same-type neighbours (among entities of both days) that are "
                "the same on both days, over a hash sample of the entities.",
            ),
            _col("overlap_sampled", LongType(), "Entities the overlap was measured on.", False),
            _col(
                "level0_kept", DoubleType(), "Share whose strongest level-0 token is the same on both days."
            ),
            _col(
                "level1_kept",
                DoubleType(),
                "Share whose strongest level-1 token (its path: level-0 and level-1 codes) is the same.",
            ),
            _col("model_version", StringType(), "Model version of ds.", False),
            _col("previous_model_version", StringType(), "Model version of previous_ds.", False),
            DS,
        ]
    ),
    partition_by=("ds",),
    properties=_DAILY_PROPS,
)

ALL_TABLES: dict[str, TableSpec] = {
    t.name: t
    for t in (
        EVENTS,
        ENTITIES,
        INGEST_REJECTS,
        SYNTHETIC_TRUTH,
        NODES,
        EDGES,
        NEIGHBOURHOODS,
        ENTITY_CONTENT,
        EMBEDDINGS,
        BOM_TOKENS,
        BOM_VOCAB,
        REPRESENTATION_DRIFT,
        EVAL_METRICS,
    )
}
