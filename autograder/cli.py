"""The ``rooflab`` command: a thin shell over functions a notebook can call too.

    rooflab doctor                       versions, GPU or interpreter, known-bad combinations
    rooflab list                         the problems and their signatures
    rooflab check PROBLEM FILE.py:FUNC   grade a function in a child process, its answers
                                         checked again outside it (exit 0 pass, 1 fail, 2 usage
                                         error, 3 needs a GPU: CUDA C compiled but not run)
    rooflab roofline [--remeasure]       this device's ceilings beside its datasheet, and when
                                         and how they were measured
    rooflab trace PROBLEM FILE.py:FUNC   memory traffic, predicted for a card (interpreter)
    rooflab bench matmul|coalescing|softmax|attention|...
                                         kernels against the library, timed (GPU only);
                                         --baseline gates them (exit 0 pass, 1 regression,
                                         2 usage error, 3 needs a GPU: nothing timed)
    rooflab bench allreduce              the course's ring against dist.all_reduce, on
                                         gloo ranks on this CPU
    rooflab build [--check]              labs/ and solutions/ notebooks from book/ masters
    rooflab release OUT/                 the course without its answers, for learners
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

# Importing the autograder switches on the interpreter before any learner kernel exists.
from . import device, problems
from .checking.candidate import CandidateError, UsageError, check_target, load_function
from .checking.engine import check
from .checking.isolated import EXIT_FAIL, EXIT_NEEDS_GPU, EXIT_PASS, EXIT_USAGE
from .device import datasheet, roofline, versions


def cmd_doctor(args: argparse.Namespace) -> int:
    dev = device.current()
    found = versions.installed()
    for name, found_version in found.items():
        print(f"{name:>14}  {found_version or '-'}")
    print(f"{'mode':>14}  {dev.mode}")
    if dev.is_gpu:
        print(f"{'driver':>14}  {dev.driver}   SMs {dev.sm_count}   L2 {dev.l2_bytes >> 20} MiB")
    from .confine import why_unavailable

    # Not a problem for a learner's notebook, but `rooflab check` and `rooflab grade` need it.
    sandbox = why_unavailable()
    print(f"{'sandbox':>14}  " + ("bubblewrap: rooflab check and rooflab grade run graded "
                                 "code confined" if not sandbox else
                                 f"none: {sandbox}; rooflab check and rooflab grade need it "
                                 "(or --unconfined)"))
    problems = versions.known_problems(found)
    for line in problems:
        print(f"PROBLEM: {line}")
    if not problems:
        print("OK: no known-bad combination")
    return EXIT_FAIL if problems else EXIT_PASS


def cmd_list(args: argparse.Namespace) -> int:
    for spec in problems.all_problems():
        print(f"{spec.id:<24} {spec.title}")
        print(f"{'':<24} {spec.signature}")
    return EXIT_PASS


def cmd_check(args: argparse.Namespace) -> int:
    """Grade in a child process (checking/isolated.py), unless --in-process asks for this one."""
    try:
        spec = problems.get(args.problem)
    except KeyError as error:
        raise UsageError(error.args[0]) from None
    check_target(args.function)
    if not args.in_process:
        from .checking.isolated import check_in_child

        verdict = check_in_child(spec.id, args.function, seed=args.seed,
                                 time_limit=args.time_limit, verbose=args.verbose,
                                 unconfined=args.unconfined)
        print(verdict.text)
        return verdict.exit_code
    function = load_function(args.function)
    result = check(spec, function, seed=args.seed, show=False, raise_on_failure=False,
                   time_limit=args.time_limit)
    print(result.message() if result.failed or args.verbose else result.line)
    if result.verdict == "NEEDS A GPU":
        return EXIT_NEEDS_GPU
    return EXIT_PASS if result.passed else EXIT_FAIL


def _print_ceilings(rows: list[roofline.Ceilings]) -> None:
    dtypes = ["fp32", "tf32", "fp16", "bf16"]
    width = max(34, *(len(c.label) + 2 for c in rows))
    print(f"{'':<{width}}{'GB/s':>8}" + "".join(f"{d + ' TFLOP/s':>14}" for d in dtypes))
    for c in rows:
        peaks = "".join(f"{c.flops[d] / 1e12:>14.1f}" if d in c.flops else f"{'-':>14}"
                        for d in dtypes)
        print(f"{c.label:<{width}}{c.bandwidth / 1e9:>8.0f}{peaks}")


def cmd_roofline(args: argparse.Namespace) -> int:
    dev = device.current()
    if args.card is not None and args.card not in datasheet.CARDS:
        raise UsageError(f"unknown card {args.card!r}; known: {', '.join(datasheet.CARDS)}")
    print(dev.mode)
    how: list[str] = []
    if dev.is_gpu:
        measured = roofline.ceilings(remeasure=args.remeasure)
        beside = roofline.from_datasheet(args.card) if args.card else roofline.datasheet_for(dev)
        _print_ceilings([measured] + ([beside] if beside else []))
        if beside is None:
            print(f"(no datasheet entry for {dev.name}: every measurement is accepted)")
        how = roofline.provenance(measured, beside) + [_cache_line(measured, dev)]
        for line in how:
            print(textwrap.fill(line, 100, subsequent_indent="    ", break_on_hyphens=False,
                                break_long_words=False))
    else:
        measured = None
        beside = roofline.from_datasheet(args.card or datasheet.DEFAULT_CARD)
        print(f"Nothing measured: no GPU here. Datasheet of {beside.device}, for reference:")
        _print_ceilings([beside])
    if args.json:
        _write_json(args.json, dev, measured, beside, how)
    if args.html:
        from .model.plot import roofline_figure

        figure = roofline_figure(measured or beside, beside=beside if measured else None)
        figure.write_html(args.html, include_plotlyjs="cdn")
        print(f"wrote {args.html}")
    return EXIT_PASS


def _cache_line(measured: roofline.Ceilings, dev: device.Device) -> str:
    path = roofline.cache_path(dev)
    if measured.suspect:
        return f"not cached (the cache would be {path})"
    return f"cached in {path}"


def _write_json(path: str, dev: device.Device, measured: roofline.Ceilings | None,
                beside: roofline.Ceilings | None, how: list[str]) -> None:
    """The evidence for bench/results/: card, driver, versions, measured and datasheet, and
    how the measured figures came to be (method, raises, rejections) in words too."""
    record = {
        "card": dev.name,
        "mode": dev.mode,
        "driver": dev.driver,
        "versions": versions.installed(),
        "measured": asdict(measured) if measured else None,
        "datasheet": asdict(beside) if beside else None,
        "how_measured": how,
        "cache": str(roofline.cache_path(dev)) if measured and not measured.suspect else None,
    }
    if measured and beside:
        record["measured_over_datasheet"] = {
            "bandwidth": measured.bandwidth / beside.bandwidth,
            **{d: measured.flops[d] / beside.flops[d] for d in measured.flops if d in beside.flops},
        }
    _write_record(path, record)


def _write_record(path: str, record: dict, suffix: str = "") -> None:
    """Write JSON to ``path``; a folder gets ``<card>-<date><suffix>.json``."""
    from .bench import gate

    print(f"wrote {gate.write(path, record, device.current().name, suffix)}")


def cmd_trace(args: argparse.Namespace) -> int:
    """Run a function on a problem's largest CPU case in the interpreter and print what
    each launch costs the memory system, and the prediction for a card."""
    from .checking.trace_report import report

    if not device.interpreter_enabled():
        raise UsageError("tracing needs Triton's interpreter: run it where there is no GPU, "
                         "or with TRITON_INTERPRET=1")
    try:
        spec = problems.get(args.problem)
    except KeyError as error:
        raise UsageError(error.args[0]) from None
    print("\n".join(report(spec, load_function(args.function), args.card)))
    return EXIT_PASS


def cmd_bench(args: argparse.Namespace) -> int:
    """Time a bench (or run it on CPU ranks) and gate it against a record. The options are
    checked before anything is timed: a typo costs no benchmark run."""
    from . import bench
    from .bench import gate

    tolerance = _fraction(args.tolerance)
    if args.name in bench.RANK_BENCHES:  # ranks on this CPU: no GPU needed
        try:  # each main checks its baseline before any rank starts
            return bench.rank_bench(args.name)(json_path=args.json, baseline=args.baseline,
                                               tolerance=tolerance)
        except gate.Refused as error:
            raise UsageError(str(error)) from None
    dev = device.current()
    if not dev.can_measure:
        print(f"rooflab bench: {dev.mode}: benchmarks need a GPU; nothing was timed",
              file=sys.stderr)
        return EXIT_NEEDS_GPU
    try:  # checked against this card, which is why a CPU says "needs a GPU" first
        against = (gate.load(args.baseline, dev.name, args.name, tolerance)
                   if args.baseline else None)
    except gate.Refused as error:
        raise UsageError(str(error)) from None
    rows = bench.run(args.name)
    print(dev.mode)
    print(bench.table(rows))
    moved = (gate.compare(rows, against, again=lambda row: bench.remeasure(args.name, row))
             if against else [])  # a row that moved is timed again, up to gate.TRIES runs
    if args.json:  # after the gate: the newest record is the one before this run
        _write_record(args.json, gate.stamp(bench.record(rows), args.name, moved),
                      suffix=f"-{args.name}")
    return EXIT_FAIL if gate.regressed(moved) else EXIT_PASS


def _fraction(text: str) -> float:
    """ "5%" or "0.05" -> 0.05; refused unless at least 0 and below 100%."""
    from .bench import gate

    try:
        return gate.fraction(text)
    except gate.Refused as error:
        raise UsageError(str(error)) from None


def cmd_release(args: argparse.Namespace) -> int:
    from .grading.release import release

    try:
        written = release(Path(args.root), Path(args.out))
    except (FileExistsError, FileNotFoundError) as error:
        raise UsageError(str(error)) from None
    print(f"wrote {len(written)} files to {args.out}: the learner notebooks, the autograder, "
          "kernels/ with every answer replaced by its stub, make lab and make test")
    return EXIT_PASS


def _bytes(text: str) -> int:
    """ "8G", "512M" or a number of bytes -> bytes; "0" -> 0 (no cap)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        if text and text[-1].upper() in units:
            return int(float(text[:-1]) * units[text[-1].upper()])
        return int(text)
    except ValueError:
        raise UsageError(f"a memory size is like 8G or 512M, not {text!r}") from None


def cmd_grade(args: argparse.Namespace) -> int:
    from .grading import gradebook
    from .grading.grade import Limits, Options, grade, parse_labs

    out = Path(args.out)
    if args.roster and args.shard:
        raise UsageError("--roster with --shard would call everyone in the other shards "
                         "missing: give --roster to --merge, which sees the whole class")
    try:
        roster, details = (gradebook.load_roster(Path(args.roster)) if args.roster
                           else (None, {}))
    except ValueError as error:
        raise UsageError(str(error)) from None
    if args.merge:
        scoring = {"--deadline": args.deadline, "--late-penalty": args.late_penalty,
                   "--late-cap": args.late_cap, "--labs": args.labs,
                   "--submitted": args.submitted, "--shard": args.shard,
                   "--resume": args.resume, "--speed-on-cpu": args.speed_on_cpu != "none"}
        given = [name for name, value in scoring.items() if value]
        if given:
            raise UsageError(f"--merge joins results as their shards graded and scored them: "
                             f"give {', '.join(given)} to each shard, not to the merge")
        try:
            views = gradebook.merge([Path(p) for p in args.submissions], out, roster, details,
                                    say=lambda line: print(f"rooflab grade: {line}",
                                                           file=sys.stderr))
        except ValueError as error:
            raise UsageError(str(error)) from None
        print(f"merged {len(gradebook.load_results(out))} results into {out}: "
              + ", ".join(v.name for v in views))
    else:
        labs = _lab_folder(Path(args.course))
        if args.shard and not re.fullmatch(r"\d+/\d+", args.shard):
            raise UsageError(f"--shard is i/n, e.g. 2/4, not {args.shard!r}")
        # A CUDA process maps far more address space than it uses: no cap where there is a
        # GPU.
        memory = args.memory or ("0" if torch.cuda.is_available() else "8G")
        limits = Limits(args.cell_timeout, args.notebook_timeout, _bytes(memory))
        try:
            options = Options(
                jobs=args.jobs, resume=args.resume, shard=args.shard,
                unconfined=args.unconfined, pick=args.pick, roster=roster, details=details,
                labs=parse_labs(args.labs), policy=_policy(args),
                submitted=_submitted(args.submitted))
            grade([Path(p) for p in args.submissions], out, labs, limits, options)
        except ValueError as error:
            raise UsageError(str(error)) from None
        except KeyboardInterrupt:
            print(f"rooflab grade: interrupted; the results written so far are in "
                  f"{out}/results: run the same command with --resume to grade the rest",
                  file=sys.stderr)
            return 130
        print(f"gradebook: {out / 'gradebook.html'} (also gradebook.json, gradebook.csv, "
              "junit.xml, grades-canvas.csv, grades-moodle.csv; each learner's feedback in "
              f"{out / 'feedback'})")
    results = gradebook.load_results(out)
    pending = sum(len((r.get("points") or {}).get("pending", [])) for r in results)
    if pending:
        its = "their" if pending > 1 else "its"
        print(f"rooflab grade: {pending} exercise{'s' * (pending > 1)} NEEDS A GPU: compiled "
              f"only, worth {its} points and earning none until graded on a GPU (the same "
              "command with --resume there)", file=sys.stderr)
    if roster is not None:
        missing, strangers = gradebook.against_roster(results, roster)
        for words, names in (("handed in nothing", missing), ("not on the roster", strangers)):
            if names:
                print(f"rooflab grade: {words} ({len(names)}): {', '.join(names)}",
                      file=sys.stderr)
    if args.require_pass:
        return _required(results)
    return EXIT_PASS


def _lab_folder(course: Path) -> Path:
    """The lab notebooks of the course the class received: ``COURSE/labs``, or ``COURSE``
    itself where it holds them."""
    for folder in (course / "labs", course):
        if any(folder.glob("[0-9][0-9]_*.ipynb")):
            return folder
    raise UsageError(f"no lab notebooks (NN_topic.ipynb) in {course.resolve()} or its labs/: "
                     "give --course, the folder of the release the class received")


def _policy(args: argparse.Namespace):
    """Points and lateness, from the options."""
    from .grading.scoring import Policy, parse_time

    deadlines = {}
    for text in args.deadline:
        lab, _, when = text.rpartition("=") if re.match(r"^\d\d=", text) else ("", "", text)
        try:
            deadlines[lab] = parse_time(when)
        except ValueError:
            raise UsageError(f"--deadline is an ISO date and time, 2026-12-01T23:59 (the "
                             f"grading machine's zone) or with its zone, or NN=WHEN for lab "
                             f"NN alone, not {text!r}") from None
    late_per_day = _share("--late-penalty", args.late_penalty) if args.late_penalty else 0.0
    late_cap = _share("--late-cap", args.late_cap) if args.late_cap else None
    if (late_per_day or late_cap is not None) and not deadlines:
        raise UsageError("--late-penalty and --late-cap need a --deadline")
    return Policy(speed_on_cpu=args.speed_on_cpu, deadlines=deadlines,
                  late_per_day=late_per_day, late_cap=late_cap)


def _share(option: str, text: str) -> float:
    """ "10%" or "0.1" -> 0.1, a share of a lab's points."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= 1:  # NaN too
        raise UsageError(f"{option} is a share of the points, between 0% and 100%, not "
                         f"{text!r}")
    return value


def _submitted(path: str | None) -> dict:
    from .grading.scoring import read_submitted

    return read_submitted(Path(path)) if path else {}


def _required(results: list[dict]) -> int:
    """``--require-pass``: EXIT_FAIL when an exercise failed or is not written yet. NEEDS A
    GPU fails nothing: a CPU job cannot run it, and a GPU job decides it."""
    from .grading.gradebook import FAILED

    failed = [f"{r['learner']} {g['exercise']}: {g['verdict']}"
              for r in results for g in r["grades"] if g["verdict"] in FAILED]
    pending = [f"{r['learner']} {g['exercise']}" for r in results for g in r["grades"]
               if g["verdict"] == "NEEDS A GPU"]
    for line in failed:
        print(f"  not passed: {line}")
    for line in pending:
        print(f"  needs a GPU (not counted here): {line}")
    return EXIT_FAIL if failed else EXIT_PASS


def cmd_build(args: argparse.Namespace) -> int:
    from .course.build import build, masters

    root = Path(args.root)
    if not masters(root):
        raise UsageError(f"no lab masters (book/NN_topic.md) under {root.resolve()}")
    stale = build(root, check_only=args.check)
    for path in stale:
        print(f"{'stale' if args.check else 'wrote'}: {path.relative_to(root)}")
    if args.check and stale:
        print("run `rooflab build` and commit the notebooks")
        return EXIT_FAIL
    if not stale:
        print("notebooks are up to date")
    return EXIT_PASS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rooflab", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    commands.add_parser("doctor", help="versions, mode and known-bad combinations")
    commands.add_parser("list", help="list the problems")

    p = commands.add_parser("check", help="grade a function on a problem")
    p.add_argument("problem", help='problem id, e.g. "coalescing/vector_add"')
    p.add_argument("function", help="FILE.py:FUNCTION or MODULE:FUNCTION")
    p.add_argument("--seed", type=int, default=None, help="repeat the inputs of an earlier run")
    p.add_argument("-v", "--verbose", action="store_true", help="print every case")
    p.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="per case (default $ROOFLAB_TIME_LIMIT, else 120; 0: none)")
    p.add_argument("--in-process", action="store_true",
                   help="run the candidate in this process (to debug it; its exit or crash "
                   "then ends rooflab too, and its answers are not checked again)")
    p.add_argument("--unconfined", action="store_true",
                   help="run the child without the sandbox (bubblewrap), with your rights: "
                   "only where bubblewrap cannot run (also $ROOFLAB_UNCONFINED=1)")

    p = commands.add_parser("trace", help="memory traffic of a function, in the interpreter")
    p.add_argument("problem", help='problem id, e.g. "coalescing/transpose"')
    p.add_argument("function", help="FILE.py:FUNCTION or MODULE:FUNCTION")
    p.add_argument("--card", default=None, help="card to predict for (default H100 SXM), or "
                   "a ceilings JSON measured on a GPU")

    p = commands.add_parser(
        "bench", help="the course's kernels against the library (GPU; allreduce, fsdp: gloo "
        "ranks on this CPU)",
        description="Time the course's kernels against the library on this GPU (allreduce and\n"
        "fsdp: on gloo ranks on this CPU), and with --baseline gate them against a record.\n"
        "--baseline and --tolerance are checked before anything is timed.",
        epilog="exit status:\n"
        "  0  ran; with --baseline, no regression\n"
        "  1  a regression: a course kernel's best ratio to the library fell below its\n"
        "     record by more than the tolerance and by more than the spread of its runs\n"
        "  2  usage error: a --baseline that is missing, not JSON, not a benchmark record,\n"
        "     or a record of another bench or card; a --tolerance not in [0, 100%)\n"
        "  3  needs a GPU: a GPU bench on a CPU, nothing was timed",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    from .bench import BENCHES, RANK_BENCHES

    p.add_argument("name", choices=[*BENCHES, *RANK_BENCHES], help="which benchmark")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON; a folder "
                   "gets <card>-<date>-<name>.json (<cpu>-... for the benches on ranks)")
    p.add_argument("--baseline", metavar="FILE", help="a record to gate against (or "
                   "'newest': this card's (CPU's) newest in bench/results/; none there: "
                   "nothing to gate against, exit 0)")
    p.add_argument("--tolerance", default="5%", help="how far below its record a row may "
                   "fall, 5%% or 0.05 (default 5%%); a row that moved is run 3 times and "
                   "allowed its spread where that is wider")

    p = commands.add_parser("release", help="the course without its answers, for learners")
    p.add_argument("out", help="a new folder to write it to")
    p.add_argument("--root", default=".", help="the repository (default: here)")

    p = commands.add_parser(
        "grade", help="grade a class's notebooks into a gradebook",
        description="Grade each learner's notebooks: every cell but the learner's own is "
        "put back as the lab has it, each notebook runs in a fresh kernel with limits, and "
        "each exercise is decided outside the learner's process, its answers checked "
        "again. Writes OUT/gradebook.html, .json, .csv and junit.xml, and one result per "
        "learner and lab in OUT/results/. Exits 0 when grading worked, whatever the "
        "grades.",
        epilog="examples:\n  rooflab grade submissions/* --out gradebook/ --course course/\n"
        "  rooflab grade alice.zip bob/ carol.ipynb --out gradebook/ --labs 01,02\n"
        "  rooflab grade submissions/* --out gradebook/ --deadline 2026-12-01T23:59 "
        "--late-penalty 10%\n"
        "  rooflab grade submissions/* --out shard-2 --shard 2/4   (then:)\n"
        "  rooflab grade --merge shard-* --out gradebook/ --roster learners.csv",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("submissions", nargs="+", metavar="SUBMISSION",
                   help="one per learner: a notebook (the learner is its file name), or a "
                   "folder or a zip of notebooks (the learner is the folder's or zip's name)")
    p.add_argument("--out", required=True, help="the gradebook folder")
    p.add_argument("--course", default=".", help="the course the class received (`rooflab "
                   "release` output), whose labs/ holds the lab notebooks and their points "
                   "(default: here)")
    p.add_argument("--labs", default=None, metavar="NN,NN|changed",
                   help="grade these labs only, by number (00,01), or 'changed': the labs "
                   "each learner has begun (a cell of theirs differs from the lab)")
    p.add_argument("--jobs", type=int, default=0, help="notebooks graded at once (default: "
                   "half the CPU cores; always 1 on a GPU, so timings do not collide)")
    p.add_argument("--cell-timeout", type=float, default=600.0, metavar="SECONDS",
                   help="per cell (default 600): the kernel is interrupted, the cell fails")
    p.add_argument("--notebook-timeout", type=float, default=3600.0, metavar="SECONDS",
                   help="per notebook (default 3600): then it is ended, kernel and all")
    p.add_argument("--memory", default=None, help="address-space cap of each notebook's "
                   "kernel, e.g. 8G (default: 8G without a GPU, none with one, whose driver "
                   "maps far more; 0: none)")
    p.add_argument("--resume", action="store_true",
                   help="skip each notebook whose result is already in OUT/results/ and "
                   "whose content has not changed since (its points are scored again under "
                   "this run's settings)")
    p.add_argument("--shard", metavar="I/N", help="grade only the I-th of N shares "
                   "(CI matrix, job array); join them with --merge")
    p.add_argument("--require-pass", action="store_true", help="exit 1 when an exercise "
                   "failed or is not written (CI grading one learner's push); NEEDS A GPU "
                   "is listed, and fails nothing")
    p.add_argument("--speed-on-cpu", choices=("none", "predicted"), default="none",
                   help="on a CPU, where nothing is timed, an exercise's speed points: none "
                   "(default: correctness earns them all) or predicted (the roofline "
                   "fraction predicted from the traced traffic)")
    p.add_argument("--deadline", action="append", default=[], metavar="[NN=]WHEN",
                   help="ISO date and time, e.g. 2026-12-01T23:59 (this machine's zone) or "
                   "2026-12-01T23:59+01:00; NN=WHEN for lab NN alone (repeatable)")
    p.add_argument("--late-penalty", metavar="PCT", help="share of a lab's points lost per "
                   "day or part of a day late, e.g. 10%%")
    p.add_argument("--late-cap", metavar="PCT", help="late work earns at most this share of "
                   "a lab's points, e.g. 50%%")
    p.add_argument("--submitted", metavar="CSV", help="when each learner handed in: rows of "
                   "learner,time or learner,lab,time; otherwise each notebook's date (in "
                   "its zip, or its file's), which a git checkout does not keep")
    p.add_argument("--merge", action="store_true",
                   help="SUBMISSIONS are shard folders: join their results into OUT (each "
                   "may be empty, and no learner's lab may be in two)")
    p.add_argument("--pick", choices=("error", "newest"), default="error",
                   help="a learner's several notebooks for one lab: error (default: none "
                   "is graded, the gradebook says so) or newest (the last modified; the "
                   "result names the others)")
    p.add_argument("--roster", metavar="CSV", help="the class, one learner a row in the "
                   "first column: the gradebook names who handed in nothing and who is not "
                   "on it")
    p.add_argument("--unconfined", action="store_true",
                   help="run the notebooks without the sandbox (bubblewrap), with your "
                   "rights: only where bubblewrap cannot run, in an environment installed "
                   "from a release (the gradebook says so)")

    p = commands.add_parser("build", help="write labs/ and solutions/ from the masters")
    p.add_argument("--check", action="store_true", help="only say which notebooks are stale")
    p.add_argument("--root", default=".", help="the repository (default: here)")

    p = commands.add_parser("roofline", help="this device's ceilings (measured on a GPU)")
    p.add_argument("--remeasure", action="store_true",
                   help="measure again (10-20 s), replacing the cache unless the measurement "
                   "is far below the datasheet")
    p.add_argument("--card", default=None,
                   help="datasheet to show (default: this GPU's, or H100 SXM on a CPU); "
                   f"one of: {', '.join(datasheet.CARDS)}")
    p.add_argument("--html", metavar="FILE", help="also write the roofline plot as HTML")
    p.add_argument("--json", metavar="PATH",
                   help="also write the numbers and versions as JSON; a folder gets "
                   "<card>-<date>.json")
    return parser


COMMANDS = {"doctor": cmd_doctor, "list": cmd_list, "check": cmd_check,
            "roofline": cmd_roofline, "build": cmd_build, "trace": cmd_trace,
            "bench": cmd_bench, "release": cmd_release, "grade": cmd_grade}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except UsageError as error:
        print(f"rooflab {args.command}: {error}", file=sys.stderr)
        return EXIT_USAGE
    except CandidateError as error:
        print(f"FAIL {getattr(args, 'problem', '')}: {error}")
        return EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
