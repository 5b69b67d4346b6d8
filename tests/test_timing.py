import time
from types import SimpleNamespace

import pytest
import torch

from rooflab.autograder.device import timing


def test_cpu_stand_in_times_a_sleep_in_ms():
    median_ms = timing.cpu_stand_in(lambda: time.sleep(0.002))
    assert 1.5 < median_ms < 50


@pytest.mark.parametrize(("warmup", "rep"), [(1, 3), (2, 5), (0, 1)])
def test_cpu_stand_in_calls_warmup_plus_rep_times(warmup, rep):
    calls = []
    timing.cpu_stand_in(lambda: calls.append(1), warmup=warmup, rep=rep)
    assert len(calls) == warmup + rep


def test_cpu_stand_in_default_counts():
    calls = []
    timing.cpu_stand_in(lambda: calls.append(1))
    assert len(calls) == 4


def test_cpu_stand_in_accepts_do_bench_keywords():
    result = timing.cpu_stand_in(lambda: None, quantiles=None, return_mode="median",
                                 grad_to_none=None)
    assert isinstance(result, float)
    assert result >= 0


def test_cpu_stand_in_returns_the_median_not_the_mean(monkeypatch):
    clock = SimpleNamespace(now=0.0)
    durations = iter([0.5, 0.001, 0.100, 0.003])  # seconds: one warmup, then three reps

    def work():
        clock.now += next(durations)

    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: clock.now))
    assert timing.cpu_stand_in(work, warmup=1, rep=3) == pytest.approx(3.0)


def test_timing_median_us():
    assert timing.Timing(2.5e-6, "cuda graph").median_us == pytest.approx(2.5)


@pytest.mark.cpu("checks the CPU path")
def test_time_gpu_raises_on_cpu():
    with pytest.raises(RuntimeError, match="CUDA"):
        timing.time_gpu(lambda: None)


@pytest.mark.gpu
def test_time_gpu_large_copy_uses_do_bench():
    src = torch.empty(1 << 28, device="cuda", dtype=torch.float32)  # 1 GiB
    dst = torch.empty_like(src)
    result = timing.time_gpu(lambda: dst.copy_(src))
    assert result.method == "do_bench"
    # 2 GiB moved: 0.1 ms would be over 20 TB/s, 50 ms under 45 GB/s.
    assert 1e-4 < result.median_s < 5e-2


@pytest.mark.gpu
def test_time_gpu_tiny_kernel_uses_cuda_graph():
    a = torch.randn(1024, device="cuda")
    b = torch.randn(1024, device="cuda")
    result = timing.time_gpu(lambda: torch.add(a, b))
    assert result.method == "cuda graph"
    assert 0 < result.median_s < timing.CUDA_GRAPH_BELOW_S
