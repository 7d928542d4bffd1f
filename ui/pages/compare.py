"""Two runs side by side: first the verdict (is B faster than A per step, how sure, and where the
step time went), then the answer in one sentence, their key figures (duration, GPUs, busy %,
utilisation, memory peak, energy), then kernels, CUDA API and memory operations matched by name,
the biggest changes first; every other column in expanders."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
import streamlit as st

from query.headline import compare_headline, key_figures
from query.verdict_text import advice, headline, measures_rows, parts_rows, runs_rows
from tracehouse.timefmt import parse_duration
from tracehouse.wallclock import starts_without_wall_clock
from ui.changes import absent_blank, offered, speed_word
from ui.controls import run_label
from ui.data import ask, attempt, command, plain, stop_if_empty
from ui.tables import styled, table

SUMMARIES = ("kernels", "api", "memops")
CHANGE_COLUMNS = ("category", "name", "total_ns_a", "total_ns_b", "delta_ns", "delta_pct")
NOT_MEASURED = "not measured"
VERDICT_BOX: dict[str, Callable[[str], object]] = {"faster": st.success, "slower": st.warning}  # else st.info


def box_of(text: str) -> Callable[[str], object]:
    """The colour a headline's own word means: green where B is faster, orange where slower, blue
    for anything else (too noisy to tell, the same, not measured)."""
    return VERDICT_BOX.get(speed_word(text), st.info)


def show_verdict(run_a: str, run_b: str, params: dict[str, str]) -> bool:
    """The verdict of B against A per step, headline first, in small static tables (the explorer's
    grids are for the long tables below); without a verdict, a line saying why. True where the
    verdict is the page's headline."""
    pattern, window = params.get("steps", ""), params.get("window", "")
    try:
        window_ns = parse_duration(window) if window else 0
    except ValueError as error:
        st.caption(f"The window in the URL does not parse: {plain(str(error))}")
        window_ns = 0
    options = {"step_pattern": pattern} if pattern else {}
    frames, why = attempt("verdict", (run_a,), (run_b,), window_ns=window_ns, **options)
    if pattern or window:
        chose = f"NVTX ranges matching `{plain(pattern)}` as steps" if pattern else f"windows of {plain(window)}"
        st.caption(f"The verdict compares {chose}.")
        if st.button("Back to the runs' own steps", key="verdict-default"):
            show_runs(run_a, run_b)
    if why:
        st.caption(f"No verdict per step for these runs. {why}")
        return False
    measures: pd.DataFrame = frames["measures"]
    known = measures[measures["verdict"] != NOT_MEASURED] if not measures.empty else measures
    if known.empty:
        notes = "; ".join(str(note) for note in measures.attrs.get("notes", []))
        st.caption("No verdict per step: " + plain(notes or headline(measures), 2000))
        offer_advice(measures, frames["runs"], run_a, run_b)
        return False
    said = headline(measures)
    box_of(said)(plain(said, 2000))
    st.table(measures_rows(measures).set_index("measure"))
    if not frames["parts"].empty:
        st.markdown("**Where the step time went** (per step, B - A)")
        st.table(parts_rows(frames["parts"]).set_index("part"))  # kernels by their short names
    if not frames["phases"].empty:
        st.markdown("**By phase** (per step, B - A)")
        st.table(parts_rows(frames["phases"]).set_index("part"))
    if not frames["phase_work"].empty:
        st.markdown("**GPU time launched from each phase** (per step, B - A)")
        st.table(parts_rows(frames["phase_work"], total="GPU time").set_index("part"))
    offer_advice(measures, frames["runs"], run_a, run_b)
    with st.expander("The runs' steps (warm-up left out)"):
        st.table(runs_rows(frames["runs"]).set_index("group"))
    return True


def offer_advice(measures: pd.DataFrame, runs: pd.DataFrame, run_a: str, run_b: str) -> None:
    """The verdict's advice (steps to name, windows to cut) as a button that does it, not as CLI flags."""
    said, options = advice(measures, runs)
    offer = offered(options)
    if offer is None:
        return
    label, wanted = offer
    st.caption(plain(said.split(" (--window")[0].split(": cut")[0].rstrip(":"), 2000) + ".")  # the button says how
    if st.button(label, key="verdict-advice"):
        show_runs(run_a, run_b, **wanted)


def show_runs(run_a: str, run_b: str, **verdict: str) -> None:
    st.query_params.from_dict({"a": run_a, "b": run_b, **verdict})
    st.rerun()


st.title("Compare")
stop_if_empty()
runs_listed = ask("runs")
labels = run_label(runs_listed)
params = st.query_params.to_dict()
choices = list(labels)
if len(choices) < 2:
    st.info(f"Comparing needs two runs in the store; import another (`{command()} import report.sqlite`).")
    st.stop()
left, right = st.columns(2)
# by default the two newest runs of one source (the list is newest first)
pairs = runs_listed.groupby("source", sort=False)["run_id"].apply(list)
newest_pair = next((ids[:2] for ids in pairs if len(ids) >= 2), choices[:2])


def pick(column: st.delta_generator.DeltaGenerator, title: str, key: str, fallback: str) -> str:
    wanted = params.get(key, "")
    index = choices.index(wanted if wanted in choices else fallback)
    if wanted and wanted not in choices:
        column.warning(f"Run {plain(wanted)} is not in the store.")
    return str(
        column.selectbox(title, choices, index=index, format_func=lambda run: labels.get(run, run), key=f"pick-{key}")
    )


run_a = pick(left, "Run A (before)", "a", newest_pair[1])
run_b = pick(right, "Run B (after)", "b", newest_pair[0])
if {"a": run_a, "b": run_b} != {k: params.get(k) for k in ("a", "b")}:
    st.query_params.from_dict({"a": run_a, "b": run_b})
if run_a == run_b:
    st.info("Pick two different runs.")
    st.stop()
verdict_leads = show_verdict(run_a, run_b, params)
st.divider()  # the verdict per step above, the two runs' totals below
runs = ask("compare", (run_a, run_b))
whole = compare_headline(runs, ask("diff", run_a, run_b))
if verdict_leads:  # one headline: the whole runs' durations (set-up included) are a figure below it
    st.markdown(f"**Whole runs**, start to end, set-up included: {plain(whole, 2000)}")
else:
    box_of(whole)(plain(whole, 2000))
st.caption(f"A: {plain(labels.get(run_a, run_a))} · B: {plain(labels.get(run_b, run_b))}")
st.dataframe(key_figures(runs), hide_index=True, placeholder="")
summaries = st.multiselect("What to compare", SUMMARIES, default=list(SUMMARIES))
exact = ask("diff", run_a, run_b, summaries=tuple(summaries))
changes = absent_blank(exact)
main = [c for c in CHANGE_COLUMNS if c in changes.columns]
st.caption("Δ total time, B - A: green is less time in B, red more; blank where a run has none of it.")
table(
    changes[main], "diff", "kernels, API calls or memory operations", "name", "delta_ns", "Δ total time, B - A",
    full_names=False, csv=exact[main],
)  # fmt: skip
with st.expander("Every figure of both runs"):  # a start without a wall clock says so, never 1970
    clockless = dict(zip(runs_listed["run_id"].astype(str), runs_listed["relative_time"].astype(bool), strict=True))
    st.dataframe(styled(starts_without_wall_clock(runs, clockless)), hide_index=True, width="stretch", placeholder="")
if not changes.empty:
    with st.expander("Every column of the changes (instances, averages)"):
        st.dataframe(styled(changes), hide_index=True, width="stretch", placeholder="")
