"""The bubblewrap command line that confines graded code.

Inside, the graded code sees a file system made of:

* the system (``/usr``, ``/etc``, ...), this Python and its packages, and the folders the
  grader adds (the autograder itself), all read-only;
* ``overlays``: a folder of the grader's mounted over another path, read-only (the
  course's kernels without their answers over the installed ones);
* its own ``scratch`` folder, the only place it can write, and an empty ``/tmp``.

Nothing else exists there: not the other submissions, not the gradebook, not the
grader's job files, not the home folder. It has a network namespace of its own, whose only
interface is loopback (enough for gloo ranks, and nothing beyond); a pid namespace of its
own, so that when its first process ends, or the grader that started it dies, every
process it started ends too; and a cleared environment (no token of the grader's leaks
in), bubblewrap's own too: it is the first process inside, and its environment and
memory can be read there. On a machine with a GPU the NVIDIA device nodes are bound in.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import site
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

# The system's own folders, read-only. Where one is a symlink (Debian's /bin -> usr/bin)
# it is made the same symlink inside.
SYSTEM = ["/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt",
          "/sys"]
# What the graded code keeps of the grader's environment: the course's and the libraries'
# own switches, never the rest (a CI job's tokens, the grader's paths).
KEPT_ENV = ("ROOFLAB_", "TRITON_", "CUDA_", "NVIDIA_", "PYTORCH_", "TORCH_", "OMP_",
            "MKL_", "LC_", "JPY_", "PYTEST_CURRENT_TEST", "PATH", "LANG", "TERM",
            "LD_LIBRARY_PATH", "PYTHONHASHSEED")
# Starts bubblewrap with no environment at all (coreutils' env, on every Linux).
ENV = shutil.which("env") or "/usr/bin/env"
# The namespaces: its own user, pids, network (loopback only), IPC and host name.
UNSHARE = ["--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc",
           "--unshare-uts", "--unshare-cgroup-try"]


@dataclass
class Sandbox:
    """Where graded code may write (``scratch``) and what else it may read."""

    scratch: Path
    read_only: list[Path] = field(default_factory=list)
    # Inside path -> the folder mounted there instead (read-only).
    overlays: dict[Path, Path] = field(default_factory=dict)
    # Folders in scratch mounted on their own: the graded code writes in them, but cannot
    # remove, rename or replace them (by a link to elsewhere, say) for the grader to read.
    pinned: list[Path] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def command(self, argv: list[str], cwd: Path | None = None) -> list[str]:
        """``argv`` run inside the sandbox, from ``cwd`` (default: the scratch folder).
        Paths in ``argv`` must be real ones (resolved): a link to them may not exist
        inside, unless it is to this Python."""
        scratch = self.scratch.resolve()
        # /tmp is a folder of the scratch, on disk: a tmpfs would hold what the graded code
        # writes there in memory, where no address-space limit applies.
        tmp = scratch / "tmp"
        tmp.mkdir(exist_ok=True)
        # bubblewrap itself starts with an empty environment: it stays inside as pid 1,
        # whose /proc/1/environ (and memory) the graded code can read, and --clearenv
        # clears only its child's. What the child keeps is set by --setenv below.
        args = [ENV, "-i", shutil.which("bwrap") or "bwrap", *UNSHARE, "--die-with-parent",
                "--dev", "/dev", "--proc", "/proc"]
        for path in SYSTEM:
            args += _mount(Path(path))
        # /tmp before the rest: what follows may be in the grader's /tmp, and must show.
        args += ["--bind", str(tmp), "/tmp"]
        for path in [*_python_folders(), *_library_folders(),
                     *(p.resolve() for p in self.read_only)]:
            args += ["--ro-bind-try", str(path), str(path)]
        for link in _python_links():  # the way this Python was named, where it is a link
            args += ["--ro-bind-try", str(link.resolve()), str(link)]
        for inside, outside in self.overlays.items():
            args += ["--ro-bind", str(outside.resolve()), str(inside)]
        args += ["--bind", str(scratch), str(scratch)]
        for path in self.pinned:
            args += ["--bind", str(path.resolve()), str(path.resolve())]
        for node in gpu_nodes():
            args += ["--dev-bind", node, node]
        # The root the mounts hang from is a tmpfs too: read-only, once they are made.
        args += ["--remount-ro", "/", "--clearenv"]
        for name, value in self.environment().items():
            args += ["--setenv", name, value]
        args += ["--chdir", str((cwd or scratch).resolve()), "--", *argv]
        return args

    def environment(self) -> dict[str, str]:
        """The graded code's environment: what it keeps of ours, its own home and caches
        in its scratch folder, and ``env``."""
        home = self.scratch.resolve() / "home"
        for folder in (home, home / ".cache"):
            folder.mkdir(parents=True, exist_ok=True)
        kept = {name: value for name, value in os.environ.items()
                if name.startswith(KEPT_ENV)}
        return {**kept, "HOME": str(home), "TMPDIR": "/tmp",
                "XDG_CACHE_HOME": str(home / ".cache"),
                "TRITON_CACHE_DIR": str(home / ".cache" / "triton"),
                "MPLCONFIGDIR": str(home / ".cache" / "matplotlib"),
                "IPYTHONDIR": str(home / ".ipython"),
                "JUPYTER_RUNTIME_DIR": str(home / ".jupyter-runtime"),
                "PYTHONDONTWRITEBYTECODE": "1", **self.env}


def _mount(path: Path) -> list[str]:
    if path.is_symlink():
        return ["--symlink", os.readlink(path), str(path)]
    return ["--ro-bind-try", str(path), str(path)]


def _python_folders() -> list[Path]:
    """This Python and every folder its packages are imported from (a virtual
    environment's and the base installation's)."""
    folders = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent}
    for found in [*site.getsitepackages(), site.getusersitepackages()]:
        folders.add(Path(found))
    resolved = sorted({f.resolve() for f in folders if f.exists()})
    # A folder inside another one needs no mount of its own.
    return [f for f in resolved if not any(o != f and f.is_relative_to(o) for o in resolved)]


def package_folder(name: str) -> Path:
    """The folder an installed package ``name`` is imported from (without importing it)."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations, f"{name} is not a package"
    return Path(list(spec.submodule_search_locations)[0]).resolve()


def _python_links() -> list[Path]:
    """This Python's folders as named, where a link leads to them (a virtual environment
    reached through a linked folder): the interpreter is started by that name."""
    named = {Path(sys.prefix), Path(sys.executable).parent}
    return sorted(p for p in named if p.exists() and p.resolve() != p.absolute())


def _library_folders() -> list[Path]:
    """Where the libraries a GPU build needs live outside /usr and /opt (a cluster's
    modules, a CUDA toolkit): the folders of $LD_LIBRARY_PATH and $CUDA_HOME."""
    named = [*os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep),
             os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", "")]
    return sorted({Path(p).resolve() for p in named if p and Path(p).is_dir()})


def gpu_nodes() -> list[str]:
    """The NVIDIA device nodes of this machine (none without a GPU)."""
    dev = Path("/dev")
    return sorted(str(p) for p in dev.glob("nvidia*") if not p.is_dir()) + \
        sorted(str(p) for p in (dev / "nvidia-caps").glob("*"))


@cache
def why_unavailable() -> str:
    """"" when bubblewrap runs here; else why not, in words."""
    if shutil.which("bwrap") is None:
        return ("bubblewrap is not installed (Debian and Ubuntu: `apt-get install "
                "bubblewrap`; Fedora: `dnf install bubblewrap`)")
    try:
        with tempfile.TemporaryDirectory(prefix="rooflab-probe-") as scratch:
            done = subprocess.run(Sandbox(Path(scratch)).command(["true"]),
                                  capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bubblewrap could not start: {error}"
    if done.returncode != 0:
        said = done.stderr.strip()[:200]
        namespaces = any(word in said for word in ("namespace", "Operation not permitted",
                                                   "Permission denied"))
        return (f"bubblewrap could not start a sandbox here ({said})" + (
            ": user namespaces may be switched off (sysctl kernel.unprivileged_userns_clone "
            "or kernel.apparmor_restrict_unprivileged_userns, or a container without them)"
            if namespaces else ""))
    return ""
