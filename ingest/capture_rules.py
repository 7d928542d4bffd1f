"""Captures on a rule: `tracehouse serve --capture-rule FILE`. Each rule watches one NVML metric of
every GPU as its samples arrive; when the metric's mean over a sliding window falls below (or rises
above) a fixed value or a fraction of a baseline run's mean, the running training-API runs of that
GPU's host are asked for a capture of their next steps, at most once per run per `every`. A capture
a rule with a baseline asked for is compared with the baseline once imported: kernel time per step,
in all and per kernel, kept with the capture (`compared`).

```yaml
rules:
  - name: sm-drop                # names the requests it makes ("rule sm-drop")
    metric: gpu.sm_active_pct
    below: 0.8                   # with a baseline: a fraction of its mean; without: the metric's own unit
    baseline: resnet50-good      # a run's id or name: the metric's mean on its host during the run
    phase: forward               # the means inside that phase's (or NVTX range's) instances, here and in the baseline
    for: 30s                     # the window the mean is taken over (default 30s)
    steps: 20                    # steps to capture (default 10)
    every: 10m                   # at most one capture per run per this long (default 10m)
    runs: "resnet*"              # only runs so named (a glob; default every run)
```
"""

from __future__ import annotations

import bisect
import collections
import fnmatch
import json
import logging
import math
import queue
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import yaml

from ingest.captures import DEFAULT_STEPS, MAX_STEPS, CaptureRecord, Report
from tracehouse.regularfile import FileRefused, read_regular
from tracehouse.timefmt import now_ns, parse_duration
from tracehouse.units import duration

log = logging.getLogger("tracehouse.capture.rules")
RULE_KEYS = frozenset({"name", "metric", "below", "above", "baseline", "phase", "for", "steps", "every", "runs"})
MAX_RULES = 100
MAX_FILE_BYTES = 256 << 10  # a hundred rules with comments take tens of KiB; larger is refused unread
MAX_NUMBER_CHARS = 32  # a number written longer says nothing a rule needs (and int() of 5000 digits refuses)
QUEUED_BATCHES = 1000  # past this, samples wait for nobody: a rule misses them, the writes never wait
RETRY_NS = 10_000_000_000  # after asking a host's runs (or being refused), the rule looks at that host again after this
BASELINE_RETRY_NS = 60_000_000_000  # a baseline without samples is read again after this
PHASE_EVERY_NS = 2_000_000_000  # a rule with a phase reads a host's instances of it at most this often


def compared(kernels: Sequence[dict[str, Any]], baseline: str, steps_a: int, steps_b: int) -> dict[str, Any]:
    """Kernel time per step, A (the baseline run; per run where it has no steps) against B (the captured
    steps): in all and for the COMPARED_KERNELS kernels that changed most; and the sentence that says it."""
    per_a, per_b = max(1, steps_a), max(1, steps_b)
    rows = [
        {"name": k["name"], "per_step_ns_a": k["total_ns_a"] // per_a, "per_step_ns_b": k["total_ns_b"] // per_b}
        for k in kernels
    ]
    for row in rows:
        row["delta_ns"] = row["per_step_ns_b"] - row["per_step_ns_a"]
    rows.sort(key=lambda row: (-abs(row["delta_ns"]), row["name"]))
    total_a = sum(k["total_ns_a"] for k in kernels) // per_a
    total_b = sum(k["total_ns_b"] for k in kernels) // per_b
    per = "step" if steps_a else "run (the baseline has no steps)"
    if not total_b:
        summary = "no GPU kernels in the captured steps (a CPU profile): nothing to compare with the baseline"
    else:
        change = f" ({100 * (total_b - total_a) / total_a:+.1f} %)" if total_a else ""
        summary = (f"kernel time per step {duration(total_b)} against {duration(total_a)} per {per} of baseline "
                   f"{baseline!r}{change}; most changed: {rows[0]['name'][:120]} "
                   f"({'+' if rows[0]['delta_ns'] >= 0 else '-'}{duration(abs(rows[0]['delta_ns']))})")  # fmt: skip
    return {"summary": summary, "baseline": baseline, "steps_a": steps_a, "steps_b": steps_b,
            "total_ns_a": total_a, "total_ns_b": total_b, "kernels": rows[:COMPARED_KERNELS]}  # fmt: skip


class RuleError(ValueError):
    """A rule file that cannot be used; the message names the file, the rule and the key."""


@dataclass(frozen=True)
class _Unreadable:
    """A value the loader would not turn into a number; the rule that holds it is refused, naming its key."""

    reason: str


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """The safe loader, refusing a key repeated in one mapping and keeping overlong numbers as _Unreadable."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, Hashable) and key in seen:
                raise RuleError(f"line {line}: key {key!r} repeats (first on line {seen[key]}); give each key once")
            if isinstance(key, Hashable):
                seen[key] = line
        return super().construct_mapping(node, deep)

    def construct_number(self, node: yaml.ScalarNode) -> Any:
        if len(node.value) > MAX_NUMBER_CHARS:
            return _Unreadable(f"a number of {len(node.value)} characters; at most {MAX_NUMBER_CHARS}")
        if node.tag.endswith(":int"):
            return self.construct_yaml_int(node)
        return self.construct_yaml_float(node)


for _tag in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float"):
    _Loader.add_constructor(_tag, _Loader.construct_number)


@dataclass(frozen=True)
class Rule:
    name: str
    metric: str
    limit: float
    below: bool  # True: fires when the mean falls below the limit; False: above it
    baseline: str = ""
    phase: str = ""
    window_ns: int = 30_000_000_000
    steps: int = DEFAULT_STEPS
    every_ns: int = 600_000_000_000
    runs: str = ""

    def describe(self, threshold: float, base: float | None) -> str:
        side = "below" if self.below else "above"
        if base is None:
            return f"{side} {threshold:.4g}"
        where = f" in phase {self.phase!r}" if self.phase else ""
        return f"{side} {threshold:.4g} ({self.limit:g} times {base:.4g}, run {self.baseline!r}{where})"


def load_rules(path: Path) -> list[Rule]:
    """The rules of a file named by --capture-rule: a regular file of at most MAX_FILE_BYTES (a FIFO or a
    device is refused before anything blocks or is read)."""
    try:
        text = read_regular(path, MAX_FILE_BYTES).decode()
    except FileRefused as refused:
        raise RuleError(f"--capture-rule {refused}") from None
    except UnicodeDecodeError:
        raise RuleError(f"--capture-rule {path}: not UTF-8 text") from None
    return parse_rules(text, f"--capture-rule {path}")


def parse_rules(text: str, where: str) -> list[Rule]:
    if len(text) > MAX_FILE_BYTES:
        raise RuleError(f"{where}: {len(text):,} characters; a rule file holds at most {MAX_FILE_BYTES:,} bytes")
    try:
        if any(isinstance(event, yaml.AliasEvent) for event in yaml.parse(text, Loader=_Loader)):
            raise RuleError(f"{where}: aliases (*name) are not supported")
        document = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as error:
        raise RuleError(f"{where}: not YAML: {' '.join(str(error).split())}") from None
    except RuleError as error:
        raise RuleError(f"{where}: {error}") from None
    except RecursionError:
        raise RuleError(f"{where}: nested too deeply for a rule file") from None
    if not isinstance(document, dict) or set(document) != {"rules"} or not isinstance(document["rules"], list):
        raise RuleError(f"{where}: expected a mapping with one key, 'rules', holding a list of rules")
    entries = document["rules"]
    if not entries or len(entries) > MAX_RULES:
        raise RuleError(f"{where}: 'rules' holds {len(entries)} rules; 1 to {MAX_RULES}")
    rules = [_rule(entry, f"{where}: rule {i + 1}") for i, entry in enumerate(entries)]
    names = [rule.name for rule in rules]
    if len(set(names)) != len(names):
        raise RuleError(f"{where}: rule names repeat: {sorted({n for n in names if names.count(n) > 1})}")
    return rules


def _rule(entry: Any, where: str) -> Rule:
    if not isinstance(entry, dict):
        raise RuleError(f"{where}: a rule is a mapping of {', '.join(sorted(RULE_KEYS))}")
    unknown = sorted(str(key) for key in entry if key not in RULE_KEYS)
    if unknown:
        raise RuleError(f"{where}: unknown key {unknown[0]!r}; the keys are {', '.join(sorted(RULE_KEYS))}")
    named = f" ({entry['name']})" if isinstance(entry.get("name"), str) and len(entry["name"]) <= 256 else ""
    for key, value in entry.items():
        if isinstance(value, _Unreadable):
            raise RuleError(f"{where}{named}: {key!r}: {value.reason}")
    for key in ("name", "metric"):
        if not isinstance(entry.get(key), str) or not entry[key].strip() or len(entry[key]) > 256:
            raise RuleError(f"{where}: {key!r} is required: 1 to 256 characters of text")
    where = f"{where} ({entry['name']})"
    if ("below" in entry) == ("above" in entry):
        raise RuleError(f"{where}: give one of 'below' and 'above'")
    side = "below" if "below" in entry else "above"
    limit = entry[side]
    if isinstance(limit, bool) or not isinstance(limit, int | float) or not math.isfinite(limit):
        raise RuleError(f"{where}: {side!r} must be a number (a finite one)")
    texts = {key: entry.get(key, "") for key in ("baseline", "phase", "runs")}
    for key, value in texts.items():
        if not isinstance(value, str) or len(value) > 256:
            raise RuleError(f"{where}: {key!r} must be text of at most 256 characters")
    if texts["phase"] and not texts["baseline"]:
        raise RuleError(f"{where}: 'phase' needs a 'baseline': the means inside a phase are compared with the "
                        "baseline run's inside it")  # fmt: skip
    durations = {}
    for key, default in (("for", "30s"), ("every", "10m")):
        try:
            durations[key] = parse_duration(str(entry.get(key, default)))
        except ValueError as error:
            raise RuleError(f"{where}: {key!r}: {error}") from None
        if durations[key] <= 0:
            raise RuleError(f"{where}: {key!r} must be longer than 0")
    steps = entry.get("steps", DEFAULT_STEPS)
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise RuleError(f"{where}: 'steps' must be a whole number from 1 to {MAX_STEPS}")
    return Rule(
        entry["name"], entry["metric"], float(limit), below=side == "below", baseline=texts["baseline"],
        phase=texts["phase"], window_ns=durations["for"], steps=steps, every_ns=durations["every"], runs=texts["runs"],
    )  # fmt: skip


class _Window:
    """One GPU's samples of one metric over the last `span` ns, and their sum."""

    def __init__(self, span: int) -> None:
        self.span = span
        self.values: collections.deque[tuple[int, float]] = collections.deque()
        self.total = 0.0

    def add(self, ts: int, value: float) -> None:
        if self.values and ts <= self.values[-1][0]:
            return  # late or repeated (a replayed spool): the window moves forward only
        self.values.append((ts, value))
        self.total += value
        while self.values[0][0] <= ts - self.span:
            self.total -= self.values.popleft()[1]

    def mean_if_full(self) -> float | None:
        """The mean once the samples cover the window (their first within a tenth of its start)."""
        if len(self.values) < 2 or self.values[-1][0] - self.values[0][0] < self.span * 9 // 10:
            return None
        return self.total / len(self.values)


Ask = Callable[[str, int, str, str], None]  # (run_id, steps, reason, requested_by): a capture request
Keep = Callable[[CaptureRecord, str, str], None]  # (request, session, comparison JSON): kept with the capture
COMPARED_KERNELS = 20


class RuleEngine:
    """Watches the samples that writes store (`observe`, on the write's thread: a filter and a queue
    put) and, on a thread of its own, keeps the windows and asks for captures (`ask`)."""

    def __init__(self, store: Any, rules: Sequence[Rule], ask: Ask, keep: Keep | None = None) -> None:
        self.store = store
        self.rules = list(rules)
        self.ask = ask
        self.keep = keep
        self.metrics = pa.array(sorted({rule.metric for rule in self.rules}), pa.string())
        self._queue: queue.Queue[pa.Table | tuple[CaptureRecord, Report] | None] = queue.Queue(QUEUED_BATCHES)
        self._windows: dict[tuple[str, str, int], _Window] = {}
        self._baselines: dict[str, tuple[float | None, int]] = {}  # the mean, and when it was read
        self._asked: dict[tuple[str, str], int] = {}  # (rule, run): when this rule last asked
        self._tried: dict[tuple[str, str], int] = {}  # (rule, host): when this rule last asked its runs
        self._phase_read: dict[tuple[str, str, int], int] = {}  # (rule, host, gpu): when its phases were last read
        self._thread = threading.Thread(target=self._work, name="capture-rules", daemon=True)
        self.fired = 0

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(5)

    def observe(self, samples: pa.Table) -> None:
        wanted = samples.filter(pc.is_in(samples.column("metric").cast(pa.string()), value_set=self.metrics))
        if wanted.num_rows:
            try:
                self._queue.put_nowait(wanted.select(["host", "gpu", "metric", "ts", "value"]))
            except queue.Full:
                log.warning("capture rules are behind: %d samples not looked at", wanted.num_rows)

    def imported(self, request: CaptureRecord, report: Report) -> None:
        """A process imported its profile: a rule's capture with a baseline is compared with it (later)."""
        rule = self._rule_of(request)
        if rule is not None and rule.baseline and self.keep is not None:
            self._queue.put((request, report))

    def _rule_of(self, request: CaptureRecord) -> Rule | None:
        name = request.requested_by.removeprefix("rule ")
        return next((r for r in self.rules if request.requested_by.startswith("rule ") and r.name == name), None)

    def drain(self) -> None:
        """Wait until what was observed so far has been looked at (for tests)."""
        self._queue.join()

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                if isinstance(item, tuple):
                    self._compare(*item)
                else:
                    self._look(item)
            except Exception:
                log.exception("capture rules: %s", "no comparison made" if isinstance(item, tuple) else
                              "samples not looked at")  # fmt: skip
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def _look(self, samples: pa.Table) -> None:
        columns = [samples.column(name).to_pylist() for name in ("host", "gpu", "metric")]
        times = samples.column("ts").cast(pa.int64()).to_pylist()
        values = samples.column("value").to_pylist()
        touched: set[tuple[str, str, int]] = set()
        now = now_ns()
        for rule in self.rules:
            recent = now - 2 * rule.window_ns  # an import's or a replayed spool's old samples say nothing of now
            for host, gpu, metric, ts, value in zip(*columns, times, values, strict=True):
                if metric == rule.metric and ts >= recent:
                    key = (rule.name, host, gpu)
                    window = self._windows.get(key)
                    if window is None:
                        window = self._windows[key] = _Window(rule.window_ns)
                    window.add(ts, value)
                    touched.add(key)
        for rule in self.rules:
            for _, host, gpu in sorted(k for k in touched if k[0] == rule.name):
                self._check(rule, host, gpu)

    def _check(self, rule: Rule, host: str, gpu: int) -> None:
        window = self._windows[(rule.name, host, gpu)]
        mean = window.mean_if_full()
        if mean is not None and rule.phase:
            mean = self._mean_in_phase(rule, host, gpu, window)
        if mean is None:
            return
        base = self._baseline(rule) if rule.baseline else None
        if rule.baseline and base is None:
            return
        threshold = rule.limit * base if base is not None else rule.limit
        if (mean >= threshold) if rule.below else (mean <= threshold):
            return
        now = now_ns()
        if now - self._tried.get((rule.name, host), -RETRY_NS) < RETRY_NS:
            return
        self._tried[(rule.name, host)] = now
        seconds = rule.window_ns / 1e9
        inside = f" inside phase {rule.phase!r}" if rule.phase else ""
        reason = (f"rule {rule.name}: {rule.metric} averaged {mean:.4g}{inside} over {seconds:g} s on {host} "
                  f"GPU {gpu}, {rule.describe(threshold, base)}")  # fmt: skip
        for run_id, name in self._running(host):
            if rule.runs and not fnmatch.fnmatchcase(name, rule.runs):
                continue
            if now - self._asked.get((rule.name, run_id), -rule.every_ns) < rule.every_ns:
                continue
            try:
                self.ask(run_id, rule.steps, reason, f"rule {rule.name}")
            except Exception as refused:  # a capture under way, the run just ended: the next window tries again
                log.info("capture rule %s: run %s not asked: %s", rule.name, run_id, refused)
                continue
            self._asked[(rule.name, run_id)] = now
            self.fired += 1
            log.info("capture rule %s asked run %s for %d steps: %s", rule.name, run_id, rule.steps, reason)

    def _compare(self, request: CaptureRecord, report: Report) -> None:
        """Kernel time per step of the captured steps (this process's GPU work since the request) against
        the baseline run's (per step where it has steps), each kernel's and in all; kept with the capture."""
        rule = self._rule_of(request)
        if rule is None or self.keep is None:
            return
        pid = int(report.session.rsplit(".", 1)[1])
        captured = max(1, report.last_step - report.first_step + 1)
        sql = (
            "SELECT name, sumIf(d, side = 'a') AS total_ns_a, sumIf(d, side = 'b') AS total_ns_b FROM ("
            "SELECT 'a' AS side, name, toUnixTimestamp64Nano(end) - toUnixTimestamp64Nano(start) AS d FROM {db}.events "
            "WHERE run_id = {baseline:String} AND kind = 'kernel' UNION ALL "
            "SELECT 'b', name, toUnixTimestamp64Nano(end) - toUnixTimestamp64Nano(start) FROM {db}.events "
            "WHERE run_id = {run:String} AND kind = 'kernel' AND pid = {pid:UInt32} "
            "AND start >= fromUnixTimestamp64Nano({since:Int64}) AND start < fromUnixTimestamp64Nano({until:Int64})"
            ") GROUP BY name"
        )
        found = self._baseline_run(rule)
        if found is None:
            return
        baseline = str(found["run_id"])
        parameters = {"baseline": baseline, "run": request.run_id, "pid": pid, "since": request.requested_ns,
                      "until": report.at_ns}  # fmt: skip
        kernels = self.store.query(sql, parameters).to_pylist()
        steps_a = (
            self.store.query(
                "SELECT count() AS n FROM {db}.events WHERE run_id = {baseline:String} AND kind = 'step'", parameters
            )
            .column("n")[0]
            .as_py()
        )
        self.keep(request, report.session, json.dumps(compared(kernels, baseline, int(steps_a), captured)))

    def _baseline_run(self, rule: Rule) -> dict[str, Any] | None:
        """The rule's baseline run (an id, or a name: its latest ended run): run_id, host, start, end."""
        rows = self.store.query(
            "SELECT run_id, host, start, coalesce(end, now64(9)) AS end FROM {db}.runs FINAL "
            "WHERE run_id = {run:String} OR name = {run:String} "
            "ORDER BY run_id = {run:String} DESC, end IS NULL, start DESC LIMIT 1",
            {"run": rule.baseline},
        ).to_pylist()
        return rows[0] if rows else None

    def _mean_in_phase(self, rule: Rule, host: str, gpu: int, window: _Window) -> float | None:
        """The window's mean over the samples inside the host's instances of the rule's phase (phases of the
        training API, or NVTX ranges so named) that ended by now; None without any. Read at most every
        PHASE_EVERY_NS per host and rule."""
        now = now_ns()
        key = (rule.name, host, gpu)
        if now - self._phase_read.get(key, -PHASE_EVERY_NS) < PHASE_EVERY_NS:
            return None
        self._phase_read[key] = now
        first, last = window.values[0][0], window.values[-1][0]
        spans = self.store.query(
            "SELECT toUnixTimestamp64Nano(start) AS s, toUnixTimestamp64Nano(end) AS e FROM {db}.events "
            "WHERE host = {host:String} AND kind IN ('phase', 'nvtx') AND name = {phase:String} "
            "AND start <= fromUnixTimestamp64Nano({last:Int64}) AND end > fromUnixTimestamp64Nano({first:Int64}) "
            "ORDER BY s LIMIT 100000",
            {"host": host, "phase": rule.phase, "first": first, "last": last},
        ).to_pylist()
        merged: list[list[int]] = []  # the instances' union: threads' instances may overlap
        for span in spans:
            if merged and span["s"] <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], span["e"])
            else:
                merged.append([span["s"], span["e"]])
        starts = [start for start, _ in merged]
        inside = [v for ts, v in window.values if (i := bisect.bisect_right(starts, ts) - 1) >= 0 and ts < merged[i][1]]
        return sum(inside) / len(inside) if inside else None

    def _running(self, host: str) -> list[tuple[str, str]]:
        rows = self.store.query(
            "SELECT run_id, name FROM {db}.runs FINAL WHERE host = {host:String} AND source = 'user' "
            "AND end IS NULL AND NOT importing ORDER BY run_id",
            {"host": host},
        ).to_pylist()
        return [(row["run_id"], row["name"]) for row in rows]

    def _baseline(self, rule: Rule) -> float | None:
        """The baseline run's mean of the metric on its host during the run (or inside its instances of
        the phase), read once; None (said once) when it has none."""
        key = f"{rule.baseline}\0{rule.metric}\0{rule.phase}"
        mean, read = self._baselines.get(key, (None, -BASELINE_RETRY_NS))
        now = now_ns()
        if mean is None and now - read >= BASELINE_RETRY_NS:
            mean = self._baseline_mean(rule)
            self._baselines[key] = (mean, now)
            if mean is None:
                log.warning("capture rule %s: run %r has no %s samples%s: the rule waits (reads it again in a minute)",
                            rule.name, rule.baseline, rule.metric,
                            f" inside phase {rule.phase!r}" if rule.phase else "")  # fmt: skip
        return mean

    def _baseline_mean(self, rule: Rule) -> float | None:
        run = self._baseline_run(rule)
        if run is None:
            return None
        samples = (
            "SELECT host, ts, value FROM {db}.samples WHERE host = {host:String} AND metric = {metric:String} "
            "AND ts >= {start:DateTime64(9)} AND ts < {end:DateTime64(9)}"
        )
        parameters = {"host": run["host"], "metric": rule.metric, "start": run["start"], "end": run["end"],
                      "run": run["run_id"], "phase": rule.phase}  # fmt: skip
        if rule.phase:
            sql = (
                f"SELECT avg(s.value) AS mean FROM ({samples}) AS s ASOF JOIN (SELECT host, start, end FROM "
                "{db}.events WHERE run_id = {run:String} AND kind IN ('phase', 'nvtx') AND name = {phase:String}) "
                "AS r ON s.host = r.host AND s.ts >= r.start WHERE s.ts < r.end"
            )
        else:
            sql = f"SELECT avg(value) AS mean FROM ({samples})"
        mean = self.store.query(sql, parameters).column("mean")[0].as_py()
        return None if mean is None or mean != mean else float(mean)
