"""Load a GPU for the device check: bf16 matmuls for --seconds, in this process and in
--children processes of its own (spawned), each holding its own GPU memory. Prints one
JSON line per process: pid, GiB held, TFLOP/s reached."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time


def load(seconds: float, size: int, hold_gib: float) -> None:
    import torch

    held = torch.empty(int(hold_gib * (1 << 30)), dtype=torch.uint8, device="cuda")
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    started, done = time.monotonic(), 0
    while time.monotonic() - started < seconds:
        for _ in range(20):
            a @ b
        torch.cuda.synchronize()
        done += 20
    elapsed = time.monotonic() - started
    flops = 2 * size**3 * done / elapsed / 1e12
    print(json.dumps({"pid": os.getpid(), "held_gib": hold_gib, "tflops": round(flops, 1), "seconds": round(elapsed, 1),
                      "held_bytes": held.numel()}), flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--children", type=int, default=0)
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    children = [context.Process(target=load, args=(args.seconds, 4096, 2.0 * (i + 1))) for i in range(args.children)]
    for child in children:
        child.start()
    load(args.seconds, 8192, 8.0)
    for child in children:
        child.join()


if __name__ == "__main__":
    main()
