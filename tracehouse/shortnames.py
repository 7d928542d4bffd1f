"""Short labels for long kernel and function names that never merge two distinct names.

A demangled C++ name is shown the way Nsight Systems' short names read, without the return type, with the
parameter list elided as `(…)` and each template argument cut to its own head:
`void clover::par_ranged2d_kernel<PdV_kernel(bool, …)::[lambda(int, int) (instance 1)]>(clover::Range2d, T1)`
becomes `clover::par_ranged2d_kernel<PdV_kernel(…)::[…]>(…)`. Where several names read the same, only the bracketed
parts in which they differ are opened, one level at a time. What is still too wide loses its namespace qualifiers
(unless they are what tells it apart), then is cut after its head, keeping the stretch where it differs from the
others; a numbered suffix settles whatever is left. Other names (NVTX ranges, CUDA API calls) that fit stay as
they are. Pure, and bounded in time on untrusted names of any size.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_WIDTH = 60
MIN_WIDTH = 8  # room for a label and its `#N`; narrower widths count as this
_MAX_ROUNDS = 24  # bracket levels opened to tell names apart before falling back to the full names
_MAX_TOKENS = 20_000  # brackets and spaces read in one name; past that it is treated as plain text
_CLOSERS = {"(": ")", "<": ">", "[": "]", "{": "}"}
_TOKENS = re.compile(r"\(anonymous namespace\)|(?<!\w)operator *(?:\(\)|\[\]|[-<>=!+*/%^&|~,]{1,3})|[ ()<>\[\]{}]")
_HEAD = re.compile(r"[^<(\[{]*(?:<[\w:~]*)?")
_QUALIFIERS = re.compile(r"(?<![\w:])(?:(?:[^\W\d]\w*|\(anonymous namespace\))::)+(?=[^\W\d~])")


@dataclass(frozen=True)
class _Parsed:
    text: str
    starts: list[int]  # each bracket group's opening index, in order of position (a parent before its children)
    ends: list[int]  # its closing index; len(text) when it is never closed
    parents: list[int]  # the enclosing group, -1 at the top level
    body: int  # where the name begins once a return type is dropped
    structured: bool  # looks like a C++ function or template; anything else is plain text


def middle_ellipsis(text: str, width: int = DEFAULT_WIDTH) -> str:
    if len(text) <= width:
        return text
    if width < 2:
        return "…"[:width]
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head) :]


def _parse(text: str) -> _Parsed:
    starts: list[int] = []
    ends: list[int] = []
    parents: list[int] = []
    stack: list[int] = []
    params = last_space = -1
    for count, match in enumerate(_TOKENS.finditer(text)):
        if count == _MAX_TOKENS:
            return _Parsed(text, [], [], [], 0, False)
        c, i = match.group(), match.start()
        if len(c) > 1:  # `(anonymous namespace)`, `operator()`, `operator<`: plain text
            continue
        if c == " ":
            last_space = last_space if stack or params >= 0 else i
        elif c in _CLOSERS:
            if not stack and c == "(" and params < 0 and i and (text[i - 1].isalnum() or text[i - 1] in "_>)"):
                params = i
            parents.append(stack[-1] if stack else -1)
            starts.append(i)
            ends.append(len(text))
            stack.append(len(starts) - 1)
        elif stack and c == _CLOSERS[text[starts[stack[-1]]]] and text[i - 1 : i + 1] != "->":
            ends[stack.pop()] = i
    tops = (s for s, p in zip(starts, parents, strict=True) if p < 0)
    top_template = any(text[s] == "<" and s and text[s - 1] != " " for s in tops)
    return _Parsed(text, starts, ends, parents, last_space + 1 if params >= 0 else 0, params >= 0 or top_template)


def _opened_at_first(parsed: _Parsed) -> set[int]:
    """The template argument lists of the name itself."""
    return {
        g for g, s in enumerate(parsed.starts) if parsed.parents[g] < 0 and s >= parsed.body and parsed.text[s] == "<"
    }


def _render(parsed: _Parsed, opened: set[int]) -> tuple[str, list[int]]:
    """The name with every group not opened shown as `(…)`, and those groups (the places that could open next)."""
    if not parsed.structured:
        return parsed.text, []
    text, starts, ends = parsed.text, parsed.starts, parsed.ends
    visible = [False] * len(starts)
    out: list[str] = []
    closed: list[int] = []
    at = parsed.body
    for g, start in enumerate(starts):
        parent = parsed.parents[g]
        if start < parsed.body or not (parent < 0 or (visible[parent] and parent in opened)):
            continue
        visible[g] = True
        if g not in opened and ends[g] > start + 1:
            out += [text[at : start + 1], "…", text[ends[g] : ends[g] + 1]]
            at = ends[g] + 1
            closed.append(g)
    out.append(text[at:])
    return "".join(out), closed


def _compact(text: str, width: int) -> str:
    """A shortened C++ rendering without namespace qualifiers, and without its elided parameter list if too wide."""
    text = _QUALIFIERS.sub("", text)
    return text[:-3] if len(text) > width and text.endswith("(…)") else text


def _common_prefix(a: str, b: str) -> int:
    low, high = 0, min(len(a), len(b))
    while low < high:  # bisection over slices: C speed on names of any length
        middle = (low + high + 1) // 2
        low, high = (middle, high) if a[:middle] == b[:middle] else (low, middle - 1)
    return low


def _prefix(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _window(text: str, width: int, differences: list[int]) -> str | None:
    """`text` cut to `width`, keeping its head and each position in `differences`; None when they do not all fit.

    The head is the function's name and the head of its first template argument (shorter if need be); what follows
    it is the stretch that begins with the word in which `text` first differs from the others, or else the end."""
    last = max(differences, default=0)
    if len(text) <= width or last < width - 1:
        return _prefix(text, width)
    end = _HEAD.match(text).end()  # type: ignore[union-attr]
    for head in (min(end, width * 2 // 3) if end >= 8 else (width - 1) // 2, width // 4):
        first = min(d for d in differences if d >= head)
        start = max(head, first - width // 3)
        start = max(start, *(text.rfind(c, start, first) + 1 for c in " ,{["))
        if len(text) - start <= width - 1 - head:
            return text[:head] + "…" + text[len(text) - (width - 1 - head) :]
        if start + width - 2 - head > last:
            return text[:head] + "…" + text[start : start + width - 2 - head] + "…"
    return None


def _windows(texts: dict[str, str], width: int) -> dict[str, str]:
    """Each text cut to `width` so as to keep where it differs from its neighbours in sorted order."""
    order = sorted(texts, key=lambda n: (texts[n], n))
    cut: dict[str, str] = {}
    for i, name in enumerate(order):
        text = texts[name]
        near = [_common_prefix(text, texts[n]) for n in order[max(0, i - 1) : i] + order[i + 1 : i + 2]]
        cut[name] = _window(text, width, near) or _prefix(text, width)
    return cut


def short_name(name: str, width: int = DEFAULT_WIDTH) -> str:
    """One name's short form, at most `width` characters."""
    parsed = _parse(name)
    shown = _render(parsed, _opened_at_first(parsed))[0]
    return _prefix(_compact(shown, width) if shown != name else shown, width)


def _open_difference(
    group: list[str], parsed: dict[str, _Parsed], opened: dict[str, set[int]], closed: list[list[int]]
) -> bool:
    """Open, in each name of `group`, the first closed group whose contents differ between them; False if none do."""
    if len({len(c) for c in closed}) != 1:
        return False
    for k in range(len(closed[0])):
        spans = [(parsed[n], c[k]) for n, c in zip(group, closed, strict=True)]
        if len({p.text[p.starts[g] : p.ends[g] + 1] for p, g in spans}) > 1:
            for n, c in zip(group, closed, strict=True):
                opened[n].add(c[k])
            return True
    return False


def _distinct_renderings(names: list[str]) -> dict[str, str]:
    """Each long name's rendering, opened only as far as telling it from the others needs."""
    parsed = {n: _parse(n) for n in names}
    opened = {n: _opened_at_first(parsed[n]) for n in names}
    shown = {n: _render(parsed[n], opened[n]) for n in names}
    for round_ in range(_MAX_ROUNDS + 1):
        for group in _clashes({n: shown[n][0] for n in names}):
            if round_ < _MAX_ROUNDS and _open_difference(group, parsed, opened, [shown[n][1] for n in group]):
                shown.update({n: _render(parsed[n], opened[n]) for n in group})
            else:
                shown.update({n: (n, []) for n in group})
    return {n: shown[n][0] for n in names}


def unique_short_names(names: Iterable[str], width: int = DEFAULT_WIDTH) -> dict[str, str]:
    """Every distinct name's label: at most `width` (at least MIN_WIDTH) characters, no two alike, and the same
    for the same set of names in any order, so that a chart and its table agree. A name whose short_name no
    other name of the set shares is labelled with it, whatever else is in the set: the same kernel reads the
    same in every table, chart, hover and sentence. Names whose short forms clash are opened further where
    they differ from each other, and from nothing else: their labels depend only on those namesakes."""
    width = max(width, MIN_WIDTH)
    distinct = sorted(set(names))
    labels = {name: short_name(name, width) for name in distinct}
    for group in _clashes(labels):  # each group on its own: a label depends on its namesakes only
        labels.update(_told_apart(group, width))
    taken = set(labels.values())
    for group in _clashes(labels):
        for number, name in enumerate(group[1:], start=2):
            while (label := _numbered(labels[name], number, width)) in taken:
                number += 1
            labels[name] = label
            taken.add(label)
    return labels


def _told_apart(names: list[str], width: int) -> dict[str, str]:
    """Labels for names whose short forms clash: opened, then cut, where they differ from each other."""
    raw = _distinct_renderings(names)  # C++ signatures read alike, long or not: `relu_kernel<float>(…)`
    compact = {n: _compact(r, width) if r != n else r for n, r in raw.items()}
    labels = _windows(compact, width)
    for group in _clashes(labels):
        texts = compact if len({compact[n] for n in group}) == len(group) else raw
        labels.update(_windows({n: texts[n] for n in group}, width))
    return labels


def _numbered(label: str, number: int, width: int) -> str:
    suffix = f" #{number}"
    return label[: max(0, width - len(suffix))] + suffix[-width:]


def _clashes(labels: dict[str, str]) -> list[list[str]]:
    by_label: dict[str, list[str]] = defaultdict(list)
    for name, label in labels.items():
        by_label[label].append(name)
    return [sorted(g) for _, g in sorted(by_label.items()) if len(g) > 1]
