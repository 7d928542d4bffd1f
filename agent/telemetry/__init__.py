"""Sampling: GPU backends (NVML, simulated), host metrics, the fixed-rate schedule and sampler."""
