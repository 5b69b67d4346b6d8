"""Candidates that get the right answer without doing the exercise, or do worse: the work
done by a library op the grader might not know, by numpy, by a worker thread, under a
disabled dispatch mode; and hostile code (endless loops). Each launches a real Triton
kernel, so "launched no kernel" cannot be what catches it.

The grader must fail every one of them, and say why.
"""

import threading

import torch
import triton
import triton.language as tl

import rooflab.autograder  # noqa: F401  (interpreter on before the kernels below)


@triton.jit
def _copy(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(dst_ptr + offsets, tl.load(src_ptr + offsets, mask=mask), mask=mask)


def _copy_into(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """A kernel for show: copies an answer computed elsewhere into ``dst``."""
    _copy[(triton.cdiv(dst.numel(), 256),)](src, dst, dst.numel(), BLOCK=256)
    return dst


# --- vector add: the sum computed elsewhere, copied out by a kernel ----------------------

def add_in_numpy(x, y):
    answer = torch.from_numpy(x.float().cpu().numpy() + y.float().cpu().numpy())
    return _copy_into(torch.empty_like(x), answer.to(x.device, x.dtype).contiguous())


def add_in_a_thread(x, y):
    answer = {}
    worker = threading.Thread(target=lambda: answer.setdefault("sum", x + y))
    worker.start()
    worker.join()
    return _copy_into(torch.empty_like(x), answer["sum"])


def add_out_of_sight(x, y):
    with torch._C._DisableTorchDispatch():
        answer = torch.add(x, y)
    return _copy_into(torch.empty_like(x), answer)


def add_by_mul_and_sum(x, y):
    answer = torch.stack([x, y]).mul(1).sum(0)
    return _copy_into(torch.empty_like(x), answer)


# --- matmul: ops that multiply without a name the old denylist knew --------------------

def _matmul_by(op):
    def candidate(a, b):
        answer = op(a, b).to(a.dtype).contiguous()
        return _copy_into(torch.empty_like(answer), answer)

    candidate.__name__ = f"matmul_by_{op.__name__}"
    return candidate


def _mul_sum(a, b):
    return (a.float()[:, :, None] * b.float()[None, :, :]).sum(1)


def _addmv(a, b):
    return torch.stack([torch.addmv(torch.zeros(a.shape[0], dtype=torch.float32,
                                                device=a.device), a.float(), col.float())
                        for col in b.T], dim=1)


def _addbmm(a, b):
    zeros = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float32, device=a.device)
    return torch.addbmm(zeros, a.float()[None], b.float()[None])


def _bilinear(a, b):
    # out[i, j] = a[i] · W[j] · 1, with W[j] the j-th column of b.
    ones = torch.ones(a.shape[0], 1, device=a.device)
    return torch.nn.functional.bilinear(a.float(), ones, b.float().T[:, :, None])


def _conv1d(a, b):
    # Each row of a against each column of b: a 1-wide convolution over K channels.
    return torch.nn.functional.conv1d(a.float().T[None], b.float().T[:, :, None])[0].T


def _einsum_free(a, b):
    return sum(a.float()[:, k:k + 1] * b.float()[k:k + 1, :] for k in range(a.shape[1]))


MATMUL_CHEATS = [_matmul_by(op) for op in (_mul_sum, _addmv, _addbmm, _bilinear, _conv1d,
                                            _einsum_free)]


# --- strided copy: indexing and take ----------------------------------------------------

def strided_copy_by_indexing(x, stride):
    answer = x[torch.arange(0, x.numel(), stride, device=x.device)]
    return _copy_into(torch.empty_like(answer), answer)


def strided_copy_by_take(x, stride):
    answer = torch.take(x, torch.arange(0, x.numel(), stride, device=x.device))
    return _copy_into(torch.empty_like(answer), answer)


# --- hostile code -------------------------------------------------------------------------

@triton.jit
def _spin(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    value = tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
    while tl.sum(value, axis=0) == tl.sum(value, axis=0):  # never false for finite values
        value = value + 0.0
    tl.store(x_ptr + offsets, value, mask=offsets < n)


def loops_in_the_kernel(x, y):
    out = torch.zeros_like(x)
    _spin[(1,)](out, min(out.numel(), 16), BLOCK=16)
    return out


def loops_in_host_code(x, y):
    while True:
        pass


def swallows_every_exception(x, y):
    while True:
        try:
            while True:
                pass
        except Exception:  # a grader's time limit must not be an Exception
            continue



# --- right answers, the wrong structure -------------------------------------------------------

@triton.jit
def _bias_relu_in_place(c_ptr, bias_ptr, M, N, stride_cm, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    for start in range(0, N, BLOCK_N):
        rn = start + cols
        c = tl.load(c_ptr + row * stride_cm + rn, mask=rn < N, other=0.0).to(tl.float32)
        bias = tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
        out = tl.maximum(c + bias, 0.0).to(c_ptr.dtype.element_ty)
        tl.store(c_ptr + row * stride_cm + rn, out, mask=rn < N)


def epilogue_in_a_second_kernel(a, b, bias):
    """The matmul, then the bias and ReLU by a second kernel that reads and writes C again."""
    from rooflab.kernels.matmul import matmul

    c = matmul(a, b)
    _bias_relu_in_place[(c.shape[0],)](c, bias, c.shape[0], c.shape[1], c.stride(0),
                                       BLOCK_N=64)
    return c


@triton.jit
def _matmul_without_dot(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                        BLOCK: tl.constexpr):
    rm = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    rn = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    for k in range(0, K):  # one rank-1 update a step: no tensor cores at all
        a = tl.load(a_ptr + rm * sam + k * sak, mask=rm < M, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + k * sbk + rn * sbn, mask=rn < N, other=0.0).to(tl.float32)
        acc += a[:, None] * b[None, :]
    zeros = tl.zeros((BLOCK, 32), dtype=tl.float16)
    decoy = tl.dot(zeros, tl.zeros((32, BLOCK), dtype=tl.float16))  # for show
    acc += decoy
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc.to(c_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul_with_a_decoy_dot(a, b):
    """Rank-1 updates on the CUDA cores, and one tl.dot on zeros per tile, for show."""
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    grid = (triton.cdiv(M, 128), triton.cdiv(N, 128))
    _matmul_without_dot[grid](a, b, c, M, N, K, *a.stride(), *b.stride(), *c.stride(),
                              BLOCK=128)
    return c


@triton.jit
def _softmax_three_loops(x_ptr, out_ptr, N, stride_xm, stride_xn, stride_om,
                         BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    m = float("-inf")
    for start in range(0, N, BLOCK):  # pass 1: the max
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_xm + cols * stride_xn, mask=cols < N,
                    other=float("-inf")).to(tl.float32)
        m = tl.maximum(m, tl.max(x, axis=0))
    d = 0.0
    for start in range(0, N, BLOCK):  # pass 2: the sum
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_xm + cols * stride_xn, mask=cols < N,
                    other=float("-inf")).to(tl.float32)
        d += tl.sum(tl.exp(x - m), axis=0)
    for start in range(0, N, BLOCK):  # pass 3: the output
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_xm + cols * stride_xn, mask=cols < N,
                    other=float("-inf")).to(tl.float32)
        y = tl.exp(x - m) / d
        tl.store(out_ptr + row * stride_om + cols, y.to(out_ptr.dtype.element_ty),
                 mask=cols < N)


def softmax_in_three_loops(x):
    """Right, one kernel, but the max and the sum each take a pass over x."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _softmax_three_loops[(x.shape[0],)](x, out, x.shape[1], x.stride(0), x.stride(1),
                                        out.stride(0), BLOCK=512)
    return out


# --- work done by torch inside a launch ------------------------------------------------

@triton.jit
def _idle(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pass


# Triton calls a kernel's pre-run hooks with its arguments, inside the launch.
_idle.add_pre_run_hook(lambda x_ptr, y_ptr, out_ptr, *rest, **named:
                       torch.add(x_ptr, y_ptr, out=out_ptr))


def add_in_a_pre_run_hook(x, y):
    out = torch.empty_like(x)
    _idle[(1,)](x, y, out, x.numel(), BLOCK=1024)
    return out


_HELD: list[torch.Tensor] = []


def _add_held() -> None:
    torch.add(_HELD[0], _HELD[1], out=_HELD[2])


@triton.jit
def _body_calls_python(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    _add_held()  # the interpreter runs the body as Python: a call is a call


def add_in_the_kernels_body(x, y):
    out = torch.empty_like(x)
    _HELD[:] = [x, y, out]
    _body_calls_python[(1,)](x, y, out, x.numel(), BLOCK=1024)
    return out


# --- the grader's environment, looked for from inside the sandbox --------------------------

def seen_in_proc(needle: bytes) -> dict:
    """Every process this one can see in /proc: which hold ``needle`` in their environment
    or command line, and in the memory of any other (read through /proc/PID/mem, region by
    region of its maps). Also how many processes and bytes of memory were read."""
    import os

    own = str(os.getpid())
    seen = {"processes": 0, "memory_read": 0, "holding": []}
    for pid in (entry for entry in os.listdir("/proc") if entry.isdigit()):
        seen["processes"] += 1
        for part in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{part}", "rb") as file:
                    if needle in file.read():
                        seen["holding"].append(f"{pid}/{part}")
            except OSError:
                continue
        if pid == own:  # its own memory holds the needle it looks for
            continue
        try:
            with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
                for line in maps:
                    span, perms = line.split()[:2]
                    start, end = (int(x, 16) for x in span.split("-"))
                    if "r" not in perms:
                        continue
                    try:
                        mem.seek(start)
                        chunk = mem.read(end - start)
                    except (OSError, ValueError, OverflowError):
                        continue
                    seen["memory_read"] += len(chunk)
                    if needle in chunk:
                        seen["holding"].append(f"{pid}/mem")
        except OSError:
            continue
    return seen


# A variable set for the grader alone (not one of the ROOFLAB_ switches the sandbox keeps).
GRADERS_SECRET = ("GRADERS_OWN_TOKEN", "grader" + "-only-" + "4d1c9e")


def cost_if_nothing_leaks(n, dtype_bytes):
    """roofline/cost_vector_add, right only where no process in sight holds the grader's
    secret; says what it read."""
    seen = seen_in_proc(GRADERS_SECRET[1].encode())
    print(f"looked at {seen['processes']} processes, {seen['memory_read']} bytes of "
          f"memory; the secret in: {seen['holding']}", flush=True)
    return (n, 3 * n * dtype_bytes) if not seen["holding"] else (0, 0)
