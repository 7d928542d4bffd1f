"""The explorer's pure parts: the view in the URL, window moves, and lane labels."""

from __future__ import annotations

import pandas as pd
import pytest

from ui.figures import _ordered_labels
from ui.view import LAST_NS, MIN_WIDTH_NS, RunBounds, View, ViewError, inside, pan, selected, zoom

NOW = 1_800_000_000_000_000_000
S = 1_000_000_000


def test_a_view_survives_the_url() -> None:
    for view in (
        View(),
        View(run="r1", start="now-5m", host="node-1", metrics=()),
        View(last="1h", metrics=("a", "b")),
    ):
        assert View.from_params(view.params()) == view
    assert View().params() == {}, "the defaults leave the URL clean"


def test_the_window_comes_from_typed_times_then_a_preset_then_the_run() -> None:
    run = RunBounds(NOW - 100 * S, NOW - 10 * S)
    assert View(start=str(NOW - 50 * S), end=str(NOW - 40 * S)).window(NOW, run) == (NOW - 50 * S, NOW - 40 * S)
    assert View(start="now-30s").window(NOW, run) == (NOW - 30 * S, NOW - 10 * S), "the run's end closes it"
    assert View(start="now-30s").window(NOW, None) == (NOW - 30 * S, NOW)
    assert View(last="5m").window(NOW, run) == (NOW - 300 * S, NOW)
    assert View(run="r").window(NOW, run) == (NOW - 100 * S, NOW - 10 * S)
    assert View(run="r").window(NOW, RunBounds(NOW - 100 * S, None)) == (NOW - 100 * S, NOW), "an open run: to now"
    assert View().window(NOW, None) == (NOW - 900 * S, NOW)


@pytest.mark.parametrize(
    ("view", "field"),
    [
        (View(start="yesterday"), "from"),
        (View(last="forever"), "last"),
        (View(start="now", end="now-1m"), "window"),
        (View(end="3000-01-01T00:00:00Z"), "to"),
        (View(start="99999999999999999999"), "from"),
        (View(start="1969-12-31T23:00:00Z"), "from"),
    ],
)
def test_a_window_that_does_not_parse_names_its_field(view: View, field: str) -> None:
    with pytest.raises(ViewError, match=field):
        view.window(NOW, None)


def test_moves_keep_the_window_inside_what_a_store_holds() -> None:
    assert zoom(10 * S, 20 * S, 2.0) == (5 * S, 25 * S)
    assert zoom(0, 10 * S, 2.0) == (0, 20 * S), "a relative-time run starts at 0: zooming out stays there"
    assert pan(0, 10 * S, -0.5) == (0, 10 * S)
    assert pan(LAST_NS - 10 * S, LAST_NS, 0.5) == (LAST_NS - 10 * S, LAST_NS)
    assert pan(10 * S, 20 * S, 0.5) == (15 * S, 25 * S)
    assert inside(5 * S, 5 * S) == (5 * S - MIN_WIDTH_NS // 2, 5 * S + MIN_WIDTH_NS // 2), "a microsecond at least"


def test_a_selection_becomes_a_window() -> None:
    assert selected(NOW, 2.5, 1.25) == (NOW + 1_250_000_000, NOW + 2_500_000_000)
    assert selected(NOW, 1.0, 1.0) == inside(NOW + S, NOW + S), "a click is not an empty window"


def test_every_lane_has_a_row_of_its_own() -> None:
    keys = pd.DataFrame(
        [
            ("gpu", "h", 0, 7, 0, 0, 0),
            ("sync", "h", 0, 7, 9, 9, 0),  # cudaStreamSynchronize
            ("sync", "h", 0, -1, 9, 9, 0),  # cudaDeviceSynchronize: same thread, no stream
            ("nvtx", "h", -1, -1, 9, 9, 1),
            ("nvtx", "h", -1, -1, 9, 9, 0),
            ("cuda_api", "h", -1, -1, 9, 9, 0),
        ],
        columns=["lane", "host", "gpu", "stream", "pid", "tid", "depth"],
    )
    order, labels = _ordered_labels(keys)
    assert len(set(order)) == len(order) == len(keys) and set(labels) == set(order)
    assert order[0] == "GPU 0 · stream 7" and order[1:3] == ["NVTX · pid 9 · tid 9", "NVTX · pid 9 · tid 9 · L1"]
