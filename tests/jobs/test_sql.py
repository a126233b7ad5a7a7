"""`hir sql`: tables by name, bound parameters, output formats, and the worked queries in docs/sql/."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from jobs import sql
from jobs.common.delta import write_table
from jobs.common.errors import HirError
from jobs.sql import config_from_args, render, run_query
from schemas.tables import BOM_TOKENS, BOM_VOCAB, ENTITIES, EVENTS
from tests.conftest import REPO_ROOT

D1, D2 = dt.date(2026, 1, 1), dt.date(2026, 1, 2)
DOCS = REPO_ROOT / "docs" / "sql"


def token(user: str, tok: str, weight: float, rank: int, ds: dt.date) -> tuple:
    return ("user", hash(user) % 1000, user, 0, tok, weight, rank, tok[3:], "v1", ds)


@pytest.fixture(scope="module")
def warehouse(spark, tmp_path_factory):
    wh = tmp_path_factory.mktemp("sql") / "warehouse"
    t = dt.datetime(2026, 1, 1, 10)
    events = [
        ("shop", "u1", "A", "buy", "purchase", t, None, D1),
        ("shop", "u2", "B", "buy", "purchase", t, None, D2),
        ("shop", "u3", "C", "buy", "purchase", t, None, D1),
        ("shop", "u4", "A", "view", "view", t, None, D1),
    ]
    write_table(spark.createDataFrame(events, EVENTS.schema), EVENTS, wh, None)
    entities = [
        ("shop", "item", i, None, None, b, None, None, t, D1)
        for i, b in (("A", "acme"), ("B", "acme"), ("C", "x"))
    ]
    write_table(spark.createDataFrame(entities, ENTITIES.schema), ENTITIES, wh, None)
    tokens = [
        token("u1", "L0:1", 0.7, 1, D2), token("u1", "L0:2", 0.3, 2, D2),
        token("u2", "L0:1", 0.6, 1, D2), token("u2", "L0:3", 0.4, 2, D2),
        token("u3", "L0:2", 0.9, 1, D2), token("u3", "L0:1", 0.1, 2, D2),
        token("u4", "L0:1", 1.0, 1, D2),
        token("u1", "L0:2", 1.0, 1, D1), token("u2", "L0:1", 1.0, 1, D1),
        token("u3", "L0:2", 1.0, 1, D1), token("u4", "L0:2", 1.0, 1, D1),
    ]  # fmt: skip
    write_table(spark.createDataFrame(tokens, BOM_TOKENS.schema), BOM_TOKENS, wh, None)
    vocab = [
        (f"L0:{i}", 0, None, 1, label, "new" if d == D1 else "continued", D1, "v1", d)
        for d in (D1, D2)
        for i, label in ((1, "kitchen"), (2, "phones"), (3, "tools"))
    ]
    write_table(spark.createDataFrame(vocab, BOM_VOCAB.schema), BOM_VOCAB, wh, None)
    return wh


def query(spark, warehouse, name: str, **params) -> list[tuple]:
    argv = ["--warehouse", str(warehouse), "-f", str(DOCS / name)]
    for key, value in params.items():
        argv += ["-p", f"{key}={value}"]
    return [tuple(r) for r in run_query(spark, config_from_args(argv)).collect()]


def test_top_tokens_of_brand_purchasers(spark, warehouse):
    rows = query(spark, warehouse, "top_tokens_of_brand_purchasers.sql", brand="acme", ds=D2)
    # acme purchasers are u1 and u2 (u4 only viewed, u3 bought another brand)
    assert rows == [("L0:1", "kitchen", 2, 1.3), ("L0:3", "tools", 1, 0.4), ("L0:2", "phones", 1, 0.3)]


def test_users_with_token(spark, warehouse):
    rows = query(spark, warehouse, "users_with_token.sql", token="L0:1", ds=D2)
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("u4", 1, 1.0),
        ("u1", 1, 0.7),
        ("u2", 1, 0.6),
        ("u3", 2, 0.1),
    ]


def test_token_share_drift(spark, warehouse):
    rows = query(spark, warehouse, "token_share_drift.sql", ds=D2, prev_ds=D1)
    assert [(r[0], float(r[1]), float(r[2]), float(r[3])) for r in rows] == [
        ("L0:1", 0.25, 0.75, 0.5),
        ("L0:2", 0.75, 0.25, -0.5),
    ]


def test_token_label_and_members(spark, warehouse):
    rows = query(spark, warehouse, "token_label_and_members.sql", token="L0:1", ds=D2)
    assert [(r[1], r[5], r[6]) for r in rows] == [
        ("kitchen", "u4", 1.0),
        ("kitchen", "u1", 0.7),
        ("kitchen", "u2", 0.6),
    ]


def test_every_worked_query_is_tested():
    tested = {"top_tokens_of_brand_purchasers.sql", "users_with_token.sql", "token_share_drift.sql",
              "token_label_and_members.sql"}  # fmt: skip
    assert {p.name for p in DOCS.glob("*.sql")} == tested


def test_formats_and_errors(spark, warehouse, capsys):
    df = run_query(spark, config_from_args(["--warehouse", str(warehouse), "-e", "SELECT token, size FROM bom_vocab "
                                            "WHERE ds = DATE'2026-01-01' ORDER BY token"]))  # fmt: skip
    assert render(df, "csv", 2) == "token,size\nL0:1,1\nL0:2,1"
    assert json.loads(render(df, "json", 1)) == {"token": "L0:1", "size": 1}
    assert "L0:3" in render(df, "table", 10)
    code = sql.run_job(sql.main, ["--warehouse", str(warehouse), "-e", "SELECT * FROM no_such_table"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: query failed:") and len(err.splitlines()) == 1
    with pytest.raises(HirError, match="--param must be NAME=VALUE"):
        config_from_args(["-e", "SELECT 1", "-p", "oops"])
    with pytest.raises(HirError, match="warehouse not found"):
        run_query(spark, config_from_args(["--warehouse", "no/such/dir", "-e", "SELECT 1"]))
