"""Top-K: the k largest scores of every row, with their positions, in descending order.

Picking the top k of n scores does almost no arithmetic, a comparison or two per element.
Its floor is the input read once and the k results written once, so it is memory-bound:
at 256 × 262 144 fp32 that is 268 MB, 80 µs on an H100. ``torch.topk`` takes about ten
times that, because its radix select reads each row several times. The ladder:

1. ``topk_rows``: one program per row walks its row in blocks and keeps a running top K
   in registers, merging each block in with a sorting network (``tl.sort``/``tl.topk``).
   Right for small k and many rows; it stops scaling when K words no longer fit in a
   program's registers, and when there are fewer rows than multiprocessors.
2. ``topk_radix``: radix select on the bits of the floats. A 256-bin histogram of the
   top byte of every element finds the bucket that holds the k-th largest; one more read
   copies the few elements at or above it into a small buffer; a sort of those survivors
   finishes. Each row is split over several programs, so 256 rows fill 132 SMs. Rows
   whose survivors would not fit (a narrow range of values, heavy duplicates) refine the
   bucket with the next byte first, one more read each time.
3. ``StreamingTopK``: scores that arrive in chunks over time, O(k) memory: each chunk's
   top k is merged into the running top k on the GPU, the same merge that combines the
   top k of several GPUs.

Ordering: every version ranks elements by ``float_key``, an unsigned integer whose order
is the order of the floats, with every NaN above +inf (as ``torch.topk`` ranks them,
whatever their sign bit). ±0 are distinct keys (+0 ranks first) but equal values, so
either may come back, as from ``torch.topk``. A key and the element's position, packed
into one 64-bit word, sort together: ties between equal values break by position.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rooflab.autograder.device import interpreter_enabled

DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# In Triton's interpreter tl.sort and tl.topk cost seconds on a block of 1024 (each layer
# of their network is a reduction over a custom combine function, element by element in
# Python); the same network written with tl.maximum and tl.minimum takes milliseconds.
# On a GPU the compiler's own sort is the one to use.
INTERPRETED = tl.constexpr(interpreter_enabled())


# %% Ordering floats as integers ------------------------------------------------------------


@triton.jit
def float_key(x):
    """An unsigned 32-bit key whose order is the order of the values of ``x``: for two
    floats a < b, float_key(a) < float_key(b). Every NaN gets the largest key, 2**32 - 1,
    above +inf. fp16 and bf16 are upcast first, which is exact."""
    bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
    ### BEGIN SOLUTION
    ### KEY
    # A positive float's bits already grow with its value: set the sign bit, to put it
    # above every negative one. A negative float's bits grow as the value *falls*
    # (-2.0 is 0xC0000000, -1.0 is 0xBF800000): flip them all (x ^ 0xFFFFFFFF; ~x does
    # the same, but Triton 3.6's interpreter fails on ~ of an unsigned integer).
    key = tl.where((bits >> 31) == 1, bits ^ 0xFFFFFFFF, bits | 0x80000000)
    ### END KEY
    # 0 * inf gives a NaN with the sign bit set, which would land below -inf.
    key = tl.where(x != x, 0xFFFFFFFF, key)
    ### END SOLUTION
    return key


@triton.jit
def key_value(key):
    """The fp32 value of a key (float_key's inverse; every NaN comes back as one NaN)."""
    bits = tl.where((key >> 31) == 1, key ^ 0x80000000, key ^ 0xFFFFFFFF)
    return bits.to(tl.float32, bitcast=True)


# %% Sorting networks -----------------------------------------------------------------------


@triton.jit
def _network_topk(x, LOG_N: tl.constexpr, LOG_K: tl.constexpr):
    """The 2**LOG_K largest of x (2**LOG_N entries), descending, by a bitonic network
    written with tl.maximum and tl.minimum. First it sorts runs of K, alternately
    descending and ascending; then, while x is longer than K, it keeps the larger of each
    pair of neighbouring runs (their top K, as one bitonic sequence) and merges that into
    order. Each layer pairs every entry with the one D away (viewed as [A, 2, D]); the
    larger goes first in even-numbered runs of 2**s, last in odd ones. (One function, no
    helper per layer: in the interpreter every call of a jit function costs a millisecond.)"""
    for s in tl.static_range(1, LOG_N + 1):
        n: tl.constexpr = LOG_N if s <= LOG_K else LOG_N - (s - LOG_K)  # x is 2**n long
        if s > LOG_K:  # keep the larger of each pair of runs of K: x halves
            a, b = tl.split(tl.permute(tl.reshape(x, [1 << (n - LOG_K), 2, 1 << LOG_K]),
                                       [0, 2, 1]))
            x = tl.reshape(tl.maximum(a, b), [1 << n])
        run: tl.constexpr = min(s, LOG_K)  # runs of 2**run come out sorted
        for i in tl.static_range(run):
            j: tl.constexpr = run - 1 - i
            a, b = tl.split(tl.permute(tl.reshape(x, [1 << (n - j - 1), 2, 1 << j]),
                                       [0, 2, 1]))
            first = (((tl.arange(0, 1 << (n - j - 1)) >> (run - j - 1)) & 1) == 0)[:, None]
            high, low = tl.maximum(a, b), tl.minimum(a, b)
            pair = tl.join(tl.where(first, high, low), tl.where(first, low, high))
            x = tl.reshape(tl.permute(pair, [0, 2, 1]), [1 << n])
    return x


@triton.constexpr_function
def _log2(n):
    return n.bit_length() - 1


@triton.jit
def top_k(x, K: tl.constexpr):
    """The K largest entries of the 1-D ``x``, in descending order. ``x``'s length and K
    are powers of two, K >= 2. On a GPU this is ``tl.topk``; in the interpreter the same
    bitonic network, written so that it runs fast there."""
    if INTERPRETED:
        return _network_topk(x, _log2(x.shape[0]), _log2(K))
    else:
        return tl.topk(x, K)


@triton.jit
def merge_top(a, b):
    """The top len(a) of two equally long vectors, in descending order."""
    both = tl.reshape(tl.join(a, b), [2 * a.shape[0]])
    return top_k(both, a.shape[0])


@triton.jit
def pack(key, position):
    """(key, position) as one 64-bit word that sorts by key, then by position. Position 0
    and key 0 (which no float has: it would be a NaN, and NaN's key is 2**32 - 1) make 0,
    below every element: the value of an empty slot."""
    return (key.to(tl.uint64) << 32) | position.to(tl.uint64)


# %% 1. One program per row -----------------------------------------------------------------


def _pad(k: int) -> int:
    """K as the sorting networks need it: a power of two, at least 2."""
    return max(2, triton.next_power_of_2(k))


def _outputs(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Check the arguments; allocate the values (x's dtype) and int64 indices, [m, k]."""
    assert x.dim() == 2, "top-k here works on a matrix, along its last dimension"
    assert x.dtype in DTYPES, f"top-k supports {DTYPES}, not {x.dtype}"
    m, n = x.shape
    if not 1 <= k <= n:
        raise ValueError(f"k must be between 1 and the row length {n}, not {k}")
    assert n < 2**31, "positions are packed in 32 bits"
    return (torch.empty((m, k), dtype=x.dtype, device=x.device),
            torch.empty((m, k), dtype=torch.int64, device=x.device))


@triton.jit
def store_top(running, values_ptr, indices_ptr, row, K, stride_vm, stride_im,
              K_PAD: tl.constexpr):
    """Write the first K of the packed words ``running`` (descending) as values and int64
    indices, row ``row``."""
    slots = tl.arange(0, K_PAD)
    value = key_value((running >> 32).to(tl.uint32))
    tl.store(values_ptr + row * stride_vm + slots, value.to(values_ptr.dtype.element_ty),
             mask=slots < K)
    tl.store(indices_ptr + row * stride_im + slots, (running & 0xFFFFFFFF).to(tl.int64),
             mask=slots < K)


@triton.jit
def topk_rows_kernel(x_ptr, values_ptr, indices_ptr, N, K, stride_xm, stride_xn,
                     stride_vm, stride_im, BLOCK: tl.constexpr, K_PAD: tl.constexpr):
    """One program per row: walk it in blocks of BLOCK, keeping in ``running`` the K_PAD
    largest (key, position) words seen so far, in descending order."""
    row = tl.program_id(0).to(tl.int64)  # row * stride can pass 2**31 on a big tensor
    running = tl.zeros((K_PAD,), tl.uint64)  # 0: an empty slot, below every element
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(x_ptr + row * stride_xm + cols * stride_xn, mask=mask, other=0.0)
        ### BEGIN SOLUTION
        # Lanes past the row's end must never win: give them the empty word, 0.
        words = tl.where(mask, pack(float_key(x), cols), 0)
        ### KEY
        # The block's own top K_PAD, then the top K_PAD of it and the running ones.
        running = merge_top(running, top_k(words, K_PAD))
        ### END KEY
        ### END SOLUTION
    store_top(running, values_ptr, indices_ptr, row, K, stride_vm, stride_im, K_PAD)


def topk_rows(x: torch.Tensor, k: int, block: int | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest entries of each row of the 2-D ``x`` (fp32, fp16 or bf16, of any
    strides) and their column indices, descending, as ``torch.topk(x, k)`` returns them:
    values in x's dtype, indices int64, NaN above every number, ties in any order.

    One program per row. Where it stops scaling:

    * registers: a program holds K_PAD = next_power_of_2(k) packed 64-bit words, a block of
      ``block`` (at least K_PAD) more, and the 2 K_PAD words of each merge: 40 KB at
      k = 1024, 160 KB at k = 4096, against 256 KB of registers on a whole SM. Past a few
      thousand the words spill to local memory;
    * work: each block goes through sorting networks, its own top K_PAD and the merge:
      16 compare-and-swaps per element at k = 64, 89 at k = 1024 (blocks of 1024), which
      grows with k where the bytes read do not;
    * the chip: one program per row, so with fewer rows than multiprocessors most of the
      GPU has nothing to do (8 rows: 8 of 132 SMs).
    """
    values, indices = _outputs(x, k)
    m, n = x.shape
    k_pad = _pad(k)
    # In the interpreter a block's network costs about the same at 1024 as at 16384 (it is
    # numpy's work, a few hundred operations whatever their size): fewer, larger blocks.
    block = block or (16384 if interpreter_enabled() else 1024)
    block = max(k_pad, min(block, triton.next_power_of_2(n)))
    topk_rows_kernel[(m,)](x, values, indices, n, k, x.stride(0), x.stride(1),
                           values.stride(0), indices.stride(0), BLOCK=block, K_PAD=k_pad,
                           num_warps=min(16, max(4, block // 256)))
    return values, indices


# %% 2. Radix select ------------------------------------------------------------------------
#
# Think of each key as four base-256 digits, most significant first. The histogram of the
# first digit over a row says, bucket by bucket, how many elements start with it; counting
# down from bucket 255, the bucket where the count reaches k holds the k-th largest. Every
# element in a higher bucket is in the top k; the ones in that bucket are candidates. If
# the candidates fit the buffer, one more read copies them there and a sort finishes; if
# not, the next digit's histogram, over that bucket only, splits it further.

BINS = 256  # one byte of the key per level: tl.histogram's cost grows with its bins
LEVELS = 4  # 32-bit keys


@triton.jit
def threshold_bucket(hist, k):
    """The bucket of ``hist`` (counts of digits 0..BINS-1 among the candidates) that
    holds the k-th largest candidate, the number of candidates in higher buckets, and the
    number in that bucket."""
    digits = tl.arange(0, hist.shape[0])
    ### BEGIN SOLUTION
    ### KEY
    at_or_above = tl.cumsum(hist, 0, reverse=True)  # candidates in bucket d or higher
    # at_or_above never grows with d: the buckets where it is still >= k are 0..bucket.
    bucket = tl.sum((at_or_above >= k).to(tl.int32), 0) - 1
    ### END KEY
    above = tl.sum(tl.where(digits > bucket, hist, 0), 0)
    inside = tl.sum(tl.where(digits == bucket, hist, 0), 0)
    ### END SOLUTION
    return bucket, above, inside


@triton.jit
def radix_walk(hist_ptr, row, K, CAP, LEVEL, BINS: tl.constexpr, LEVELS: tl.constexpr):
    """Replay the choices of levels 0..LEVEL-1 of a row from their histograms. Returns the
    key prefix chosen so far, its length in digits, how many elements are above it, the
    number of elements under that prefix, how many of them are still to be picked, and
    whether the candidates (elements above or under the prefix) fit a buffer of CAP.
    Levels after the one where they fit are not looked at."""
    prefix = tl.zeros((), tl.uint64)
    depth = tl.zeros((), tl.int32)
    greater = tl.zeros((), tl.int32)
    inside = tl.zeros((), tl.int32)
    left = K + tl.zeros((), tl.int32)
    fits = tl.zeros((), tl.int32)
    for level in range(0, LEVEL):
        if fits == 0:
            hist = tl.load(hist_ptr + (row * LEVELS + level) * BINS + tl.arange(0, BINS))
            bucket, above, inside = threshold_bucket(hist, left)
            prefix = (prefix << 8) | bucket.to(tl.uint64)
            depth = level + 1
            greater += above
            left -= above
            fits = (greater + inside <= CAP).to(tl.int32)
    return prefix, depth, greater, inside, left, fits


@triton.jit
def radix_histogram_kernel(x_ptr, hist_ptr, N, K, CAP, stride_xm, stride_xn, CHUNK, LEVEL,
                           BLOCK: tl.constexpr, BINS: tl.constexpr, LEVELS: tl.constexpr):
    """Program (row, part) counts, over its CHUNK of the row, the digit LEVEL of every
    element under the prefix the earlier levels chose, and adds its counts to the row's
    histogram for that level. A row whose candidates already fit reads nothing."""
    row = tl.program_id(0).to(tl.int64)
    start = tl.program_id(1) * CHUNK
    end = tl.minimum(start + CHUNK, N)
    prefix, depth, greater, inside, left, fits = radix_walk(hist_ptr, row, K, CAP, LEVEL,
                                                            BINS, LEVELS)
    end = tl.where(fits != 0, start, end)  # nothing left to do here: an empty loop
    shift = 24 - 8 * LEVEL  # this level's digit: bits shift .. shift + 7 of the key
    counts = tl.zeros((BINS,), tl.int32)
    for block in range(start, end, BLOCK):
        cols = block + tl.arange(0, BLOCK)
        mask = cols < end
        x = tl.load(x_ptr + row * stride_xm + cols * stride_xn, mask=mask, other=0.0)
        ### BEGIN SOLUTION
        key = float_key(x)
        digit = ((key >> shift) & (BINS - 1)).to(tl.int32)
        ### KEY
        # Only the elements under the prefix chosen so far (at level 0: all of them).
        under = mask & ((key.to(tl.uint64) >> (shift + 8)) == prefix)
        counts += tl.histogram(digit, BINS, mask=under)
        ### END KEY
        ### END SOLUTION
    tl.atomic_add(hist_ptr + (row * LEVELS + LEVEL) * BINS + tl.arange(0, BINS), counts,
                  mask=tl.arange(0, BINS) < tl.where(fits != 0, 0, BINS))


@triton.jit
def radix_filter_kernel(x_ptr, hist_ptr, cand_ptr, counts_ptr, N, K, CAP, stride_xm,
                        stride_xn, CHUNK, BLOCK: tl.constexpr, BINS: tl.constexpr,
                        LEVELS: tl.constexpr):
    """Program (row, part) copies the elements of its chunk that are above the prefix
    the levels chose, or under it, into the row's candidate buffer (CAP packed words):
    the ones above at slots 0..greater-1, the ones under it after them. Slots are reserved
    with atomic counters, two per row. At the last level the prefix is the whole key: the
    elements under it are equal, and only as many as are still needed are kept."""
    row = tl.program_id(0).to(tl.int64)
    start = tl.program_id(1) * CHUNK
    end = tl.minimum(start + CHUNK, N)
    prefix, depth, greater, inside, left, fits = radix_walk(hist_ptr, row, K, CAP, LEVELS,
                                                            BINS, LEVELS)
    shift = 32 - 8 * depth
    limit = tl.where(fits != 0, inside, left)  # elements under the prefix to keep
    for block in range(start, end, BLOCK):
        cols = block + tl.arange(0, BLOCK)
        mask = cols < end
        x = tl.load(x_ptr + row * stride_xm + cols * stride_xn, mask=mask, other=0.0)
        key = float_key(x)
        ### BEGIN SOLUTION
        ### KEY
        top = key.to(tl.uint64) >> shift
        above = mask & (top > prefix)
        under = mask & (top == prefix)
        ### END KEY
        words = pack(key, cols)
        n_above = tl.sum(above.to(tl.int32), 0)
        if n_above > 0:  # most blocks have none: skip the atomic
            ### KEY
            first = tl.atomic_add(counts_ptr + row * 2, n_above)  # reserve n_above slots
            slot = first + tl.cumsum(above.to(tl.int32), 0) - 1
            ### END KEY
            tl.store(cand_ptr + row * CAP + slot, words.to(tl.int64, bitcast=True), mask=above)
        n_under = tl.sum(under.to(tl.int32), 0)
        if n_under > 0:
            first = tl.atomic_add(counts_ptr + row * 2 + 1, n_under)
            slot = first + tl.cumsum(under.to(tl.int32), 0) - 1
            tl.store(cand_ptr + row * CAP + greater + slot, words.to(tl.int64, bitcast=True),
                     mask=under & (slot < limit))
        ### END SOLUTION


@triton.jit
def radix_finish_kernel(cand_ptr, hist_ptr, values_ptr, indices_ptr, K, CAP, stride_vm,
                        stride_im, BLOCK: tl.constexpr, K_PAD: tl.constexpr,
                        BINS: tl.constexpr, LEVELS: tl.constexpr):
    """One program per row: the top K of the row's candidates, sorted, as in topk_rows."""
    row = tl.program_id(0).to(tl.int64)
    prefix, depth, greater, inside, left, fits = radix_walk(hist_ptr, row, K, CAP, LEVELS,
                                                            BINS, LEVELS)
    count = greater + tl.where(fits != 0, inside, left)  # the candidates in the buffer
    running = tl.zeros((K_PAD,), tl.uint64)
    for start in range(0, count, BLOCK):
        slots = start + tl.arange(0, BLOCK)
        words = tl.load(cand_ptr + row * CAP + slots, mask=slots < count, other=0)
        running = merge_top(running, top_k(words.to(tl.uint64, bitcast=True), K_PAD))
    store_top(running, values_ptr, indices_ptr, row, K, stride_vm, stride_im, K_PAD)


def _sm_count(device: torch.device) -> int:
    """Multiprocessors to fill: the GPU's; in the interpreter, a toy card's 8."""
    if device.type == "cuda" and not interpreter_enabled():
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8


def topk_radix(x: torch.Tensor, k: int, block: int | None = None, split: int | None = None,
               cap: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest entries of each row of ``x`` and their column indices, descending,
    by radix select over the bits of the keys.

    Launches, each row split over ``split`` programs (enough for 4 per SM in all):

    ==============  ===========================================  ======================
    launch          does                                         reads x
    ==============  ===========================================  ======================
    histogram × 4   level L: counts of byte L of the key, under   once at level 0; again
                    the prefix of levels < L; rows whose           only for rows whose
                    candidates already fit skip it                 candidates do not fit
    filter          copies elements above / under the prefix      once
                    into the buffer (``cap`` words a row)
    finish          top k of the buffer, sorted (one program      no
                    per row)
    ==============  ===========================================  ======================

    On random normal scores the top byte (sign and seven bits of exponent) already cuts a
    row of 262 144 to a few thousand candidates: x is read twice, and the scratch is a few
    KB a row. A narrow range of values (all in [1, 2), say) shares its top byte, so those
    rows take a level or more, one read each; a row of equal values takes all four.
    """
    values, indices = _outputs(x, k)
    m, n = x.shape
    k_pad = _pad(k)
    block = block or (8192 if interpreter_enabled() else 2048)
    block = min(block, triton.next_power_of_2(n))
    sms = _sm_count(x.device)
    if split is None:
        split = max(1, min(triton.cdiv(4 * sms, m), triton.cdiv(n, block)))
    chunk = triton.cdiv(triton.cdiv(n, split), block) * block
    split = triton.cdiv(n, chunk)
    # The buffer: 8 k words a row, and with a row per SM or more, up to 1/32 of a row
    # (the top byte of random normal scores leaves 2-3% of them). The finish sorts it with
    # one program per row: with few rows, a smaller buffer and one more level are faster.
    cap = cap or max(8 * k_pad, triton.next_power_of_2(n) // 32 if m >= sms else 0)
    assert cap >= k, "the buffer must hold at least k candidates"
    hist = torch.zeros((m, LEVELS, BINS), dtype=torch.int32, device=x.device)
    counts = torch.zeros((m, 2), dtype=torch.int32, device=x.device)
    cand = torch.empty((m, cap), dtype=torch.int64, device=x.device)
    warps = min(8, max(4, block // 256))
    for level in range(LEVELS):
        radix_histogram_kernel[(m, split)](x, hist, n, k, cap, x.stride(0), x.stride(1), chunk,
                                           level, BLOCK=block, BINS=BINS, LEVELS=LEVELS,
                                           num_warps=warps)
    radix_filter_kernel[(m, split)](x, hist, cand, counts, n, k, cap, x.stride(0), x.stride(1),
                                    chunk, BLOCK=block, BINS=BINS, LEVELS=LEVELS,
                                    num_warps=warps)
    # The finish sorts blocks of candidates: in the interpreter a block of 8192 costs
    # about what one of 1024 does, and there are fewer of them.
    finish = max(k_pad, min(8192 if interpreter_enabled() else 1024,
                            triton.next_power_of_2(cap)))
    radix_finish_kernel[(m,)](cand, hist, values, indices, k, cap, values.stride(0),
                              indices.stride(0), BLOCK=finish, K_PAD=k_pad, BINS=BINS,
                              LEVELS=LEVELS, num_warps=min(16, max(4, finish // 256)))
    return values, indices


# %% 3. A stream of chunks, and several GPUs ------------------------------------------------


@triton.jit
def merge_topk_kernel(a_values_ptr, a_indices_ptr, NA, b_values_ptr, b_indices_ptr, NB,
                      B_BASE, out_values_ptr, out_indices_ptr, K, K_PAD: tl.constexpr):
    """The top K of two lists of candidates, each at most K_PAD long: a (values and
    positions) and b (values, and positions counted from B_BASE). One program."""
    slots = tl.arange(0, K_PAD)
    a = tl.load(a_values_ptr + slots, mask=slots < NA, other=0.0)
    b = tl.load(b_values_ptr + slots, mask=slots < NB, other=0.0)
    ### BEGIN SOLUTION
    # Sort keys with a payload: the slot each candidate came from, a's first, then b's.
    # The positions themselves need not fit in 32 bits: they are fetched by slot after.
    ### KEY
    a_words = tl.where(slots < NA, pack(float_key(a), slots), 0)
    b_words = tl.where(slots < NB, pack(float_key(b), slots + K_PAD), 0)
    ### END KEY
    best = merge_top(a_words, b_words)
    slot = (best & 0xFFFFFFFF).to(tl.int32)
    from_a = slot < K_PAD
    index = tl.where(from_a, tl.load(a_indices_ptr + slot, mask=from_a & (slots < K)),
                     tl.load(b_indices_ptr + slot - K_PAD, mask=~from_a & (slots < K))
                     + B_BASE)
    value = key_value((best >> 32).to(tl.uint32))
    ### END SOLUTION
    tl.store(out_values_ptr + slots, value.to(out_values_ptr.dtype.element_ty), mask=slots < K)
    tl.store(out_indices_ptr + slots, index, mask=slots < K)


class StreamingTopK:
    """The top k of a stream of scores that arrives in chunks, in O(k) memory.

    ``update(chunk)`` takes the next 1-D chunk; ``result()`` returns the top k so far,
    (values, indices), descending, where an index is a position in the stream plus
    ``offset``. Between updates the object holds its top k and nothing else: never the
    chunks, which may be gone (or reused by the caller) as soon as ``update`` returns.

    ``merge(other)`` takes in another stream's top k, as the top k of several GPUs, each
    over its own shard of the scores (with ``offset`` = where its shard starts), combine.
    """

    def __init__(self, k: int, offset: int = 0):
        if k < 1:
            raise ValueError(f"k must be at least 1, not {k}")
        self.k, self.offset, self.seen = k, offset, 0
        self.values: torch.Tensor | None = None  # the top k so far, descending
        self.indices: torch.Tensor | None = None

    def update(self, chunk: torch.Tensor) -> None:
        assert chunk.dim() == 1, "a chunk is a 1-D tensor of scores"
        if chunk.numel() == 0:
            return
        ### BEGIN SOLUTION
        # The chunk's own top k (a chunk shorter than k: all of it): one program for a
        # chunk that fits a block, many for a long one. Then merge it into the top k so
        # far, its positions counted from where it starts. Nothing of the chunk is kept.
        ### KEY
        topk = topk_rows if chunk.numel() <= 8192 else topk_radix
        values, indices = topk(chunk[None, :], min(self.k, chunk.numel()))
        self._absorb(values[0], indices[0], self.offset + self.seen)
        ### END KEY
        self.seen += chunk.numel()
        ### END SOLUTION

    def merge(self, other) -> None:
        """Take in ``other``'s top k (its indices are already positions in the whole)."""
        if other.values is not None:
            self._absorb(other.values, other.indices, 0)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.values is None:
            raise ValueError("no scores yet: call update first")
        return self.values, self.indices

    def _absorb(self, values: torch.Tensor, indices: torch.Tensor, base: int) -> None:
        """Replace the top k so far by the top k of it and (values, indices + base)."""
        held = 0 if self.values is None else self.values.numel()
        a_values = values if self.values is None else self.values  # unread when held is 0
        a_indices = indices if self.indices is None else self.indices
        kept = min(self.k, held + values.numel())
        out_values = torch.empty(kept, dtype=values.dtype, device=values.device)
        out_indices = torch.empty(kept, dtype=torch.int64, device=values.device)
        merge_topk_kernel[(1,)](a_values, a_indices, held, values, indices, values.numel(),
                                base, out_values, out_indices, kept, K_PAD=_pad(self.k),
                                num_warps=4)
        self.values, self.indices = out_values, out_indices
