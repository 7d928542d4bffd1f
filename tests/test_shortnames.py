"""Short names on real kernel names from the fixtures: never two alike, within the width, the telling part kept."""

from __future__ import annotations

import gzip
import json
import random
import re
import sqlite3
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import FIXTURES
from tracehouse.shortnames import DEFAULT_WIDTH, short_name, unique_short_names

CLOVERLEAF = FIXTURES / "nsys" / "nsys-2024.5-pipit-cloverleaf-4xa100.sqlite"
KINETO = FIXTURES / "kineto"
CUTLASS_TRACE = KINETO / "trace_filter_sampled_rank-0.json.gz"  # 53 `void cutlass::Kernel<cutlass_80_…>` kernels


def cloverleaf_kernels() -> list[str]:
    if not CLOVERLEAF.exists():
        pytest.skip("CloverLeaf nsys fixture absent")
    with sqlite3.connect(f"file:{CLOVERLEAF}?mode=ro", uri=True) as db:
        query = "SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName"
        return [row[0] for row in db.execute(query)]


def kineto_kernels(*paths: Path) -> list[str]:
    names: set[str] = set()
    for path in paths or tuple(KINETO.glob("*.json.gz")):
        if not path.exists():
            pytest.skip(f"{path.name} absent")
        events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
        names.update(e["name"] for e in events if e.get("cat") == "kernel")
    if not names:
        pytest.skip("no Kineto fixtures")
    return sorted(names)


def check(labels: dict[str, str], names: list[str], width: int = DEFAULT_WIDTH) -> None:
    assert set(labels) == set(names)
    assert len(set(labels.values())) == len(labels), "two distinct names share a label"
    assert all(len(label) <= width for label in labels.values())


def test_cloverleaf_kernels_keep_their_own_function_and_lambda_instance_visible() -> None:
    names = cloverleaf_kernels()
    labels = unique_short_names(names)
    check(labels, names)
    assert len(names) == 102
    for name, label in labels.items():
        own = re.search(r"<(\w+)\(", name).group(1)  # type: ignore[union-attr]
        assert own in label, (own, label)
        instance = re.search(r"\(instance \d+\)", name)
        if instance and sum(n.startswith(name[: instance.start()]) for n in names) > 1:
            assert instance.group() in label, (name, label)
    advec_mom = {labels[n] for n in names if "<advec_mom_kernel(" in n}
    assert len(advec_mom) == 12  # one bar each, not one stacked bar of about 83 ms
    assert "PdV_kernel" in short_name(next(n for n in names if "PdV_kernel" in n))


def test_cutlass_kernels_keep_their_configuration() -> None:
    names = [n for n in kineto_kernels(CUTLASS_TRACE) if "cutlass" in n]
    assert len(names) == 53
    labels = unique_short_names(names)
    check(labels, names)
    for name, label in labels.items():
        assert re.search(r"cutlass_80_\w+", name).group() in label  # type: ignore[union-attr]


def test_pytorch_kernels_are_told_apart_and_start_with_their_function() -> None:
    names = kineto_kernels()
    labels = unique_short_names(names)
    check(labels, names)
    for name, label in labels.items():
        if len(name) > DEFAULT_WIDTH and (own := re.match(r"void (?:\w+::|\(anonymous namespace\)::)*(\w+)<", name)):
            qualified = r"(?:\w+::|\(anonymous namespace\)::)*"  # kept only where they tell names apart
            assert re.match(qualified + re.escape(own.group(1)[:15]), label), (own.group(1), label)
    assert not [label for label in labels.values() if re.search(r" #\d+$", label)], "settled by a number"


def test_same_labels_whatever_the_order() -> None:
    names = cloverleaf_kernels() + kineto_kernels()
    expected = unique_short_names(names)
    for seed in range(3):
        shuffled = names[:]
        random.Random(seed).shuffle(shuffled)
        assert unique_short_names(shuffled + shuffled[:10]) == expected


def test_names_alike_in_their_first_80_characters_stay_apart() -> None:
    stem = "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, "
    names = [stem + f"at::native::{op}Functor<float> >, at::detail::Array<char*, 3> >(int)" for op in ("Mul", "Div")]
    assert names[0][:80] == names[1][:80]
    labels = unique_short_names(names)
    check(labels, names)
    assert "Mul" in labels[names[0]] and "Div" in labels[names[1]]


def test_names_that_fit_stay_as_they_are() -> None:
    names = [
        "train_step",
        "cudaMemcpyAsync",
        "[CUDA memcpy Host-to-Device]",
        "aten::addmm",
        "ampere_sgemm_128x64_nn",
        "",
    ]
    assert unique_short_names(names) == {n: n for n in names}
    assert short_name("cudaMemcpyAsync") == "cudaMemcpyAsync"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("void at::native::(anonymous namespace)::foo<int>(" + "int, " * 20 + "int)", "foo<int>(…)"),
        (
            "void clover::par_ranged2d_kernel<PdV_kernel(bool, int, int, double, clover::Buffer2D<double> &)"
            "::[lambda(int, int) (instance 1)]>(clover::Range2d, T1)",
            "par_ranged2d_kernel<PdV_kernel(…)::[…]>(…)",
        ),
        (
            "std::enable_if<!(false), void>::type internal::gemvx::kernel<int, float>(" + "float, " * 10 + "int)",
            "kernel<int, float>(…)",
        ),
        (
            "at::native::Functor<float>::operator()(" + "float, " * 10 + "int) const",
            "Functor<float>::operator()(…) const",
        ),
    ],
)
def test_one_short_name_drops_return_type_parameters_and_qualifiers(name: str, expected: str) -> None:
    assert short_name(name) == expected


def test_untrusted_names_never_raise_and_take_bounded_time() -> None:
    huge = ["(" * 1_000_000, "<" * 500_000 + ">" * 500_000, "void f<" + "int, " * 200_000 + ">(float)", "é" * 10**6]
    started = time.monotonic()
    for name in huge:
        names = [name, name + "x", name[:-1]]
        check(unique_short_names(names), names)
        assert len(short_name(name)) <= DEFAULT_WIDTH
    assert time.monotonic() - started < 20


BRACKETY = st.text(alphabet="ab_:<>()[]{}, #…é-", max_size=120)
PIECES = ["void ", "ns::", "f", "<", ">", "(", ")", "int", ", ", "[lambda(int) (instance ", "1", ")]", "{lambda()#"]
PIECES += ["}", "operator()", "(anonymous namespace)::", " const"]
CPP_LIKE = st.lists(st.sampled_from(PIECES), max_size=60).map("".join)
NAMES = st.lists(st.one_of(st.text(max_size=90), BRACKETY, CPP_LIKE), max_size=25)


@settings(max_examples=150, deadline=None)
@given(NAMES, st.integers(min_value=8, max_value=80))
def test_any_text_gets_distinct_labels_within_the_width(names: list[str], width: int) -> None:
    labels = unique_short_names(names, width)
    check(labels, list(dict.fromkeys(names)), width)
    assert unique_short_names(list(reversed(names)), width) == labels
