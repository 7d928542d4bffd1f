"""The experiment model of a matrix, shared by its YAML and CSV readers: RunSpec (one run to start), the
settings given at each level and how they are inherited, typed and checked fields, and the expansion of
experiments into slots of RunSpecs, their templates filled with the parameters of each combination.

Errors are raised as `_Bad` with the line they belong to; agent.runs.matrix names the file.
"""

from __future__ import annotations

import itertools
import math
import re
import shlex
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple, TypeVar

from tracehouse.model import DEFAULT_LIMITS

MAX_RUNS = 10_000  # RunSpecs in one matrix, all slots together
MAX_REPEAT = 1000
MAX_GPU = DEFAULT_LIMITS.max_gpu_index
MAX_KEY_BYTES = DEFAULT_LIMITS.max_name_bytes  # a tag or env name
MAX_VALUE_BYTES = DEFAULT_LIMITS.max_string_bytes  # a tag or env value

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_T = TypeVar("_T")


@dataclass(frozen=True)
class RunSpec:
    name: str  # after templating
    command: tuple[str, ...]  # argv
    experiment: str  # the experiment's name as written (CSV: the row's name, or its group)
    params: Mapping[str, str]  # this combination
    repetition: int  # 1..repeat
    tags: Mapping[str, str]  # defaults' | experiment's | member's, then params, then "repetition"
    env: Mapping[str, str]
    gpus: tuple[int, ...] | None  # None: not given
    nsys: bool
    nsys_args: tuple[str, ...]
    timeout: float | None  # seconds
    line: int  # of the experiment, collocated member or CSV row it came from


class _Bad(Exception):  # not a ValueError: converters' ValueErrors are caught and given a line
    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line


class _Text(NamedTuple):
    template: str
    line: int


_Fields = dict[str, tuple[object, int]]  # key -> (value, line of the key)


@dataclass(frozen=True)
class _Layer:
    """Settings given at one level (defaults, experiment, member); None or empty: not given there."""

    repeat: int | None = None
    gpus: tuple[int, ...] | None = None
    nsys: bool | None = None
    nsys_args: tuple[str, ...] | None = None
    timeout: float | None = None
    tags: Mapping[str, _Text] = field(default_factory=dict)
    env: Mapping[str, _Text] = field(default_factory=dict)

    def merge(self, top: _Layer) -> _Layer:
        """These settings, with `top`'s where it gives them."""

        def pick(mine: _T | None, theirs: _T | None) -> _T | None:
            return theirs if theirs is not None else mine

        return _Layer(
            repeat=pick(self.repeat, top.repeat),
            gpus=pick(self.gpus, top.gpus),
            nsys=pick(self.nsys, top.nsys),
            nsys_args=pick(self.nsys_args, top.nsys_args),
            timeout=pick(self.timeout, top.timeout),
            tags={**self.tags, **top.tags},
            env={**self.env, **top.env},
        )


@dataclass(frozen=True)
class _Job:
    name: _Text
    command: str | tuple[str, ...]
    command_line: int
    layer: _Layer
    params: Mapping[str, str]  # its own (CSV group rows), over the experiment's combination
    line: int


@dataclass(frozen=True)
class _Experiment:
    name: str
    params: Mapping[str, tuple[str, ...]]
    repeat: int
    jobs: tuple[_Job, ...]
    line: int

    @property
    def runs(self) -> int:
        return math.prod(map(len, self.params.values())) * self.repeat * len(self.jobs)


def _experiment(fields: _Fields, members: list[tuple[_Fields, int]] | None, defaults: _Layer, line: int) -> _Experiment:
    if ("command" in fields) == (members is not None):
        raise _Bad(line, "an experiment needs exactly one of 'command' and 'collocated'")
    layer = defaults.merge(_layer(fields))
    jobs = (
        [_job(fields, layer, line)] if members is None else [_job(m, layer.merge(_layer(m)), at) for m, at in members]
    )
    name = _required(fields, "name", _text, line)
    return _Experiment(name, _get(fields, "params", _params) or {}, layer.repeat or 1, tuple(jobs), line)


def _job(fields: _Fields, layer: _Layer, line: int, params: Mapping[str, str] | None = None) -> _Job:
    name = _Text(_required(fields, "name", _text, line), fields["name"][1])
    command = _required(fields, "command", _command, line)
    return _Job(name, command, fields["command"][1], layer, params or {}, line)


def _layer(fields: _Fields) -> _Layer:
    def texts(key: str) -> dict[str, _Text]:
        return {name: _Text(value, fields[key][1]) for name, value in (_get(fields, key, _strings) or {}).items()}

    return _Layer(
        repeat=_get(fields, "repeat", _repeat),
        gpus=_get(fields, "gpus", _gpus),
        nsys=_get(fields, "nsys", _flag),
        nsys_args=_get(fields, "nsys_args", _argv),
        timeout=_get(fields, "timeout", _seconds),
        tags=texts("tags"),
        env=texts("env"),
    )


def _get(fields: _Fields, key: str, convert: Callable[[object, str], _T]) -> _T | None:
    if key not in fields:
        return None
    value, line = fields[key]
    try:
        return convert(value, key)
    except ValueError as e:
        raise _Bad(line, str(e)) from None


def _required(fields: _Fields, key: str, convert: Callable[[object, str], _T], line: int) -> _T:
    value = _get(fields, key, convert)
    if value is None:
        raise _Bad(line, f"missing required {key!r}")
    return value


def _text(value: object, what: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise ValueError(f"{what} must be text or a number, not {type(value).__name__}")


def _whole(value: object, what: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        return int(value)
    raise ValueError(f"{what} must be a whole number, got {value!r}")


def _repeat(value: object, what: str) -> int:
    n = _whole(value, what)
    if not 1 <= n <= MAX_REPEAT:
        raise ValueError(f"{what} must be from 1 to {MAX_REPEAT}, got {n}")
    return n


def _gpus(value: object, what: str) -> tuple[int, ...]:
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, list) else [value]
    gpus = tuple(_whole(item, f"{what} (GPU indices like 0, '0,1' or [0, 1])") for item in items)
    if not gpus or any(not 0 <= gpu <= MAX_GPU for gpu in gpus) or len(set(gpus)) < len(gpus):
        raise ValueError(f"{what} must be distinct GPU indices from 0 to {MAX_GPU}, got {value!r}")
    return gpus


def _flag(value: object, what: str) -> bool:
    words = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
    if isinstance(value, bool):
        return value
    if isinstance(value, str | int) and str(value).strip().lower() in words:
        return words[str(value).strip().lower()]
    raise ValueError(f"{what} must be true or false, got {value!r}")


def _seconds(value: object, what: str) -> float:
    try:
        seconds = float(value) if isinstance(value, str | int | float) and not isinstance(value, bool) else -1.0
    except ValueError:
        seconds = -1.0
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{what} must be a positive number of seconds, got {value!r}")
    return seconds


def _argv(value: object, what: str) -> tuple[str, ...]:
    if isinstance(value, list):
        return tuple(_text(item, f"each item of {what}") for item in value)
    return _split(_text(value, what), what)


def _split(command: str, what: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(command))
    except ValueError as e:
        raise ValueError(f"{what} {command!r} cannot be split into arguments: {e}") from None


def _command(value: object, what: str) -> str | tuple[str, ...]:
    command: str | tuple[str, ...] = _argv(value, what) if isinstance(value, list) else _text(value, what)
    if not command or (isinstance(command, str) and not command.strip()):
        raise ValueError(f"{what} is empty")
    return command


def _strings(value: object, what: str) -> dict[str, str]:
    """tags or env: text names (env: variable names) to single values."""
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be a mapping of names to values")
    for name in value:
        if not name or len(name.encode()) > MAX_KEY_BYTES or (what == "env" and not _NAME.fullmatch(name)):
            kind = "a variable name (letters, digits and _, not first a digit)" if what == "env" else "a name"
            raise ValueError(f"{what}: {name[:40]!r} must be {kind} of 1 to {MAX_KEY_BYTES} bytes")
    return {name: _text(item, f"{what}[{name!r}]") for name, item in value.items()}


def _params(value: object, what: str) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be a mapping of names to a value or a list of values")
    params = {}
    for name, item in value.items():
        if not _NAME.fullmatch(name) or len(name) > MAX_KEY_BYTES:
            raise ValueError(f"parameter name {name[:40]!r} must be letters, digits and _, not first a digit")
        values = tuple(_text(v, f"{what}[{name!r}]") for v in (item if isinstance(item, list) else [item]))
        if not values or any(len(v.encode()) > MAX_VALUE_BYTES for v in values):
            raise ValueError(f"{what}[{name!r}] must be a value or a non-empty list of values of at most 64 KiB")
        params[name] = values
    return params


def _expand(experiments: list[_Experiment]) -> tuple[tuple[RunSpec, ...], ...]:
    total = 0
    for experiment in experiments:
        total += experiment.runs
        if total > MAX_RUNS:
            raise _Bad(experiment.line, f"the matrix expands to more than {MAX_RUNS} runs")
    slots = []
    for experiment in experiments:
        names = list(experiment.params)
        for values in itertools.product(*experiment.params.values()):
            combination = dict(zip(names, values, strict=True))
            for repetition in range(1, experiment.repeat + 1):
                slots.append(tuple(_render(job, experiment, combination, repetition) for job in experiment.jobs))
    return tuple(slots)


def _render(job: _Job, experiment: _Experiment, combination: Mapping[str, str], repetition: int) -> RunSpec:
    params = {**combination, **job.params}
    name = _fill(job.name, params)
    if not name.strip():
        raise _Bad(job.name.line, f"name {job.name.template!r} is empty after templating")
    at = job.command_line
    if isinstance(job.command, str):
        try:
            command = _split(_fill(_Text(job.command, at), params), "command")
        except ValueError as e:
            raise _Bad(at, str(e)) from None
    else:
        command = tuple(_fill(_Text(arg, at), params) for arg in job.command)
    if not command or not command[0]:
        raise _Bad(at, "command is empty after templating")
    layer = job.layer
    tags = {key: _checked(_fill(text, params), text.line) for key, text in layer.tags.items()}
    env = {key: _checked(_fill(text, params), text.line) for key, text in layer.env.items()}
    return RunSpec(
        name=name,
        command=tuple(_checked(arg, at) for arg in command),
        experiment=experiment.name,
        params=MappingProxyType(params),
        repetition=repetition,
        tags=MappingProxyType({**tags, **params, "repetition": str(repetition)}),
        env=MappingProxyType(env),
        gpus=layer.gpus,
        nsys=bool(layer.nsys),
        nsys_args=layer.nsys_args or (),
        timeout=layer.timeout,
        line=job.line,
    )


def _fill(text: _Text, params: Mapping[str, str]) -> str:
    """str.format_map over the parameters only: no attribute or index lookups; {{ and }} are literal braces."""
    try:
        for _, name, _, _ in string.Formatter().parse(text.template):
            if name is not None and name not in params:
                known = ", ".join(params) or "none"
                raise _Bad(text.line, f"{text.template!r} names unknown parameter {{{name}}} (parameters: {known})")
        return text.template.format_map(params)
    except (ValueError, KeyError, IndexError) as e:
        raise _Bad(text.line, f"bad template {text.template!r}: {e}") from None


def _checked(value: str, line: int) -> str:
    """An argument, tag or env value: exec refuses NUL, and nothing needs more than 64 KiB."""
    if "\0" in value or len(value.encode()) > MAX_VALUE_BYTES:
        raise _Bad(line, f"{value[:40]!r}...: a NUL character or longer than {MAX_VALUE_BYTES} bytes")
    return value
