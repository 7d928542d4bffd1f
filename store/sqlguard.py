"""Confines user SQL to reading tracehouse's tables, by the engine's own parse of the text that runs.

The store wraps a user's text as `SELECT * FROM (\\n<text>\\n)`, has the engine parse exactly that
(`EXPLAIN AST`, one line per node, indented by depth) and gives the lines to `refusal`, which
allows only what store/sqlallow.py lists: node types, functions, table functions, and tables of
the store's own database. Nothing is looked up by a deny-list of names.

The dump prints identifiers and aliases as they are, so a name with a line break in it adds lines
of its making. No rule here depends on where a line stands, except the wrapper's own lines, which
come before any of the user's text: every line is checked for itself, each real node starts a line
of its own with its real type and name, and a made-up line is checked like any other.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from store.sqlallow import (
    AGGREGATE_FUNCTIONS,
    CASE_INSENSITIVE,
    COMBINATORS,
    NODE_TYPES,
    SCALAR_FUNCTIONS,
    TABLE_FUNCTIONS,
)

WHY = " (user SQL may only read tracehouse's tables)"
# The outer query of the wrapping, up to the user's subquery; the format clause the client appends
# is the last child of the root.
_OUTER = (
    "SelectWithUnionQuery (children 2)",
    " ExpressionList (children 1)",
    "  SelectQuery (children 2)",
    "   ExpressionList (children 1)",
    "    Asterisk",
    "   TablesInSelectQuery (children 1)",
    "    TablesInSelectQueryElement (children 1)",
    "     TableExpression (children 1)",
    "      Subquery (children 1)",
)
_LINE = re.compile(r" *([A-Za-z]+(?:::[A-Za-z]+)?)(?: (.*))?")
_SUFFIX = r"(?: \(alias .*\))?(?: \(children \d+\))?"
_FUNCTION = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)" + _SUFFIX)
_TABLE = re.compile(r"(?:([A-Za-z_][A-Za-z0-9_]*)\.)?[A-Za-z_][A-Za-z0-9_]*" + _SUFFIX)
_WORDS = {"Set": "SETTINGS", "ColumnsApplyTransformer": "APPLY", "QueryParameter": "a query parameter"}


def wrap(sql: str) -> str:
    """The text that runs: one query, as a subquery, so that nothing but a query can."""
    return f"SELECT * FROM (\n{sql.strip().rstrip(';')}\n)"


def refusal(lines: Sequence[str], output_format: str, database: str, databases: Iterable[str]) -> str | None:
    """Why the query is refused, or None when it only reads. `lines`: EXPLAIN AST of the wrapped
    text with `FORMAT output_format` appended; `databases`: every database the engine has."""
    ends = bool(lines) and lines[-1] == f" Identifier {output_format}"
    if tuple(lines[: len(_OUTER)]) != _OUTER or len(lines) <= len(_OUTER) + 1 or not ends:
        return "sql: only one query (SELECT or WITH) runs here, and nothing after it"
    others = [name.lower() for name in databases if name != database]
    after_table_expression = False
    for line in lines[len(_OUTER) : -1]:
        found = _LINE.fullmatch(line)
        if not found:
            return "sql: a name with a line break in it is not allowed here"
        kind, rest = found.group(1), found.group(2) or ""
        reason = _node_refusal(kind, rest, after_table_expression, database, others)
        if reason:
            return f"sql: {reason} is not allowed here{WHY}"
        after_table_expression = kind == "TableExpression"
    return None


# a type that is an aggregate function's state (bytes of the engine's memory, its addresses among them),
# or that may hold one whatever its name says (Dynamic, Variant, JSON), anywhere inside a column's type
_STATE_TYPE = re.compile(r"\b(?:Simple)?AggregateFunction\(|\bDynamic\b|\bVariant\(|\bJSON\b|\bObject\(")


def state_refusal(columns: Iterable[tuple[str, str]]) -> str | None:
    """Why a result of these (name, type) columns, as the engine types it, is refused: a column that
    holds aggregate function states. None when every column holds values."""
    for name, type_name in columns:
        if _STATE_TYPE.search(type_name):
            shown, typed = _shown(name), _shown(type_name)
            named = shown if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", shown) else "`" + shown.replace("`", "\\`") + "`"
            return (
                f"sql: column {shown!r} is {typed}, which holds aggregate function states (the engine's memory, "
                f"not values): answer their values, e.g. finalizeAggregation({named}) or a -Merge aggregate "
                "(sumMerge of sumState), or cast it to a plain type"
            )
    return None


def _node_refusal(kind: str, rest: str, table_position: bool, database: str, others: list[str]) -> str | None:
    if kind not in NODE_TYPES:
        return _WORDS.get(kind, kind)
    if kind == "Function":
        name = _FUNCTION.fullmatch(rest)
        shown = _shown(rest.split(" ", 1)[0])
        if table_position:
            return None if name and name.group(1) in TABLE_FUNCTIONS else f"table function {shown}"
        return None if name and function_allowed(name.group(1)) else f"function {shown}"
    if kind == "TableIdentifier":
        table = _TABLE.fullmatch(rest)
        if not table or table.group(1) not in (None, database):
            return f"table {_shown(rest.split(' (alias ', 1)[0])}"
    if kind == "Identifier":  # `x IN db.table` names a table by an identifier
        lowered = rest.lower()
        for other in others:
            if lowered.startswith(other + "."):
                return f"database {_shown(rest[: len(other)])}"
    return None


def function_allowed(name: str) -> bool:
    """A scalar or window function, or an aggregate with combinators (sumIf, uniqArrayIf, COUNTDistinct)."""
    if _known(name, SCALAR_FUNCTIONS):
        return True
    while not _known(name, AGGREGATE_FUNCTIONS):
        suffix = next((c for c in COMBINATORS if name.endswith(c) and len(name) > len(c)), None)
        if suffix is None:
            return False
        name = name[: -len(suffix)]
    return True


def _known(name: str, names: frozenset[str]) -> bool:
    return name in names or (name.lower() in _LOWERED and _LOWERED[name.lower()] in names)


_LOWERED = {name.lower(): name for name in CASE_INSENSITIVE}


def _shown(text: str) -> str:
    """A name from the user's text, fit for one line of a message."""
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= 64 else text[:61] + "..."
