"""pyarrow and numpy in a process that only converts data, started without what it never uses.

- pandas: pyarrow imports it (when installed) at its first `pa.array`, to recognise pandas objects
  among the values it converts: about 0.2 s of CPU and 40 MB of memory, the largest part of an
  importer's start. A process that only ever hands pyarrow lists, numpy arrays and Arrow data
  (`tracehouse import`, the agent) lets pyarrow find pandas absent, once, before its first
  conversion. pandas itself stays importable, and pyarrow's own pandas conversions (`to_pandas`)
  still find it.
- OpenBLAS's threads: numpy starts its BLAS library's thread pool (a thread a core) when it is
  imported, and the pool spins for about 0.1 s of CPU though nothing here multiplies matrices.
  numpy is imported with the pool at one thread; the environment is given back as it was, so
  that processes started later (a `tracehouse run` job) get the user's settings."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType

BLAS_THREADS = "OPENBLAS_NUM_THREADS"


class _NoPandas(MetaPathFinder):
    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> ModuleSpec | None:
        if name == "pandas":
            raise ModuleNotFoundError("pandas is left out of this process", name=name)
        return None


def arrow_without_pandas() -> None:
    """numpy imported with one BLAS thread (numpy_without_blas_threads), then pyarrow's one attempt
    to import pandas made now, and failed. Call it before anything converts data with pyarrow; once
    pandas is imported, it changes nothing."""
    numpy_without_blas_threads()
    if "pandas" in sys.modules:
        return
    import pyarrow as pa

    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(finder)


def numpy_without_blas_threads() -> None:
    """numpy imported with OpenBLAS's pool at one thread, unless numpy is imported already or the
    user chose the pool's size; the environment is left as it was."""
    if "numpy" in sys.modules or BLAS_THREADS in os.environ:
        return
    os.environ[BLAS_THREADS] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        del os.environ[BLAS_THREADS]
