"""Where GPU time went in the window: nsys-stats-style summaries, busy and idle time per GPU
with the longest idle gaps, and per phase the GPU's busy share and telemetry."""

from __future__ import annotations

import streamlit as st

from tracehouse import units
from ui.controls import window_sidebar, zoom_buttons
from ui.data import ask, step_window, stop_if_empty
from ui.tables import origin_caption, table

SUMMARIES = {  # tab: (summary, what it lists)
    "Kernels": ("kernels", "kernels"),
    "CUDA API": ("api", "CUDA API calls"),
    "Memory ops": ("memops", "memory operations"),
    "NVTX": ("nvtx", "NVTX ranges, phases and steps"),
}
GAPS_SHOWN = 20
GAP_CHOICES = [10_000, 100_000, 1_000_000, 10_000_000, 100_000_000]
GAPS_ASKED = 1000  # per GPU, the longest first
OVER_WINDOW = "the window shown"

st.title("Kernels & phases")
stop_if_empty()
scope = window_sidebar()
window = scope.window()
zoom_buttons(scope, "kernels")
tabs = st.tabs([*SUMMARIES, "GPU time", "Phases", "NVTX → GPU"])
for tab, (title, (kind, what)) in zip(tabs, SUMMARIES.items(), strict=False):
    with tab:
        table(ask("summary", kind, **window), kind, what, "name", "total_ns", f"{title}: total time")
with tabs[4]:
    min_gap_ns = st.select_slider("Idle gaps longer than", GAP_CHOICES, value=1_000_000, format_func=units.duration)
    min_gap = units.duration(min_gap_ns)
    over, steps = OVER_WINDOW, step_window(scope.view.run) if scope.view.run else None
    if steps is not None:  # as AMD TraceLens measures it: over the steps on the GPU
        over = st.radio("Busy % over", [OVER_WINDOW, steps.label()], horizontal=True, key="gpu-time-over")
    measured = window if over == OVER_WINDOW or steps is None else {**window, "start": steps.start_ns,
                                                                      "end": steps.end_ns}  # fmt: skip
    origin = int(measured["start"])
    answer = ask("gpu_time", min_gap_ns=min_gap_ns, max_gaps=GAPS_ASKED, **measured)
    gpus = answer["gpus"]
    if not gpus.empty:
        gpus = gpus.assign(gpu_name=gpus["host"] + " GPU " + gpus["gpu"].astype(str))
    span = f"{scope.when(origin)} → {scope.when(int(measured['end']))}"
    st.caption(f"Busy % over {over}: {span}. " + origin_caption(origin, scope.relative, scope.origin_ns))
    table(gpus, "gpu_time", "GPU work", "gpu_name", "busy_pct", "busy share per GPU", origin_ns=origin)
    gaps = answer["gaps"]  # the longest first, over every GPU
    st.subheader("Idle gaps, longest first")
    if not gaps.empty and int(gaps.groupby(["host", "gpu"]).size().max()) >= GAPS_ASKED:
        st.caption(f"A GPU has {GAPS_ASKED:,} gaps or more: listed are its {GAPS_ASKED:,} longest.")
    table(gaps, "idle_gaps", f"idle gaps longer than {min_gap}", origin_ns=origin, top=GAPS_SHOWN)
with tabs[5]:
    phases = ask("phases", **window)
    if not phases.empty:
        phases = phases.assign(phase=phases["name"] + " · GPU " + phases["gpu"].astype(str))
    table(phases, "phases", "NVTX ranges or phases", "phase", "busy_pct", "GPU busy share inside each phase")
with tabs[6]:
    projected = ask("nvtx_gpu", **window)["summary"]
    table(projected, "nvtx_gpu", "NVTX ranges", "name", "gpu_total_ns", "GPU time of the work launched inside")
