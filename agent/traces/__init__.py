"""Trace files: Nsight Systems exports and PyTorch-profiler traces read, checked and imported; the
folder watcher; synthetic generators of both formats."""
