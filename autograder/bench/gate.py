"""The performance gate: did the course's kernels get slower than the results on record?

A benchmark row's speed relative to the library, measured in the same run on the same
card (``Row.ratio_to_baseline``), carries from one machine of a card to another far better
than a time does: clocks, drivers and neighbours move both numbers together. So the gate
compares that ratio with the one recorded in ``bench/results/`` for the same card and
bench. What it measures and judges, for each of the course's rows (the library's rows are
the yardstick, not gated):

* a row within ``tolerance`` of its record is steady: measured once, by the bench itself,
  so a steady run costs nothing more than the bench;
* any other row has moved, or seems to have: it is measured ``again`` (the kernel and its
  library baseline, fresh inputs), ``TRIES`` times in all, and its *spread* is taken,
  (max − min) / median of its tries' ratios. A slow row that a retry brings back within
  the tolerance is steady at once, with no more runs;
* a moved row is judged on its best try, against a margin that is the widest of the
  tolerance, its spread now and its spread on record (records this gate writes carry
  the spread of every row it measured again): *regressed* when the best try is below the
  record by more than the margin, *improved* when above it by more, *noisy* when it moved
  by more than the tolerance but not by more than its spread.

The best try, because a shared card or CPU makes a single slow timing common and a real
regression repeatable; the spread, because where two identical runs differ by 2× (gloo
ranks on a busy CPU), a 5% gate measures the neighbours, not the code. The table prints
each moved row's spread, so a gate that did not fire says why.

A baseline is read and checked (``load``) before anything is timed, so a typo costs no
benchmark run.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from .workload import Row

TRIES = 3  # runs in all of a row that moved: enough for a spread, few enough to stay cheap
RESULTS = Path("bench/results")


class Refused(ValueError):
    """A baseline or tolerance the gate cannot judge with, refused before anything is timed
    (``rooflab bench`` exits 2)."""


def fraction(value: str | float) -> float:
    """A tolerance: "5%", "0.05" or 0.05 -> 0.05; at least 0 and below 100%."""
    text = str(value).strip()
    try:
        number = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise Refused(f"--tolerance {text!r}: not a fraction (0.05) or a percentage "
                      "(5%)") from None
    if not 0 <= number < 1:  # NaN fails every comparison, so it lands here too
        hint = (f" (did you mean {text}%?)" if math.isfinite(number) and number >= 1
                and not text.endswith("%") else "")
        raise Refused(f"--tolerance {text!r}: must be at least 0 and below 100%{hint}")
    return number


@dataclass(frozen=True)
class Baseline:
    """A record to gate against, read and checked."""

    tolerance: float
    card: str
    name: str
    path: Path | None = None  # None: "newest" found no record of the bench for this card
    record: dict = field(default_factory=dict)
    folder: Path = RESULTS  # where "newest" looked


def load(baseline: str, card: str, name: str, tolerance: str | float,
         folder: Path = RESULTS) -> Baseline:
    """``baseline``, a record's path or "newest" (the newest record of bench ``name`` for
    ``card`` in ``folder``), read and checked. Raises Refused, naming the file and what is
    wrong with it, for a tolerance, a file or a record the gate cannot judge with."""
    limit = fraction(tolerance)
    path = newest_record(folder, card, name) if baseline == "newest" else Path(baseline)
    if path is None:
        return Baseline(limit, card, name, folder=folder)
    return Baseline(limit, card, name, path, _checked(path, card, name), folder)


def _checked(path: Path, card: str, name: str) -> dict:
    where = f"--baseline {path}"
    if not path.exists():
        raise Refused(f"{where}: no such record (a file `rooflab bench --json` wrote, or "
                      "'newest')")
    if not path.is_file():
        raise Refused(f"{where}: not a file")
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise Refused(f"{where}: not JSON ({error})") from None
    rows = record.get("rows") if isinstance(record, dict) else None
    if not isinstance(rows, list) or not all(map(_is_row, rows)):
        raise Refused(f"{where}: not a benchmark record (rows, each with a shape, a dtype, "
                      "a kernel and a ratio_to_baseline)")
    recorded = _bench_of(record, path)
    if recorded is not None and recorded != name:
        raise Refused(f"{where}: a record of `rooflab bench {recorded}`, not of {name}")
    # Refused, not warned of: a ratio to the library belongs to its card, whose library
    # picks its own kernels for it, so a row compared across cards fails or passes by the
    # card, not by the code, and a warning in a CI log is read after the wrong verdict.
    # A record without a card (made by hand) is taken at its word.
    recorded_card = record.get("card")
    if isinstance(recorded_card, str) and _slug(recorded_card) != _slug(card):
        raise Refused(f"{where}: measured on {recorded_card}, not on this machine's {card}: "
                      "ratios to the library do not carry from one card to another")
    return record


def _is_row(row: object) -> bool:
    number = (int, float, type(None))
    return (isinstance(row, dict) and {"shape", "dtype", "kernel"} <= row.keys()
            and isinstance(row.get("ratio_to_baseline"), number)
            and isinstance(row.get("spread"), number))


def _bench_of(record: dict, path: Path) -> str | None:
    """The bench a record is of: its own word (records of benches on ranks, and every
    record this gate stamps), its rows' (each GPU row names its bench), else its file
    name, ``<card>-<date>-<name>.json``; None where none says."""
    if isinstance(record.get("bench"), str):
        return record["bench"]
    named = {row.get("bench") for row in record["rows"]} - {None}
    if len(named) == 1:
        return str(named.pop())
    match = re.search(r"-\d{4}-\d{2}-\d{2}-([A-Za-z0-9_]+)\.json$", path.name)
    return match.group(1) if match else None


@dataclass
class Moved:
    """One of the course's rows beside its record."""

    shape: str
    dtype: str
    kernel: str
    recorded: float  # ratio to the library then (NaN: no record of this row)
    ratios: list[float]  # ratio to the library now, one a try
    recorded_spread: float  # the spread on record, 0 where none
    verdict: str  # "regressed", "improved", "noisy", "steady" or "new"

    @property
    def now(self) -> float:
        return max(self.ratios)

    @property
    def tries(self) -> int:
        return len(self.ratios)

    @property
    def spread(self) -> float:
        """(max − min) / median of the tries' ratios; 0 for a single try."""
        if len(self.ratios) < 2:
            return 0.0
        return (max(self.ratios) - min(self.ratios)) / statistics.median(self.ratios)


def _key(row: dict) -> tuple[str, str, str]:
    return row["shape"], row["dtype"], row["kernel"]


def judge(rows: list[Row], record: dict, tolerance: float,
          again: Callable[[Row], Row | None]) -> list[Moved]:
    """Compare each of the course's rows (not the library's) with ``record`` (a JSON
    record ``rooflab bench --json`` wrote); measure a row that moved ``again``, up to
    ``TRIES`` runs in all (see the module's docstring)."""
    recorded = {_key(row): row for row in record.get("rows", [])}
    moved = []
    for row in rows:
        if row.library or row.ratio_to_baseline is None:
            continue
        then = recorded.get(_key(vars(row)), {})
        before, ratios = then.get("ratio_to_baseline"), [row.ratio_to_baseline]
        if before is None:
            moved.append(Moved(row.shape, row.dtype, row.kernel, math.nan, ratios, 0.0, "new"))
            continue
        low, high = before * (1 - tolerance), before * (1 + tolerance)
        if not low <= ratios[0] <= high:
            for _ in range(TRIES - 1):
                fresh = again(row)
                if fresh is not None and fresh.ratio_to_baseline is not None:
                    ratios.append(fresh.ratio_to_baseline)
                if low <= max(ratios) <= high:
                    break  # a slow try that a second look clears
        entry = Moved(row.shape, row.dtype, row.kernel, before, ratios,
                      then.get("spread") or 0.0, "steady")
        margin = max(tolerance, entry.spread, entry.recorded_spread)
        if entry.now < before * (1 - margin):
            entry.verdict = "regressed"
        elif entry.now > before * (1 + margin):
            entry.verdict = "improved"
        elif not low <= entry.now <= high:
            entry.verdict = "noisy"
        moved.append(entry)
    return moved


def _noise(m: Moved) -> str:
    said = (f"  spread {m.spread:.0%} over {m.tries} runs "
            f"({min(m.ratios):.2f}–{max(m.ratios):.2f}×)" if m.tries > 1 else "")
    return said + (f", {m.recorded_spread:.0%} on record" if m.recorded_spread else "")


def table(moved: list[Moved], tolerance: float) -> str:
    """What moved, worst first, each with its spread; the steady rows in a count."""
    order = {"regressed": 0, "improved": 1, "noisy": 2, "new": 3}
    shown = sorted((m for m in moved if m.verdict != "steady"), key=lambda m: (
        order[m.verdict], 0 if m.verdict == "new" else m.now / m.recorded))
    lines = [f"against the record, ratio to the library, best of up to {TRIES} runs (a row "
             f"regresses\nbelow its record by more than {tolerance:.0%} and by more than the "
             "spread of its runs):"]
    for m in shown:
        new = m.verdict == "new"
        then = "-" if new else f"{m.recorded:.2f}×"
        change = "" if new else f"{m.now / m.recorded - 1:+.0%}"
        lines.append(f"  {m.verdict.upper():<10}{m.kernel:<36}{m.shape:<22}{m.dtype:<10}"
                     f"{then:>7} → {m.now:.2f}× {change:>5}{_noise(m)}")
    if any(m.verdict == "noisy" for m in moved):
        lines.append(f"  NOISY: moved by more than {tolerance:.0%}, not by more than the "
                     "spread of its runs: too small a change for this machine to show")
    steady = sum(m.verdict == "steady" for m in moved)
    lines.append(f"  {steady} rows within {tolerance:.0%} of the record")
    return "\n".join(lines)


def compare(rows: list[Row], baseline: Baseline,
            again: Callable[[Row], Row | None]) -> list[Moved]:
    """Judge ``rows`` against ``baseline`` and print what moved; [] when there is no
    record to judge them against."""
    if baseline.path is None:
        print(f"no record of `{baseline.name}` for {baseline.card} in {baseline.folder}/ "
              "yet: nothing to gate against")
        return []
    moved = judge(list(rows), baseline.record, baseline.tolerance, again)
    print(f"\n{baseline.path}:")
    print(table(moved, baseline.tolerance))
    return moved


def regressed(moved: list[Moved]) -> bool:
    return any(m.verdict == "regressed" for m in moved)


def stamp(record: dict, name: str, moved: list[Moved]) -> dict:
    """``record``, about to be written, with its bench's name and the spread of each row
    the gate measured again: a later gate against it allows for that spread."""
    record.setdefault("bench", name)
    measured = {(m.shape, m.dtype, m.kernel): m for m in moved if m.tries > 1}
    for row in record.get("rows", []):
        if (m := measured.get(_key(row))) is not None:
            row["spread"], row["tries"] = m.spread, m.tries
    return record


def _slug(card: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", card).strip("-")


def newest_record(folder: Path, card: str, name: str) -> Path | None:
    """The newest ``<card>-<date>-<name>.json`` in ``folder`` for this card."""
    slug = _slug(card)
    pattern = re.compile(rf"^{re.escape(slug)}-(\d{{4}}-\d{{2}}-\d{{2}})-{re.escape(name)}\.json$")
    found = sorted((match.group(1), path) for path in folder.glob("*.json")
                   if (match := pattern.match(path.name)))
    return found[-1][1] if found else None


def write(path: str, record: dict, card: str, suffix: str = "") -> Path:
    """JSON to ``path``; a folder gets ``<card>-<date><suffix>.json``, the name
    ``newest_record`` looks for."""
    target = Path(path)
    if target.is_dir() or path.endswith("/"):
        target = target / f"{_slug(card)}-{date.today().isoformat()}{suffix}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(record, indent=2) + "\n")
    return target
