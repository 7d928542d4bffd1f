"""A verdict for people: the headline, the measures, the parts of the step-time difference and the
runs, in human units, as terminal tables or Markdown (a pull-request comment). Pure: the frames of
Client.verdict in, text out."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pandas as pd

from tracehouse.units import duration, missing, number, percent

PARTS_SHOWN = 10
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


def headline(measures: pd.DataFrame) -> str:
    """'B is slower than A: step time +1.7 % (95 % interval +1.4 % … +2.1 %), from 3 and 3 runs.'"""
    if measures.empty:
        return "Nothing to compare: neither group has steps, GPU work or telemetry in common."
    known = measures[measures["verdict"] != "not measured"]
    row = known.iloc[0] if len(known) else measures.iloc[0]
    label = LABELS.get(str(row["measure"]), str(row["measure"]))
    if missing(row.get("change")):
        return f"B vs A: {label} not measured."
    interval = _interval(row["low"], row["high"], signed_percent)
    evidence = (f"{int(row['runs_a'])} and {int(row['runs_b'])} runs" if row["evidence"] == "runs"
                else f"one run each side ({int(row['steps_a'])} and {int(row['steps_b'])} steps): "
                "run-to-run spread not measured")  # fmt: skip
    figure = f"{label} {signed_percent(row['change'])}{f' (95 % interval {interval})' if interval else ''}"
    word = str(row["verdict"])
    said = f"B is {word} than A" if word in ("faster", "slower") else f"B vs A: {_said(row)}"
    return f"{said}: {figure}, from {evidence}."


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
            "steps A/B": "" if missing(row.get("steps_a")) else f"{int(row['steps_a'])}/{int(row['steps_b'])}",
        })  # fmt: skip
    return pd.DataFrame(rows)


def parts_rows(parts: pd.DataFrame, shown: int = PARTS_SHOWN, total: str = "step time") -> pd.DataFrame:
    """The PARTS_SHOWN parts of largest |B - A| (time per step), the rest summed in one row, and the
    total (`total`: the step time for parts and phases, GPU time for the work launched from phases)."""
    if parts.empty:
        return pd.DataFrame()
    head, rest = parts.iloc[:shown], parts.iloc[shown:]
    rows = [_part(str(row["part"]), row["a_ns"], row["b_ns"], row["delta_ns"], row["low_ns"], row["high_ns"])
            for _, row in head.iterrows()]  # fmt: skip
    if len(rest):
        rows.append(_part(f"{len(rest)} other parts", rest["a_ns"].sum(), rest["b_ns"].sum(), rest["delta_ns"].sum(),
                          None, None))  # fmt: skip
    rows.append(_part(total, parts["a_ns"].sum(), parts["b_ns"].sum(), parts["delta_ns"].sum(), None, None))
    return pd.DataFrame(rows)


def _part(name: str, a: float, b: float, delta: float, low: float | None, high: float | None) -> dict[str, str]:
    signed = lambda ns: "" if missing(ns) else ("+" if ns > 0 else "") + duration(ns)  # noqa: E731
    return {"part": name, "A per step": duration(a), "B per step": duration(b), "B - A": signed(delta),
            "95 % interval": _interval(low, high, signed)}  # fmt: skip


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
    text = [f"### tracehouse verdict: {names[1]} (B) vs {names[0]} (A)", "", headline(frames["measures"]), "",
            markdown_table(measures_rows(frames["measures"]))]  # fmt: skip
    for name, title in TITLES.items():
        if not frames.get(name, pd.DataFrame()).empty:
            text += [f"#### {title}", "", markdown_table(parts_rows(frames[name], total=TOTALS[name]))]
    text += ["<details><summary>Runs</summary>", "", markdown_table(runs_rows(frames["runs"])), "</details>", ""]
    return "\n".join(text)
