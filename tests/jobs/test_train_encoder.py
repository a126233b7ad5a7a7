"""Training job: reads exactly the named Delta snapshot, writes a complete immutable model version, resumes exactly,
refuses bad flags and deletion vectors in one line, and reports a collapsed run as collapsed.

Spark is slow on the CI box, so one module fixture writes every table once and one job run (through main) is
shared; the resume and collapse tests call the Spark-free `train` on inputs resolved once.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DateType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from hir_model import storage
from hir_model.checkpoint import (
    list_versions,
    load_model,
    load_quantiser,
    load_weights,
    read_lineage,
    read_metrics,
)
from hir_model.data import PyarrowReader, read_neighbourhoods
from hir_model.encoder import hash_node_ids
from jobs import train_encoder
from jobs.build_graph import node_id
from jobs.common.args import run_job
from jobs.common.delta import TableSnapshot, table_path, table_snapshot, write_table
from jobs.common.errors import HirError
from jobs.sample_neighbourhoods import SampleConfig
from jobs.train.inputs import TrainingInputs, categories_of_items
from jobs.train.next_period import NextPeriod, next_period
from jobs.train.run import EpochSelection
from jobs.train_encoder import code_version, config_from_args, default_version, resolve_inputs, train
from schemas.codes import EDGE_TYPES, NODE_TYPES
from schemas.tables import (
    EDGES,
    ENTITIES,
    ENTITY_CONTENT,
    EVENTS,
    NEIGHBOURHOODS,
    TableSpec,
)

DAY, NEXT_DAY, LEAKY_DAY = dt.date(2026, 1, 7), dt.date(2026, 1, 8), dt.date(2026, 1, 9)
L = 10  # max_tokens of the fixture's neighbourhoods
TINY = [  # trains a step in milliseconds; at dim 16 the untrained model already maps every row to one prototype
    "--dim", "32", "--heads", "2", "--layers", "1", "--prototypes", "64", "--id-buckets", "1024",
    "--batch-size", "8", "--steps", "4", "--checkpoint-every", "2", "--lr", "1e-4", "--levels", "2",
    "--threads", "1", "--seed", "5",
]  # fmt: skip


def spec_row(spec, **values) -> tuple:
    """A row in the spec's column order; columns the test does not care about get a neutral value."""
    unknown = set(values) - set(spec.columns)
    assert not unknown, f"{spec.name} has no column {unknown}"

    def neutral(dtype):
        if isinstance(dtype, StringType):
            return "x"
        if isinstance(dtype, BooleanType):
            return False
        if isinstance(dtype, ArrayType):
            return []
        if isinstance(dtype, DateType):
            return DAY
        if isinstance(dtype, TimestampType):
            return dt.datetime(2026, 1, 7, 12, tzinfo=dt.UTC)
        return 0

    return tuple(values[f.name] if f.name in values else neutral(f.dataType) for f in spec.schema.fields)


# Users and items carry the node ids build_graph gives their raw ids (source "test"), so that the events the
# next-period objective reads name the same nodes as the hand-made neighbourhoods; filled by the tables fixture.
NODE_IDS: dict[int, int] = {}


def n(raw: int) -> int:
    """The node id of a raw user (1xx) or item (2xx) id; categories (3xx) keep theirs."""
    return NODE_IDS.get(raw, raw)


def tree_row(node_id: int, node_type: str, neighbours: list[tuple], ds: dt.date) -> tuple:
    """A neighbourhoods row: target, then (node_id, type, edge type, hop, parent_pos, is_deep) tokens, padded."""
    tokens = [(n(node_id), node_type, "self", 0, -1, False), *[(n(t[0]), *t[1:]) for t in neighbours]]
    pad = L - len(tokens)
    column = lambda i, fill: [t[i] for t in tokens] + [fill] * pad  # noqa: E731
    return spec_row(
        NEIGHBOURHOODS,
        node_id=n(node_id),
        node_type=node_type,
        raw_id=str(node_id),
        num_tokens=len(tokens),
        num_hop1=sum(t[3] == 1 for t in tokens),
        token_node_id=column(0, 0),
        token_node_type=[NODE_TYPES[t[1]] for t in tokens] + [0] * pad,
        token_edge_type=[EDGE_TYPES[t[2]] for t in tokens] + [0] * pad,
        token_hop=column(3, 0),
        token_parent_pos=column(4, -1),
        token_recency=[0] * L,
        token_weight=[0.0] + [1.0] * (len(tokens) - 1) + [0.0] * pad,
        token_is_deep=column(5, False),
        ds=ds,
    )


CATEGORY = {201: 301, 202: 301, 203: 301, 204: 302, 205: 302, 206: 302}
CONVERSIONS = [
    (101, 201),
    (101, 202),
    (102, 201),
    (103, 204),
    (104, 205),
    (105, 201),
    (107, 203),
]  # 107: no row
VIEWS = [(101, 203), (102, 204), (103, 205), (104, 206), (105, 206), (106, 202), (106, 203)]


def write_events_and_catalogue(spark, warehouse: Path, events: list[tuple]) -> None:
    """The events table, and the entities table's items with their categories (CATEGORY)."""
    write_table(spark.createDataFrame(events, EVENTS.schema), EVENTS, warehouse, None)
    items = [
        spec_row(
            ENTITIES,
            source="test",
            entity_type="item",
            entity_id=str(i),
            category_id=str(c),
            price=1.0,
            ds=DAY,
        )
        for i, c in CATEGORY.items()
    ]
    write_table(spark.createDataFrame(items, ENTITIES.schema), ENTITIES, warehouse, None)


def day_rows(users, items, ds) -> list[tuple]:
    rows = []
    for u in users:
        hop1 = [(i, "item", "user_view_item", 1, 0, False) for uu, i in VIEWS if uu == u and i in items]
        hop1 += [(i, "item", "user_cart_item", 1, 0, True) for uu, i in CONVERSIONS if uu == u and i in items]
        hop2 = [(CATEGORY[t[0]], "category", "item_in_category", 2, p + 1, False) for p, t in enumerate(hop1)]
        rows.append(tree_row(u, "user", (hop1 + hop2)[: L - 1], ds))
    for i in items:
        hop1 = [(CATEGORY[i], "category", "item_in_category", 1, 0, False)]
        hop1 += [(u, "user", "item_viewed_by_user", 1, 0, False) for u, ii in VIEWS if ii == i and u in users]
        rows.append(tree_row(i, "item", hop1[: L - 1], ds))
    for c in sorted(set(CATEGORY[i] for i in items)):
        hop1 = [(i, "item", "category_has_item", 1, 0, False) for i in items if CATEGORY[i] == c]
        rows.append(tree_row(c, "category", hop1, ds))
    return rows


def edge(src, dst, edge_type, ds, last=None, weight=1.0) -> tuple:
    src_type, dst_type = edge_type.split("_")[0], edge_type.split("_")[-1]
    return spec_row(
        EDGES,
        src=n(src),
        dst=n(dst),
        src_type=src_type,
        dst_type=dst_type,
        edge_type=edge_type,
        funnel="deep" if "cart" in edge_type or "purchase" in edge_type else "upper",
        weight=weight,
        event_count=1,
        first_time=dt.datetime.combine(ds, dt.time(8), tzinfo=dt.UTC),
        last_time=last or dt.datetime.combine(ds, dt.time(9), tzinfo=dt.UTC),
        ds=ds,
    )


USERS_A, ITEMS_A = [101, 102, 103, 104, 105, 106], [201, 202, 203, 204, 205, 206]
USERS_B, ITEMS_B = [101, 102, 108], [201, 202]  # the day rewritten: different rows


@pytest.fixture(scope="module")
def tables(spark, tmp_path_factory):
    """neighbourhoods: version a (the day + a row of the next day), version b (the day rewritten); edges;
    entity_content. Returns (warehouse, version a, version b)."""
    warehouse = tmp_path_factory.mktemp("train") / "warehouse"
    raw = [(kind, r) for kind, ids in (("user", [*USERS_A, 107, 108, 999]), ("item", ITEMS_A)) for r in ids]
    keys = spark.createDataFrame(
        [("test", kind, str(r), r) for kind, r in raw], "s string, k string, r string, i int"
    )
    NODE_IDS.update(
        {
            row["i"]: row["id"]
            for row in keys.select("i", node_id(F.col("s"), F.col("k"), F.col("r")).alias("id")).collect()
        }
    )
    # Events: every view at 08:00, every conversion at 20:00, so the training cut-off (the last 20% of the day's
    # events after it) falls between them: views are the input, conversions the positives.
    at = lambda hour: dt.datetime.combine(DAY, dt.time(hour), tzinfo=dt.UTC)  # noqa: E731
    events = [
        spec_row(
            EVENTS,
            source="test",
            user_id=str(u),
            item_id=str(i),
            funnel_stage=stage,
            event_time=at(hour),
            ds=DAY,
        )
        for pairs, stage, hour in ((VIEWS, "view", 8), (CONVERSIONS, "cart", 20))
        for u, i in pairs
    ]
    write_events_and_catalogue(spark, warehouse, events)
    rows_a = day_rows(USERS_A, ITEMS_A, DAY) + [tree_row(999, "user", [], NEXT_DAY)]
    version_a = write_table(
        spark.createDataFrame(rows_a, NEIGHBOURHOODS.schema), NEIGHBOURHOODS, warehouse, None
    )
    rows_b = day_rows(USERS_B, ITEMS_B, DAY)
    version_b = write_table(
        spark.createDataFrame(rows_b, NEIGHBOURHOODS.schema), NEIGHBOURHOODS, warehouse, f"ds = '{DAY}'"
    )
    edges = [edge(u, i, "user_cart_item", DAY) for u, i in CONVERSIONS]
    edges += [edge(105, 201, "user_purchase_item", DAY)]  # cart and purchase of one pair: one positive
    edges += [edge(u, i, "user_view_item", DAY) for u, i in VIEWS]
    edges += [edge(i, c, "item_in_category", DAY, weight=5.0) for i, c in CATEGORY.items()]
    edges += [edge(201, 302, "item_in_category", DAY, weight=1.0)]  # a lighter second category is ignored
    late = dt.datetime.combine(LEAKY_DAY + dt.timedelta(days=3), dt.time(9), tzinfo=dt.UTC)
    edges += [edge(101, 201, "user_purchase_item", LEAKY_DAY, last=late)]
    write_table(spark.createDataFrame(edges, EDGES.schema), EDGES, warehouse, None)
    content = [
        spec_row(ENTITY_CONTENT, node_id=n(i), node_type="item", vector=[float(i % 4 == k) for k in range(4)])
        for i in ITEMS_A
    ]
    write_table(spark.createDataFrame(content, ENTITY_CONTENT.schema), ENTITY_CONTENT, warehouse, None)
    return warehouse, version_a, version_b


@pytest.fixture(autouse=True, scope="module")
def restore_torch_threads():
    previous = torch.get_num_threads()
    yield
    torch.set_num_threads(previous)


def argv(warehouse: Path, *extra: str) -> list[str]:
    return ["--ds", str(DAY), "--warehouse", str(warehouse), *TINY, *extra]


@pytest.fixture(scope="module")
def trained(tables):
    """One run of the job through main(), on neighbourhoods version a (not the latest), version name derived.
    Returns (exit code, model dir, the inputs main resolved), the inputs kept for the Spark-free tests."""
    warehouse, version_a, _ = tables
    resolved = []
    original = train_encoder.resolve_inputs
    train_encoder.resolve_inputs = lambda spark, cfg: resolved.append(original(spark, cfg)) or resolved[-1]
    try:
        rc = train_encoder.main(argv(warehouse, "--neighbourhoods-version", str(version_a)))
    finally:
        train_encoder.resolve_inputs = original
    (model_dir,) = [p for p in (warehouse / "models").iterdir() if not p.name.startswith(".")]
    return rc, model_dir, resolved[0]


def test_model_directory_is_complete_and_loads_weights_only(trained, tables) -> None:
    rc, model_dir, _ = trained
    assert rc == 0
    assert model_dir.name.startswith(f"{DAY}-")
    assert sorted(p.name for p in model_dir.iterdir()) == [
        "config.json",
        "lineage.json",
        "metrics.jsonl",
        "quantiser.pt",
        "weights.pt",
    ]
    weights = torch.load(model_dir / "weights.pt", weights_only=True)
    assert weights["step"] == 4
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model"]["dim"] == 32 and config["model"]["max_tokens"] == L
    assert config["model"]["content_dim"] == 4  # entity_content's vectors are used
    assert config["train"]["seed"] == 5 and config["train"]["steps"] == 4

    metrics = read_metrics(model_dir)
    assert [m["step"] for m in metrics[:-1]] == [1, 2, 3, 4]
    assert {"distill", "retrieval", "usage", "embedding_std", "collapsed", "pairs"} <= set(metrics[0])
    summary = metrics[-1]
    assert summary["summary"] and summary["collapsed"] is False
    # 6 users + 6 items + 2 categories of the day in version a; not version b's 3 + 2 + 1.
    assert summary["rows"] == 14
    assert summary["pairs"] == 6 and summary["pairs_missing_rows"] == 1  # user 107 has no row
    assert summary["pairs_by_period"] == [6]  # one period: no earlier one asked for
    q = summary["quantiser"]
    assert q["levels"] == 2 and q["codes_per_level"] == 3  # sqrt(14) rounded down
    assert len(q["usage"]) == 2 and 0 <= q["collision_rate"] <= 1 and len(q["entropy_normalised"]) == 2
    assert q["items_with_category"] == 6 and 0 < q["item_category_purity"] <= 1

    quantiser = load_quantiser(model_dir)
    assert quantiser.codebooks.shape == (2, 3, 32)
    loaded = load_model(model_dir)
    assert loaded.version == model_dir.name


def test_lineage_names_the_delta_versions_read_and_the_seed(trained, tables) -> None:
    warehouse, version_a, version_b = tables
    _, model_dir, _ = trained
    lineage = read_lineage(model_dir)
    assert version_b > version_a
    read = lineage["inputs"]["neighbourhoods"]
    assert (read["table"], read["version"], read["ds"], read["rows"]) == (
        "neighbourhoods",
        version_a,
        str(DAY),
        14,
    )
    assert read["path"] == table_path(warehouse, NEIGHBOURHOODS)
    assert lineage["inputs"]["edges"]["version"] == 1 and lineage["inputs"]["edges"]["positive_edges"] == 7
    assert lineage["inputs"]["entity_content"]["version"] == 1
    assert lineage["seed"] == 5 and lineage["ds"] == str(DAY) and lineage["code_version"]
    # The recorded files are version a's day: exactly its rows, nothing of version b or of the next day.
    rows = read_neighbourhoods(PyarrowReader(), read["files"])
    assert sorted(rows.node_id.tolist()) == sorted(map(n, USERS_A + ITEMS_A + [301, 302]))
    # The next-period inputs: the cut-off between the views and the conversions, every user with a view.
    period = lineage["inputs"]["next_period"]
    assert period["cutoff"] == "2026-01-07T20:00:00Z" and period["positives_by_stage"] == {"cart": 7}
    assert period["input_users"] == 6


def test_latest_version_is_the_default_and_resolves_to_other_files(spark, tables, trained) -> None:
    warehouse, _, version_b = tables
    inputs = resolve_inputs(spark, config_from_args(argv(warehouse)))
    assert inputs.neighbourhoods.version == version_b
    rows = read_neighbourhoods(PyarrowReader(), inputs.neighbourhoods.files)
    assert sorted(rows.node_id.tolist()) == sorted(map(n, USERS_B + ITEMS_B + [301]))
    assert not set(inputs.neighbourhoods.files) & set(
        read_lineage(trained[1])["inputs"]["neighbourhoods"]["files"]
    )
    # Each item's heaviest category; the day's positives are distinct (user, item) pairs.
    categories = dict(zip(inputs.category_items.tolist(), inputs.category_ids.tolist(), strict=True))
    assert categories == {n(i): c for i, c in CATEGORY.items()}
    # The positives: every conversion after the cut-off (user 107 too: pairing drops it, it has no history).
    period = inputs.next_period
    positives = zip(period.user_ids.tolist(), period.item_ids.tolist(), strict=True)
    assert sorted(positives) == sorted((n(u), n(i)) for u, i in CONVERSIONS)
    assert period.weights.tolist() == [3.0] * len(CONVERSIONS)


def test_the_end_of_the_next_period_is_held_out_by_time_with_rows_sampled_before_it(
    spark, tables, tmp_path
) -> None:
    # Views at 06:00 (the input), then the next period from the 09:00 cut-off: a view, a view and a cart at 12:00,
    # a purchase, a view and a cart at 18:00. Half of it held out: the validation cut-off halfway, 15:00.
    at = lambda hour: dt.datetime.combine(DAY, dt.time(hour), tzinfo=dt.UTC)  # noqa: E731
    timeline = [
        (101, 201, "view", 6), (102, 202, "view", 6), (103, 203, "view", 6),
        (101, 204, "view", 12), (102, 205, "view", 12), (103, 201, "cart", 12),
        (101, 204, "purchase", 18), (102, 206, "view", 18), (103, 205, "cart", 18),
    ]  # fmt: skip
    warehouse = tmp_path / "warehouse"
    events = [
        spec_row(
            EVENTS, source="test", user_id=str(u), item_id=str(i), funnel_stage=s, event_time=at(h), ds=DAY
        )
        for u, i, s, h in timeline
    ]
    write_events_and_catalogue(spark, warehouse, events)
    weights = {"view": 1.0, "cart": 3.0, "purchase": 5.0}
    cutoff = dt.datetime(2026, 1, 7, 9)
    period = next_period(spark, str(warehouse), DAY, cutoff, 0.2, weights, SampleConfig(ds=DAY), L, 0.5)

    def engaged(ids, items, w) -> list:
        return sorted(zip(ids.tolist(), items.tolist(), w.tolist(), strict=True))

    at_hour = lambda hour: sorted((n(u), n(i), weights[s]) for u, i, s, h in timeline if h == hour)  # noqa: E731
    assert engaged(period.user_ids, period.item_ids, period.weights) == at_hour(12)
    held = period.validation
    assert held.cutoff == dt.datetime(2026, 1, 7, 15)
    assert engaged(held.user_ids, held.item_ids, held.weights) == at_hour(18)
    assert period.lineage["validation_cutoff"] == "2026-01-07T15:00:00Z"
    assert period.lineage["validation_by_stage"] == {"cart": 1, "purchase": 1, "view": 1}

    def items_of(rows, user: int) -> set[int]:
        row = rows.index_of(np.array([n(user)]))[0]
        tokens = zip(rows.columns["token_node_id"][row], rows.columns["token_node_type"][row], strict=True)
        return {int(t) for t, kind in tokens if kind == NODE_TYPES["item"]}

    # The training users' rows hold what came before 09:00; the validation rows what came before 15:00.
    assert items_of(period.inputs, 101) == {n(201)}
    assert items_of(held.inputs, 101) == {n(201), n(204)}
    assert items_of(held.inputs, 103) == {n(203), n(201)}

    # Items too: 204, first engaged at 12:00, is in the catalogue (its category) before 09:00 without a user,
    # and holds its 12:00 viewer before 15:00.
    def users_of(rows, item: int) -> set[int]:
        row = rows.index_of(np.array([n(item)]))[0]
        assert row >= 0
        tokens = zip(rows.columns["token_node_id"][row], rows.columns["token_node_type"][row], strict=True)
        return {int(t) for t, kind in tokens if kind == NODE_TYPES["user"]}

    assert users_of(period.inputs, 204) == set() and users_of(held.inputs, 204) == {n(101)}
    assert users_of(period.inputs, 201) == {n(101)}  # 103's cart at 12:00 is not in the training view
    # Nothing held out: the whole period trains.
    whole = next_period(spark, str(warehouse), DAY, cutoff, 0.2, weights, SampleConfig(ds=DAY), L, 0.0)
    assert whole.validation is None and whole.lineage["validation_cutoff"] is None
    assert engaged(whole.user_ids, whole.item_ids, whole.weights) == sorted(at_hour(12) + at_hour(18))
    # Three periods asked from a 15:00 cut-off: the one after it (18:00), one as long in events before it, from
    # 09:00 (the 12:00 events, predicted from the rows before 09:00), and no third: what is left before 09:00 is
    # no longer than a period.
    periods = next_period(
        spark, str(warehouse), DAY, dt.datetime(2026, 1, 7, 15), 0.2, weights, SampleConfig(ds=DAY), L, 0.0, 3
    )
    assert engaged(periods.user_ids, periods.item_ids, periods.weights) == at_hour(18)
    (earlier,) = periods.earlier
    assert earlier.cutoff == dt.datetime(2026, 1, 7, 9)
    assert engaged(earlier.user_ids, earlier.item_ids, earlier.weights) == at_hour(12)
    assert items_of(earlier.inputs, 101) == {n(201)} and items_of(periods.inputs, 101) == {n(201), n(204)}
    assert periods.lineage["earlier_periods"] == [
        {"cutoff": "2026-01-07T09:00:00Z", "positives": 3, "input_users": 3}
    ]


def test_an_existing_version_is_never_overwritten(trained, tables, capsys) -> None:
    warehouse, version_a, _ = tables
    _, model_dir, inputs = trained
    flags = argv(warehouse, "--neighbourhoods-version", str(version_a))
    # A rerun with the same flags, inputs and code derives the same name: the model exists, nothing is trained.
    assert default_version(config_from_args(flags), inputs, code_version()) == model_dir.name
    before = (model_dir / "weights.pt").read_bytes()
    rerun = train(config_from_args(flags), inputs)
    assert rerun.reused and rerun.path == model_dir and "existed already" in rerun.line()
    # Naming an existing version is refused, before any Spark work, in one line.
    rc = run_job(train_encoder.main, [*flags, "--version", model_dir.name])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: model version") and "already exists" in err
    assert len(err.splitlines()) == 1
    assert (model_dir / "weights.pt").read_bytes() == before


@pytest.fixture(scope="module")
def inputs_a(trained) -> TrainingInputs:
    return trained[2]


class Interrupted(Exception):
    pass


def train_interrupted_at_step_3(flags: list[str], inputs) -> None:
    """Runs train with these flags and kills it (an exception out of the progress hook) at step 3."""
    update = train_encoder.Progress.update

    def crash_at_step_3(self, metrics):
        if metrics["step"] == 3:
            raise Interrupted
        update(self, metrics)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(train_encoder.Progress, "update", crash_at_step_3)
        with pytest.raises(Interrupted):
            train(config_from_args(flags), inputs)


def assert_same_training(version: str | Path, reference: Path) -> None:
    """A resumed version's weights and per-step metrics (local or on a store) equal the uninterrupted run's."""
    resumed, uninterrupted = load_weights(version), load_weights(reference)
    for part in ("student", "teacher", "student_head", "teacher_head"):
        for name, tensor in uninterrupted[part].items():
            assert torch.equal(resumed[part][name], tensor), f"{part}.{name}"
    strip = lambda rows: [m for m in rows if not m.get("summary")]  # noqa: E731
    assert strip(read_metrics(version)) == strip(read_metrics(reference))


def test_resume_continues_to_the_same_model_as_an_uninterrupted_run(trained, tables, inputs_a) -> None:
    warehouse, version_a, _ = tables
    _, reference, _ = trained
    # Same flags as the reference run, another version name, and the pyarrow loader this time.
    flags = argv(
        warehouse, "--neighbourhoods-version", str(version_a), "--version", "resumed", "--loader", "pyarrow"
    )
    train_interrupted_at_step_3(flags, inputs_a)
    run_dir = warehouse / "models" / ".runs" / "resumed"
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step-00000002"]
    assert not (warehouse / "models" / "resumed").exists()  # nothing published by a killed run

    report = train(config_from_args([*flags, "--resume"]), inputs_a)
    assert read_lineage(report.path)["resumed_from_step"] == 2
    assert not run_dir.exists()  # the work folder goes once the version is written
    assert_same_training(report.path, reference)
    assert torch.equal(load_quantiser(report.path).codebooks, load_quantiser(reference).codebooks)


def test_resume_refuses_without_checkpoint_or_with_other_flags(tables, inputs_a) -> None:
    warehouse, version_a, _ = tables
    flags = argv(
        warehouse, "--neighbourhoods-version", str(version_a), "--version", "never-started", "--resume"
    )
    with pytest.raises(HirError, match="no checkpoint of version never-started"):
        train(config_from_args(flags), inputs_a)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--ds", "2026-13-01"], "--ds must be a date"),
        (["--steps", "0"], "invalid positive integer value"),
        (["--epochs", "2"], "not allowed with argument"),  # TINY already passes --steps
        (["--loader", "spark"], "invalid choice"),
        (["--dim", "15"], "must be divisible by --heads"),
        (["--neighbourhoods-version", "-1"], "invalid non-negative integer value"),
        (["--lr", "-1"], "--lr must be >= 0"),
        (["--version", "../x"], "must be a plain folder name"),
        (["--stability-weight", "-0.5"], "--stability-weight must be 0 or more"),
        (["--stability-weight", "nan"], "--stability-weight must be 0 or more"),
        (["--codebook-tolerance", "0.9"], "--codebook-tolerance must be 1 or more"),
        (["--train-periods", "0"], "invalid positive integer value"),
        (["--validate-every", "-1"], "invalid non-negative integer value"),
        (["--retrieval-temp", "0"], "--retrieval-temp must be a positive number"),
        (["--retrieval-temp", "nan"], "--retrieval-temp must be a positive number"),
    ],
)
def test_bad_flags_fail_in_one_line(tmp_path, capsys, extra, message) -> None:
    rc = run_job(train_encoder.main, argv(tmp_path, *extra))
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and err.startswith("error: ") and message in err, err


def test_missing_table_and_missing_version_fail_in_one_line(spark, tables, tmp_path, capsys) -> None:
    warehouse, _, version_b = tables
    assert run_job(train_encoder.main, argv(tmp_path / "empty")) == 2
    assert "table neighbourhoods not found" in capsys.readouterr().err
    assert run_job(train_encoder.main, argv(warehouse, "--neighbourhoods-version", str(version_b + 5))) == 2
    err = capsys.readouterr().err.strip()
    assert f"has no version {version_b + 5}" in err and len(err.splitlines()) == 1


def test_edges_with_events_after_the_day_are_refused(spark, tables) -> None:
    warehouse, _, _ = tables
    with pytest.raises(HirError, match="events after the day"):
        categories_of_items(spark, str(warehouse), None, LEAKY_DAY)


def test_tables_with_deletion_vectors_are_refused(spark, tmp_path) -> None:
    spec = TableSpec("dv", "a table with a deletion vector", StructType([StructField("node_id", LongType())]))
    path = table_path(tmp_path, spec)
    frame = spark.createDataFrame([(1,), (2,), (3,)], spec.schema).coalesce(1)
    frame.write.format("delta").option("delta.enableDeletionVectors", "true").save(path)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE node_id = 2")  # marks the row deleted, keeps the file
    with pytest.raises(HirError, match="enables deletion vectors"):
        table_snapshot(spark, spec, str(tmp_path), None, None)
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'false')")
    with pytest.raises(HirError, match="holds 3 rows but the snapshot keeps 2"):
        table_snapshot(spark, spec, str(tmp_path), None, None)


# -- collapse: no Spark, inputs written with pyarrow ---------------------------------------------------------


def indistinguishable_day(folder: Path, rows: int = 12) -> TrainingInputs:
    """Users the model cannot tell apart: with 2 id buckets, target ids that hash to the same buckets, and the same
    viewed item. Every user then gets the same embedding and prototype: the representation has collapsed, whatever
    the weights. The next-period pairs join users to users (the day has no items): every row is alike anyway."""
    candidates = torch.arange(1, 5000)
    users = torch.full_like(candidates, NODE_TYPES["user"])
    same = (hash_node_ids(candidates, users, 2, 0) == 0) & (hash_node_ids(candidates, users, 2, 1) == 0)
    ids = candidates[same][:rows].numpy()
    pair = lambda target, neighbour, dtype: np.tile(np.array([target, neighbour], dtype=dtype), (rows, 1))  # noqa: E731
    columns = {
        "node_id": ids,
        "node_type": np.array(["user"] * rows),
        "num_tokens": np.full(rows, 2, dtype=np.int32),
        "token_node_id": np.stack([ids, np.full(rows, 7)], axis=1),
        "token_node_type": pair(NODE_TYPES["user"], NODE_TYPES["item"], np.int32),
        "token_edge_type": pair(EDGE_TYPES["self"], EDGE_TYPES["user_view_item"], np.int32),
        "token_hop": pair(0, 1, np.int32),
        "token_parent_pos": pair(-1, 0, np.int32),
        "token_recency": pair(0, 0, np.int32),
        "token_weight": pair(0.0, 1.0, np.float32),
        "token_is_deep": pair(False, False, bool),
    }
    folder.mkdir(parents=True)
    pq.write_table(
        pa.table({c: list(v) if v.ndim == 2 else v for c, v in columns.items()}), folder / "part-0.parquet"
    )
    snapshot = TableSnapshot(
        "neighbourhoods", str(folder), 0, str(DAY), (str(folder / "part-0.parquet"),), rows
    )
    empty = np.zeros(0, dtype=np.int64)
    rows_read = read_neighbourhoods(PyarrowReader(), snapshot.files)
    period = NextPeriod(
        dt.datetime(2026, 1, 7, 20), rows_read, ids[:6], ids[6:12], np.ones(6, np.float32), {"cutoff": "-"}
    )
    return TrainingInputs(snapshot, {"version": 0}, None, period, empty, empty)


def test_a_collapsed_run_is_reported_as_collapsed(tmp_path, monkeypatch, capsys) -> None:
    inputs = indistinguishable_day(tmp_path / "day")
    flags = argv(tmp_path / "wh", "--id-buckets", "2")
    report = train(config_from_args(flags), inputs)
    assert report.collapsed and "every entity of the day has the same prototype" in report.collapse_detail
    metrics = read_metrics(report.path)
    assert metrics[-1]["collapsed"] is True and metrics[-1]["day_prototype_usage"] == 1 / 64
    assert all(m["collapsed"] and m["usage"] == 1 / 64 for m in metrics[:-1])  # one prototype on every step
    assert report.line().startswith(f"model {report.version} [COLLAPSED]")

    # Through main: the model is written for diagnosis, the exit code says the run failed.
    monkeypatch.setattr(train_encoder, "resolve_inputs", lambda spark, cfg: inputs)
    monkeypatch.setattr("jobs.common.spark.get_spark", lambda *a, **k: None)
    assert run_job(train_encoder.main, [*flags, "--version", "via-main"]) == 1
    assert "COLLAPSED:" in capsys.readouterr().err
    assert (tmp_path / "wh" / "models" / "via-main" / "weights.pt").exists()


def test_ablation_flags_reach_the_model_config_and_name_another_version(tables, inputs_a, trained) -> None:
    warehouse, version_a, _ = tables
    _, reference, _ = trained
    base = argv(warehouse, "--neighbourhoods-version", str(version_a))
    no_bias = config_from_args([*base, "--no-attention-bias"])
    no_distill = config_from_args([*base, "--no-distillation"])
    assert no_bias.fingerprint() != no_distill.fingerprint() != config_from_args(base).fingerprint()
    report = train(no_distill, inputs_a)
    saved = json.loads((report.path / "config.json").read_text())
    assert report.path != reference and saved["model"]["distill_weight"] == 0.0
    assert saved["model"]["use_attention_bias"] is True
    # The prototype head is not trained without distillation: the collapse check looks at the embeddings.
    assert not report.collapsed and report.collapse_detail.startswith("distillation off")
    history = [m for m in read_metrics(report.path) if not m.get("summary")]
    assert all(m["loss"] == pytest.approx(m["retrieval"]) for m in history)
    report = train(no_bias, inputs_a)
    assert json.loads((report.path / "config.json").read_text())["model"]["use_attention_bias"] is False
    softer = config_from_args([*base, "--retrieval-temp", "0.2"])
    assert softer.fingerprint() != config_from_args(base).fingerprint()
    report = train(softer, inputs_a)
    assert json.loads((report.path / "config.json").read_text())["model"]["retrieval_temp"] == 0.2


def test_resume_from_checkpoints_on_an_object_store(
    trained, tables, inputs_a, s3_server, s3_settings, monkeypatch, tmp_path
) -> None:
    monkeypatch.setenv("HIR_CACHE_DIR", str(tmp_path / "cache"))
    warehouse, version_a, _ = tables
    _, reference, _ = trained
    models = s3_server.new_bucket("train-resume") + "/models"
    flags = argv(
        warehouse, "--neighbourhoods-version", str(version_a), "--model-dir", models, "--version", "resumed",
        "--loader", "pyarrow",
    )  # fmt: skip
    train_interrupted_at_step_3(flags, inputs_a)
    run_dir = storage.join(models, ".runs", "resumed")
    assert storage.listdir(storage.join(run_dir, "checkpoints")) == ["step-00000002"]
    assert list_versions(models) == []  # nothing published by a killed run

    report = train(config_from_args([*flags, "--resume"]), inputs_a)
    assert report.path == storage.join(models, "resumed")
    assert read_lineage(report.path)["resumed_from_step"] == 2
    assert not storage.exists(run_dir)  # the work folder goes once the version is written
    assert_same_training(report.path, reference)


def test_long_epochs_are_validated_inside_and_patience_counts_validations() -> None:
    # An epoch of 183 steps validated at most 64 steps apart: three evenly spaced validations, after its steps
    # 61, 122 and 183 (step 0 is a warm start's continued model).
    inside = EpochSelection(None, None, steps_per_epoch=183, patience=6, every=64)
    assert [s for s in range(367) if inside.validates_at(s)] == [0, 61, 122, 183, 244, 305, 366]
    # 209 steps at most 64 apart: four validations, 52.25 steps apart, rounded up.
    four = EpochSelection(None, None, steps_per_epoch=209, patience=6, every=64)
    assert [s for s in range(1, 210) if four.validates_at(s)] == [53, 105, 157, 209]
    # An epoch no longer than the spacing, or no spacing: its end only, as before the flag.
    for short in (EpochSelection(None, None, 35, 6, every=64), EpochSelection(None, None, 35, 6)):
        assert [s for s in range(1, 71) if short.validates_at(s)] == [35, 70]
    assert [s for s in range(1, 367) if EpochSelection(None, None, 183, 6).validates_at(s)] == [183, 366]
    # Patience counts validations: best at step 61, six validations later is step 427 (not six epochs, 1159).
    assert inside.validations_after(61, 426) == 5 and inside.validations_after(61, 427) == 6
