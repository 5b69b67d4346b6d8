"""Will a kernel's ``tl.dot`` keep the tensor cores busy, and does its tile fit an SM?

Read from the interpreter's trace (``trace.Launch.dots`` and the launch's integer
arguments), so a CPU can say what a GPU would do with the same kernel:

* operands: fp16/bf16 tiles go to the tensor cores at full rate. Tiles upcast to fp32
  before ``tl.dot`` run as TF32 at half that rate at best (or on the CUDA cores, ~15× slower,
  with ``input_precision="ieee"``). An fp16 accumulator loses accuracy for no gain.
* tile shape: a tile of BLOCK_M × BLOCK_N does M·N/(M+N) FLOPs per byte it loads. Smaller tiles
  leave the matrix units idle between loads and fetch each input byte more often.
* shared memory: ``num_stages`` copies of an A tile and a B tile must fit the SM's shared
  memory (227 KiB a block on H100/H200; 163 KiB on A100; 99 KiB on Ada).
* registers: the fp32 accumulator is spread over ``num_warps × 32`` threads. Beyond about
  128 fp32 values a thread (of at most 255 registers) the compiler spills to local memory.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .trace_data import Dot, Launch

# Triton's launch defaults when a kernel is launched without them.
DEFAULT_NUM_WARPS, DEFAULT_NUM_STAGES = 4, 3
_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4, "fp8e4nv": 1, "fp8e5": 1}


@dataclass(frozen=True)
class TileRules:
    # FLOPs per byte loaded by a BLOCK_M × BLOCK_N tile: 2·M·N·K / ((M + N)·K·2 bytes) =
    # M·N / (M + N): 32 at 64×64, 64 at 128×128. Hopper needs the latter to stay fed.
    min_m: int = 128
    min_n: int = 128
    min_k: int = 32
    shared_memory: int = 227 * 1024  # bytes a block may use on H100/H200
    accumulator_per_thread: int = 128  # fp32 registers, of at most 255

    def shared_bytes(self, dot: Dot, stages: int) -> int:
        return stages * (dot.m * dot.k + dot.k * dot.n) * _BYTES.get(dot.operand, 4)

    @staticmethod
    def accumulator_registers(dot: Dot, warps: int) -> int:
        return dot.m * dot.n // (warps * 32)


HOPPER = TileRules()


def rules_for(card) -> TileRules:
    """The tile rules with a datasheet card's shared memory (Hopper's when unknown)."""
    shared = getattr(card, "shared_memory", 0)
    return TileRules(shared_memory=shared) if shared else HOPPER


def main_dot(launch: Launch) -> Dot | None:
    """The dot a launch ran most often: its full tile (all tiles have one shape)."""
    counts = Counter(launch.dots)
    return counts.most_common(1)[0][0] if counts else None


def failures(launches: list[Launch], input_dtype: str, rules: TileRules = HOPPER) -> list[str]:
    """Why the matrix units would be starved or the tile would not fit, in words; empty
    when the launches' dots look like a tensor-core kernel."""
    dots = [(launch, main_dot(launch)) for launch in launches]
    dots = [(launch, dot) for launch, dot in dots if dot is not None]
    if not dots:
        return ["no tl.dot ran: the tensor cores are only reached through tl.dot"]
    found = []
    for launch, dot in dots:
        where = f"{launch.kernel}'s tl.dot ({dot.m}×{dot.k} @ {dot.k}×{dot.n})"
        if input_dtype in ("fp16", "bf16") and dot.operand == "fp32":
            found.append(f"{where} multiplies fp32 tiles: the {input_dtype} inputs were upcast "
                         f"before the dot, which runs at half the {input_dtype} rate at best "
                         "(TF32); pass the loaded tiles to tl.dot as they are")
        if dot.accumulator in ("fp16", "bf16"):
            found.append(f"{where} accumulates in {dot.accumulator}: accumulate in fp32 "
                         "(tl.zeros(..., dtype=tl.float32)); it costs nothing on tensor cores")
        if dot.m < rules.min_m or dot.n < rules.min_n:
            reuse = dot.m * dot.n / (dot.m + dot.n)
            found.append(f"{where}: a {dot.m}×{dot.n} tile does {reuse:.0f} FLOPs per byte "
                         f"it loads ({rules.min_m}×{rules.min_n}: "
                         f"{rules.min_m * rules.min_n / (rules.min_m + rules.min_n):.0f}); "
                         "at 989 TFLOP/s that asks more of L2 and shared memory than they "
                         f"deliver. Use at least {rules.min_m}×{rules.min_n}")
        if dot.k < rules.min_k:
            found.append(f"{where}: BLOCK_K = {dot.k} gives each step of the K loop too "
                         "little work to hide its loads (and is one 16-deep instruction); "
                         f"use BLOCK_K ≥ {rules.min_k}")
        found += misfits(launch, dot, rules)
    return found


def misfits(launch: Launch, dot: Dot, rules: TileRules = HOPPER) -> list[str]:
    """Why this launch's tile would not fit one SM: shared memory, accumulator registers."""
    where = f"{launch.kernel}'s tl.dot ({dot.m}×{dot.k} @ {dot.k}×{dot.n})"
    found = []
    stages = launch.options.get("num_stages", DEFAULT_NUM_STAGES)
    warps = launch.options.get("num_warps", DEFAULT_NUM_WARPS)
    shared = rules.shared_bytes(dot, stages)
    if shared > rules.shared_memory:
        found.append(f"{where} with num_stages={stages} needs {shared >> 10} KiB of shared "
                     f"memory; an SM offers {rules.shared_memory >> 10} KiB: fewer stages or "
                     "a smaller BLOCK_K")
    registers = rules.accumulator_registers(dot, warps)
    if registers > rules.accumulator_per_thread:
        found.append(f"{where} with num_warps={warps} holds {registers} fp32 accumulator "
                     f"values per thread (more than {rules.accumulator_per_thread}: spills "
                     "to local memory); use more warps or a smaller tile")
    return found
