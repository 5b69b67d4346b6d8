"""One benchmark's kernel, run once for a profiler to see, on the inputs `rooflab bench`
times it on:

    ncu --profile-from-start off python3 bench/profile.py topk topk_radix "256x262144 k=256"
    python3 bench/profile.py kmeans update --list      # what would run (any machine)

Each chosen kernel runs once to compile and warm up, then once more between
cudaProfilerStart and cudaProfilerStop: with ``--profile-from-start off``, Nsight Compute
profiles that call's launches and nothing else (no autotuning, no warm-up, no check).
"""

from __future__ import annotations

import argparse
import sys

import torch

from rooflab.autograder.bench import BENCHES


def label(load) -> str:
    """A workload as the command line matches it: its shape, then its dtype."""
    return f"{load.shape} {str(load.dtype).removeprefix('torch.')}"


def chosen(bench: str, kernel: str, shape: str, device: str) -> list[tuple]:
    """(workload, kernel name, kernel) for every kernel of ``bench`` whose name contains
    ``kernel``, in every workload whose label (shape and dtype) contains ``shape``."""
    return [(load, name, fn) for load in BENCHES[bench](device) if shape in label(load)
            for name, fn in load.kernels.items() if kernel in name]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bench", choices=sorted(BENCHES))
    parser.add_argument("kernel", help="part of a kernel's name, as rooflab bench prints it")
    parser.add_argument("shape", nargs="?", default="",
                        help="part of a workload's shape and dtype, such as "
                        "'4096x4096x4096 float32' (default: every one)")
    parser.add_argument("--list", action="store_true", help="say what would run, run nothing")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    runs = chosen(args.bench, args.kernel, args.shape, device)
    for load, name, _ in runs:
        print(f"{args.bench}: {label(load)}: {name}")
    if not runs:
        print(f"no kernel of {args.bench} matches {args.kernel!r} at {args.shape!r}",
              file=sys.stderr)
        return 2
    if args.list:
        return 0
    if device != "cuda":
        print("profiling needs a CUDA GPU", file=sys.stderr)
        return 2
    cudart = torch.cuda.cudart()
    for load, name, fn in runs:
        inputs = load.make()
        fn(*inputs)  # compiles (and autotunes) outside the profiled range
        torch.cuda.synchronize()
        cudart.cudaProfilerStart()
        fn(*inputs)
        torch.cuda.synchronize()
        cudart.cudaProfilerStop()
        print(f"profiled {args.bench}: {label(load)}: {name}", flush=True)
        del inputs
    return 0


if __name__ == "__main__":
    sys.exit(main())
