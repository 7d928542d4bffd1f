"""The CSV reader of a matrix: one row per combination, `param:`/`tag:`/`env:` columns, rows sharing a
`group` collocated; lines starting with # are comments."""

from __future__ import annotations

import csv
import io

from agent.runs.matrix_model import _Bad, _Experiment, _experiment, _Fields, _get, _job, _Layer, _layer, _params

_CSV_COLUMNS = frozenset({"name", "command", "repeat", "gpus", "nsys", "nsys_args", "timeout", "group"})
_CSV_PREFIXES = {"param": "params", "tag": "tags", "env": "env"}


def _from_csv(text: str) -> list[_Experiment]:
    lines = [(n, s) for n, s in enumerate(io.StringIO(text, newline=""), 1) if not s.startswith("#")]
    reader = csv.reader(s for _, s in lines)
    columns: list[str] = []
    batches: dict[tuple[str, object], list[tuple[_Fields, int]]] = {}  # rows of a group together, in first-row order
    consumed = 0  # lines the reader has taken: the next row starts at lines[consumed]
    try:
        for cells in reader:
            line, consumed = lines[consumed][0], reader.line_num
            if not any(cell.strip() for cell in cells):
                continue
            if not columns:
                columns = _csv_header(cells, line)
                continue
            if len(cells) > len(columns):
                raise _Bad(line, f"{len(cells)} cells but {len(columns)} columns")
            fields: _Fields = {}
            mappings: dict[str, dict[str, str]] = {}
            for column, cell in zip(columns, (cell.strip() for cell in cells), strict=False):
                kind, _, key = column.partition(":")
                if cell and key:
                    mappings.setdefault(_CSV_PREFIXES[kind], {})[key] = cell
                elif cell:
                    fields[column] = (cell, line)
            fields.update((field, (mapping, line)) for field, mapping in mappings.items())
            group = str(fields.pop("group")[0]) if "group" in fields else ""
            batches.setdefault(("group", group) if group else ("row", line), []).append((fields, line))
    except csv.Error as e:
        raise _Bad(lines[reader.line_num - 1][0] if reader.line_num else 1, f"invalid CSV: {e}") from None
    if not batches:
        raise _Bad(max([n for n, _ in lines], default=1), "no experiments (a header row, then one row per run)")
    return [
        _experiment(rows[0][0], None, _Layer(), rows[0][1]) if kind == "row" else _csv_group(str(group), rows)
        for (kind, group), rows in batches.items()
    ]


def _csv_header(cells: list[str], line: int) -> list[str]:
    columns = [cell.strip() for cell in cells]
    for column in columns:
        kind, colon, key = column.partition(":")
        if column not in _CSV_COLUMNS and not (colon and key and kind in _CSV_PREFIXES):
            known = ", ".join([*sorted(_CSV_COLUMNS), "param:NAME", "tag:NAME", "env:NAME"])
            raise _Bad(line, f"unknown column {column!r} (known: {known})")
        if columns.count(column) > 1:
            raise _Bad(line, f"column {column!r} twice")
    for required in ("name", "command"):
        if required not in columns:
            raise _Bad(line, f"missing required column {required!r}")
    return columns


def _csv_group(group: str, rows: list[tuple[_Fields, int]]) -> _Experiment:
    jobs, repeats = [], set()
    for fields, line in rows:
        layer = _layer(fields)
        repeats.add(layer.repeat or 1)
        if len(repeats) > 1:
            raise _Bad(line, f"repeat differs from the first row of group {group!r} (line {rows[0][1]})")
        params = {key: values[0] for key, values in (_get(fields, "params", _params) or {}).items()}
        jobs.append(_job(fields, layer, line, params))
    return _Experiment(group, {}, repeats.pop(), tuple(jobs), rows[0][1])
