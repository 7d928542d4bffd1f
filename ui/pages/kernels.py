"""Where GPU time went in the window: nsys-stats-style summaries, busy and idle time per GPU
with the idle gaps, and per phase the GPU's busy share and telemetry."""

from __future__ import annotations

import streamlit as st

from tracehouse.timefmt import parse_duration
from ui.controls import window_sidebar, zoom_buttons
from ui.data import ask, stop_if_empty
from ui.tables import table

SUMMARIES = {  # tab: (summary, what it lists)
    "Kernels": ("kernels", "kernels"),
    "CUDA API": ("api", "CUDA API calls"),
    "Memory ops": ("memops", "memory operations"),
    "NVTX": ("nvtx", "NVTX ranges, phases and steps"),
}

st.title("Kernels & phases")
stop_if_empty()
scope = window_sidebar()
window = scope.window()
zoom_buttons(scope, "kernels")
tabs = st.tabs([*SUMMARIES, "GPU time", "Phases", "NVTX → GPU"])
for tab, (title, (kind, what)) in zip(tabs, SUMMARIES.items(), strict=False):
    with tab:
        table(ask("summary", kind, **window), kind, what, "name", "total_ns", f"{title}: total time (ns)")
with tabs[4]:
    min_gap = st.select_slider("Idle gaps longer than", ["10us", "100us", "1ms", "10ms", "100ms"], value="1ms")
    answer = ask("gpu_time", min_gap_ns=parse_duration(min_gap), **window)
    gpus = answer["gpus"]
    if not gpus.empty:
        gpus = gpus.assign(gpu_name=gpus["host"] + " GPU " + gpus["gpu"].astype(str))
    table(gpus, "gpu_time", "GPU work", "gpu_name", "busy_pct", "busy % per GPU")
    st.subheader("Idle gaps, longest first")
    table(answer["gaps"], "idle_gaps", f"idle gaps longer than {min_gap}")
with tabs[5]:
    phases = ask("phases", **window)
    if not phases.empty:
        phases = phases.assign(phase=phases["name"] + " · GPU " + phases["gpu"].astype(str))
    table(phases, "phases", "NVTX ranges or phases", "phase", "busy_pct", "GPU busy % inside each phase")
with tabs[6]:
    projected = ask("nvtx_gpu", **window)["summary"]
    table(projected, "nvtx_gpu", "NVTX ranges", "name", "gpu_total_ns", "GPU time of the work launched inside (ns)")
