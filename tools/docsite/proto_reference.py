"""The wire protocol's reference, in Markdown, from the .proto files and their comments.

protoc (grpcio-tools) parses them with their comments (`--include_source_info`), so the page says
what the files say: a service, method, message, field or enum value without a comment has none here.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from google.protobuf import descriptor_pb2

REPO = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO / "proto"
PACKAGE = "tracehouse.v1"

F = descriptor_pb2.FieldDescriptorProto
SCALARS = {
    value: name.removeprefix("TYPE_").lower()
    for name, value in F.Type.items()
    if name not in ("TYPE_MESSAGE", "TYPE_ENUM", "TYPE_GROUP")
}


def descriptor_set(files: Sequence[Path]) -> descriptor_pb2.FileDescriptorSet:
    """The files as protoc parses them, comments included."""
    from grpc_tools import protoc  # the docs and test extras install it

    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "set.pb"
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"-I{Path(protoc.__file__).parent / '_proto'}",
            f"--descriptor_set_out={out}",
            "--include_source_info",
            *[str(path) for path in files],
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc could not parse {', '.join(str(path) for path in files)}")
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def _comments(file: descriptor_pb2.FileDescriptorProto) -> dict[tuple[int, ...], str]:
    found = {}
    for location in file.source_code_info.location:
        text = " ".join(part.strip() for part in (location.leading_comments, location.trailing_comments) if part)
        if text:
            found[tuple(location.path)] = text
    return found


def _paragraph(text: str) -> str:
    """A comment as Markdown: its blank lines kept as paragraph breaks."""
    paragraphs = [" ".join(line.strip() for line in block.splitlines()) for block in text.split("\n\n")]
    return "\n\n".join(p for p in paragraphs if p)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _type_name(name: str) -> str:
    return name.removeprefix(f".{PACKAGE}.")


def _link(name: str) -> str:
    short = _type_name(name)
    if name.startswith(f".{PACKAGE}."):
        return f"[`{short}`](#{short.lower().replace('.', '')})"
    return f"`{short}`"


def _field_type(field: F, maps: dict[str, tuple[F, F]]) -> str:
    if field.type_name in maps:
        key, value = maps[field.type_name]
        return f"map<{_field_type(key, maps)}, {_field_type(value, maps)}>"
    base = _link(field.type_name) if field.type_name else f"`{SCALARS[field.type]}`"
    if field.label == F.LABEL_REPEATED:
        return f"repeated {base}"
    if field.proto3_optional:
        return f"optional {base}"
    return base


def _messages(
    messages: Sequence[descriptor_pb2.DescriptorProto], path: tuple[int, ...], prefix: str
) -> Iterator[tuple[str, descriptor_pb2.DescriptorProto, tuple[int, ...]]]:
    for i, message in enumerate(messages):
        if message.options.map_entry:
            continue
        here = (*path, i)
        yield f"{prefix}{message.name}", message, here
        yield from _messages(message.nested_type, (*here, 3), f"{prefix}{message.name}.")


def _maps(file: descriptor_pb2.FileDescriptorProto) -> dict[str, tuple[F, F]]:
    found = {}

    def walk(messages: Sequence[descriptor_pb2.DescriptorProto], scope: str) -> None:
        for message in messages:
            name = f"{scope}.{message.name}"
            if message.options.map_entry:
                found[name] = (message.field[0], message.field[1])
            walk(message.nested_type, name)

    walk(file.message_type, f".{file.package}")
    return found


def _enum(name: str, enum: descriptor_pb2.EnumDescriptorProto, path: tuple[int, ...], notes: dict) -> list[str]:
    lines = [f"### `{name}`", ""]
    if path in notes:
        lines += [_paragraph(notes[path]), ""]
    lines += ["| value | number | what |", "|---|---|---|"]
    for i, value in enumerate(enum.value):
        lines.append(f"| `{value.name}` | {value.number} | {_cell(notes.get((*path, 2, i), ''))} |")
    return [*lines, ""]


def file_reference(file: descriptor_pb2.FileDescriptorProto) -> str:
    notes = _comments(file)
    maps = _maps(file)
    lines = [f"## {Path(file.name).name}", ""]
    for s, service in enumerate(file.service):
        lines += [f"### service `{service.name}`", ""]
        if (6, s) in notes:
            lines += [_paragraph(notes[(6, s)]), ""]
        lines += ["| method | request | answer | what |", "|---|---|---|---|"]
        for m, method in enumerate(service.method):
            lines.append(
                f"| `{method.name}` | {_link(method.input_type)} | {_link(method.output_type)} "
                f"| {_cell(notes.get((6, s, 2, m), ''))} |"
            )
        lines.append("")
    for e, enum in enumerate(file.enum_type):
        lines += _enum(enum.name, enum, (5, e), notes)
    for name, message, path in _messages(file.message_type, (4,), ""):
        lines += [f"### `{name}`", ""]
        if path in notes:
            lines += [_paragraph(notes[path]), ""]
        if message.field:
            lines += ["| field | type | number | what |", "|---|---|---|---|"]
            for f, field in enumerate(message.field):
                lines.append(
                    f"| `{field.name}` | {_field_type(field, maps)} | {field.number} "
                    f"| {_cell(notes.get((*path, 2, f), ''))} |"
                )
            lines.append("")
        for e, enum in enumerate(message.enum_type):
            lines += _enum(f"{name}.{enum.name}", enum, (*path, 4, e), notes)
    return "\n".join(lines)


def proto_reference(files: Sequence[Path] | None = None) -> str:
    """Every service, method, message, field and enum of the .proto files, with their comments."""
    chosen = sorted((PROTO_ROOT / "tracehouse" / "v1").glob("*.proto")) if files is None else list(files)
    parsed = descriptor_set(chosen)
    wanted = {str(path.relative_to(PROTO_ROOT)) for path in chosen}
    return "\n".join(file_reference(file) for file in parsed.file if file.name in wanted)
