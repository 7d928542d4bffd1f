"""User SQL answers values, never aggregate function states: a state is bytes of the engine's
memory (heap addresses among them). Refused by the engine's own types of the result, through the
real server and store."""

from __future__ import annotations

import pytest

from query.client import Client, QueryFailed

STATES = {
    "sumState": ("SELECT sumState(number) AS s FROM numbers(3)", "'s' is AggregateFunction(sum, UInt64)"),
    "uniqState": ("SELECT uniqState(number) FROM numbers(3)", "'uniqState(number)' is AggregateFunction(uniq"),
    "groupBitmapState": (
        "SELECT groupBitmapState(toUInt64(number)) AS bits FROM numbers(3)",
        "'bits' is AggregateFunction(groupBitmap, UInt64)",
    ),
    "array of states": ("SELECT [sumState(1)] AS states", "'states' is Array(AggregateFunction(sum, UInt8))"),
    "state in a tuple": ("SELECT 1 AS one, tuple(2, uniqState(3)) AS t", "'t' is Tuple(UInt8, AggregateFunction("),
    "state in a map": ("SELECT map('k', sumState(1)) AS m", "'m' is Map(String, AggregateFunction(sum, UInt8))"),
    "state in a subquery": (
        "SELECT x FROM (SELECT number, sumState(number) AS x FROM numbers(3) GROUP BY number)",
        "'x' is AggregateFunction(sum, UInt64)",
    ),
    "simple state": ("SELECT CAST(1, 'SimpleAggregateFunction(sum, UInt64)') AS v", "'v' is SimpleAggregateFunction"),
    "state in a Dynamic": ("SELECT sumState(1)::Dynamic AS d", "'d' is Dynamic"),
}


@pytest.mark.parametrize(("sql", "named"), STATES.values(), ids=STATES.keys())
def test_a_result_column_of_aggregate_states_is_refused_naming_it(client: Client, sql: str, named: str) -> None:
    with pytest.raises(QueryFailed) as caught:
        client.sql(sql)
    assert caught.value.code.name == "INVALID_ARGUMENT", caught.value
    message = caught.value.message
    assert message.startswith("sql: column ") and named in message, message
    assert "finalizeAggregation(" in message and "-Merge" in message and "\n" not in message


def test_finalized_states_still_answer(client: Client) -> None:
    finalized = client.sql("SELECT finalizeAggregation(sumState(number)) AS total FROM numbers(4)")
    merged = client.sql("SELECT sumMerge(s) AS merged FROM (SELECT sumState(number) AS s FROM numbers(3))")
    assert finalized.to_dict("records") == [{"total": 6}] and merged.to_dict("records") == [{"merged": 3}]
