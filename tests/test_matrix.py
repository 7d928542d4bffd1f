"""Experiment matrices: parsing, inheritance, expansion order, and refusals that name the file and line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent.runs.matrix import MAX_BYTES, Matrix, MatrixError, load_matrix
from agent.runs.matrix_model import MAX_RUNS, RunSpec

EXAMPLE = """\
# defaults apply to every experiment; an experiment's own keys win
defaults:
  repeat: 2
  gpus: "0"
  tags: {suite: resnet}
  env: {OMP_NUM_THREADS: "4"}
  nsys: false
  nsys_args: "--trace cuda,nvtx"
  timeout: 3600
experiments:
  - name: "resnet50-bs{batch}"
    command: "python train.py --batch {batch} --model {model}"
    params: {batch: [64, 128], model: resnet50}
    repeat: 3
  - name: shared-gpu
    collocated:
      - {name: "a-bs{batch}", command: "python a.py {batch}"}
      - {name: b, command: ["python", "b.py"], gpus: [1, 2], tags: {suite: mine}}
    params: {batch: [32]}
"""


def load(tmp_path: Path, text: str, name: str = "m.yaml") -> Matrix:
    path = tmp_path / name
    path.write_text(text)
    return load_matrix(path)


def refused(tmp_path: Path, text: str, name: str = "m.yaml") -> str:
    with pytest.raises(MatrixError) as info:
        load(tmp_path, text, name)
    return str(info.value)


def runs(matrix: Matrix) -> list[RunSpec]:
    return [spec for slot in matrix.slots for spec in slot]


def test_example_expands_in_order(tmp_path: Path) -> None:
    matrix = load(tmp_path, EXAMPLE)
    assert matrix.path == tmp_path / "m.yaml"
    assert [[(s.name, s.repetition) for s in slot] for slot in matrix.slots] == [
        [("resnet50-bs64", 1)],
        [("resnet50-bs64", 2)],
        [("resnet50-bs64", 3)],
        [("resnet50-bs128", 1)],
        [("resnet50-bs128", 2)],
        [("resnet50-bs128", 3)],
        [("a-bs32", 1), ("b", 1)],
        [("a-bs32", 2), ("b", 2)],
    ]
    assert matrix.runs == 10
    first = matrix.slots[0][0]
    assert first == RunSpec(
        name="resnet50-bs64",
        command=("python", "train.py", "--batch", "64", "--model", "resnet50"),
        experiment="resnet50-bs{batch}",
        params={"batch": "64", "model": "resnet50"},
        repetition=1,
        tags={"suite": "resnet", "batch": "64", "model": "resnet50", "repetition": "1"},
        env={"OMP_NUM_THREADS": "4"},
        gpus=(0,),
        nsys=False,
        nsys_args=("--trace", "cuda,nvtx"),
        timeout=3600.0,
        line=11,
    )
    a, b = matrix.slots[7]
    assert (a.experiment, a.command, a.gpus, a.line) == ("shared-gpu", ("python", "a.py", "32"), (0,), 17)
    assert (b.experiment, b.command, b.gpus, b.line) == ("shared-gpu", ("python", "b.py"), (1, 2), 18)
    assert b.tags == {"suite": "mine", "batch": "32", "repetition": "2"}
    assert b.env == {"OMP_NUM_THREADS": "4"}


def test_defaults_inherited_and_overridden_layer_by_layer(tmp_path: Path) -> None:
    matrix = load(
        tmp_path,
        """\
defaults: {tags: {a: "1", b: "1"}, env: {X: "1"}, nsys: true, timeout: 10}
experiments:
  - name: plain
    command: run
  - name: own
    command: run
    tags: {b: "2", c: "{p}"}
    env: {Y: "y-{p}"}
    nsys: no
    timeout: 2.5
    gpus: 3
    params: {p: [true, 1.5], q: x}
  - name: group
    tags: {b: "2"}
    collocated:
      - {name: m, command: run, tags: {b: "3", p: "tag"}, nsys: false}
    params: {p: v}
""",
    )
    plain, own1, own2, member = runs(matrix)
    assert plain.tags == {"a": "1", "b": "1", "repetition": "1"}
    assert (plain.env, plain.nsys, plain.timeout, plain.gpus, plain.nsys_args) == ({"X": "1"}, True, 10.0, None, ())
    assert own1.tags == {"a": "1", "b": "2", "c": "true", "p": "true", "q": "x", "repetition": "1"}
    assert own2.params == {"p": "1.5", "q": "x"}
    assert (own2.env, own2.nsys, own2.timeout, own2.gpus) == ({"X": "1", "Y": "y-1.5"}, False, 2.5, (3,))
    assert member.tags == {"a": "1", "b": "3", "p": "v", "repetition": "1"}  # params win over tags
    assert (member.nsys, member.timeout) == (False, 10.0)


def test_list_command_templating_and_brace_escape(tmp_path: Path) -> None:
    matrix = load(
        tmp_path,
        """\
experiments:
  - name: "x{{{n}}}"
    command: ["python", "-c", "print({{'n': {n}}})", "two words {n}", 3]
    params: {n: [1, 2]}
""",
    )
    assert [s.name for s in runs(matrix)] == ["x{1}", "x{2}"]
    assert runs(matrix)[1].command == ("python", "-c", "print({'n': 2})", "two words 2", "3")


def test_string_command_is_split_after_templating(tmp_path: Path) -> None:
    matrix = load(tmp_path, "experiments:\n  - {name: s, command: \"run --msg '{m} done' {m}\", params: {m: a b}}\n")
    assert runs(matrix)[0].command == ("run", "--msg", "a b done", "a", "b")


CSV = """\
# a comment before the header
name,command,repeat,gpus,nsys,nsys_args,timeout,group,param:bs,tag:team,env:SEED
train-{bs},"python t.py --bs {bs}",2,"0,1",yes,--trace cuda,60,,64,ml,{bs}
# a comment between rows
a-{bs},python a.py {bs},,0,,,,pair,32,,
solo,python s.py,,,,,,,,,
b,"python b.py",,0,0,,,pair,,infra,7
"""


def test_csv_rows_params_tags_env_and_groups(tmp_path: Path) -> None:
    matrix = load(tmp_path, CSV, "m.csv")
    assert [[s.name for s in slot] for slot in matrix.slots] == [
        ["train-64"],
        ["train-64"],
        ["a-32", "b"],  # the group runs where its first row is
        ["solo"],
    ]
    train = matrix.slots[1][0]
    assert train.command == ("python", "t.py", "--bs", "64")
    assert (train.repetition, train.gpus, train.nsys, train.nsys_args, train.timeout) == (
        2,
        (0, 1),
        True,
        ("--trace", "cuda"),
        60.0,
    )
    assert (train.tags, train.env, train.line, train.experiment) == (
        {"team": "ml", "bs": "64", "repetition": "2"},
        {"SEED": "64"},
        3,
        "train-{bs}",
    )
    a, b = matrix.slots[2]
    assert (a.experiment, a.line, a.params, a.env, a.nsys) == ("pair", 5, {"bs": "32"}, {}, False)
    assert (b.experiment, b.line, b.params, b.tags, b.env) == (
        "pair",
        7,
        {},
        {"team": "infra", "repetition": "1"},
        {"SEED": "7"},
    )
    solo = matrix.slots[3][0]
    assert (solo.gpus, solo.timeout, solo.tags) == (None, None, {"repetition": "1"})


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        (
            "experiments:\n  - name: x\n    comand: y\n",
            3,
            "unknown key 'comand' in an experiment (known: collocated, command",
        ),
        ("experiments:\n  - name: x\n    repeat: 2\n", 2, "needs exactly one of 'command' and 'collocated'"),
        ("experiments:\n  - name: x\n    command: y\n    collocated: [{name: a, command: b}]\n", 2, "exactly one"),
        ("experiments:\n  - command: y\n", 2, "missing required 'name'"),
        ("experiments:\n  - name: x\n    collocated:\n      - {name: a}\n", 4, "missing required 'command'"),
        ("experiments:\n  - name: x\n    command: y\n    repeat: 0\n", 4, "repeat must be from 1 to 1000, got 0"),
        ("experiments:\n  - name: x\n    command: y\n    repeat: 1001\n", 4, "repeat must be from 1 to 1000"),
        ("experiments:\n  - name: x\n    command: y\n    repeat: 2.5\n", 4, "repeat must be a whole number"),
        ("experiments:\n  - name: x\n    command: y\n    repeat: true\n", 4, "repeat must be a whole number"),
        ("experiments:\n  - name: x\n    command: y\n    gpus: [0, 4096]\n", 4, "gpus must be distinct GPU indices"),
        ("experiments:\n  - name: x\n    command: y\n    gpus: [0, 0]\n", 4, "gpus must be distinct"),
        ("experiments:\n  - name: x\n    command: y\n    gpus: -1\n", 4, "gpus must be distinct"),
        ("experiments:\n  - name: x\n    command: y\n    nsys: maybe\n", 4, "nsys must be true or false"),
        ("experiments:\n  - name: x\n    command: y\n    timeout: 0\n", 4, "timeout must be a positive number"),
        ("experiments:\n  - name: x\n    command: y\n    timeout: .nan\n", 4, "timeout must be a positive"),
        ("experiments:\n  - name: x\n    command: y\n    tags: [a]\n", 4, "tags must be a mapping"),
        ("experiments:\n  - name: x\n    command: y\n    tags: {a: {b: c}}\n", 4, "nested too deeply"),
        ("experiments:\n  - name: x\n    command: y\n    tags: {a: ~}\n", 4, "must be text or a number, not NoneType"),
        ("experiments:\n  - name: x\n    command: y\n    tags: {'': a}\n", 4, "tags: '' must be a name"),
        ("experiments:\n  - name: x\n    command: y\n    env: {1X: a}\n", 4, "env: '1X' must be a variable name"),
        ("experiments:\n  - name: x\n    command: y\n    params: {p: []}\n", 4, "non-empty list"),
        ("experiments:\n  - name: x\n    command: y\n    params: [p]\n", 4, "params must be a mapping"),
        ("experiments:\n  - name: x\n    command: y\n    params: {p-q: 1}\n", 4, "parameter name 'p-q'"),
        ("experiments:\n  - name: x\n\n    command: y {bs}\n    params: {batch: 1}\n", 4, "unknown parameter {bs}"),
        ("experiments:\n  - name: x{batch.real}\n    command: y\n    params: {batch: 1}\n", 2, "unknown parameter"),
        ("experiments:\n  - name: x{batch\n    command: y\n    params: {batch: 1}\n", 2, "bad template 'x{batch'"),
        ("experiments:\n  - name: x}\n    command: y\n", 2, "bad template"),
        ("experiments:\n  - name: x\n    command: y\n    tags: {t: '{nope}'}\n", 4, "unknown parameter {nope}"),
        ("experiments:\n  - name: x\n    command: '  '\n", 3, "command is empty"),
        ("experiments:\n  - name: x\n    command: []\n", 3, "command is empty"),
        (
            "experiments:\n  - name: x\n    command: '{p}'\n    params: {p: ''}\n",
            3,
            "command is empty after templating",
        ),
        ('experiments:\n  - name: x\n    command: "run \'unclosed"\n', 3, "cannot be split into arguments"),
        ('experiments:\n  - name: x\n    command: y\n    nsys_args: "\'a"\n', 4, "nsys_args"),
        ("experiments:\n  - name: '{p}'\n    command: y\n    params: {p: ' '}\n", 2, "empty after templating"),
        (
            "experiments:\n  - name: x\n    command: y\n  - name: z\n    command: y\n    name: w\n",
            6,
            "duplicate key 'name'",
        ),
        ("experiments:\n  - name: x\n    command: y\n    tags: {a: 1, a: 2}\n", 4, "duplicate key 'a'"),
        ("defaults: {}\nexperiments: []\ndefaults: {}\n", 3, "duplicate key 'defaults' in the file (first on line 1)"),
        ("experiments:\n  - name: x\n    command: [y\n", 4, "invalid YAML"),
        ("experiments:\n  - name: x\n\tcommand: y\n", 3, "invalid YAML"),
        ("experiments: []\n", 1, "'experiments' must be a non-empty list"),
        ("defaults: {repeat: 2}\n", 1, "missing required key 'experiments'"),
        ("- a\n- b\n", 1, "the file must be a mapping"),
        ("# nothing\n", 1, "empty"),
        ("matrix: {}\n", 1, "unknown key 'matrix' in the file (known: defaults, experiments)"),
        ("defaults: {name: x}\nexperiments: []\n", 1, "unknown key 'name' in defaults"),
        (
            "experiments:\n  - name: x\n    collocated:\n      - {name: a, command: b, repeat: 2}\n",
            4,
            "unknown key 'repeat'",
        ),
        ("x: &a 1\nexperiments: *a\n", 2, "aliases"),
        ("experiments:\n  - name: !!python/name:os.system x\n    command: y\n", 2, "cannot read value"),
        ('experiments:\n  - name: x\n    command: y\n    env: {X: "a\\0b"}\n', 4, "a NUL character"),
    ],
)
def test_yaml_refusals_name_file_and_line(tmp_path: Path, text: str, line: int, message: str) -> None:
    error = refused(tmp_path, text, "exp.yaml")
    assert error.startswith(f"exp.yaml line {line}: "), error
    assert message in error, error


def test_template_values_and_sizes_are_limited(tmp_path: Path) -> None:
    big = "v" * (64 * 1024 + 1)
    error = refused(
        tmp_path,
        f"experiments:\n  - name: x\n    command: y\n    tags: {{t: '{{p}}{{p}}'}}\n    params: {{p: {big[:40000]}}}\n",
    )
    assert re.match(r"m\.yaml line 4: 'vvv.*: a NUL character or longer than 65536 bytes", error), error
    error = refused(tmp_path, f"experiments:\n  - name: x\n    command: y\n    tags: {{{'k' * 257}: v}}\n")
    assert error.startswith("m.yaml line 4: tags: 'kkk"), error


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("name,comand\nx,y\n", 1, "unknown column 'comand' (known: command, gpus, group, name, nsys"),
        ("# c\nname,command,tag:\nx,y,z\n", 2, "unknown column 'tag:'"),
        ("name,repeat\nx,2\n", 1, "missing required column 'command'"),
        ("name,command,name\nx,y,z\n", 1, "column 'name' twice"),
        ("name,command,repeat\nx,y,1\n# c\nx,y,three\n", 4, "repeat must be a whole number, got 'three'"),
        ("name,command,nsys\nx,y,maybe\n", 2, "nsys must be true or false"),
        ("name,command\nx,y,z\n", 2, "3 cells but 2 columns"),
        ("name,command\n,y\n", 2, "missing required 'name'"),
        ("name,command,param:p\nx,y {q},1\n", 2, "unknown parameter {q}"),
        (
            "name,command,group,repeat\na,y,g,2\nb,y,other,3\nc,y,g,3\n",
            4,
            "repeat differs from the first row of group 'g' (line 2)",
        ),
        ("name,command,env:A-B\nx,y,1\n", 2, "env: 'A-B' must be a variable name"),
        ("# only\nname,command\n", 2, "no experiments"),
    ],
)
def test_csv_refusals_name_file_and_line(tmp_path: Path, text: str, line: int, message: str) -> None:
    error = refused(tmp_path, text, "exp.csv")
    assert error.startswith(f"exp.csv line {line}: "), error
    assert message in error, error


def test_run_cap_counts_products_repeats_and_members(tmp_path: Path) -> None:
    values = list(range(100))
    ok = f"experiments:\n  - name: x\n    command: y\n    params: {{a: {values}, b: {values}}}\n"
    assert load(tmp_path, ok).runs == MAX_RUNS
    over = ok + "  - name: z\n    collocated: [{name: a, command: b}]\n"
    assert refused(tmp_path, over) == f"m.yaml line 5: the matrix expands to more than {MAX_RUNS} runs"
    huge = f"experiments:\n  - name: x\n    command: y\n    repeat: 1000\n    params: {{a: {list(range(11))}}}"
    assert "line 2: the matrix expands to more than" in refused(tmp_path, huge)


def test_file_level_refusals(tmp_path: Path) -> None:
    assert refused(tmp_path, "x", "m.json") == "m.json: unknown matrix format '.json'; use .yaml, .yml or .csv"
    assert "use .yaml, .yml or .csv" in refused(tmp_path, "x", "matrix")
    path = tmp_path / "big.yml"
    path.write_text("# " + "x" * MAX_BYTES + "\nexperiments: [{name: x, command: y}]\n")
    with pytest.raises(MatrixError, match=r"^big\.yml: larger than 1048576 bytes$"):
        load_matrix(path)
    path.write_bytes(b"experiments: [{name: \xff, command: y}]\n")
    with pytest.raises(MatrixError, match=r"^big\.yml: not UTF-8 \(byte 21\)$"):
        load_matrix(path)
    with pytest.raises(MatrixError, match=r"^absent\.csv: cannot read"):
        load_matrix(tmp_path / "absent.csv")


def test_yml_extension_and_byte_order_mark(tmp_path: Path) -> None:
    path = tmp_path / "m.YML"
    path.write_bytes(b"\xef\xbb\xbfexperiments: [{name: x, command: y}]\n")
    assert [s.name for s in runs(load_matrix(path))] == ["x"]
