"""The host agent: samples NVML (or simulated GPUs) and host metrics at a fixed rate and
ships columnar batches to `tracehouse serve`, spooling to disk while the server is away."""
