"""The performance gate: did the course's kernels get slower than the results on record?

A benchmark row's speed relative to the library, measured in the same run on the same
card (``Row.ratio_to_baseline``), carries from one machine of a card to another far better
than a time does: clocks, drivers and neighbours move both numbers together. So the gate
compares that ratio with the one recorded in ``bench/results/`` for the same card. A row
more than ``tolerance`` below its record is suspicious, not yet guilty: it is measured
again (the kernel and its library baseline, fresh inputs) and judged on the best of its
tries, because a shared card makes a single slow timing common and a real regression
repeatable.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from .workload import Row

REPEATS = 2  # more tries for a row that looks slower than its record


@dataclass
class Moved:
    """One of the course's rows beside its record."""

    shape: str
    dtype: str
    kernel: str
    recorded: float  # ratio to the library then
    now: float  # the best ratio to the library now, after any repeats
    tries: int
    verdict: str  # "regressed", "improved", "steady" or "new"


def _key(row: dict) -> tuple[str, str, str]:
    return row["shape"], row["dtype"], row["kernel"]


def judge(rows: list[Row], record: dict, tolerance: float,
          again: Callable[[Row], Row | None]) -> list[Moved]:
    """Compare each of the course's rows (not the library's) with ``record`` (a JSON
    record ``rooflab bench --json`` wrote); measure a suspicious row ``again`` up to
    ``REPEATS`` times."""
    recorded = {_key(row): row.get("ratio_to_baseline") for row in record.get("rows", [])}
    moved = []
    for row in rows:
        if row.library or row.ratio_to_baseline is None:
            continue
        before = recorded.get(_key(vars(row)))
        if before is None:
            moved.append(Moved(row.shape, row.dtype, row.kernel, float("nan"),
                               row.ratio_to_baseline, 1, "new"))
            continue
        best, tries = row.ratio_to_baseline, 1
        while best < before * (1 - tolerance) and tries <= REPEATS:
            repeat = again(row)
            tries += 1
            if repeat is not None and repeat.ratio_to_baseline is not None:
                best = max(best, repeat.ratio_to_baseline)
        if best < before * (1 - tolerance):
            verdict = "regressed"
        elif best > before * (1 + tolerance):
            verdict = "improved"
        else:
            verdict = "steady"
        moved.append(Moved(row.shape, row.dtype, row.kernel, before, best, tries, verdict))
    return moved


def table(moved: list[Moved], tolerance: float) -> str:
    """What moved, worst first; the steady rows in a count."""
    order = {"regressed": 0, "improved": 1, "new": 2, "steady": 3}
    shown = sorted((m for m in moved if m.verdict != "steady"), key=lambda m: (
        order[m.verdict], m.now / m.recorded if m.recorded == m.recorded else 0))
    lines = [f"against the record, ratio to the library (tolerance {tolerance:.0%}):"]
    for m in shown:
        change = f"{m.now / m.recorded - 1:+.0%}" if m.recorded == m.recorded else ""
        then = f"{m.recorded:.2f}×" if m.recorded == m.recorded else "-"
        lines.append(f"  {m.verdict.upper():<10}{m.kernel:<36}{m.shape:<22}{m.dtype:<10}"
                     f"{then:>7} → {m.now:.2f}× {change:>5}"
                     + (f"  (best of {m.tries} tries)" if m.tries > 1 else ""))
    steady = sum(m.verdict == "steady" for m in moved)
    lines.append(f"  {steady} rows within {tolerance:.0%} of the record")
    return "\n".join(lines)


def regressed(rows: list[Row], baseline: str, card: str, name: str, tolerance: float,
              again: Callable[[Row], Row | None]) -> bool:
    """Judge ``rows`` against ``baseline``, a record's path or "newest" (the newest record of
    bench ``name`` for ``card`` in bench/results/), and print what moved: True on a
    regression that a second look confirms. FileNotFoundError when no record is there."""
    path = Path(baseline)
    if baseline == "newest":
        found = newest_record(Path("bench/results"), card, name)
        if found is None:
            print(f"no record of `{name}` for {card} in bench/results/ yet: nothing to gate "
                  "against")
            return False
        path = found
    if not path.is_file():
        raise FileNotFoundError(f"no such record: {path}")
    moved = judge(list(rows), read(path), tolerance, again)
    print(f"\n{path}:")
    print(table(moved, tolerance))
    return any(m.verdict == "regressed" for m in moved)


def _slug(card: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", card).strip("-")


def newest_record(folder: Path, card: str, name: str) -> Path | None:
    """The newest ``<card>-<date>-<name>.json`` in ``folder`` for this card."""
    slug = _slug(card)
    pattern = re.compile(rf"^{re.escape(slug)}-(\d{{4}}-\d{{2}}-\d{{2}})-{re.escape(name)}\.json$")
    found = sorted((match.group(1), path) for path in folder.glob("*.json")
                   if (match := pattern.match(path.name)))
    return found[-1][1] if found else None


def read(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def write(path: str, record: dict, card: str, suffix: str = "") -> Path:
    """JSON to ``path``; a folder gets ``<card>-<date><suffix>.json``, the name
    ``newest_record`` looks for."""
    target = Path(path)
    if target.is_dir() or path.endswith("/"):
        target = target / f"{_slug(card)}-{date.today().isoformat()}{suffix}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(record, indent=2) + "\n")
    return target
