"""Ingestion: adapters on tiny inline files, reject reasons, thresholds, idempotency, flags, real data."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from jobs import ingest_events
from jobs.common.delta import read_table, table_exists
from jobs.common.errors import HirError
from jobs.ingest_events import IngestConfig, ingest
from jobs.sources.synthetic import SyntheticSpec
from schemas.tables import ENTITIES, EVENTS, INGEST_REJECTS, SYNTHETIC_TRUTH


def write(path: Path, text: str, newline: str = "\n") -> str:
    path.write_bytes(text.replace("\n", newline).encode())
    return str(path)


def events_of(spark, warehouse, source: str | None = None):
    df = read_table(spark, EVENTS, warehouse)
    return df if source is None else df.where(F.col("source") == source)


def rejects_of(spark, warehouse):
    return {r["record"]: r["reason"] for r in read_table(spark, INGEST_REJECTS, warehouse).collect()}


TAOBAO = """user_id,item_id,category_id,behavior_type,timestamp
1,100,7,pv,1511544070
1,100,7,pv,1511544070
1,100,7,buy,1511600000
2,200,8,fav,1512144000
x,200,8,pv,1511544070
3,200,8,click,1511544070
3,200,8,pv,notatime
3,200,8
"""


def test_taobao_adapter_canonical_events_and_reasons(spark, warehouse, tmp_path):
    path = write(tmp_path / "tb.csv", TAOBAO, "\r\n")  # raw slices have CRLF endings
    report = ingest(
        spark,
        IngestConfig(source="taobao", inputs=(path,), warehouse=str(warehouse), max_reject_fraction=1.0),
    )
    assert (report.read, report.events, report.rejects, report.duplicates) == (8, 3, 4, 1)
    assert report.reconciles

    expected = spark.createDataFrame(
        [
            (
                "taobao",
                "1",
                "100",
                "pv",
                "view",
                dt.datetime(2017, 11, 24, 17, 21, 10),
                None,
                dt.date(2017, 11, 25),
            ),
            (
                "taobao",
                "1",
                "100",
                "buy",
                "purchase",
                dt.datetime(2017, 11, 25, 8, 53, 20),
                None,
                dt.date(2017, 11, 25),
            ),
            # 2017-12-01 16:00 UTC is 2017-12-02 00:00 in Shanghai: the day follows the source's time zone.
            (
                "taobao",
                "2",
                "200",
                "fav",
                "favourite",
                dt.datetime(2017, 12, 1, 16, 0, 0),
                None,
                dt.date(2017, 12, 2),
            ),
        ],
        EVENTS.schema,
    )
    assert_df_equality(
        events_of(spark, warehouse),
        expected,
        ignore_row_order=True,
        ignore_nullable=True,
        ignore_metadata=True,
    )
    assert rejects_of(spark, warehouse) == {
        "x,200,8,pv,1511544070": "non-numeric user_id 'x'",
        "3,200,8,click,1511544070": "unknown event type 'click'",
        "3,200,8,pv,notatime": "bad timestamp 'notatime'",
        "3,200,8": "malformed line: 3 of 5 fields",
    }
    entities = read_table(spark, ENTITIES, warehouse).select("entity_id", "category_id", "ds").collect()
    assert sorted(tuple(r) for r in entities) == [
        ("100", "7", dt.date(2017, 11, 25)),
        ("200", "8", dt.date(2017, 12, 2)),
    ]


REES46 = """event_time,event_type,product_id,category_id,category_code,brand,price,user_id,user_session
2019-10-01 00:00:00 UTC,view,44600062,2103807459595387724,,shiseido,35.79,541312140,s1
2019-10-01 00:00:01 UTC,cart,3900821,2053013552326770905,appliances.environment.water_heater,AQUA,0,554748717,s2
2019-10-01 00:00:02 UTC,remove_from_cart,3900821,2053013552326770905,,aqua,33.20,554748717,s2
2019-10-01 00:00:03 UTC,purchase,3900821,2053013552326770905,,,abc,554748717,s2
2019-10-01 00:00:04 UTC,view,3900821,2053013552326770905,,,33.2,5547
"""


def test_rees46_adapter_keeps_attributes_and_rejects_truncated_line(spark, warehouse, tmp_path):
    path = write(tmp_path / "r.csv", REES46, "\r\n")
    report = ingest(
        spark,
        IngestConfig(source="rees46", inputs=(path,), warehouse=str(warehouse), max_reject_fraction=1.0),
    )
    assert (report.read, report.events, report.rejects, report.duplicates) == (5, 3, 2, 0)
    stages = {r["event_type"]: r["funnel_stage"] for r in events_of(spark, warehouse).collect()}
    assert stages == {"view": "view", "cart": "cart", "remove_from_cart": "removal"}
    reasons = set(rejects_of(spark, warehouse).values())
    assert reasons == {"non-numeric price 'abc'", "truncated or malformed line: 8 of 9 fields"}
    item = read_table(spark, ENTITIES, warehouse).where("entity_id = '3900821'").first()
    # the later event's brand wins (lower-cased); its price 33.20 replaces the cart's price 0 (null: unknown)
    assert (item["brand"], item["price"], item["category_code"]) == (
        "aqua",
        33.2,
        "appliances.environment.water_heater",
    )
    assert item["category_id"] == "2053013552326770905"  # 64-bit ids survive as strings


GENERIC_MAPPING = """
name = "shop"
format = "csv"
delimiter = ";"
timezone = "Europe/Berlin"
time_format = "yyyy-MM-dd'T'HH:mm:ss"
[columns]
user_id = "customer"
item_id = "sku"
event_type = "action"
event_time = "when"
brand = "maker"
[event_types]
click = "view"
order = "purchase"
"""


def test_generic_csv_mapping(spark, warehouse, tmp_path):
    mapping = write(tmp_path / "m.toml", GENERIC_MAPPING)
    data = write(
        tmp_path / "g.csv",
        'customer;sku;action;when;maker\nc1;"s;1";click;2024-03-01T23:30:00;Acme\n'
        "c2;s2;order;2024-03-02T10:00:00;\nc3;s3;click;2024-03-02T10:00:00;x;extra\n",
    )
    report = ingest(
        spark,
        IngestConfig(
            source="generic",
            inputs=(data,),
            mapping=mapping,
            warehouse=str(warehouse),
            max_reject_fraction=1.0,
        ),
    )
    assert (report.source, report.events, report.rejects) == ("shop", 2, 1)
    rows = {r["item_id"]: r for r in events_of(spark, warehouse, "shop").collect()}
    assert rows["s;1"]["funnel_stage"] == "view"  # quoted delimiter inside a field
    # Wall-clock 23:30 in Berlin (UTC+1) is 22:30 UTC, still March 1st there.
    assert (rows["s;1"]["event_time"], rows["s;1"]["ds"]) == (
        dt.datetime(2024, 3, 1, 22, 30),
        dt.date(2024, 3, 1),
    )
    assert rows["s2"]["funnel_stage"] == "purchase"
    assert set(rejects_of(spark, warehouse).values()) == {"too many fields: more than 5"}


def test_generic_parquet_mapping(spark, warehouse, tmp_path):
    mapping = write(
        tmp_path / "m.toml",
        'name = "pq"\nformat = "parquet"\ntime_format = "epoch_millis"\n'
        '[columns]\nuser_id = "u"\nitem_id = "i"\nevent_type = "t"\nevent_time = "ms"\n'
        '[event_types]\nview = "view"\nbuy = "purchase"\n',
    )
    spark.createDataFrame(
        [(1, 10, "view", 1700000000000), (2, None, "buy", 1700000000000)], "u long, i long, t string, ms long"
    ).write.parquet(str(tmp_path / "pq"))
    report = ingest(
        spark,
        IngestConfig(
            source="generic",
            inputs=(str(tmp_path / "pq"),),
            mapping=mapping,
            warehouse=str(warehouse),
            max_reject_fraction=1.0,
        ),
    )
    assert (report.events, report.rejects) == (1, 1)
    assert list(rejects_of(spark, warehouse).values()) == ["missing item_id"]
    assert events_of(spark, warehouse).first()["event_time"] == dt.datetime(2023, 11, 14, 22, 13, 20)


def test_generic_mapping_errors_are_one_line(tmp_path):
    bad = write(tmp_path / "bad.toml", '[columns]\nuser_id = "u"\n')
    with pytest.raises(HirError, match="lacks item_id, event_type, event_time"):
        ingest_events.generic.load_mapping(bad)
    stage = write(tmp_path / "stage.toml", GENERIC_MAPPING.replace('order = "purchase"', 'order = "bought"'))
    with pytest.raises(HirError, match="unknown funnel stage 'bought'"):
        ingest_events.generic.load_mapping(stage)


def test_reject_fraction_threshold_writes_nothing(spark, warehouse, tmp_path):
    path = write(tmp_path / "tb.csv", TAOBAO)
    with pytest.raises(
        HirError, match=r"4 of 8 records rejected \(50.0% > --max-reject-fraction 0.05\).*nothing written"
    ):
        ingest(spark, IngestConfig(source="taobao", inputs=(path,), warehouse=str(warehouse)))
    for spec in (EVENTS, ENTITIES, INGEST_REJECTS):
        assert not table_exists(spark, spec, warehouse)


def test_rerun_is_idempotent_and_leaves_other_sources_alone(spark, warehouse, tmp_path):
    taobao = write(tmp_path / "tb.csv", TAOBAO)
    other = write(
        tmp_path / "other.csv", "user_id,item_id,category_id,behavior_type,timestamp\n9,9,9,pv,1511544070\n"
    )
    cfg = IngestConfig(source="taobao", inputs=(taobao,), warehouse=str(warehouse), max_reject_fraction=1.0)
    ingest(spark, cfg)
    first_events = events_of(spark, warehouse).collect()
    first_rejects = read_table(spark, INGEST_REJECTS, warehouse).collect()
    # A generic source shares the day 2017-11-25 with taobao.
    mapping = write(
        tmp_path / "m.toml",
        'name = "shop"\n[columns]\nuser_id = "user_id"\nitem_id = "item_id"\n'
        'event_type = "behavior_type"\nevent_time = "timestamp"\n[event_types]\npv = "view"\n',
    )
    ingest(spark, IngestConfig(source="generic", inputs=(other,), mapping=mapping, warehouse=str(warehouse)))
    ingest(spark, cfg)
    assert_df_equality(
        events_of(spark, warehouse, "taobao"),
        spark.createDataFrame(first_events, EVENTS.schema),
        ignore_row_order=True,
        ignore_nullable=True,
        ignore_metadata=True,
    )
    assert sorted(map(tuple, read_table(spark, INGEST_REJECTS, warehouse).collect())) == sorted(
        map(tuple, first_rejects)
    )
    assert events_of(spark, warehouse, "shop").count() == 1


def test_ds_flag_rejects_other_days(spark, warehouse, tmp_path):
    path = write(tmp_path / "tb.csv", TAOBAO)
    report = ingest(
        spark,
        IngestConfig(
            source="taobao",
            inputs=(path,),
            warehouse=str(warehouse),
            ds=dt.date(2017, 11, 25),
            max_reject_fraction=1.0,
        ),
    )
    assert report.days == ("2017-11-25",)
    assert "event day 2017-12-02 is not --ds 2017-11-25" in rejects_of(spark, warehouse).values()


def test_synthetic_is_deterministic_and_plants_interests(spark, tmp_path):
    spec = SyntheticSpec(users=60, items=200, events=3000, seed=3, parents=4, children=3)
    a, b = tmp_path / "a", tmp_path / "b"
    ra = ingest(spark, IngestConfig(source="synthetic", warehouse=str(a), synthetic=spec))
    rb = ingest(spark, IngestConfig(source="synthetic", warehouse=str(b), synthetic=spec))
    assert ra.reconciles and ra.rejects == 0 and ra.events == rb.events
    assert abs(ra.events - 3000) < 300
    assert_df_equality(events_of(spark, a), events_of(spark, b), ignore_row_order=True)
    truth = read_table(spark, SYNTHETIC_TRUTH, a)
    users = truth.where("entity_type = 'user'").select(
        F.col("entity_id").alias("user_id"), F.col("parent_cluster").alias("user_parent")
    )
    items = truth.where("entity_type = 'item'").select(
        F.col("entity_id").alias("item_id"), F.col("parent_cluster").alias("item_parent")
    )
    joined = events_of(spark, a).join(users, "user_id").join(items, "item_id")
    on_interest = joined.where("user_parent = item_parent").count() / joined.count()
    assert (
        on_interest > 0.85
    )  # 90% of views planted inside the user's parent interest (+ noise hitting it by chance)
    stages = {r[0]: r[1] for r in events_of(spark, a).groupBy("funnel_stage").count().collect()}
    assert stages["view"] > 10 * stages["cart"] > 0 and stages["cart"] > stages["purchase"] > 0
    # every conversion follows a view of the same item by the same user
    views = (
        events_of(spark, a)
        .where("funnel_stage = 'view'")
        .select("user_id", "item_id", F.col("event_time").alias("vt"))
    )
    deep = events_of(spark, a).where("funnel_stage IN ('cart', 'purchase')")
    unexplained = (
        deep.join(views, ["user_id", "item_id"], "left")
        .groupBy("user_id", "item_id", "event_time")
        .agg(F.min("vt").alias("first_view"))
        .where("first_view IS NULL OR first_view > event_time")
    )
    assert unexplained.count() == 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--source", "kafka", "--input", "x"], "argument --source: invalid choice: 'kafka'"),
        (["--source", "taobao", "--input", "does/not/exist.csv"], "input not found: does/not/exist.csv"),
        (["--source", "taobao", "--input", "x", "--ds", "2017-13-01"], "--ds must be a date as YYYY-MM-DD"),
        (["--source", "taobao"], "--input is required for --source taobao"),
        (["--source", "generic", "--input", "x"], "--mapping is required"),
    ],
)
def test_bad_flags_fail_fast_with_one_line(argv, message, capsys, tmp_path):
    code = ingest_events.run_job(ingest_events.main, argv + ["--warehouse", str(tmp_path / "wh")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "wh").exists()


@pytest.mark.slow
def test_real_taobao_reconciles(spark, warehouse, shared_data):
    folder = shared_data / "taobao_userbehavior"
    report = ingest(
        spark,
        IngestConfig(
            source="taobao",
            inputs=(str(folder / "UserBehavior_user_complete.csv"),),
            warehouse=str(warehouse),
        ),
    )
    assert (report.read, report.events, report.rejects, report.duplicates) == (40959, 40959, 0, 0)
    stages = {r[0]: r[1] for r in events_of(spark, warehouse).groupBy("funnel_stage").count().collect()}
    assert stages == {"view": 36835, "cart": 2301, "favourite": 979, "purchase": 844}  # SOURCE.md statistics
    # The three raw slices (no header, CRLF in one, overlapping users) de-duplicate to the curated file.
    raw = sorted(str(p) for p in (folder / "raw").glob("*.csv"))
    report = ingest(spark, IngestConfig(source="taobao", inputs=tuple(raw), warehouse=str(warehouse)))
    assert (report.read, report.events, report.rejects, report.duplicates) == (45279, 40959, 0, 4320)


@pytest.mark.slow
def test_real_rees46_reconciles(spark, warehouse, shared_data):
    path = shared_data / "rees46_oct2019" / "2019-Oct_head.csv"
    report = ingest(spark, IngestConfig(source="rees46", inputs=(str(path),), warehouse=str(warehouse)))
    # 17,434 usable rows (5 exact duplicates among them) + the truncated last line.
    assert (report.read, report.events, report.rejects, report.duplicates) == (17435, 17429, 1, 5)
    assert report.reject_reasons == {"truncated or malformed line:": 1}
    entities = read_table(spark, ENTITIES, warehouse)
    assert entities.count() == 6493
    assert entities.where("brand IS NOT NULL").select("brand").distinct().count() == 864
