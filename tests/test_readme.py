"""The README is the front door, the book holds the manual: the README stays short, its
links lead to files that exist and to book pages that `make book` builds (they are in
book/myst.yml's contents), every command the README once showed is still written down
somewhere, and the performance model's page states the time model's constants as the code
has them."""

import ast
import re
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BOOK = ROOT / "book"
MAX_LINES = 250

# Every command the README showed when it held the whole manual (716 lines, before the
# manual moved into book/guides/): each line of its ```sh blocks, less a trailing comment,
# and each inline `make …` or `rooflab …`. Frozen here, since that README is gone.
OLD_README_COMMANDS = (
    "make lab",
    "make test",
    "make test TORCH_INDEX=https://download.pytorch.org/whl/cpu",
    'make lab LAB_ARGS="--no-browser --ip 0.0.0.0 --port 8899"',
    ".venv/bin/rooflab list",
    ".venv/bin/rooflab check coalescing/vector_add my_add.py:add",
    ".venv/bin/rooflab doctor",
    ".venv/bin/rooflab roofline [--remeasure] [--html roof.html] [--json roof.json]",
    ".venv/bin/rooflab trace coalescing/transpose my_transpose.py:transpose",
    ".venv/bin/rooflab bench matmul --json bench/results/",
    ".venv/bin/rooflab bench fsdp",
    "torchrun --standalone --nproc-per-node=N -m rooflab.kernels.collectives",
    ".venv/bin/rooflab release course/",
    ".venv/bin/rooflab grade submissions/* --out gradebook/ --course course/ \\",
    "--deadline 2026-12-01T23:59 --late-penalty 10% --roster learners.csv",
    "#!/bin/bash",
    "#SBATCH --array=1-8 --gpus=1 --time=04:00:00",
    "course/.venv/bin/rooflab grade submissions/* --course course/ \\",
    "--out shards/$SLURM_ARRAY_TASK_ID --shard $SLURM_ARRAY_TASK_ID/8 \\",
    "--deadline 2026-12-01T23:59 --late-penalty 10%",
    "make",
    "rooflab doctor",
    "make build",
    "rooflab check",
    "rooflab roofline",
    "rooflab",
    "rooflab grade",
    "rooflab build",
    "rooflab release OUT/",
    "rooflab grade SUBMISSION… --out DIR",
    "rooflab grade --merge shard-* --out gradebook/",
    "course/.venv/bin/rooflab grade --merge shards/* --out gradebook/ --roster learners.csv",
    "make book",
    "make gpu-check",
    "make gpu-test",
    "make gpu-notebooks",
    "rooflab bench coalescing|matmul|softmax|attention|topk|sampling|kmeans|amp|allreduce|fsdp",
    "make gpu-bench",
    "rooflab bench NAME --baseline FILE",
    "rooflab bench",
    "rooflab trace",
    "make lint",
    "make record",
    "make browser-test",
)

# [text](target), not ![picture](target); a target up to a space or the closing bracket.
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _book_pages() -> list[Path]:
    """The book's Markdown sources: masters, concepts, guides (not what npm or a build put
    there)."""
    return sorted(path for path in BOOK.rglob("*.md")
                  if not {"node_modules", "_build"} & set(path.relative_to(BOOK).parts))


def _relative_links(path: Path) -> list[tuple[Path, str]]:
    """Each relative link of a Markdown file, outside code: (the file, the anchor or '')."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    text = re.sub(r"`[^`]*`", "", text)
    links = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # https:, mailto:, or a place on the same page
        file, _, anchor = target.partition("#")
        links.append(((path.parent / file).resolve(), anchor))
    return links


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub and mystmd make it: lower case, punctuation dropped,
    spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading).strip().lower()
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_slug(heading) for heading in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def _toc_files() -> set[Path]:
    """The pages book/myst.yml lists, as paths."""
    def walk(entries):
        for entry in entries:
            if "file" in entry:
                yield (BOOK / entry["file"]).resolve()
            yield from walk(entry.get("children", []))
    config = yaml.safe_load((BOOK / "myst.yml").read_text())
    return set(walk(config["project"]["toc"]))


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_the_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_LINES, f"README.md has {lines} lines; the manual goes in book/guides/"


@pytest.mark.parametrize("page", [README, *sorted((BOOK / "guides").glob("*.md"))],
                         ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_and_its_heading(page):
    links = _relative_links(page)
    assert links or page != README, "the README links to no page of the book"
    for target, anchor in links:
        where = target.relative_to(ROOT) if target.is_relative_to(ROOT) else target
        assert target.exists(), f"{page.name} links to {where}, which does not exist"
        if anchor and target.suffix == ".md":
            assert anchor in _anchors(target), f"{page.name}: {where} has no heading #{anchor}"


def test_every_book_page_the_readme_links_to_is_built():
    toc = _toc_files()
    linked = {target for target, _ in _relative_links(README)
              if target.suffix == ".md" and target.is_relative_to(BOOK.resolve())}
    assert linked, "the README links to no page of the book"
    missing = sorted(str(path.relative_to(ROOT)) for path in linked - toc)
    assert not missing, f"not in book/myst.yml's toc, so `make book` leaves them out: {missing}"


def test_no_command_the_old_readme_showed_is_lost():
    written = _flat("\n".join(path.read_text() for path in [README, *_book_pages()]))
    lost = [command for command in OLD_README_COMMANDS if _flat(command) not in written]
    assert not lost, f"in neither README.md nor book/**/*.md: {lost}"


def test_the_performance_model_states_the_time_models_constants():
    """Each row of the page's table of constants, `NAME` | `value`, as time_model.py has it."""
    source = ast.parse((ROOT / "autograder" / "model" / "time_model.py").read_text())
    constants = {node.targets[0].id: node.value.value for node in source.body
                 if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                 and isinstance(node.value, ast.Constant)}
    page = (BOOK / "guides" / "performance-model.md").read_text()
    rows = re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \| `([^`]+)` \|", page, re.M)
    assert rows, "the performance model's page has no table of constants"
    for name, value in rows:
        assert name in constants, f"time_model.py has no constant {name}"
        assert float(value) == constants[name], f"{name}: the page says {value}, the code " \
                                                f"{constants[name]}"
    named = {name for name in constants if re.fullmatch(r"[A-Z][A-Z0-9_]+", name)}
    assert named <= {name for name, _ in rows}, f"not on the page: {named - set(dict(rows))}"
