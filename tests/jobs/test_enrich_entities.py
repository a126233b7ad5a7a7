"""Enrichment: texts from attributes, UDF equals the encoder, only changed texts are re-embedded."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from hir_model.content import HashingEncoder, encoder_name, load_encoder
from jobs.common.delta import read_table, write_table
from jobs.common.errors import HirError
from jobs.enrich_entities import EnrichConfig, config_from_args, enrich
from schemas.tables import ENTITIES, ENTITY_CONTENT, NODES

D1, D2 = dt.date(2019, 10, 1), dt.date(2019, 10, 2)
T = dt.datetime(2019, 10, 1, 12)


def entity(item, cat, code, brand, price, ds, title=None):
    return ("rees46", "item", item, cat, code, brand, price, title, T, ds)


def node(node_id, node_type, raw_id, ds):
    return (node_id, "rees46", node_type, raw_id, 1, ds)


ENTITY_ROWS = [
    entity("1", "55", "appliances.kitchen.mixer", "elenberg", 25.71, D1),
    entity("2", "55", "appliances.kitchen.mixer", None, None, D1),
    entity("3", "66", None, "apple", 1500.0, D1),
    # a later attribute change of item 1, visible only from D2 on
    entity("1", "55", "appliances.kitchen.mixer", "bosch", 25.71, D2),
]
NODE_ROWS = [
    node(11, "item", "1", D1),
    node(12, "item", "2", D1),
    node(13, "item", "3", D1),
    node(21, "advertiser", "elenberg", D1),
    node(31, "category", "55", D1),
    node(32, "category", "appliances.kitchen", D1),
    node(33, "category", "66", D1),
    node(41, "user", "u1", D1),
]


@pytest.fixture()
def small_warehouse(spark, warehouse):
    write_table(spark.createDataFrame(ENTITY_ROWS, ENTITIES.schema), ENTITIES, warehouse, None)
    day2 = [(*r[:-1], D2) for r in NODE_ROWS]
    write_table(spark.createDataFrame(NODE_ROWS + day2, NODES.schema), NODES, warehouse, None)
    return warehouse


def content(spark, warehouse):
    return {r["raw_id"]: r for r in read_table(spark, ENTITY_CONTENT, warehouse).collect()}


def test_texts_from_taxonomy_brand_price_and_never_later_days(spark, small_warehouse):
    report = enrich(spark, EnrichConfig(ds=D1, warehouse=str(small_warehouse), encoder="hashing:64"))
    assert (report.nodes, report.embedded, report.unchanged) == (7, 7, 0)  # users get no text
    assert report.texts == 6  # item 2 and category 55 read the same: the encoder runs once for both
    texts = {raw: row["text"] for raw, row in content(spark, small_warehouse).items()}
    assert texts == {
        "1": "appliances kitchen mixer. brand elenberg. low price",  # D2's 'bosch' is not visible on D1
        "2": "appliances kitchen mixer",
        "3": "category 66. brand apple. premium price",
        "elenberg": "brand elenberg",
        "55": "appliances kitchen mixer",
        "appliances.kitchen": "appliances kitchen",
        "66": "category 66",
    }


def test_udf_vectors_equal_the_encoder_run_directly(spark, small_warehouse):
    enrich(spark, EnrichConfig(ds=D1, warehouse=str(small_warehouse), encoder="hashing:64"))
    rows = read_table(spark, ENTITY_CONTENT, small_warehouse).orderBy("node_id").collect()
    direct = HashingEncoder(64).encode([r["text"] for r in rows])
    np.testing.assert_array_equal(np.array([r["vector"] for r in rows], dtype=np.float32), direct)
    assert {r["encoder"] for r in rows} == {encoder_name("hashing:64")}
    assert np.allclose(np.linalg.norm(direct, axis=1), 1.0, atol=1e-6)


def test_second_run_embeds_only_changed_texts(spark, small_warehouse):
    cfg = EnrichConfig(ds=D1, warehouse=str(small_warehouse), encoder="hashing:64")
    enrich(spark, cfg)
    before = content(spark, small_warehouse)
    again = enrich(spark, cfg)
    assert (again.embedded, again.unchanged) == (0, 7)
    # On D2 item 1's brand changed: exactly that entity is re-embedded, the rest keep their vectors.
    day2 = enrich(spark, EnrichConfig(ds=D2, warehouse=str(small_warehouse), encoder="hashing:64"))
    assert (day2.embedded, day2.unchanged, day2.texts) == (1, 6, 1)
    after = content(spark, small_warehouse)
    assert after["1"]["text"] == "appliances kitchen mixer. brand bosch. low price"
    assert after["1"]["updated_ds"] == D2 and after["2"]["updated_ds"] == D1
    assert after["2"]["vector"] == before["2"]["vector"]
    assert read_table(spark, ENTITY_CONTENT, small_warehouse).count() == 7  # merged, not appended


@pytest.mark.slow
def test_minilm_in_the_udf_matches_the_model_and_knows_meaning(spark, small_warehouse):
    enrich(spark, EnrichConfig(ds=D1, warehouse=str(small_warehouse), encoder="minilm"))
    rows = read_table(spark, ENTITY_CONTENT, small_warehouse).orderBy("node_id").collect()
    encoder = load_encoder("minilm")
    direct = encoder.encode([r["text"] for r in rows])
    udf = np.array([r["vector"] for r in rows], dtype=np.float32)
    assert udf.shape == (7, 384)
    np.testing.assert_allclose(udf, direct, atol=1e-5)  # same model, other process: fp32 reduction order only
    kitchen, mixer, apple = encoder.encode(["appliances kitchen", "kitchen mixer blender", "brand apple"])
    assert kitchen @ mixer > kitchen @ apple


def test_bad_encoder_and_node_types_are_one_line_errors():
    with pytest.raises(HirError, match="unknown content encoder 'bert'"):
        config_from_args(["--ds", "2019-10-01", "--encoder", "bert"])
    with pytest.raises(HirError, match="hashing dimension must be an integer"):
        config_from_args(["--ds", "2019-10-01", "--encoder", "hashing:x"])
    with pytest.raises(HirError, match="--node-types: 'user' has no text"):
        config_from_args(["--ds", "2019-10-01", "--node-types", "item,user"])


def test_missing_nodes_is_a_clear_error(spark, warehouse):
    write_table(spark.createDataFrame(ENTITY_ROWS, ENTITIES.schema), ENTITIES, warehouse, None)
    with pytest.raises(HirError, match="table nodes not found"):
        enrich(spark, EnrichConfig(ds=D1, warehouse=str(warehouse), encoder="hashing"))
