"""The engine's syntax errors told in the user's own text. Pure.

User SQL runs wrapped (sqlguard.wrap, and `EXPLAIN AST` before it to confine it), so the engine's
"position N (line L, col C)" count from the start of the wrapper. Here each position is moved
into the user's text as they sent it (1-based characters, lines and columns); one past their
text (the wrapper's closing lines) reads "the end of the query"; one before it is dropped.
"""

from __future__ import annotations

import re

_AT = re.compile(r"position (\d+) \(((?:(?!\(line ).)*?)\) \(line \d+, col \d+\)(: .*?(?=\. [A-Z(]|\.?$))?")
_CUT = re.compile(r"position (\d+) \(([^()]*)$")  # a quoted token cut at its line break: "position 36 ('abc"
_BRACKET = re.compile(r"'(.)' at position (\d+) \(line \d+, col \d+\)")
_NO_BRACKETS = re.compile(r"\s*Unmatched parentheses:[\s,]*(?:is|are) never closed\.?")
_LIST_GAPS = re.compile(r"(: |, )(?:, )+|, (?= (?:is|are) never closed)")


def in_user_text(message: str, sql: str, head: str) -> str:
    """`message` with its positions in `sql`. `head`: the engine's text before the user's
    (sql.strip().rstrip(";") follows it, as sqlguard.wrap puts it)."""
    body = sql.strip().rstrip(";")
    lead = len(sql) - len(sql.lstrip())
    skip, size = len(head.encode()), len(body.encode())

    def where(position: str) -> tuple[str, int] | None:
        """('inside', index in sql) or ('after', 0); None before the user's text."""
        offset = int(position) - 1 - skip  # the engine counts bytes from 1
        if offset < 0:
            return None
        if offset >= size:
            return "after", 0
        return "inside", lead + len(body.encode()[:offset].decode("utf-8", "ignore"))

    def spot(index: int) -> str:
        line = sql.count("\n", 0, index) + 1
        column = index - (sql.rfind("\n", 0, index) + 1) + 1
        return f"position {index + 1} (line {line}, col {column})"

    def bracket(match: re.Match[str]) -> str:
        found = where(match.group(2))
        return f"'{match.group(1)}' at {spot(found[1])}" if found and found[0] == "inside" else ""

    def at(match: re.Match[str]) -> str:
        found = where(match.group(1))
        if found is None or found[0] == "after":
            return "the end of the query"
        token, snippet = match.group(2), match.group(3) or ""
        return spot(found[1]).replace(" (line", f" ({token}) (line", 1) + snippet

    def cut(match: re.Match[str]) -> str:
        found = where(match.group(1))
        if found is None or found[0] == "after":
            return "the end of the query"
        return spot(found[1]).replace(" (line", f" ({match.group(2)}…) (line", 1)

    text = _BRACKET.sub(bracket, message)
    text = _LIST_GAPS.sub(lambda m: m.group(1) or "", text)
    text = _NO_BRACKETS.sub("", text)
    text, found = _AT.subn(at, text)
    return (text if found else _CUT.sub(cut, text)).strip()
