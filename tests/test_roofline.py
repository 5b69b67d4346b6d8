import json

import pytest
import torch

from rooflab.autograder import datasheet, roofline
from rooflab.autograder.device import Device, current
from rooflab.autograder.problem import Cost

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

H100 = Device(kind="gpu", name="NVIDIA H100 80GB HBM3", torch_device="cuda", driver="12.8")
CPU = Device(kind="cpu", name="Some CPU", torch_device="cpu")


def simple_ceilings() -> roofline.Ceilings:
    # 1 TB/s and 100 TFLOP/s fp32: the ridge is at 100 FLOP/byte.
    return roofline.Ceilings("test card", "measured", 1e12, {"fp32": 1e14})


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ROOFLAB_CACHE_DIR", str(tmp_path))
    return tmp_path


# --- time floor --------------------------------------------------------------------------


def test_time_floor_memory_bound():
    floor = roofline.time_floor(Cost(flops=1e10, bytes=4e10), simple_ceilings())
    assert floor.compute_s == pytest.approx(1e-4)
    assert floor.memory_s == pytest.approx(0.04)
    assert floor.seconds == pytest.approx(0.04)
    assert floor.bound == "memory"


def test_time_floor_compute_bound():
    floor = roofline.time_floor(Cost(flops=1e12, bytes=1e9), simple_ceilings())
    assert floor.compute_s == pytest.approx(0.01)
    assert floor.memory_s == pytest.approx(0.001)
    assert floor.seconds == pytest.approx(0.01)
    assert floor.bound == "compute"


def test_time_floor_uses_the_cost_dtype():
    ceil = roofline.from_datasheet("H100 SXM")
    floor = roofline.time_floor(Cost(flops=989.4e12, bytes=1.0, dtype="bf16"), ceil)
    assert floor.compute_s == pytest.approx(1.0)
    assert floor.bound == "compute"


def test_time_floor_without_flops_is_memory_bound_even_for_unknown_dtype():
    floor = roofline.time_floor(Cost(flops=0, bytes=2e12, dtype="fp8"), simple_ceilings())
    assert floor.compute_s == 0.0
    assert floor.seconds == pytest.approx(2.0)
    assert floor.bound == "memory"


def test_time_floor_unknown_dtype_raises():
    with pytest.raises(KeyError, match="fp8"):
        roofline.time_floor(Cost(flops=1.0, bytes=1.0, dtype="fp8"), simple_ceilings())


def test_roofline_fraction():
    floor = roofline.time_floor(Cost(flops=0, bytes=1e9), simple_ceilings())  # 1 ms
    assert roofline.roofline_fraction(floor, 2e-3) == pytest.approx(0.5)
    assert roofline.roofline_fraction(floor, 1e-3) == pytest.approx(1.0)


def test_ridge():
    assert simple_ceilings().ridge("fp32") == pytest.approx(100.0)
    h100 = roofline.from_datasheet("H100 SXM")
    assert h100.ridge("bf16") == pytest.approx(989.4e12 / 3.35e12)


# --- datasheet ---------------------------------------------------------------------------


def test_from_datasheet_default_is_h100_sxm():
    ceil = roofline.from_datasheet()
    assert ceil.device == "H100 SXM"
    assert ceil.source == "datasheet"
    assert ceil.bandwidth == pytest.approx(3.35e12)
    assert ceil.flops["bf16"] == pytest.approx(989.4e12)
    assert "not measured" in ceil.label


def test_from_datasheet_accepts_card_and_device_name():
    card = datasheet.CARDS["L4"]
    assert roofline.from_datasheet(card).device == "L4"
    assert roofline.from_datasheet("NVIDIA L4").device == "L4"


def test_from_datasheet_copies_flops():
    ceil = roofline.from_datasheet("T4")
    ceil.flops["bf16"] = 1.0
    assert "bf16" not in datasheet.CARDS["T4"].flops


@pytest.mark.parametrize(
    ("device_name", "card"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
        ("NVIDIA A100 80GB PCIe", "A100 80GB"),
        ("NVIDIA L4", "L4"),
        ("Tesla T4", "T4"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA L40S", "L40S"),
    ],
)
def test_lookup_real_device_names(device_name, card):
    found = datasheet.lookup(device_name)
    assert found is not None
    assert found.name == card


@pytest.mark.parametrize("device_name", ["AMD Instinct MI300X", "Intel(R) Xeon(R) CPU", ""])
def test_lookup_unknown_is_none(device_name):
    assert datasheet.lookup(device_name) is None


def test_get_by_table_name_and_device_name():
    assert datasheet.get("A100 40GB") is datasheet.CARDS["A100 40GB"]
    assert datasheet.get("Tesla T4") is datasheet.CARDS["T4"]


def test_get_unknown_raises_with_known_list():
    with pytest.raises(KeyError) as info:
        datasheet.get("Voodoo 2")
    message = str(info.value)
    assert "Voodoo 2" in message
    for name in datasheet.CARDS:
        assert name in message


def test_datasheet_for_gpu_and_cpu():
    ceil = roofline.datasheet_for(H100)
    assert ceil is not None and ceil.device == "H100 SXM"
    assert roofline.datasheet_for(CPU) is None


# --- cache ---------------------------------------------------------------------------------


def test_cache_round_trip(cache_dir):
    measured = roofline.Ceilings(H100.name, "measured", 3.0e12, {"bf16": 7.5e14, "fp32": 5e13},
                                 driver="12.8", measured_at="2025-01-01T00:00:00+00:00")
    path = roofline.save(measured, H100)
    assert path.exists()
    assert path.parent == cache_dir
    assert roofline.load_cached(H100) == measured


def test_load_cached_missing_is_none(cache_dir):
    assert roofline.load_cached(H100) is None


def test_cache_path_differs_by_driver(cache_dir):
    other = Device(kind="gpu", name=H100.name, torch_device="cuda", driver="13.0")
    assert roofline.cache_path(H100) != roofline.cache_path(other)
    assert roofline.cache_path(H100).parent == cache_dir
    assert roofline.cache_path(H100).name.endswith(".json")


def test_cache_path_differs_by_device_name(cache_dir):
    other = Device(kind="gpu", name="NVIDIA H200", torch_device="cuda", driver="12.8")
    assert roofline.cache_path(H100) != roofline.cache_path(other)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", json.dumps({"unexpected": 1}), ""])
def test_corrupt_cache_is_none(cache_dir, text):
    path = roofline.cache_path(H100)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    assert roofline.load_cached(H100) is None


def test_cache_dir_honours_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.delenv("ROOFLAB_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert roofline.cache_dir() == tmp_path / "xdg" / "rooflab"


def test_cache_dir_falls_back_to_home(tmp_path, monkeypatch):
    monkeypatch.delenv("ROOFLAB_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert roofline.cache_dir() == tmp_path / ".cache" / "rooflab"


def test_rooflab_cache_dir_beats_xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("ROOFLAB_CACHE_DIR", str(tmp_path / "mine"))
    assert roofline.cache_dir() == tmp_path / "mine"


# --- measuring -----------------------------------------------------------------------------


def test_measure_refuses_a_cpu_device():
    with pytest.raises(RuntimeError, match="GPU"):
        roofline.measure(CPU)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU path")
def test_measure_raises_on_cpu():
    with pytest.raises(RuntimeError, match="from_datasheet"):
        roofline.measure()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU path")
def test_ceilings_raises_on_cpu_without_cache(cache_dir):
    with pytest.raises(RuntimeError):
        roofline.ceilings()


# --- GPU -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_cache_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        path = tmp_path_factory.mktemp("rooflab-cache")
        mp.setenv("ROOFLAB_CACHE_DIR", str(path))
        yield path


@pytest.mark.gpu
@needs_cuda
def test_measured_ceilings_near_datasheet(gpu_cache_dir):
    measured = roofline.ceilings(remeasure=True)
    assert measured.source == "measured"
    assert roofline.cache_path(current()).exists()
    assert roofline.load_cached(current()) == measured
    card = datasheet.lookup(current().name)
    if card is None:
        pytest.skip(f"no datasheet entry for {current().name}")
    ratio = measured.bandwidth / card.bandwidth
    assert 0.3 < ratio < 1.2, f"bandwidth {ratio:.2f}x datasheet"
    for dtype, peak in card.flops.items():
        if dtype not in measured.flops:
            continue
        ratio = measured.flops[dtype] / peak
        assert 0.3 < ratio < 1.2, f"{dtype} {ratio:.2f}x datasheet"


@pytest.mark.gpu
@needs_cuda
def test_library_matmul_reaches_the_roofline(gpu_cache_dir):
    from rooflab.autograder.timing import time_gpu

    n = 4096
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    timing = time_gpu(lambda: torch.matmul(a, b))
    floor = roofline.time_floor(Cost(flops=2 * n**3, bytes=3 * n * n * 2, dtype="bf16"),
                                roofline.ceilings())
    assert floor.bound == "compute"
    assert roofline.roofline_fraction(floor, timing.median_s) >= 0.6
