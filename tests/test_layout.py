"""The autograder's house: its layers hold (``make lint`` checks them with import-linter,
from the contracts in pyproject.toml), a back-import or a circle would break them, every
module lives in a layer, and no module reaches for another's private names."""

import ast
import importlib
from copy import deepcopy
from pathlib import Path

import pytest

# Both come with the dev tools (`make lint`); a GPU image without them still runs the rest.
grimp = pytest.importorskip("grimp")
pytest.importorskip("importlinter")
from importlinter import api  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = {c["id"]: c for c in api.read_configuration(str(ROOT / "pyproject.toml"))
             ["contracts_options"]}
TYPES = {"layers": "importlinter.contracts.layers.LayersContract",
         "independence": "importlinter.contracts.independence.IndependenceContract",
         "acyclic_siblings": "importlinter.contracts.acyclic_siblings.AcyclicSiblingsContract"}
ROOTS = ["rooflab.autograder", "rooflab.kernels"]


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph(*ROOTS, cache_dir=None)


def kept(contract_id: str, graph) -> bool:
    options = CONTRACTS[contract_id]
    module, _, name = TYPES[options["type"]].rpartition(".")
    contract = getattr(importlib.import_module(module), name)(
        name=options["name"], session_options={"root_packages": ROOTS},
        contract_options=options)
    return contract.check(deepcopy(graph), verbose=False).kept


def with_import(graph, importer: str, imported: str):
    """A copy of ``graph`` with one more import, as if ``importer`` had written it."""
    changed = deepcopy(graph)
    changed.add_import(importer=importer, imported=imported, line_number=1,
                       line_contents=f"import {imported}")
    return changed


@pytest.mark.parametrize("contract", sorted(CONTRACTS))
def test_the_contracts_hold(contract, graph):
    assert kept(contract, graph)


@pytest.mark.parametrize("importer, imported", [
    # the device layer reaching up for the engine: a lower layer importing a higher one
    ("rooflab.autograder.device.timing", "rooflab.autograder.checking.engine"),
    # the model importing a course kernel, which imports the model: a circle
    ("rooflab.autograder.model.traffic", "rooflab.kernels.matmul"),
    # grading and bench are siblings: neither may know the other
    ("rooflab.autograder.bench.gate", "rooflab.autograder.grading.gradebook"),
])
def test_a_back_import_breaks_the_layers(importer, imported, graph):
    assert not kept("layers", with_import(graph, importer, imported))


def test_a_circle_inside_a_package_breaks_the_acyclic_contract(graph):
    """Layers say nothing about two modules of one package; a circle there is caught too."""
    # report words the runs launch reads back: launch importing report closes a circle
    broken = with_import(graph, "rooflab.autograder.ranks.launch",
                         "rooflab.autograder.ranks.report")
    assert kept("layers", broken)
    assert not kept("acyclic", broken)


def test_two_labs_problems_must_not_know_each_other(graph):
    broken = with_import(graph, "rooflab.autograder.problems.fsdp",
                         "rooflab.autograder.problems.topk")
    assert not kept("labs", broken)


def test_every_module_is_in_a_layer_and_nothing_imports_the_face(graph):
    """The top level holds the face (__init__), the command line and what defines a
    problem; every other module is in a sub-package of one concern, named in a layer."""
    layers = [name.strip() for row in CONTRACTS["layers"]["layers"] for name in row.split("|")]
    for module in graph.modules:
        if module in ROOTS:
            continue
        assert any(module == layer or module.startswith(layer + ".") for layer in layers), \
            f"{module} is in no layer of pyproject.toml's contract"
    assert not graph.find_modules_that_directly_import("rooflab.autograder")
    top = sorted(p.name for p in (ROOT / "autograder").iterdir()
                 if p.suffix == ".py" or (p / "__init__.py").exists())
    assert top == ["__init__.py", "bench", "checking", "cli.py", "confine", "course", "device",
                   "evidence", "grading", "model", "problem.py", "problems", "ranks"]


def private_imports(path: Path) -> list[str]:
    """``from X import _name`` statements of one file (``__future__`` aside)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            found += [f"{path.name}:{node.lineno} {alias.name}" for alias in node.names
                      if alias.name.startswith("_")]
    return found


def test_no_module_imports_another_ones_private_names():
    """What two modules share is a public name of the lower one."""
    files = [*(ROOT / "autograder").rglob("*.py"), *(ROOT / "kernels").rglob("*.py")]
    assert [found for path in files for found in private_imports(path)] == []
