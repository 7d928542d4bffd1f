"""Regenerate the committed protobuf/gRPC Python code from proto/: `python -m tracehouse.protogen`."""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO / "proto"
PACKAGE = "tracehouse/v1"

# Lines that name the generator's version; they differ between equally valid generators.
_VERSION_LINE = re.compile(
    r"^(# Protobuf Python Version:.*|GRPC_GENERATED_VERSION = .*|\s+\d+,\s*$|\s+'',\s*$)\n", re.MULTILINE
)


def proto_files() -> list[Path]:
    return sorted((PROTO_ROOT / PACKAGE).glob("*.proto"))


def generate(out_dir: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) over every .proto; return the files it wrote."""
    from grpc_tools import protoc  # a test/dev dependency only

    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{Path(protoc.__file__).parent / '_proto'}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(p) for p in proto_files()],
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed")
    return sorted(p for p in (out_dir / PACKAGE).iterdir() if p.suffix in (".py", ".pyi"))


def normalized(text: str) -> str:
    return _VERSION_LINE.sub("", text)


def main() -> int:
    written = generate(REPO)
    print("\n".join(str(p.relative_to(REPO)) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
