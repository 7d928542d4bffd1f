"""The YAML reader of a matrix: `defaults` + `experiments`, each with `params` crossed into combinations.

The node tree is walked here, for line numbers and duplicate keys; the text is untrusted: it is read with
the safe loader only, and aliases are refused.
"""

from __future__ import annotations

import yaml

from agent.runs.matrix_model import _Bad, _Experiment, _experiment, _Fields, _Layer, _layer, _text

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_LAYER_KEYS = frozenset({"repeat", "gpus", "tags", "env", "nsys", "nsys_args", "timeout"})
_MEMBER_KEYS = frozenset({"name", "command", "gpus", "tags", "env", "nsys", "nsys_args", "timeout"})
_EXPERIMENT_KEYS = _LAYER_KEYS | {"name", "command", "collocated", "params"}


def _from_yaml(text: str) -> list[_Experiment]:
    try:
        for event in yaml.parse(text, Loader=_LOADER):
            if isinstance(event, yaml.AliasEvent):  # each alias could multiply the work; defaults cover the need
                raise _Bad(event.start_mark.line + 1, "aliases (*name) are not supported; use defaults")
        root = yaml.compose(text, Loader=_LOADER)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        raise _Bad(mark.line + 1 if mark else 1, f"invalid YAML: {e.problem or e.context}") from None
    except (yaml.YAMLError, RecursionError) as e:
        raise _Bad(1, f"invalid YAML: {e}") from None
    if root is None:
        raise _Bad(1, "empty; expected a mapping with 'experiments'")
    top = _node_fields(root, "the file", frozenset({"defaults", "experiments"}))
    defaults = _layer(_values(top["defaults"][0], "defaults", _LAYER_KEYS)) if "defaults" in top else _Layer()
    if "experiments" not in top:
        raise _Bad(_line(root), "missing required key 'experiments'")
    node, line = top["experiments"]
    if not isinstance(node, yaml.SequenceNode) or not node.value:
        raise _Bad(line, "'experiments' must be a non-empty list")
    experiments = []
    for item in node.value:
        fields = _node_fields(item, "an experiment", _EXPERIMENT_KEYS)
        members = None
        if "collocated" in fields:
            group, at = fields.pop("collocated")
            if not isinstance(group, yaml.SequenceNode) or not group.value:
                raise _Bad(at, "'collocated' must be a non-empty list of commands")
            members = [(_values(m, "a collocated member", _MEMBER_KEYS), _line(m)) for m in group.value]
        values = {key: (_value(node), at) for key, (node, at) in fields.items()}
        experiments.append(_experiment(values, members, defaults, _line(item)))
    return experiments


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def _node_fields(node: yaml.Node, what: str, known: frozenset[str]) -> dict[str, tuple[yaml.Node, int]]:
    if not isinstance(node, yaml.MappingNode):
        raise _Bad(_line(node), f"{what} must be a mapping")
    fields: dict[str, tuple[yaml.Node, int]] = {}
    for key_node, value in node.value:
        key = _key(key_node)
        if key in fields:
            raise _Bad(_line(key_node), f"duplicate key {key!r} in {what} (first on line {fields[key][1]})")
        if key not in known:
            raise _Bad(_line(key_node), f"unknown key {key!r} in {what} (known: {', '.join(sorted(known))})")
        fields[key] = (value, _line(key_node))
    return fields


def _values(node: yaml.Node, what: str, known: frozenset[str]) -> _Fields:
    return {key: (_value(value), at) for key, (value, at) in _node_fields(node, what, known).items()}


def _value(node: yaml.Node, depth: int = 0) -> object:
    """A scalar, a list of scalars, or a mapping of text to those (tags, env, params)."""
    if isinstance(node, yaml.ScalarNode):
        return _scalar(node)
    if isinstance(node, yaml.SequenceNode) and depth < 2:
        return [_value(item, 2) for item in node.value]
    if isinstance(node, yaml.MappingNode) and depth < 1:
        pairs: dict[str, object] = {}
        for key_node, value in node.value:
            key = _key(key_node)
            if key in pairs:
                raise _Bad(_line(key_node), f"duplicate key {key!r}")
            pairs[key] = _value(value, 1)
        return pairs
    raise _Bad(_line(node), "nested too deeply; expected a value, a list of values or a mapping of those")


def _key(node: yaml.Node) -> str:
    try:
        return _text(_scalar(node), "a key")
    except ValueError as e:
        raise _Bad(_line(node), str(e)) from None


def _scalar(node: yaml.Node) -> object:
    if not isinstance(node, yaml.ScalarNode):
        raise _Bad(_line(node), "expected a single value")
    try:
        return yaml.constructor.SafeConstructor().construct_object(node)
    except yaml.YAMLError as e:
        raise _Bad(_line(node), f"cannot read value: {getattr(e, 'problem', e)}") from None
