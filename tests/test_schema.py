"""The schema's DDL for one server and for a cluster, checked by the engine's own parser;
retention; store passwords given apart from the URL."""

from __future__ import annotations

import re
from pathlib import Path

import clickhouse_connect
import pytest

from store.location import parse_store_url, with_password
from store.migrations import MIGRATIONS, RETENTION_NAMES, TABLES_BY_NAME, retention, script
from store.schema import Layout, Statement, parse_retention, render
from store.store import Store
from tracehouse.cli.main import main
from tracehouse.model import DEFAULT_LIMITS

LAYOUTS = [
    Layout(),
    Layout("telemetry", retention={"samples": 30 * 86400, "samples_10s": 86400, "samples_1m": 365 * 86400}),
    Layout(cluster="tracehouse"),
    Layout("gpu_fleet", cluster="prod_2x2", shards_by="run_id", retention={"events": 90 * 86400}),
]


def _parses(store: Store, statement: str) -> str:
    """The statement as the engine's parser formats it; raises when it does not parse."""
    return str(store.query("SELECT formatQuery({sql:String}) AS f", {"sql": statement}).column("f")[0].as_py())


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: f"{layout.database}-{layout.cluster or 'one'}")
def test_every_statement_parses(store: Store, layout: Layout) -> None:
    statements = script(layout)
    assert statements
    for statement in statements:
        formatted = _parses(store, statement)
        assert formatted.split()[0] in ("CREATE", "ALTER", "INSERT", "TRUNCATE", "DROP")


@pytest.mark.parametrize("layout", LAYOUTS[::2], ids=("one", "cluster"))
def test_columns_put_comment_before_codec(layout: Layout) -> None:
    """ClickHouse before 26.8 takes a column's COMMENT only before its CODEC."""
    for statement in script(layout):
        assert not re.search(r"CODEC\([^\n]*\) COMMENT", statement), statement


def test_a_typo_would_not_parse(store: Store) -> None:
    with pytest.raises(Exception, match="Syntax error"):
        _parses(store, script(Layout(cluster="c"))[3].replace("ORDER BY", "ORDER"))


def test_cluster_tables_are_replicated_and_distributed() -> None:
    layout = Layout("gpu_fleet", cluster="prod_2x2", shards_by="run_id")
    statements = script(layout)
    text = "\n".join(statements)
    assert "TRUNCATE" not in text and "INSERT INTO `gpu_fleet`.samples_1" not in text  # no backfill on a cluster
    for statement in statements[:-1]:
        assert " ON CLUSTER 'prod_2x2'" in statement
    for table in TABLES_BY_NAME.values():
        local = next(s for s in statements if f"`gpu_fleet`.{table.name}_local ON CLUSTER" in s and "(" in s)
        engine = re.search(
            r"ENGINE = (Replicated\w+)\('/clickhouse/tables/\{shard\}/gpu_fleet/(\w+)', '\{replica\}'", local
        )
        assert engine and engine.group(1) == f"Replicated{table.engine}" and engine.group(2) == table.name
        assert "replicated_deduplication_window" in local or not table.dedup
        distributed = next(s for s in statements if f"`gpu_fleet`.{table.name} ON CLUSTER 'prod_2x2' AS" in s)
        assert f"Distributed('prod_2x2', 'gpu_fleet', '{table.name}_local', " in distributed
    samples = next(s for s in statements if "'samples_local', " in s)
    assert samples.rstrip().endswith("cityHash64(run_id))")
    views = [s for s in statements if "MATERIALIZED VIEW" in s]
    # per 1 s (migration 2, dropped by 5), per 1 min (made again from the 10 s one by 7), per 10 s
    assert len(views) == 4 and all("FROM `gpu_fleet`.samples_local" in v for v in views[:3])
    assert "TO `gpu_fleet`.samples_1m_local" in views[3] and "FROM `gpu_fleet`.samples_10s_local" in views[3]


def test_script_builds_a_store_that_serve_takes_as_is(tmp_path: Path) -> None:
    """What `tracehouse schema` prints, run on an empty engine, is the latest schema."""
    url = f"chdb://{tmp_path / 'store'}"
    (tmp_path / "store").mkdir()
    bare = clickhouse_connect.get_client(dsn=url)
    try:
        for statement in script(Layout("telemetry", retention={"samples": 7 * 86400})):
            bare.command(statement)
    finally:
        bare.close()
    with Store.open(url, DEFAULT_LIMITS, "telemetry") as store:
        versions = store.query("SELECT version FROM {db}.schema_migrations ORDER BY version").column(0).to_pylist()
        assert versions == [m.version for m in MIGRATIONS]  # recorded once: nothing applied again
        engine = store.query("SELECT engine_full FROM system.tables WHERE database = 'telemetry' AND name = 'samples'")
        assert "TTL toDateTime(ts) + toIntervalSecond(604800)" in engine.column(0)[0].as_py()


def test_retention_is_set_changed_and_removed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url = f"chdb://{tmp_path / 'store'}"

    def ttls() -> dict[str, str]:
        with Store.open(url, DEFAULT_LIMITS, retention=retention) as store:
            rows = store.query("SELECT name, engine_full FROM system.tables WHERE database = 'tracehouse'").to_pylist()
        return {row["name"]: row["engine_full"].partition(" TTL ")[2].partition(" SETTINGS")[0] for row in rows}

    retention = parse_retention(["samples=30d", "rollups=1y"], RETENTION_NAMES)
    first = ttls()
    assert first["samples"] == "toDateTime(ts) + toIntervalSecond(2592000)"
    assert first["samples_1m"] == first["samples_10s"] == "toDateTime(ts) + toIntervalSecond(31536000)"
    assert first["events"] == "" and first["ingest_batches"] == "toDateTime(received) + toIntervalDay(90)"
    caplog.clear()
    assert ttls() == first
    assert "retention of" not in caplog.text  # unchanged: no ALTER, which would rewrite the tables
    retention = parse_retention(["samples=2w", "samples_10s=forever"], RETENTION_NAMES)
    second = ttls()
    assert second["samples"] == "toDateTime(ts) + toIntervalSecond(1209600)"
    assert second["samples_10s"] == ""
    assert second["samples_1m"] == first["samples_1m"]  # not named: kept as it was
    retention = parse_retention(["events=30d"], RETENTION_NAMES)
    third = ttls()  # what is kept of a run goes with its events
    assert {third[table] for table in ("events", "kept_ranges", "kept_islands", "kept_gaps")} == {
        "toDateTime(start) + toIntervalSecond(2592000)"
    }
    assert third["kept_gpus"] == "toDateTime(end) + toIntervalSecond(2592000)"  # a row for all of a GPU's islands
    assert third["kept_answers"] == "toDateTime(made) + toIntervalSecond(2592000)"


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ("samples", "TABLE=DURATION"),
        ("runs=30d", "TABLE one of"),
        ("samples=30", "number of hours"),
        ("samples=0d", "number of hours"),
        ("samples=5m", "number of hours"),
        ("samples=-1d", "number of hours"),
    ],
)
def test_bad_retention_is_refused(entry: str, reason: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_retention([entry], RETENTION_NAMES)
    assert main(["schema", "--retention", entry]) == 2
    assert reason in capsys.readouterr().err


@pytest.mark.parametrize(
    ("entries", "reason"),
    [
        (["rollups=1h"], "samples_10s=1h would expire before samples (not given)"),
        (["samples=30d", "rollups=1w"], "samples_10s=1w would expire before samples (30d)"),
        (["samples=30d", "samples_10s=90d", "samples_1m=30d"], "samples_1m=30d would expire before samples_10s (90d)"),
        (["samples=30d", "samples_1m=1y"], "samples_1m=1y would expire before samples_10s (not given)"),
    ],
)
def test_a_rollup_kept_shorter_than_what_it_sums_up_is_refused(entries: list[str], reason: str) -> None:
    with pytest.raises(ValueError, match=re.escape(reason)):
        retention(entries)


def test_retention_with_rollups_kept_longer() -> None:
    assert retention(["samples=30d", "samples_10s=90d", "samples_1m=1y", "events=forever"]) == {
        "samples": 30 * 86400, "samples_10s": 90 * 86400, "samples_1m": 365 * 86400, "events": 0, "kept_ranges": 0,
        "kept_islands": 0, "kept_gpus": 0, "kept_gaps": 0, "kept_answers": 0,
    }  # fmt: skip
    assert retention(["samples=2w", "rollups=forever"]) == {"samples": 14 * 86400, "samples_10s": 0, "samples_1m": 0}


def test_schema_command_prints_statements_and_refuses_bad_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema", "--cluster", "tracehouse", "--shards-by", "run_id", "--retention", "samples=30d"]) == 0
    out = capsys.readouterr().out
    assert out.count(";\n") == len(script(Layout(cluster="tracehouse", shards_by="run_id")))
    assert "ON CLUSTER 'tracehouse'" in out and "toIntervalSecond(2592000)" in out
    assert main(["schema", "--cluster", "x'; DROP TABLE y; --"]) == 2
    assert "cluster: " in capsys.readouterr().err
    assert main(["schema", "--database", "a-b"]) == 2


def test_steps_render_only_where_they_can_run() -> None:
    backfill = Statement("INSERT INTO {db}.t SELECT 1", local_only=True)
    assert render(backfill, Layout()) == ["INSERT INTO `tracehouse`.t SELECT 1"]
    assert render(backfill, Layout(cluster="c")) == []


def test_store_password_from_a_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert with_password("http://us%40er@ch:8123", "x").startswith("http://us%40er:x@ch")
    url = with_password("https://reader@ch.example:8443/telemetry", "p@ss:w/rd")
    parsed = parse_store_url(url)
    assert parsed.database == "telemetry" and "p@ss" not in parsed.display and "***" in parsed.display
    assert with_password("http://ch:8123", "x").startswith("http://default:x@ch:8123")
    with pytest.raises(ValueError, match="already"):
        with_password("http://u:a@ch:8123", "b")
    with pytest.raises(ValueError, match="http"):
        with_password("chdb:///tmp/x", "b")
    # the CLI: a file nobody can read, and a server that is not there, are both clear failures
    assert main(["serve", "--store", "http://u@127.0.0.1:1/db", "--store-password-file", str(tmp_path / "no")]) == 2
    assert "--store-password-file" in capsys.readouterr().err
    monkeypatch.setenv("TRACEHOUSE_STORE_PASSWORD", "s3cret-value")
    assert main(["serve", "--store", "http://u:other@127.0.0.1:1/db"]) == 2
    err = capsys.readouterr().err
    assert "give it once" in err and "s3cret-value" not in err and "other" not in err
