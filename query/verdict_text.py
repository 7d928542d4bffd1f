"""A verdict for people: the headline, the measures, the parts of the step-time difference and the
runs, in human units, as terminal tables or Markdown (a pull-request comment). Pure: the frames of
Client.verdict in, text out."""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable, Sequence

import pandas as pd

from query.verdict import MIN_WINDOW_NS, RESOLUTION_NS
from tracehouse.shortnames import unique_short_names
from tracehouse.units import duration, missing, number, percent

PARTS_SHOWN = 10
MIN_WINDOWS = 30  # windows a suggested --window gives the shortest run: 10 batches of 3 (verdict_stats)
TITLES = {
    "parts": "Where the step time went (per step, B - A)",
    "phases": "By phase (per step, B - A)",
    "phase_work": "GPU time launched from each phase (per step, B - A)",
}
TOTALS = {"parts": "step time", "phases": "step time", "phase_work": "GPU time"}
LABELS = {"step_time": "step time", "throughput": "throughput", "gpu_busy": "GPU busy", "energy": "energy per step",
          "gpu_util": "GPU utilisation"}  # fmt: skip


def _value(unit: str, value: float | None) -> str:
    if missing(value):
        return ""
    assert value is not None
    if unit == "ns":
        return duration(value)
    if unit == "%":
        return percent(value)
    if unit == "items/s":
        return f"{number(value)} items/s"
    return number(value, unit)


def signed_percent(fraction: float | None) -> str:
    """+1.7 %, -0.3 % (one decimal; two below 1 %)."""
    if missing(fraction):
        return ""
    assert fraction is not None
    value = 100 * fraction
    return f"{value:+.2f} %" if abs(value) < 1 else f"{value:+.1f} %"


def _interval(low: float | None, high: float | None, show: Callable[[float | None], str]) -> str:
    return "" if missing(low) or missing(high) else f"{show(low)} … {show(high)}"


def _said(row: pd.Series) -> str:
    word = str(row["verdict"])
    if word == "too noisy to tell" and not missing(row.get("more_runs")):
        runs = int(row["more_runs"])
        return f"too noisy to tell: about {runs} more run{'s' if runs != 1 else ''} per group would tell"
    return word


def _runs(count: int) -> str:
    return "one run" if count == 1 else f"{count} runs"


def evidence_text(row: pd.Series) -> str:
    """What a measure's figure stands on: '3 and 3 runs'; 'one run each side (12 and 14 steps): run-to-run
    spread not measured'; '2 runs of A and one run of B (…): run-to-run spread not measured for B'."""
    runs_a, runs_b = int(row["runs_a"]), int(row["runs_b"])
    if row["evidence"] == "runs":
        return f"{runs_a} and {runs_b} runs"
    per = f"{row.get('per') or 'step'}s"
    counted = f"({int(row['steps_a'])} and {int(row['steps_b'])} {per})"
    if runs_a == runs_b == 1:
        return f"one run each side {counted}: run-to-run spread not measured"
    single = " and ".join(side for side, runs in (("A", runs_a), ("B", runs_b)) if runs == 1)
    return f"{_runs(runs_a)} of A and {_runs(runs_b)} of B {counted}: run-to-run spread not measured for {single}"


def headline(measures: pd.DataFrame, runs: pd.DataFrame | None = None) -> str:
    """'B is slower than A: step time +1.7 % (95 % interval +1.4 % … +2.1 %), from 3 and 3 runs.'; with
    `runs` (the verdict's runs table), a refusal says which runs lack what (see `advice` for what to add)."""
    if measures.empty or (measures["verdict"] == "not measured").all():
        return f"Nothing to compare: {_lacking(runs)}." if runs is not None and not runs.empty else (
            "Nothing to compare: neither group has steps, GPU work or telemetry in common.")  # fmt: skip
    known = measures[measures["verdict"] != "not measured"]
    row = known.iloc[0] if len(known) else measures.iloc[0]
    label = LABELS.get(str(row["measure"]), str(row["measure"]))
    if missing(row.get("change")):
        return f"B vs A: {label} not measured."
    interval = _interval(row["low"], row["high"], signed_percent)
    figure = f"{label} {signed_percent(row['change'])}{f' (95 % interval {interval})' if interval else ''}"
    word = str(row["verdict"])
    said = f"B is {word} than A" if word in ("faster", "slower") else f"B vs A: {_said(row)}"
    return f"{said}: {figure}, from {evidence_text(row)}."


def _names(runs: pd.DataFrame, which: pd.Series) -> str:
    names = [str(row["name"] or row["run_id"]) for _, row in runs[which].iterrows()]
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _lacking(runs: pd.DataFrame) -> str:
    """Why no measure could be compared, from the runs table."""
    reasons = []
    if "gpu_work" in runs and not runs["gpu_work"].fillna(False).astype(bool).all():
        reasons.append(f"no GPU work in {_names(runs, ~runs['gpu_work'].fillna(False).astype(bool))}")
    if "has_steps" in runs and not runs["has_steps"].fillna(False).astype(bool).all():
        stepless = _names(runs, ~runs["has_steps"].fillna(False).astype(bool))
        reasons.append(f"no steps in {stepless} (--steps REGEX names NVTX ranges as steps)")
    if (runs["steps"] == 0).any():
        reasons.append(f"nothing left to measure in {_names(runs, runs['steps'] == 0)}")
    return "; ".join(reasons) or "the two groups have no steps, GPU work or telemetry in common"


def _nice_floor(ns: float) -> int:
    """The largest 1, 2 or 5 times a power of ten at most `ns`."""
    power = 10 ** math.floor(math.log10(ns))
    return int(max(step * power for step in (1, 2, 5) if step * power <= ns))


def duration_option(ns: int) -> str:
    """A duration as an option's value that tracehouse.timefmt.parse_duration reads back: 20ms, 1s, 500us."""
    for unit, scale in (("d", 86_400 * 10**9), ("h", 3_600 * 10**9), ("s", 10**9), ("ms", 10**6), ("us", 10**3)):
        if ns >= scale and ns % scale == 0:
            return f"{ns // scale}{unit}"
    return f"{ns}ns"


def suggested_window(runs: pd.DataFrame) -> int | None:
    """A window that cuts the shortest run into MIN_WINDOWS or more (enough to tell a change from
    step-to-step noise); None when the runs are windowed finer already, or are too short for it."""
    windowed = runs[~runs["has_steps"].fillna(False).astype(bool)] if "has_steps" in runs else runs
    spans = runs["span_ns"].dropna() if "span_ns" in runs else pd.Series(dtype="float64")
    if windowed.empty or spans.empty or float(spans.min()) <= 0:
        return None
    window = _nice_floor(float(spans.min()) / MIN_WINDOWS)
    now = runs["mean_step_ns"].dropna()
    if window < MIN_WINDOW_NS or (not now.empty and window >= float(now.min())):
        return None
    return window


_RE2_SPECIAL = re.compile(r"([\\.+*?()|\[\]{}^$])")


def steps_pattern(runs: pd.DataFrame) -> str | None:
    """A --steps pattern naming, for every run without steps, its NVTX range of most instances
    (the runs table's repeated_range); None where one of them has none."""
    if "repeated_range" not in runs or "has_steps" not in runs:
        return None
    stepless = runs[~runs["has_steps"].fillna(False).astype(bool)]
    names = [name for name in stepless["repeated_range"] if isinstance(name, str) and name]
    if stepless.empty or len(names) < len(stepless):
        return None
    escaped = sorted({_RE2_SPECIAL.sub(r"\\\1", name) for name in names})
    return f"^{escaped[0]}$" if len(escaped) == 1 else f"^({'|'.join(escaped)})$"


def advice(measures: pd.DataFrame, runs: pd.DataFrame) -> tuple[str, list[str]]:
    """What to add where runs without steps were compared in windows: a sentence, and the options
    that a pasted command adds ([] when there is none). A --steps pattern where every such run
    repeats an NVTX range (then step time is measured too); else, when too few windows tell nothing,
    a --window that cuts the shortest run into MIN_WINDOWS."""
    if runs.empty or "span_ns" not in runs or runs["has_steps"].fillna(False).astype(bool).all():
        return "", []
    intervals = bool(not measures.empty and "low" in measures and measures["low"].notna().any())
    pattern = steps_pattern(runs)
    if pattern is not None:
        names = ", ".join(sorted({str(n) for n in runs["repeated_range"].dropna()}))
        return (f"Runs without steps repeat the NVTX range {names}: taken as steps, step time is measured too "
                "(--window DURATION cuts finer windows instead):", ["--steps", pattern])  # fmt: skip
    measured = bool(not measures.empty and (measures["verdict"] != "not measured").any())
    if intervals or not measured:  # told apart already; or nothing in the windows to measure, however fine
        return "", []
    steps = "name the runs' step ranges with --steps REGEX (NVTX ranges, one per step)"
    window = suggested_window(runs)
    if window is None:
        return f"Too few windows to tell a change from noise: {steps}.", []
    return (f"Too few windows to tell a change from noise: cut the runs into windows of {duration(window)}, "
            f"or {steps}:", ["--window", duration_option(window)])  # fmt: skip


def measures_rows(measures: pd.DataFrame) -> pd.DataFrame:
    """The measures in human units, one row each."""
    rows = []
    for _, row in measures.iterrows():
        unit = str(row["unit"])
        rows.append({
            "measure": LABELS.get(str(row["measure"]), str(row["measure"])),
            "A": _value(unit, row.get("a")), "B": _value(unit, row.get("b")),
            "change": signed_percent(row.get("change")),
            "95 % interval": _interval(row.get("low"), row.get("high"), signed_percent),
            "verdict": _said(row),
            f"{row.get('per') or 'step'}s A/B": "" if missing(row.get("steps_a"))
            else f"{int(row['steps_a'])}/{int(row['steps_b'])}",
        })  # fmt: skip
    return pd.DataFrame(rows)


def parts_rows(
    parts: pd.DataFrame, shown: int = PARTS_SHOWN, total: str = "step time", full_names: bool = False
) -> pd.DataFrame:
    """The PARTS_SHOWN parts of largest |B - A| (time per step), the rest summed in one row, and the
    total (`total`: the step time for parts and phases, GPU time for the work launched from phases).
    Kernels by their short names (tracehouse.shortnames, as every table has them), whole with `full_names`."""
    if parts.empty:
        return pd.DataFrame()
    head, rest = parts.iloc[:shown], parts.iloc[shown:]
    names = [str(name) for name in head["part"]]
    labels = {name: name for name in names} if full_names else unique_short_names(names)
    rows = [_part(labels[str(row["part"])], row["a_ns"], row["b_ns"], row["delta_ns"], row["low_ns"], row["high_ns"])
            for _, row in head.iterrows()]  # fmt: skip
    if len(rest):
        rows.append(_part(f"{len(rest)} other parts", rest["a_ns"].sum(), rest["b_ns"].sum(), rest["delta_ns"].sum(),
                          None, None))  # fmt: skip
    rows.append(_part(total, parts["a_ns"].sum(), parts["b_ns"].sum(), parts["delta_ns"].sum(), None, None))
    return pd.DataFrame(rows)


def _signed(ns: float | None) -> str:
    """+12 µs, -3 ms; a difference below the clock's resolution is 0 ns."""
    if missing(ns):
        return ""
    assert ns is not None
    return "0 ns" if abs(ns) < RESOLUTION_NS else ("+" if ns > 0 else "") + duration(ns)


def _part(name: str, a: float, b: float, delta: float, low: float | None, high: float | None) -> dict[str, str]:
    return {"part": name, "A per step": duration(a), "B per step": duration(b), "B - A": _signed(delta),
            "95 % interval": _interval(low, high, _signed)}  # fmt: skip


def runs_rows(runs: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame([
        {"group": row["group"], "run": row["name"] or row["run_id"], "run id": row["run_id"],
         "steps from": row["steps_from"], "warm-up dropped": int(row["warmup_dropped"]),
         "steps kept": int(row["steps"]), "mean step": duration(row["mean_step_ns"])}
        for _, row in runs.iterrows()
    ])  # fmt: skip


def markdown_table(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "_none_\n"
    escape = lambda text: str(text).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| " + " | ".join(map(escape, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(escape(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def markdown(frames: dict[str, pd.DataFrame], names: Sequence[str]) -> str:
    """The whole verdict as Markdown: headline, measures, parts, runs. `names`: A's and B's labels."""
    said, options = advice(frames["measures"], frames["runs"])
    told = [f"{said} `{shlex.join(options)}`" if options else said, ""] if said else []
    title = f"### tracehouse verdict: {names[1]} (B) vs {names[0]} (A)"
    text = [title, "", headline(frames["measures"], frames["runs"]), "", *told,
            markdown_table(measures_rows(frames["measures"]))]  # fmt: skip
    for name, title in TITLES.items():
        if not frames.get(name, pd.DataFrame()).empty:
            text += [f"#### {title}", "", markdown_table(parts_rows(frames[name], total=TOTALS[name]))]
    text += ["<details><summary>Runs</summary>", "", markdown_table(runs_rows(frames["runs"])), "</details>", ""]
    return "\n".join(text)
