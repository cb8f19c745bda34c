"""Resource limits, every format: matrices at and just over the device's maximum
allocation and global memory (pretended with ``Device.override``), index sizes around
2**31 through the index-type choice and conversion (without allocating that much), and
work-group / local-memory requests beyond what the device allows.  Always a clear
PySpMVError or ValueError naming the limit -- or a correct result -- never a crash or a
wrong answer."""

import numpy as np
import pyopencl as cl
import pytest
import scipy.sparse as sp
from conftest import DEVICES, poisoned
from matrix_cases import check_against_scipy, check_all, csr_from_row_lengths, read_back

import pyspmv_cl as psc
from pyspmv_cl import cache
from pyspmv_cl.errors import DeviceMemoryError, FormatNotSuitableError, IndexOverflowError
from pyspmv_cl.formats import get_format
from pyspmv_cl.formats.base import INT32_LIMIT, choose_index_dtype
from pyspmv_cl.formats.coo import COOPart

FORMATS = psc.formats()
with_formats = pytest.mark.parametrize("fmt", FORMATS)
NO_REFUSAL = {"ell": {"max_padding": float("inf")}, "ellr-t": {"max_padding": float("inf")},
              "dia": {"max_fill": float("inf"), "max_diagonals": 10**9}}


def matrix(rng, m=900, n=700):
    lengths = rng.integers(0, 30, m)
    lengths[[0, m // 2]] = [n, 0]
    return csr_from_row_lengths(rng, lengths, n, shuffle=True)


def device_buffers(impl, seen=None):
    """Every device buffer an operator holds (its ``buffers``, sub-operators', scratch)."""
    seen = set() if seen is None else seen
    found = []
    if id(impl) in seen:
        return found
    seen.add(id(impl))
    for value in vars(impl).values():
        items = value.values() if isinstance(value, dict) else [value]
        for item in items:
            if isinstance(item, cl.Buffer):
                found.append(item)
            elif hasattr(item, "__dict__") and type(item).__module__.startswith("pyspmv_cl"):
                found.extend(device_buffers(item, seen))
    return found


def first_device_only(device):
    """Host-side logic (parameter choice, checks): one device is enough, and each case
    compiles kernels of its own."""
    if device is not DEVICES[0]:
        pytest.skip("host-side limits: checked on the first device")


def is_clear(exc, *words):
    text = str(exc)
    return len(text) > 40 and any(w in text for w in words)


# ------------------------------------------------------------------ memory limits


@with_formats
def test_max_allocation_boundary(fmt, device, rng):
    """Exactly the largest matrix array fits: works.  One byte less: a clear error (or
    parameters that fit, and a right answer)."""
    A = matrix(rng)
    params = NO_REFUSAL.get(fmt, {})
    op = psc.SpMV(A, format=fmt, dtype=np.float32, device=device, **params)
    matrix_arrays = [b.size for b in op._impl.buffers.values()]
    largest = max(matrix_arrays)
    at_limit = device.override(max_alloc_size=largest)
    ok = psc.SpMV(A, format=fmt, dtype=np.float32, device=at_limit, **params)
    x = rng.standard_normal(A.shape[1])
    check_against_scipy(ok.matvec(x, out=poisoned(A.shape[0], np.float32)), A, x, np.float32)
    below = device.override(max_alloc_size=largest - 1)
    try:
        op = psc.SpMV(A, format=fmt, dtype=np.float32, device=below, **params)
    except (DeviceMemoryError, FormatNotSuitableError) as exc:
        assert is_clear(exc, "allocation", "can hold", "memory"), str(exc)
    else:  # it chose a layout that fits: then it must be within the limit, and right
        assert max(b.size for b in op._impl.buffers.values()) <= largest - 1
        check_against_scipy(op.matvec(x, out=poisoned(A.shape[0], np.float32)), A, x,
                            np.float32)


@with_formats
def test_global_memory_too_small(fmt, device, rng):
    A = matrix(rng)
    params = NO_REFUSAL.get(fmt, {})
    op = psc.SpMV(A, format=fmt, dtype=np.float64 if device.profile.fp64 else np.float32,
                  device=device, **params)
    tiny = device.override(global_mem_size=op.nbytes // 2)
    with pytest.raises((DeviceMemoryError, FormatNotSuitableError)) as info:
        psc.SpMV(A, format=fmt, dtype=op.dtype, device=tiny, **params)
    assert is_clear(info.value, "memory", "can hold"), str(info.value)
    assert isinstance(info.value, MemoryError) or fmt in str(info.value)


@with_formats
def test_tiny_max_allocation_refuses_every_format(fmt, device, rng):
    """A device that cannot hold even a small array: refused before any upload."""
    small = device.override(max_alloc_size=256, global_mem_size=10**12)
    with pytest.raises((DeviceMemoryError, FormatNotSuitableError)) as info:
        psc.SpMV(matrix(rng), format=fmt, dtype=np.float32, device=small,
                 **NO_REFUSAL.get(fmt, {}))
    assert "256 B" in str(info.value) or "can hold" in str(info.value), str(info.value)


# ------------------------------------------------------------------ index overflow


@pytest.mark.parametrize("which", ["rows", "cols", "nnz"])
def test_index_type_boundary(which):
    sizes = {"rows": 10, "cols": 10, "nnz": 10}
    for value, expected in ((INT32_LIMIT, np.int32), (INT32_LIMIT + 1, np.int64),
                            (2**31 - 1, np.int64), (2**31, np.int64), (2**32 + 5, np.int64)):
        sizes[which] = value
        args = (sizes["rows"], sizes["cols"], sizes["nnz"])
        assert choose_index_dtype(*args) == expected
        assert choose_index_dtype(*args, index_bits=64) == np.int64
        if expected == np.int64:
            with pytest.raises(IndexOverflowError, match="index_bits=64"):
                choose_index_dtype(*args, index_bits=32)
        else:
            assert choose_index_dtype(*args, index_bits=32) == np.int32
    with pytest.raises(ValueError, match="index_bits"):
        choose_index_dtype(1, 1, 1, index_bits=16)


def test_coo_positions_widen_before_they_wrap():
    """COO's chunk positions run to nnz + 2 chunks: 64-bit just before that passes 2**31."""
    part = object.__new__(COOPart)
    part.owner = type("Owner", (), {"index_dtype": np.dtype(np.int32)})()
    chunk = 4096
    part.nnz = 2**31 - 1 - 2 * chunk
    assert part._pos_dtype(chunk) == np.int32
    part.nnz += 1
    assert part._pos_dtype(chunk) == np.int64


WIDE = 2**31 + 9   # columns: past every 32-bit index


@with_formats
def test_columns_past_2_31(fmt, device, rng):
    """A 5 x (2**31 + 9) matrix: few non-zeros (nothing big to allocate) in columns up to
    2**31 + 8.  Every format must pick 64-bit indices (or refuse, clearly) and keep the
    column numbers intact; asking for 32-bit indices is refused, saying why."""
    # Uneven rows (std > mean / 2), so MatrixFeatures does not count diagonals, which
    # allocates O(m + n) (see test_features_of_a_very_wide_matrix).
    cols = np.array([0, 7, 2**31 - 2, 2**31 - 1, 2**31, 2**31 + 8, 3, 2**31 + 1])
    rows = np.array([0, 0, 0, 1, 1, 2, 2, 4])
    A = sp.csr_matrix((rng.standard_normal(cols.size), (rows, cols)), shape=(5, WIDE))
    # x is never allocated: only the operator is built (a device as big as needed).
    big = device.override(global_mem_size=2**40, max_alloc_size=2**40)
    try:
        op = psc.SpMV(A, format=fmt, dtype=np.float32, device=big, **NO_REFUSAL.get(fmt, {}))
    except (FormatNotSuitableError, DeviceMemoryError) as exc:
        assert get_format(fmt).may_refuse or isinstance(exc, MemoryError)
        assert is_clear(exc, "memory", "can hold", "suit", "allocation"), str(exc)
        return
    assert op.params["index_bits"] == 64
    stored = set()
    for name, arr in read_back(op).items():
        if "col" in name:
            if getattr(op._impl, "packed", False):  # cmrs: row-in-strip in the top 4 bits
                arr = arr.view(np.uint64) & np.uint64((1 << 60) - 1)
            stored |= set(arr[(arr >= 2**31 - 2)].tolist())
    if stored:  # formats whose column array is named *col*: the big columns survive
        assert {2**31 - 2, 2**31 - 1, 2**31, 2**31 + 1, 2**31 + 8} <= stored
    with pytest.raises((IndexOverflowError, FormatNotSuitableError)) as info:
        psc.SpMV(A, format=fmt, dtype=np.float32, device=big, index_bits=32,
                 **NO_REFUSAL.get(fmt, {}))
    assert "64" in str(info.value) or "suit" in str(info.value), str(info.value)


def test_features_of_a_very_wide_matrix():
    """Host memory for a matrix's features scales with nnz, not with its dimensions."""
    import tracemalloc

    from pyspmv_cl.features import MatrixFeatures

    A = sp.csr_matrix((np.ones(4), (np.arange(4), np.arange(4) * (2**29))), shape=(4, WIDE))
    tracemalloc.start()
    try:
        features = MatrixFeatures.from_csr(A)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert features.nnz == 4
    assert peak < 64 * 2**20, f"{peak / 2**20:.0f} MiB for a 4-non-zero matrix"


@with_formats
def test_64_bit_indices_compute_right(fmt, device, rng):
    """The int64 code path that matrices past 2**31 take, run on a small matrix (float32:
    the index arithmetic does not depend on the value type)."""
    first_device_only(device)
    dtype = np.float32
    A = matrix(rng, 300, 200)
    op = psc.SpMV(A, format=fmt, dtype=dtype, device=device, index_bits=64,
                  **NO_REFUSAL.get(fmt, {}))
    assert op.params["index_bits"] == 64
    check_all(op, A, dtype, rng)


# ------------------------------------------------------------------ work-group limits


def takes_work_group_size(fmt):
    return "work_group_size" in get_format(fmt).parameter_names()


@with_formats
def test_work_group_size_over_the_device_maximum(fmt, device, rng):
    if not takes_work_group_size(fmt):
        pytest.skip(f"{fmt} takes no work_group_size")
    limit = device.profile.max_work_group_size
    with pytest.raises(ValueError) as info:
        psc.SpMV(matrix(rng), format=fmt, device=device, work_group_size=2 * limit,
                 **NO_REFUSAL.get(fmt, {}))
    assert str(2 * limit) in str(info.value) or str(limit) in str(info.value), str(info.value)
    small = device.override(max_work_group_size=16)
    with pytest.raises(ValueError) as info:
        psc.SpMV(matrix(rng), format=fmt, device=small, work_group_size=64,
                 **NO_REFUSAL.get(fmt, {}))
    assert "16" in str(info.value), str(info.value)


@pytest.mark.parametrize("limits", [dict(max_work_group_size=1),
                                    dict(max_work_group_size=16, device_type="gpu",
                                         simd_width=32),
                                    dict(local_mem_size=2048, device_type="gpu",
                                         simd_width=64)],
                         ids=["wg1", "wg16-gpu32", "local2k-gpu64"])
@with_formats
def test_defaults_respect_small_devices(fmt, limits, device, rng):
    """On a device allowing few work-items or little local memory, the defaults fit it
    (and compute right), or the format refuses clearly."""
    first_device_only(device)
    small = device.override(**limits)
    A = matrix(rng, 300, 250)
    try:
        op = psc.SpMV(A, format=fmt, dtype=np.float32, device=small, **NO_REFUSAL.get(fmt, {}))
    except (ValueError, RuntimeError) as exc:
        assert is_clear(exc, "work-group", "work_group", "local memory"), str(exc)
        return
    wg = op.params.get("work_group_size")
    if wg is not None:
        assert wg <= small.profile.max_work_group_size
    x = rng.standard_normal(A.shape[1])
    check_against_scipy(op.matvec(x, out=poisoned(A.shape[0], np.float32)), A, x, np.float32)


def test_kernel_refusing_the_group_size_shrinks_or_says_so(device, rng, monkeypatch):
    """A driver whose compiled kernels take fewer work-items than asked
    (CL_KERNEL_WORK_GROUP_SIZE = 24, registers): the group shrinks to fit and the result
    is right, or -- when the kernel needs more than that -- a clear error, not a failed
    launch."""
    first_device_only(device)
    real = cl.Kernel.get_work_group_info

    def limited(self, param, dev):
        if param == cl.kernel_work_group_info.WORK_GROUP_SIZE:
            return min(24, real(self, param, dev))
        return real(self, param, dev)

    monkeypatch.setattr(cl.Kernel, "get_work_group_info", limited)
    # Programs built before (memoised with the real driver's limit) are another driver's.
    cache.clear_memory()
    try:
        _shrink_every_format(device, rng)
    finally:
        cache.clear_memory()   # nor may the limited ones outlive the test


def _shrink_every_format(device, rng):
    A = matrix(rng, 300, 250)
    shrunk = 0
    for fmt in FORMATS:
        if not takes_work_group_size(fmt):
            continue
        try:
            op = psc.SpMV(A, format=fmt, dtype=np.float32, device=device, work_group_size=64,
                          **NO_REFUSAL.get(fmt, {}))
        except (RuntimeError, ValueError) as exc:
            assert is_clear(exc, "work-group", "work_group", "allows"), (fmt, str(exc))
            continue
        assert op.params["work_group_size"] <= 24, (fmt, op.params)
        shrunk += 1
        x = rng.standard_normal(A.shape[1])
        check_against_scipy(op.matvec(x, out=poisoned(A.shape[0], np.float32)), A, x,
                            np.float32)
    assert shrunk >= 3
