"""Experiment matrices for `tracehouse run --matrix FILE`: parse, validate and expand; nothing is launched here.

A matrix is YAML (`defaults` + `experiments`, each with `params` crossed into combinations) or CSV (one row per
combination, `param:`/`tag:`/`env:` columns, rows sharing a `group` collocated). Every error is found before the
first run starts and names the file and line. The file is untrusted: YAML is read with the safe loader only.

The readers are agent.runs.matrix_yaml and agent.runs.matrix_csv; what both build, and its expansion into
RunSpecs, is agent.runs.matrix_model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent.runs.matrix_csv import _from_csv
from agent.runs.matrix_model import RunSpec, _Bad, _expand
from agent.runs.matrix_yaml import _from_yaml
from tracehouse.regularfile import FileRefused, open_regular

MAX_BYTES = 1 << 20  # a matrix file


class MatrixError(ValueError):
    """A matrix file that cannot be run as written; the message names the file and, where known, the line."""


@dataclass(frozen=True)
class Matrix:
    path: Path
    slots: tuple[tuple[RunSpec, ...], ...]  # one slot after another; the specs of a slot at the same time

    @property
    def runs(self) -> int:
        return sum(len(slot) for slot in self.slots)


def load_matrix(path: Path) -> Matrix:
    """Read and expand a matrix file (.yaml, .yml or .csv, at most MAX_BYTES of UTF-8)."""
    _format(path)
    try:
        with open_regular(path) as f:  # a FIFO or a device is refused, not read
            data = f.read(MAX_BYTES + 1)
    except FileRefused as e:
        raise MatrixError(f"{path.name}: cannot read: {str(e).removeprefix(f'{path}: ')}") from None
    except OSError as e:
        raise MatrixError(f"{path.name}: cannot read: {e.strerror or e}") from None
    if len(data) > MAX_BYTES:
        raise MatrixError(f"{path.name}: larger than {MAX_BYTES} bytes")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise MatrixError(f"{path.name}: not UTF-8 (byte {e.start})") from None
    return parse_matrix(text, path)


def parse_matrix(text: str, path: Path) -> Matrix:
    """Expand a matrix from its text; `path` only picks the format and names the file in errors."""
    try:
        experiments = _from_csv(text) if _format(path) == "csv" else _from_yaml(text)
        return Matrix(path, _expand(experiments))
    except _Bad as e:
        raise MatrixError(f"{path.name} line {e.line}: {e}") from None


def _format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".csv"):
        raise MatrixError(f"{path.name}: unknown matrix format {suffix or '(no extension)'!r}; use .yaml, .yml or .csv")
    return "csv" if suffix == ".csv" else "yaml"
