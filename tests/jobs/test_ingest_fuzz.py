"""Malformed inputs for every adapter: a one-line error or a full reconciliation, never a bare stack trace."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from jobs.common.delta import read_table
from jobs.common.errors import HirError
from jobs.ingest_events import IngestConfig, ingest
from schemas.tables import INGEST_REJECTS

TAOBAO_GOOD = "".join(f"{u},{100 + u},7,pv,{1511544070 + u}\n" for u in range(1, 60))
REES46_HEADER = (
    "event_time,event_type,product_id,category_id,category_code,brand,price,user_id,user_session\n"
)
REES46_GOOD = REES46_HEADER + "".join(
    f"2019-10-01 00:00:{u:02d} UTC,view,{1000 + u},2053013552326770905,appliances.kitchen,acme,9.5,{u},s{u}\n"
    for u in range(1, 60)
)
GENERIC_MAPPING = (
    'name = "shop"\n[columns]\nuser_id = "u"\nitem_id = "i"\nevent_type = "t"\nevent_time = "ts"\n'
    '[event_types]\nview = "view"\n'
)
GENERIC_GOOD = "u,i,t,ts\n" + "".join(f"{u},{u},view,{1511544070 + u}\n" for u in range(1, 60))


def run(tmp_path: Path, source: str, payload: bytes, **extra):
    path = tmp_path / f"{source}.csv"
    path.write_bytes(payload)
    mapping = None
    if source == "generic":
        mapping = tmp_path / "mapping.toml"
        mapping.write_text(GENERIC_MAPPING)
    cfg = IngestConfig(
        source=source,
        inputs=(str(path),),
        warehouse=str(tmp_path / "wh"),
        mapping=str(mapping) if mapping else None,
        **extra,
    )
    return ingest(_spark(), cfg)


def _spark():
    from jobs.common.spark import get_spark

    return get_spark()


def junk(seed: int, size: int = 4000) -> bytes:
    rng = random.Random(seed)
    return bytes(rng.randrange(256) for _ in range(size))


GOOD = {"taobao": TAOBAO_GOOD, "rees46": REES46_GOOD, "generic": GENERIC_GOOD}

# (case, payload builder, expected error fragment)
FAILING = [
    ("binary junk", lambda src: junk(1), r"records rejected|no records|not in the header|empty"),
    (
        "wrong delimiter",
        lambda src: GOOD[src].replace(",", ";").encode(),
        r"records rejected|not in the header",
    ),
    ("empty file", lambda src: b"", r"no records|is empty"),
    (
        "header only",
        lambda src: {"taobao": b"user_id,item_id,category_id,behavior_type,timestamp\n"}.get(
            src, GOOD[src].splitlines(keepends=True)[0].encode()
        ),
        r"no records",
    ),
    (
        "missing columns",
        lambda src: "\n".join(",".join(line.split(",")[:-2]) for line in GOOD[src].splitlines()).encode(),
        r"records rejected|not in the header",
    ),
]


@pytest.mark.parametrize("source", ["taobao", "rees46", "generic"])
@pytest.mark.parametrize("case, build, message", FAILING, ids=[c[0] for c in FAILING])
def test_broken_file_is_a_one_line_error_and_writes_nothing(spark, tmp_path, source, case, build, message):
    with pytest.raises(HirError, match=message) as err:
        run(tmp_path, source, build(source))
    assert "\n" not in str(err.value)
    assert not (tmp_path / "wh" / "events").exists()


def test_huge_field_and_non_utf8_bytes_reconcile(spark, tmp_path):
    huge = "1,100,7,pv," + "9" * 2_000_000 + "\n"  # a 2 MB timestamp field
    latin1 = "2,101,7,pv,15115440x\xe9\n".encode("latin-1")  # invalid UTF-8 inside a field
    payload = TAOBAO_GOOD.encode() + huge.encode() + latin1
    report = run(tmp_path, "taobao", payload)
    assert report.reconciles and (report.events, report.rejects) == (59, 2)
    reasons = sorted(r["reason"][:14] for r in read_table(spark, INGEST_REJECTS, tmp_path / "wh").collect())
    assert reasons == ["bad timestamp ", "bad timestamp "]


def test_non_utf8_attribute_is_kept_not_lost(spark, tmp_path):
    line = "2019-10-01 00:01:00 UTC,view,1,2053013552326770905,,caf\xe9,9.5,7,s7\n".encode("latin-1")
    report = run(tmp_path, "rees46", REES46_GOOD.encode() + line)
    assert report.reconciles and (report.events, report.rejects) == (60, 0)
