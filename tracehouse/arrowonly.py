"""pyarrow in a process that hands it no pandas objects, without importing pandas.

pyarrow imports pandas (when installed) at its first `pa.array`, to recognise pandas objects among
the values it converts: about 0.2 s of CPU and 40 MB of memory, the largest part of an importer's
start. A process that only ever hands pyarrow lists, numpy arrays and Arrow data (`tracehouse
import`, the agent) lets pyarrow find pandas absent, once, before its first conversion. pandas
itself stays importable, and pyarrow's own pandas conversions (`to_pandas`) still find it."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType


class _NoPandas(MetaPathFinder):
    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> ModuleSpec | None:
        if name == "pandas":
            raise ModuleNotFoundError("pandas is left out of this process", name=name)
        return None


def arrow_without_pandas() -> None:
    """pyarrow's one attempt to import pandas made now, and failed. Call it before anything converts
    data with pyarrow; once pandas is imported, it changes nothing."""
    if "pandas" in sys.modules:
        return
    import pyarrow as pa

    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(finder)
