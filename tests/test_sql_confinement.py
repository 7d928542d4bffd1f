"""User SQL reaches tracehouse's tables and nothing else: no file, network, process, dictionary,
other database or server setting, whatever function, clause or name carries it (the engine's own
parse against allow-lists, store/sqlguard.py); and all user SQL together is bounded."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from query.client import Client, QueryFailed
from store.store import Store
from store.storeerrors import SqlRejected
from tests.conftest import small_limits
from tests.helpers import T0, request, telemetry, trace
from tracehouse.channel import ClientSecurity
from tracehouse.cli.main import main
from tracehouse.cli.serve import create_server
from tracehouse.model import Limits
from tracehouse.security import ServerSecurity, load_tokens
from tracehouse.v1 import ingest_pb2_grpc

PASSWD = "/etc/passwd"
SLOW = "SELECT count() FROM numbers(100000000000)"


LIMITS = small_limits(sql_max_seconds=3.0)


# One store, server and client for the module: most tests here are one query each. A process holds
# one embedded store at a time, so the tests that need other limits open a Store on the same folder.
@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    opened = Store.open(f"chdb://{tmp_path_factory.mktemp('confined') / 'store'}", LIMITS)
    yield opened
    opened.close()


@pytest.fixture(scope="module")
def address(store: Store) -> Iterator[str]:
    server = create_server(store, "127.0.0.1:0", LIMITS)
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        run = telemetry("c-1").add_run("run-a", name="resnet", host="host-a", start=T0, tags={"team": "cv"})
        for batch in (run, trace("c-2")):
            ingest_pb2_grpc.IngestStub(channel).Write(request(batch), timeout=30)
    yield f"127.0.0.1:{server.port}"
    server.stop(grace=1)


@pytest.fixture(scope="module")
def client(address: str) -> Iterator[Client]:
    with Client(address, timeout=30) as opened:
        yield opened


def refused(client: Client, sql: str) -> str:
    with pytest.raises(QueryFailed) as caught:
        client.sql(sql)
    assert caught.value.code.name == "PERMISSION_DENIED", caught.value
    assert "root:" not in caught.value.message and "/etc/" not in caught.value.message.replace(PASSWD, "")
    return caught.value.message


ATTACKS = {
    "scalar file": (f"SELECT file('{PASSWD}') AS t", "function file"),
    "file in a string function": (f"SELECT lower(file('{PASSWD}'))", "function file"),
    "environment": ("SELECT file('/proc/self/environ')", "function file"),
    "table function file": (f"SELECT * FROM file('{PASSWD}', 'LineAsString')", "table function file"),
    "fileCluster": (f"SELECT * FROM fileCluster('c', '{PASSWD}', 'LineAsString')", "table function fileCluster"),
    "url": ("SELECT * FROM url('http://127.0.0.1:9/x', 'LineAsString')", "table function url"),
    "s3": ("SELECT * FROM s3('http://127.0.0.1:9/b/k', 'LineAsString')", "table function s3"),
    "remote": ("SELECT * FROM remote('127.0.0.1', system.one)", "table function remote"),
    "executable": ("SELECT * FROM executable('id', 'LineAsString', 'x String')", "table function executable"),
    "sqlite": ("SELECT * FROM sqlite('/tmp/x.sqlite', 't')", "table function sqlite"),
    "python": ("SELECT * FROM python(limits)", "table function python"),
    "merge": ("SELECT * FROM merge('system', '^one$')", "table function merge"),
    "input": ("SELECT * FROM input('x String')", "table function input"),
    "view": ("SELECT * FROM view(SELECT 1)", "table function view"),
    "dictionary": ("SELECT * FROM dictionary('d')", "table function dictionary"),
    "dictGet": ("SELECT dictGet('d', 'a', toUInt64(1))", "function dictGet"),
    "joinGet": ("SELECT joinGet('system.one', 'dummy', 0)", "function joinGet"),
    "system table": ("SELECT * FROM system.settings", "table system.settings"),
    "system users": ("SELECT name FROM system.users", "table system.users"),
    "information schema": ("SELECT * FROM INFORMATION_SCHEMA.TABLES", "table INFORMATION_SCHEMA.TABLES"),
    "information schema lower": ("SELECT * FROM information_schema.tables", "table information_schema.tables"),
    "quoted system table": ("SELECT * FROM `system`.`one`", "table system.one"),
    "IN a system table": ("SELECT 0 IN system.one", "database system"),
    "getSetting": ("SELECT getSetting('readonly')", "function getSetting"),
    "getServerSetting": ("SELECT getServerSetting('tcp_port')", "function getServerSetting"),
    "getMacro": ("SELECT getMacro('shard')", "function getMacro"),
    "version": ("SELECT version()", "function version"),
    "hostName": ("SELECT hostName()", "function hostName"),
    "timeZoneOf": ("SELECT timeZoneOf(now())", "function timeZoneOf"),
    # one row of a quadratic function runs past the time limit, checked only between blocks
    "editDistance": (
        "SELECT sum(editDistance(repeat('a', 20000), repeat('b', 20000 + number))) FROM numbers(8)",
        "function editDistance",
    ),
    "arrayLevenshteinDistance": (
        "SELECT arrayLevenshteinDistance(range(50000), range(1, 50001))",
        "function arrayLevenshteinDistance",
    ),
    "currentUser": ("SELECT currentUser()", "function currentUser"),
    "uptime": ("SELECT uptime()", "function uptime"),
    "serverUUID": ("SELECT serverUUID()", "function serverUUID"),
    "filesystem": ("SELECT filesystemAvailable()", "function filesystemAvailable"),
    "kernel": ("SELECT getOSKernelVersion()", "function getOSKernelVersion"),
    "sleep": ("SELECT sleep(3)", "function sleep"),
    "SETTINGS": ("SELECT 1 SETTINGS readonly = 0", "SETTINGS"),
    "SETTINGS deep inside": ("SELECT * FROM (SELECT 1 SETTINGS max_execution_time = 1000)", "SETTINGS"),
    "APPLY": (f"SELECT * APPLY(file) FROM (SELECT '{PASSWD}' AS p)", "APPLY"),
    "nested subqueries": (f"SELECT * FROM (SELECT * FROM (SELECT file('{PASSWD}') AS t))", "function file"),
    "CTE": (f"WITH f AS (SELECT file('{PASSWD}') AS t) SELECT * FROM f", "function file"),
    "scalar CTE": (f"WITH (SELECT file('{PASSWD}')) AS t SELECT t", "function file"),
    "join": (f"SELECT * FROM runs AS r JOIN file('{PASSWD}', 'LineAsString') AS f ON 1", "table function file"),
    "array join": (f"SELECT x FROM (SELECT 1) ARRAY JOIN [file('{PASSWD}')] AS x", "function file"),
    "lambda": (f"SELECT arrayMap(p -> file(p), ['{PASSWD}'])", "function file"),
    "named lambda": (f"WITH p -> file(p) AS lower SELECT lower('{PASSWD}')", "function file"),
    "IN subquery": (f"SELECT 1 WHERE 'x' IN (SELECT file('{PASSWD}'))", "function file"),
    "window": (f"SELECT any(file('{PASSWD}')) OVER () AS t", "function file"),
    "combinator": (f"SELECT anyIf(file('{PASSWD}'), 1)", "function file"),
    "upper case": (f"SELECT FILE('{PASSWD}')", "function FILE"),
    "UNION": (f"SELECT 1 AS t UNION ALL SELECT file('{PASSWD}')", "function file"),
    "out of the wrapping by a comma": (f"SELECT 1) AS a, file('{PASSWD}', 'LineAsString'", "only one query"),
    "out of the wrapping by UNION": (f"SELECT 'x') UNION ALL SELECT * FROM (SELECT file('{PASSWD}')", "only one query"),
    "out of the wrapping by WHERE": ("SELECT 1 AS x) WHERE x IN (SELECT 1", "only one query"),
    "forged line after a real one": (
        f'SELECT file(\'{PASSWD}\') AS "a) (children 1)\n           Function lower"',
        "function file",
    ),
    "forged name hides nothing": (f'SELECT "lower\nFunction x"(\'{PASSWD}\')', "is not allowed here"),
    "forged table line": ('SELECT * FROM numbers(1) AS "n\n     TableExpression (children 1)\n      Function f"', ""),
}  # fmt: skip


@pytest.mark.parametrize("attack", ATTACKS, ids=list(ATTACKS))
def test_user_sql_reaches_no_file_network_or_server_setting(client: Client, attack: str) -> None:
    sql, what = ATTACKS[attack]
    message = refused(client, sql)
    assert what in message and ("not allowed here" in message or "only one query" in message), message


def test_a_read_token_cannot_read_the_tokens_file(store: Store, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("read r" + "1" * 31 + "\nadmin a" + "2" * 31 + "\n")
    server = create_server(store, "127.0.0.1:0", LIMITS, security=ServerSecurity(load_tokens(tokens)))
    try:
        with Client(f"127.0.0.1:{server.port}", security=ClientSecurity(token="r" + "1" * 31)) as client:
            assert client.sql("SELECT 1 AS one")["one"].tolist() == [1]
            message = refused(client, f"SELECT file('{tokens}') AS t")
            assert "a222" not in message and str(tmp_path) not in message
    finally:
        server.stop(grace=1)


def test_the_cli_refuses_with_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], address: str) -> None:
    code = main(["query", "sql", f"SELECT file('{PASSWD}')", "--server", address])
    out, err = capsys.readouterr()
    assert code == 2 and "root:" not in out + err and "function file is not allowed here" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


LEGITIMATE = [
    "SELECT name, count() FROM events WHERE kind = 'kernel' GROUP BY name",  # README
    "SELECT name, count() AS kernels, sum(toUnixTimestamp64Nano(end) - toUnixTimestamp64Nano(start)) AS total_ns\n"
    "FROM events WHERE kind = 'kernel'\nGROUP BY name ORDER BY total_ns DESC LIMIT 20",  # the UI's example
    "SELECT r.name, e.kind, count() AS n FROM events AS e INNER JOIN runs AS r ON e.run_id = r.run_id "
    "GROUP BY r.name, e.kind ORDER BY n DESC",
    "SELECT name, start, row_number() OVER (PARTITION BY name ORDER BY start) AS i, "
    "lagInFrame(start) OVER w AS previous, dense_rank() OVER w AS d FROM events WINDOW w AS (ORDER BY start)",
    "SELECT metric, quantile(0.5)(value) AS p50, quantiles(0.9, 0.99)(value) AS ps, "
    "quantileExactIf(0.95)(value, gpu = 0) AS p95, medianExact(value) FROM samples GROUP BY metric",
    "SELECT arrayJoin(mapKeys(tags)) AS k, count() AS n FROM runs GROUP BY k",
    "SELECT run_id, tags['team'] AS team, mapContains(tags, 'team') AS has FROM runs FINAL WHERE tags['team'] = 'cv'",
    "WITH k AS (SELECT name, toUnixTimestamp64Nano(end) - toUnixTimestamp64Nano(start) AS ns FROM events "
    "WHERE kind = 'kernel') SELECT name, sum(ns), avg(ns), countIf(ns > 1000000), uniqExact(ns) FROM k GROUP BY name",
    "SELECT arrayMap(x -> x * 2, [1, 2, 3]) AS a, arrayFilter(x -> x > 1, [1, 2, 3]) AS b, "
    "arraySum(arrayMap((x, y) -> x * y, [1, 2], [3, 4])) AS c",
    "SELECT toStartOfInterval(ts, INTERVAL 1 SECOND) AS t, intDiv(toUnixTimestamp64Nano(ts), 1000000000) AS s, "
    "toDateTime64(min(ts), 3) AS first, formatDateTime(t, '%F %T') AS f, round(avg(value), 2) AS v "
    "FROM tracehouse.samples GROUP BY t, s ORDER BY t",
    "SELECT CASE WHEN gpu = 0 THEN 'a' ELSE 'b' END AS c, multiIf(value > 50, 'hi', value > 10, 'mid', 'lo') AS m, "
    "if(isNull(NULL), 1, 0) AS i, coalesce(NULL, 2) AS co, CAST(gpu AS String) AS g, gpu::Int64 AS g64, "
    "toString(gpu) AS gs, COUNT(DISTINCT metric) AS nm, argMax(value, ts) AS last, sumIf(value, gpu = 1) AS s1 "
    "FROM samples GROUP BY c, m, i, co, g, g64, gs HAVING count() > 0 ORDER BY c LIMIT 1 BY c",
    "SELECT JSONExtractString('{\"a\": \"b\"}', 'a') AS j, cityHash64(name) AS h, lower(name) AS l, "
    "extract(name, 'g.mm') AS e, splitByChar('_', name) AS parts, length(name) AS n, name LIKE 'ge%' AS lk "
    "FROM events WHERE kind IN ('kernel', 'memcpy') AND name NOT IN (SELECT 'x') LIMIT 5",
    "SELECT number, number % 3 AS m FROM numbers(10) WHERE m = 1 UNION ALL SELECT 100, 0",
    "SELECT DISTINCT kind FROM events ORDER BY kind",
    "SELECT e.name, x FROM events AS e ARRAY JOIN [1, 2] AS x WHERE e.kind = 'nvtx'",
    "SELECT * FROM values('a UInt8, b String', (1, 'x'), (2, 'y'))",
    "SELECT e.* EXCEPT (extras) FROM events AS e LIMIT 3",
    "SELECT batch_id FROM ingest_batches",
]


@pytest.mark.parametrize("sql", LEGITIMATE)
def test_analysis_sql_still_answers(client: Client, sql: str) -> None:
    frame = client.sql(sql)
    assert len(frame.columns) > 0


@pytest.fixture
def bounded(store: Store) -> Iterator[tuple[Client, Limits]]:
    """A server whose store lets two user queries run at once and others wait 0.3 s at most."""
    limits = dataclasses.replace(LIMITS, sql_max_seconds=2.0, sql_max_concurrent=2, sql_queue_seconds=0.3)
    other = Store(store.location, limits)
    server = create_server(other, "127.0.0.1:0", limits)
    with Client(f"127.0.0.1:{server.port}", timeout=30) as client:
        yield client, limits
    server.stop(grace=1)
    other.close()


def test_at_most_n_user_queries_at_once_the_rest_refused(bounded: tuple[Client, Limits], store: Store) -> None:
    client, limits = bounded
    answers: list[str] = []

    def slow() -> None:
        try:
            client.sql(SLOW)
        except QueryFailed as failed:
            answers.append(failed.code.name)

    threads = [threading.Thread(target=slow) for _ in range(limits.sql_max_concurrent)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while _running(store, "numbers(100000000000)") < limits.sql_max_concurrent and time.monotonic() < deadline:
        time.sleep(0.05)
    began = time.monotonic()
    with pytest.raises(QueryFailed) as caught:
        client.sql("SELECT 1")
    assert caught.value.code.name == "RESOURCE_EXHAUSTED" and "2 queries are running" in caught.value.message
    assert time.monotonic() - began < limits.sql_max_seconds / 2  # waited its bounded time, not a slow query's
    for thread in threads:
        thread.join(timeout=30)
    assert answers == ["RESOURCE_EXHAUSTED"] * limits.sql_max_concurrent  # their own time limit
    assert client.sql("SELECT 1 AS one")["one"].tolist() == [1]  # places given back


def _running(store: Store, needle: str) -> int:
    found = store.query(
        "SELECT count() AS n FROM system.processes WHERE position(query, {needle:String}) > 0 "
        "AND NOT startsWith(query, 'EXPLAIN') AND position(query, 'system.processes') = 0",
        {"needle": needle},
    )
    return int(found.column("n")[0].as_py())


def test_memory_of_each_query_is_its_share_of_the_total(store: Store) -> None:
    shared = Store(store.location, dataclasses.replace(LIMITS, sql_max_memory_bytes=256 << 20, sql_max_concurrent=4))
    try:
        with pytest.raises(SqlRejected) as caught:
            shared.user_sql("SELECT length(groupArray(number)) AS n FROM numbers(20000000)", 10)
        assert caught.value.reason == "too_large" and "64.00 MiB" in str(caught.value)
        assert shared.user_sql("SELECT length(groupArray(number)) AS n FROM numbers(1000000)", 10)[1] == 1
    finally:
        shared.close()


def test_the_allow_lists_admit_no_other_engine_function(store: Store) -> None:
    """Against this engine's own list: an engine function the check lets through is a listed one or
    an aggregate (sumMap reads as sum with the Map combinator), never one it admits by letter case."""
    from store import sqlguard
    from store.sqlallow import AGGREGATE_FUNCTIONS, SCALAR_FUNCTIONS, TABLE_FUNCTIONS

    functions = store.query("SELECT name, is_aggregate FROM system.functions").to_pylist()
    admitted = {row["name"] for row in functions if sqlguard.function_allowed(row["name"])}
    unlisted = [row for row in functions if row["name"] in admitted - SCALAR_FUNCTIONS - AGGREGATE_FUNCTIONS]
    assert len(admitted) > 1000 and all(row["is_aggregate"] for row in unlisted), unlisted
    assert {"file", "url", "dictGet", "getSetting", "hostName", "version", "joinGet", "FILE"}.isdisjoint(admitted)
    known = set(store.query("SELECT name FROM system.table_functions").column("name").to_pylist())
    assert known >= TABLE_FUNCTIONS
    # in scalar places only a scalar runs (`x IN numbers(3)` is an unknown function); format() reads its argument
    assert {name for name in known if sqlguard.function_allowed(name)} == {"format"}


def test_refusal_reads_each_line_for_itself() -> None:
    from store import sqlguard

    outer = [
        "SelectWithUnionQuery (children 2)",
        " ExpressionList (children 1)",
        "  SelectQuery (children 2)",
        "   ExpressionList (children 1)",
        "    Asterisk",
        "   TablesInSelectQuery (children 1)",
        "    TablesInSelectQueryElement (children 1)",
        "     TableExpression (children 1)",
        "      Subquery (children 1)",
    ]
    end = [" Identifier TSV"]

    def check(*lines: str) -> str | None:
        return sqlguard.refusal([*outer, *lines, *end], "TSV", "tracehouse", ["system", "default", "tracehouse"])

    assert check("       Function plus (alias x (alias y)) (children 1)", "        Literal UInt64_1") is None
    assert "function lower" in str(check("Function lower (alias a", "b)"))  # an alias cut by a line break
    assert "function file" in str(check("Function lower (alias a)", "Function file (alias b) (children 1)"))
    assert "line break" in str(check("  )garbage"))
    table = "TableExpression (children 1)"
    assert "table tracehouse x.samples" in str(check(table, "TableIdentifier tracehouse x.samples"))
    assert check(table, "TableIdentifier tracehouse.samples (alias s)") is None
    assert "table default.t" in str(check(table, "TableIdentifier default.t"))
    assert "database default" in str(check("Identifier default.t.x"))
    assert "table function lower" in str(check(table, "Function lower (children 1)"))
    assert "only one query" in str(sqlguard.refusal([*outer, "Literal 1", " Set", *end], "X", "tracehouse", []))
    assert "only one query" in str(sqlguard.refusal([*outer, "Literal 1"], "TSV", "tracehouse", []))


@pytest.fixture
def server_store(tmp_path: Path) -> Iterator[Store]:
    from tests.fake_clickhouse import USER, running

    with running(tmp_path / "clickhouse", "pw") as port:
        opened = Store.open(f"http://{USER}:pw@127.0.0.1:{port}/tracehouse", LIMITS)
        try:
            yield opened
        finally:
            opened.close()


def test_a_server_store_is_confined_too(server_store: Store) -> None:
    assert server_store.user_sql("SELECT count() AS n FROM samples", 10)[1] == 1
    assert server_store.user_sql("SELECT number FROM numbers(5)", 10)[1] == 5
    for sql, what in (
        (f"SELECT file('{PASSWD}') AS t", "function file"),
        (f"SELECT * FROM file('{PASSWD}', 'LineAsString')", "table function file"),
        ("SELECT * FROM system.one", "table system.one"),
        (f"SELECT 1) AS a, file('{PASSWD}', 'LineAsString'", "only one query"),
    ):
        with pytest.raises(SqlRejected) as caught:
            server_store.user_sql(sql, 10)
        assert caught.value.reason == "readonly" and what in str(caught.value), caught.value
