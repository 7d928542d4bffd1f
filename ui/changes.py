"""Compare's answers as the page shows them. Pure: frames and text in, frames and words out."""

from __future__ import annotations

import re

import pandas as pd

SPEED = re.compile(r"\bis (?:[\d.]+ % )?(faster|slower) than\b")


def speed_word(headline: str) -> str:
    """'faster' or 'slower' as the headline says B is, else "" (too noisy, the same, unknown)."""
    found = SPEED.search(headline)
    return found.group(1) if found else ""


def absent_blank(changes: pd.DataFrame) -> pd.DataFrame:
    """A kernel (call, operation) that one run never ran reads blank in that run's columns, not as
    0 ns taken; its Δ stays the other run's whole time."""
    shown = changes.copy()
    for side in ("a", "b"):
        if f"instances_{side}" not in shown.columns:
            continue
        absent = (shown[f"instances_{side}"].fillna(0) == 0).to_numpy()
        for column in (f"instances_{side}", f"total_ns_{side}", f"avg_ns_{side}"):
            if column in shown.columns:
                values = shown[column]
                if pd.api.types.is_integer_dtype(values.dtype):
                    values = values.astype("Int64")
                shown[column] = values.mask(absent)
    return shown


def offered(options: list[str]) -> tuple[str, dict[str, str]] | None:
    """The verdict's advice (`--steps REGEX` or `--window DURATION`, query.verdict_text.advice) as the
    explorer offers it: a button's label and the URL parameters it sets; None for no advice."""
    if len(options) != 2:
        return None
    flag, value = options
    if flag == "--steps":
        return f"Compare with NVTX ranges matching {value} as steps", {"steps": value}
    if flag == "--window":
        return f"Compare in windows of {value}", {"window": value}
    return None
