"""torch, only where the caller brought it: a tensor's value taken on the caller's thread (a
CUDA tensor's copy to the host started, not waited for) and torch.cuda.nvtx for NVTX ranges."""

from __future__ import annotations

import sys
from typing import Any

from agent.training.records import log


class _CudaValue:
    """A CUDA tensor's value on its way to the host: the worker waits for `ready` before reading `value`."""

    __slots__ = ("ready", "value")

    def __init__(self, value: Any, ready: Any) -> None:
        self.value = value
        self.ready = ready


def _snapshot(tensor: Any) -> Any:
    """A tensor's value as it is now, taken on the caller's thread (the caller may change the
    tensor in place before the worker reads it): a detached copy; for a CUDA tensor, a copy to
    the host started now, without waiting for it, and an event that marks its end. A tensor
    of more than one element is not copied: it is refused as invalid anyway."""
    detached = tensor.detach()
    numel = getattr(detached, "numel", None)
    if numel is not None and numel() != 1:
        return detached
    if getattr(detached, "is_cuda", False):
        copied = detached.to("cpu", non_blocking=True)
        ready = sys.modules["torch"].cuda.Event()
        ready.record()
        return _CudaValue(copied, ready)
    return detached.clone()


def _nvtx_module(wanted: bool | None) -> Any:
    """torch.cuda.nvtx when NVTX ranges are wanted and work; None otherwise. By default
    (None) only where the caller has imported torch and CUDA is available."""
    if wanted is False:
        return None
    torch = sys.modules.get("torch")
    try:
        if wanted is None and (torch is None or not torch.cuda.is_available()):
            return None
        import torch.cuda.nvtx as nvtx

        nvtx.range_push("tracehouse")  # a CPU-only build has the module but raises here
        nvtx.range_pop()
        return nvtx
    except Exception as error:
        log.warning("tracehouse: no NVTX ranges (%s)", error)
        return None
