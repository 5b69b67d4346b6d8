import pytest

from rooflab.autograder.device import versions

GOOD = {"python": "3.12.3", "torch": "2.13.0+cpu", "triton": "3.9.0", "numpy": "2.4.1"}


def found(**changes):
    return {**GOOD, **changes}


@pytest.mark.parametrize("interpreter", [True, False])
def test_all_good_is_empty(interpreter):
    assert versions.known_problems(GOOD, interpreter=interpreter) == []


def test_triton_36_numpy_24_breaks_the_interpreter():
    problems = versions.known_problems(found(triton="3.6.0", numpy="2.4.1"), interpreter=True)
    assert len(problems) == 1
    assert "numpy<2.4" in problems[0]
    assert "3.6.0" in problems[0] and "2.4.1" in problems[0]


def test_triton_36_numpy_24_is_fine_on_a_gpu():
    assert versions.known_problems(found(triton="3.6.0", numpy="2.4.1"), interpreter=False) == []


def test_triton_36_with_older_numpy_is_fine():
    assert versions.known_problems(found(triton="3.6.0", numpy="2.3.5"), interpreter=True) == []


def test_triton_37_numpy_24_is_fine():
    assert versions.known_problems(found(triton="3.7.0", numpy="2.4"), interpreter=True) == []


def test_triton_36_numpy_24_follows_the_interpreter_variable(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert len(versions.known_problems(found(triton="3.6.0", numpy="2.4.1"))) == 1
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert versions.known_problems(found(triton="3.6.0", numpy="2.4.1")) == []


def test_old_torch():
    problems = versions.known_problems(found(torch="2.3.1"), interpreter=False)
    assert len(problems) == 1
    assert "torch 2.3.1 is too old" in problems[0]


def test_torch_minor_versions_compare_as_numbers():
    assert versions.known_problems(found(torch="2.10.0"), interpreter=False) == []


@pytest.mark.parametrize("triton", ["3.5.1", "3.10.0", "2.3.0", "4.0.0"])
def test_unsupported_triton(triton):
    problems = versions.known_problems(found(triton=triton), interpreter=False)
    assert len(problems) == 1
    assert f"triton {triton} is not supported" in problems[0]


@pytest.mark.parametrize("triton", ["3.6.0", "3.8.1", "3.9.0+git1234"])
def test_supported_triton(triton):
    assert versions.known_problems(found(triton=triton, numpy="2.0.0"), interpreter=True) == []


@pytest.mark.parametrize("package", ["torch", "triton"])
def test_missing_package(package):
    for missing in (found(**{package: None}), {k: v for k, v in GOOD.items() if k != package}):
        problems = versions.known_problems(missing, interpreter=False)
        assert problems == [f"{package} is not installed"]


def test_missing_numpy_is_not_a_problem():
    assert versions.known_problems(found(numpy=None, triton="3.6.0"), interpreter=True) == []


def test_old_python():
    problems = versions.known_problems(found(python="3.9.1"), interpreter=False)
    assert len(problems) == 1
    assert "python 3.9.1 is too old" in problems[0]


def test_several_problems_at_once():
    bad = {"python": "3.8.0", "torch": None, "triton": "3.5.0", "numpy": "2.4.0"}
    assert len(versions.known_problems(bad, interpreter=True)) == 3


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2.13.0+cpu", (2, 13, 0)),
        ("2.4.0+cu124", (2, 4, 0)),
        ("3.6.0", (3, 6, 0)),
        ("2.4", (2, 4)),
        ("2.5.0a0", (2, 5, 0)),
        ("1.2.3.4", (1, 2, 3)),
        (None, (0,)),
    ],
)
def test_version_strings_parse(text, expected):
    assert versions._tuple(text) == expected


def test_installed_lists_python_and_packages():
    found_here = versions.installed()
    assert found_here["python"]
    assert found_here["torch"] is not None
    assert set(versions.PACKAGES) <= set(found_here)


def test_version_of_a_missing_package_is_none():
    assert versions.version("no-such-package-rooflab-test") is None


def test_missing_python_key_does_not_crash():
    partial = {k: v for k, v in GOOD.items() if k != "python"}
    assert versions.known_problems(partial, interpreter=False) == []


def test_two_part_prerelease_is_supported():
    assert versions.known_problems(found(triton="3.7rc1"), interpreter=False) == []
