"""A class graded in shares (``--shard i/n``), for a CI matrix or a job array, and joined.

A shard takes its share of the learners from the command line alone, before it opens
anything: learner k of the class (sorted by name) goes to shard k mod n. So each shard
reads and unpacks only its own learners' submissions, and every learner's labs, with any
second notebook for a lab, land in one shard.

Each shard writes its manifest, ``DIR/manifest.json``: which share it is, the whole class
as its command line named it, the learners it grades, and whether it finished. ``--merge``
reads the manifests and joins the shares only when they are the n finished shares of one
class, each there once.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

MANIFEST = "manifest.json"


def learner_of(path: Path) -> str:
    """The learner a submission belongs to, from its name alone: a zip's or a notebook's
    stem, a folder's name."""
    return path.stem if path.suffix in (".zip", ".ipynb") else path.name


def parse(spec: str) -> tuple[int, int]:
    """``i/n`` -> (i, n), 1 ≤ i ≤ n. Raises ValueError."""
    try:
        index, count = (int(part) for part in spec.split("/"))
    except ValueError:
        raise ValueError(f"--shard is i/n, e.g. 2/4, not {spec!r}") from None
    if not 1 <= index <= count:
        raise ValueError(f"--shard {spec}: i must be between 1 and n")
    return index, count


def share(paths: list[Path], spec: str | None) -> list[Path]:
    """The submissions of shard ``spec`` (all of them without one)."""
    if not spec:
        return list(paths)
    index, count = parse(spec)
    class_ = sorted({learner_of(path) for path in paths})
    mine = set(class_[index - 1::count])
    return [path for path in paths if learner_of(path) in mine]


def class_digest(learners: list[str]) -> str:
    return hashlib.sha256("\n".join(sorted(set(learners))).encode()).hexdigest()[:16]


def manifest(paths: list[Path], spec: str, settings: dict, finished: bool = False) -> dict:
    """What shard ``spec`` of the class ``paths`` writes about itself: once as it starts,
    and again, ``finished``, once every one of its learners is graded. ``settings``: what
    every shard of one grading must share (the labs graded, the course's labs, the points
    and deadlines), for the merge to compare."""
    index, count = parse(spec)
    class_ = sorted({learner_of(path) for path in paths})
    return {"shard": index, "of": count, "class": class_, "digest": class_digest(class_),
            "learners": sorted({learner_of(path) for path in share(paths, spec)}),
            "settings": settings, "finished": finished}


def write(folder: Path, paths: list[Path], spec: str, settings: dict,
          finished: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / (MANIFEST + ".partial")
    partial.write_text(json.dumps(manifest(paths, spec, settings, finished), indent=1))
    partial.replace(folder / MANIFEST)


def read(folder: Path) -> dict | None:
    """A shard folder's manifest; None where it has none."""
    try:
        return json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return None
    except ValueError as error:
        raise ValueError(f"{folder / MANIFEST}: not a shard manifest ({error})") from None


def check(folders: list[Path]) -> list[str]:
    """Raise ValueError unless the manifests in ``folders`` are the n shares of one class,
    each once; return the class (every learner the shards were given). Folders without a
    manifest (graded without ``--shard``) are not checked, and give no class: []."""
    found = [(folder, entry) for folder in folders if (entry := read(folder)) is not None]
    if not found:
        return []
    if len(found) < len(folders):
        bare = [str(f) for f in folders if not (f / MANIFEST).exists()]
        raise ValueError(f"{', '.join(bare)}: no {MANIFEST}, where the other folders are "
                         "shards: merge the shards of one grading")
    settings = {json.dumps(m.get("settings"), sort_keys=True) for _, m in found}
    if len(settings) > 1:
        raise ValueError("these shards were graded with different settings (labs, course, "
                         "points or deadlines): "
                         + "; ".join(f"{f}: {json.dumps(m.get('settings'), sort_keys=True)}"
                                     for f, m in found) + ". Grade every shard alike")
    if len({m["of"] for _, m in found}) > 1 or len({m["digest"] for _, m in found}) > 1:
        raise ValueError("these shards are not of one grading: they split different classes "
                         "or into different numbers of shares ("
                         + ", ".join(f"{f}: {m['shard']}/{m['of']}" for f, m in found) + ")")
    count = found[0][1]["of"]
    seen: dict[int, Path] = {}
    for folder, entry in found:
        if entry["shard"] in seen:
            raise ValueError(f"shard {entry['shard']}/{count} is there twice: "
                             f"{seen[entry['shard']]} and {folder}")
        seen[entry["shard"]] = folder
    unfinished = [f"{entry['shard']}/{count} ({folder})" for folder, entry in found
                  if not entry.get("finished")]
    if unfinished:
        raise ValueError(f"shard {', '.join(unfinished)} did not finish (interrupted, or out "
                         "of time): run it again with --resume, then merge")
    missing = sorted(set(range(1, count + 1)) - set(seen))
    if missing:
        raise ValueError(f"shard{'s' * (len(missing) > 1)} "
                         f"{', '.join(f'{i}/{count}' for i in missing)} missing: the merged "
                         "gradebook would leave out " + _who(found[0][1]["class"], missing,
                                                              count))
    return found[0][1]["class"]


def _who(class_: list[str], missing: list[int], count: int) -> str:
    absent = [name for k, name in enumerate(class_) if (k % count) + 1 in missing]
    shown = ", ".join(absent[:5]) + (f" and {len(absent) - 5} more" if len(absent) > 5 else "")
    return f"{len(absent)} learner{'s' * (len(absent) != 1)} ({shown})" if absent else "no one"
