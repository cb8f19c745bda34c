"""The measuring auto-tuner behind ``format="auto"``.

1. Cheap models rank the candidates: every registered format with the parameter sets
   its ``tuning_candidates`` proposes, pruned and ordered by its own ``estimate_cost``
   (a footprint/efficiency estimate that also rules out, e.g., DIA on many or poorly
   filled diagonals and the ELL family on heavy padding); the rule-based
   ``choose_format`` goes first.
2. The survivors are built and timed on the device (kernel time from profiling events,
   after warm-up, median of a few runs), within a time budget (building included), and
   checked against scipy: a candidate that raises or computes a wrong result is
   skipped and named in the explanation.
3. The best few (``FINALISTS``) are re-timed in alternation while the budget lasts,
   and the winner among them minimises kernel time, or kernel time x
   ``expected_calls`` + conversion time when the caller says how many products it
   will run.  Every measurement is
   stored in the tuning database (database.py), so the same matrix on the same
   device is decided again without timing, in any process.

Block products (``block_size=k`` > 1): every candidate is timed on products of k
vectors as the operator runs them (``_Bench``: block kernels, else column by column),
the ranking counts the passes over the matrix (``block_passes``), the rules choose
formats with block kernels (heuristics.py), and the decision is stored under k's class
(``block_class``), apart from single-vector decisions.

Policies (``tune=``): ``None``/``"auto"`` uses a stored decision, else, when measuring
pays (``nnz >= MEASURE_MIN_NNZ``), tunes online (starts on a CSR kernel at once and
measures in the background: online.py) -- or measures now when ``expected_calls`` is
given and large enough to repay the budget -- else the rules; ``"online"`` tunes online
unless stored; ``True``/``"measure"`` measures now unless stored; ``"force"``
re-measures now and overwrites; ``False``/``"model"`` uses the rules only.
``PYSPMV_CL_TUNE`` sets the default policy, ``PYSPMV_CL_TUNE_BUDGET`` the default
budget in seconds per million non-zeros.
"""

import contextlib
import dataclasses
import math
import os
import statistics
import time

import numpy as np
import pyopencl as cl

from .. import store
from ..codegen import full_bits
from ..device import runs_in_calling_thread
from ..device_inputs import DeviceCSR
from ..errors import FormatNotSuitableError, InvalidParameterError, PySpMVError
from ..features import (
    bandwidth,
    product_bytes,
    row_length_histogram,
    shape_fingerprint,
    structure_digest,
)
from ..formats import FORMATS
from ..formats import params as P
from ..formats.base import SharedUploads, conversion_is_cheap, instantiate, plan_blocks
from ..formats.columns import ColumnPath, StagingBlocks, columns_product
from ..launching import launches_seconds
from ..pinned_staging import PinnedStaging
from . import database, online
from .heuristics import block_params, block_sets_first, choose_format

TUNE_ENV = "PYSPMV_CL_TUNE"
BUDGET_ENV = "PYSPMV_CL_TUNE_BUDGET"

SECONDS_PER_MNNZ = 1.5      # default budget per million non-zeros (building included)
MIN_BUDGET = 1.0            # ... but at least this: one cold PoCL compile costs ~0.5 s
MEASURE_MIN_NNZ = 100_000   # without expected_calls, smaller matrices use the rules
MAX_FORMATS = 8             # formats timed in the first pass (budget permitting)
ALT_FORMATS = 2             # best formats whose alternative parameter sets are timed
ALT_PARAMS = 3              # alternatives per format
#: Why ``measure(host_conversions=False)`` left a format out.
HOST_CONVERSION_LEFT_OUT = "converts on the host: not timed online (tune=True times it)"
FINALISTS = 3               # re-timed in alternation at the end (load changes hit all alike)
CONFIRM_SHARE = 0.3         # of the budget kept for re-timing the finalists:
MAX_CONFIRM_ROUNDS = 12     # one round at least, then more while the budget lasts
OFFER_MARGIN = 0.95         # online: hand a candidate over early when this much faster
PAYBACK = 0.25              # expected gain of measuring over the rules (share of kernel time)

_POLICIES = {None: "auto", "auto": "auto", True: "measure", "measure": "measure",
             False: "model", "model": "model", "force": "force", "online": "online"}


@dataclasses.dataclass
class Decision:
    format: str
    params: dict              # parameters to pass (on top of the caller's)
    explanation: str
    source: str               # "model", "measured" or "database"
    impl: object = None       # the winner, already built, when measured now
    kernel_seconds: float = None
    tuning_seconds: float = 0.0
    entry: dict = None
    online: object = None     # the OnlineTuning of source "online" (tuning/online.py)
    block_size: int = 1       # the vectors per product the choice was made for


#: Block sizes tuned alike: a decision made for k vectors per product serves every k of
#: its class (the upper bounds; above the last, one class).
BLOCK_CLASSES = (1, 4, 8, 16, 32)


def block_class(k: int) -> int:
    """The class of ``k`` vectors per product (1, 4, 8, 16, 32: 2-4 -> 4, 17+ -> 32)."""
    return next((c for c in BLOCK_CLASSES if k <= c), BLOCK_CLASSES[-1])


def check_block_size(block_size) -> int:
    """``block_size`` as an int >= 1 (None: 1), or a clear error."""
    if block_size is None:
        return 1
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) \
            or block_size < 1:
        raise InvalidParameterError(
            f"block_size must be a positive integer (the vectors per product), not "
            f"{block_size!r}")
    return int(block_size)


def policy(tune):
    source = "tune"
    if tune is None:
        tune = os.environ.get(TUNE_ENV, "auto").strip().lower() or "auto"
        tune = {"true": True, "false": False}.get(tune, tune)   # as the message lists them
        source = f"{TUNE_ENV} (the default of tune)"
    try:
        return _POLICIES[tune]
    except (KeyError, TypeError):
        raise InvalidParameterError(f"{source} must be None/'auto', True/'measure', "
                                    f"False/'model', 'online' or 'force', not {tune!r}") from None


def default_budget(nnz):
    per_m = SECONDS_PER_MNNZ
    if os.environ.get(BUDGET_ENV):
        try:
            per_m = float(os.environ[BUDGET_ENV])
            if not 0 < per_m < math.inf:
                raise ValueError
        except ValueError:
            raise InvalidParameterError(f"{BUDGET_ENV} must be positive seconds per million "
                                        f"non-zeros (a finite number), not "
                                        f"{os.environ[BUDGET_ENV]!r}") from None
    return max(MIN_BUDGET, per_m * nnz / 1e6)


def _us(seconds):
    if seconds >= 1e-2:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.1f} µs"


# -- cheap models -----------------------------------------------------------------------

def block_passes(cls, f, profile, dtype, params, k):
    """Passes over the matrix of one product of ``k`` vectors as the ranking models
    it: one per block of the widths ``params`` give the format's block kernels (16,
    8, 4, 2, 1: 3 for k = 33; widths to 32 for the lanes kernels), k without them
    (one product per column)."""
    widths = cls.block_widths_for(f, profile, dtype, params) if k > 1 else ()
    return len(plan_blocks(k, widths)) if 1 in widths else k


def with_lane_columns(cls, f, profile, dtype, params_list, user_params, k):
    """``params_list`` with, after the first set (the first alternatives a second pass
    times), that set with a row split among groups of lanes where rows are long and
    uneven (``LanesBlocks.lane_split_candidate``), then with the rows taken longest
    first where they are uneven (``LanesBlocks.lane_order_candidate``), then with the
    other column count of a lanes kernel where the format has one for products of ``k``
    vectors (``LanesBlocks.lane_columns_candidate``)."""
    first_width = getattr(cls, "first_lanes_width", None)   # (formats with lanes kernels)
    given = {**user_params, **params_list[0]}
    kb = first_width(f, profile, dtype, given, k) if first_width is not None else None
    if kb is None:
        return params_list
    extras = [{**params_list[0], **extra} for extra in (
        cls.lane_split_candidate(f, given, kb), cls.lane_order_candidate(f, given, kb),
        cls.lane_columns_candidate(f, given, kb)) if extra is not None]
    return [params_list[0], *extras, *params_list[1:]]


def rank_candidates(f, profile, dtype, registry, rule_choice, csr=None, block_size=1,
                    user_params=None):
    """([(format, params)] in the order to time them, [(format, why skipped)]).

    For products of ``block_size`` k > 1 vectors a format's parameter sets with block
    kernels (with ``user_params``) go first, since the first pass times each format's
    first set, and its estimate is multiplied by the passes over the matrix of that
    set (``block_passes``): k for a format without block kernels, which reads the
    matrix once per vector."""
    user_params = dict(user_params or {})
    ranked, skipped = [], []
    for name, cls in registry.items():
        if np.dtype(dtype).kind == "c" and not cls.complex_values:
            skipped.append((name, "no complex values"))
            continue
        try:
            params_list = list(cls.tuning_candidates(f, profile, dtype, csr=csr))
        except Exception as exc:  # a half-finished format must not break auto
            skipped.append((name, f"tuning_candidates raised {type(exc).__name__}"))
            continue
        if not params_list:
            skipped.append((name, "not worth trying"))
            continue
        cost, why = cls.estimate_cost(f, profile, dtype)
        if cost is None:
            skipped.append((name, why))
            continue
        if block_size > 1:   # stable: the format's own order among each kind
            params_list = block_sets_first(cls, f, profile, dtype, params_list, user_params)
            params_list = with_lane_columns(cls, f, profile, dtype, params_list,
                                            user_params, block_size)
            cost *= block_passes(cls, f, profile, dtype, {**user_params, **params_list[0]},
                                 block_size)
        if user_params:   # the caller's parameters stay as given: only the others vary
            params_list = _without(params_list, user_params)
        ranked.append((0 if name == rule_choice else 1, cost, name, params_list))
    ranked.sort(key=lambda r: (r[0], r[1]))
    return [(name, params_list) for _, _, name, params_list in ranked], skipped


def _without(params_list, fixed):
    """``params_list`` without the keys of ``fixed`` (which are merged under each set
    when it is built), duplicates dropped, order kept: a candidate set that changed a
    parameter the caller gave (cmrs's height=4 timed as 2 and 8) overrode it."""
    out = []
    for params in params_list:
        kept = {k: v for k, v in params.items() if k not in fixed}
        if kept not in out:
            out.append(kept)
    return out


# -- measuring -------------------------------------------------------------------------

class _Bench:
    """Vectors and a reference product shared by every candidate of one tuning run.

    With ``block_size`` k > 1 every product is one of k different vectors, run as the
    operator runs it on device arrays: the format's block kernels on a row-major
    ``n x k`` block, or, for a format without them, column by column
    (``formats/columns.py``: a strided copy of each column into a vector, one product,
    a copy of the result back), so a candidate's time is that of a block product and
    its result, all k columns, is checked against scipy's ``A @ X``.

    The reference is scipy's product in float64 (computed at the first check), or,
    after ``use_reference(impl)``, a trusted candidate's own result: an online tuning
    checks candidates against the format the operator already runs, which saves a
    float64 pass over the matrix on the host (0.2-0.3 s at 20M non-zeros)."""

    def __init__(self, csr, device, dtype, queue=None, block_size=1, exclusive=None,
                 staging=None):
        self.queue = queue or device.profiling_queue
        # Around each candidate's timed launches: online, keeps the caller's products
        # off the device meanwhile (``OnlineTuning.exclusive``).
        self.exclusive = exclusive or contextlib.nullcontext
        # Online on GPUs: x and the results copied through pinned memory (a copy of
        # pageable memory held up the caller's products; wing at 20M: 20-41 MB each).
        self.pinned = staging
        self.device = device
        self.block_size = k = int(block_size)
        self.dtype = np.dtype(dtype)
        m, n = csr.shape
        rng = np.random.default_rng(0)
        self.x = rng.uniform(-1.0, 1.0, n if k == 1 else (n, k))   # row-major for k > 1
        self.csr = csr
        self.y_ref = self.scale = None
        mf = cl.mem_flags
        host_x = np.ascontiguousarray(self.x, dtype=self.dtype) if n \
            else np.zeros(1, self.dtype)
        if staging is None:
            self.x_buf = cl.Buffer(device.context, mf.READ_ONLY | mf.COPY_HOST_PTR,
                                   hostbuf=host_x)
        else:
            self.x_buf = cl.Buffer(device.context, mf.READ_ONLY, host_x.nbytes)
            staging.write(self.x_buf, host_x)
        self.y_buf = cl.Buffer(device.context, mf.READ_WRITE,
                               max(1, m * k) * self.dtype.itemsize)
        self.m, self.n = m, n
        self._columns = None   # formats/columns.py's ColumnPath, of the column path
        self._staging = StagingBlocks(device.context, self.dtype)   # its blocks

    def _scipy_reference(self):
        A64 = self.csr.astype(np.complex128 if self.dtype.kind == "c" else np.float64)
        self.y_ref = A64 @ self.x
        # Over the rows that come out finite: an Inf or NaN in the matrix must neither
        # make the scale infinite (every candidate would pass) nor fail them all.
        rows = abs(A64) @ np.abs(self.x) if self.csr.nnz and self.m else np.zeros(0)
        self.scale = float(np.max(rows[np.isfinite(rows)], initial=0.0)) or 1.0

    def use_reference(self, impl):
        """Check later candidates against ``impl``'s product (scaled by its largest
        entry, which makes the check stricter than scipy's ``|A| |x|`` scale)."""
        self.y_ref = self._product(impl).astype(np.result_type(self.dtype, np.float64))
        finite = np.isfinite(self.y_ref)
        self.scale = float(np.max(np.abs(self.y_ref[finite]), initial=0.0)) or 1.0

    @staticmethod
    def path(impl, k):
        """How a product of ``k`` vectors runs on ``impl`` (a record's ``"product"``)."""
        if k == 1:
            return "vector"
        return "block kernels" if impl.has_block_kernels else "column by column"

    def enqueue(self, impl):
        """One product on ``impl``: of the vector, or of the bench's k vectors (block
        kernels, else column by column); returns its last event."""
        k = self.block_size
        if k == 1:
            return impl.enqueue(self.queue, self.x_buf, self.y_buf, 1.0, 0.0)
        if impl.has_block_kernels:
            return impl.enqueue_block(self.queue, self.x_buf, self.y_buf, k, k, k, 1.0, 0.0)
        if self._columns is None:
            self._columns = ColumnPath(self.device, self.dtype)

        def product(x, y, waits):
            return impl.enqueue(self.queue, x, y, 1.0, 0.0, wait_for=waits or None)

        return columns_product(self._columns, self.queue, product, self.x_buf, self.y_buf,
                               self._staging, (self.m, self.n), k, 0.0)

    def _product(self, impl):
        event = self.enqueue(impl)
        y = np.empty(self.m if self.block_size == 1 else (self.m, self.block_size),
                     self.dtype)
        if self.pinned is None:
            cl.enqueue_copy(self.queue, y, self.y_buf, wait_for=[event], is_blocking=True)
        else:
            event.wait()
            self.pinned.read(self.y_buf, y)
        return y

    def launch_seconds(self, impl):
        """Device seconds of one product (``enqueue``), copies of the column path
        included."""
        return launches_seconds(lambda: self.enqueue(impl))

    def error(self, impl):
        """Relative error of this candidate's product over the reference's finite
        entries; inf where it is not finite in the same places (a matrix holding Inf
        or NaN gives non-finite rows in every format, which are not errors)."""
        if not self.m:
            return 0.0
        if self.y_ref is None:
            self._scipy_reference()
        y = self._product(impl).astype(np.result_type(self.dtype, np.float64))
        finite = np.isfinite(self.y_ref)
        if not np.array_equal(np.isfinite(y), finite):
            return float("inf")
        diff = np.abs(y[finite] - self.y_ref[finite])
        worst = float(np.max(diff, initial=0.0))
        return worst / self.scale if np.isfinite(worst) else float("inf")

    def time(self, impl, best=None, min_samples=5, max_samples=30, min_time=0.02, warmup=2):
        """Device seconds of a few products (a list); stops early when hopeless."""
        samples = []
        with self.exclusive():
            for _ in range(warmup):   # the first launch pays for lazy setup
                self.launch_seconds(impl)
            start = time.perf_counter()
            while len(samples) < min_samples or (time.perf_counter() - start < min_time
                                                 and len(samples) < max_samples):
                samples.append(self.launch_seconds(impl))
                if best is not None and len(samples) >= 2 and min(samples) > 3 * best:
                    break   # hopeless: no need for a precise median
        return samples


def _plain(params):
    """Parameters as JSON keeps them (numpy scalars -> Python numbers)."""
    return {str(k): v.item() if isinstance(v, np.generic) else v for k, v in params.items()}


def _tolerance(dtype):
    return 1e-3 if np.dtype(dtype) in (np.float32, np.complex64) else 1e-9


def _score(c, expected_calls):
    if expected_calls:
        return c["kernel_seconds"] * expected_calls + c["conversion_seconds"]
    return c["kernel_seconds"]


def measure(csr, features, device, dtype, user_params=None, *, budget=None,
            expected_calls=None, registry=None, progress=None, should_stop=None,
            queue=None, max_formats=None, alternatives=True, include=(), offer=None,
            block_size=1, host_conversions=True, exclusive=None, staging=None):
    """Time the ranked candidates within ``budget`` seconds; returns (entry, the
    winner's built implementation, the winner's record), the last two None when nothing
    could be measured.  ``progress(done, total, text)`` is told of each step;
    ``should_stop()`` ends the measurement early; ``queue`` (profiling enabled) times
    on a queue of the caller's instead of the device's profiling queue;
    ``max_formats`` (default ``MAX_FORMATS``) bounds the first pass and
    ``alternatives`` the second (other parameter sets of the best ``ALT_FORMATS``
    formats): True times ``ALT_PARAMS`` of each, an integer that many, False none;
    ``include``
    lists (format, params) timed first in the first pass whatever their rank.

    ``offer(format, params, impl)`` (online tuning) is called when a first-pass
    candidate beats the first ``include``d one by ``OFFER_MARGIN``; when it returns True
    the implementation is handed over (used by the caller from then on) and this
    measurement never touches it again: it keeps its first-pass time and is not among
    the re-timed finalists.  Candidates that convert on the device are then timed
    first, so that a gain comes early, and every candidate is checked against the first
    included one's product (the format the caller runs) instead of scipy's.

    ``block_size`` > 1 times products of that many vectors (see ``_Bench``): kernel
    seconds are per block product, and each record says how it ran (``"product"``:
    ``"block kernels"`` or ``"column by column"``).

    ``host_conversions=False`` leaves out the formats that convert on the host, but the
    rules' choice (online tuning on GPUs: ``online.host_conversions``).

    ``exclusive()`` (online tuning: ``OnlineTuning.exclusive``) is entered around each
    candidate's timed launches; ``staging`` (online tuning on GPUs: a
    ``PinnedStaging`` on ``device``'s queue and ``queue``) carries the candidates' one
    upload, the vector and the results read back for the checks."""
    max_formats = MAX_FORMATS if max_formats is None else max_formats

    def stopped():
        return should_stop is not None and should_stop()

    began = time.perf_counter()
    steps = []   # (what, seconds since began): where a measurement's time goes

    def step(what):
        steps.append([what, round(time.perf_counter() - began, 4)])

    registry = dict(FORMATS if registry is None else registry)
    user_params = dict(user_params or {})
    profile = device.profile
    features = features.with_diagonals(csr)   # the rules and DIA's estimate read them
    budget = default_budget(features.nnz) if budget is None else float(budget)
    rule_choice, _ = choose_format(features, profile, dtype, block_size)
    left_out = [] if host_conversions else [
        name for name, cls in registry.items()
        if not cls.converts_on_device and name != rule_choice]
    for name in left_out:
        del registry[name]
    order, skipped = rank_candidates(features, profile, dtype, registry, rule_choice,
                                     csr=csr, block_size=block_size,
                                     user_params=user_params)
    skipped += [(name, HOST_CONVERSION_LEFT_OUT) for name in left_out]

    def converts_on_the_host(name, params):
        """A candidate that would convert on the host, of a format that converts on the
        device in some cases only (bccoo's block shapes other than 1 x 1, dia's
        duplicates): not the rules' choice."""
        cls = registry[name]
        if host_conversions or not cls.host_input_on_device or name == rule_choice:
            return False
        try:
            resolved = cls.resolve_params(features, profile, dtype, {**user_params, **params})
        except Exception:   # run() reports it
            return False
        return not cls.device_conversion_takes(csr, resolved, dtype)

    # Online on a GPU, a format's first candidate that converts on the device (bccoo:
    # its smallest footprint may be a shape that converts on the host).
    first = [(name, next((q for q in p if not converts_on_the_host(name, q)), p[0]))
             for name, p in order[:max_formats]]
    included = {name for name, _ in include}
    skipped += [(name, "ranked lower by the model") for name, _ in order[max_formats:]
                if name not in included]
    include = [(name, dict(params)) for name, params in include if name in registry]
    if offer is not None:   # stable: the model's order among each kind
        first.sort(key=lambda c: not registry[c[0]].converts_on_device)
    first = include + [c for c in first if c not in include]
    step("ranked")
    bench = _Bench(csr, device, dtype, queue, block_size, exclusive, staging)
    start = time.perf_counter()
    results = []
    finalists = []   # [(score, rec, impl, samples)], the best few so far
    # Each finalist keeps its device buffers: only one when memory is tight.
    csr_bytes = csr.nnz * (np.dtype(dtype).itemsize + 8) + csr.shape[0] * 8
    keep = FINALISTS if 4 * (FINALISTS + 1) * csr_bytes < profile.global_mem_size else 1
    costs = []
    # One upload of the matrix for the candidates that convert on the device.
    uploads = SharedUploads(staging)

    def run(name, params, alternative):
        cls = registry[name]
        if converts_on_the_host(name, params):
            skipped.append((f"{name} {_plain(params)}" if params else name,
                            HOST_CONVERSION_LEFT_OUT))
            return
        t0 = time.perf_counter()
        try:
            resolved = cls.resolve_params(features, profile, dtype, {**user_params, **params})
            impl = instantiate(cls, csr, device, dtype, resolved, uploads, features)
            conversion = impl.conversion_seconds
            if offer is not None and include and not results and (name, params) == include[0]:
                bench.use_reference(impl)   # online: the operator's own format
            err = bench.error(impl)
            if not err <= _tolerance(dtype):
                raise ArithmeticError(f"wrong result (relative error {err:.1e})")
            fastest = min((r["kernel_seconds"] for r in results), default=None)
            samples = bench.time(impl, fastest)
        except FormatNotSuitableError as exc:
            skipped.append((name, "refused: " + str(exc).split(":", 2)[-1].strip()[:80]))
            return
        except Exception as exc:  # skip it and say so; never fail the caller
            skipped.append((name, f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
                            if str(exc) else type(exc).__name__))
            return
        finally:
            costs.append(time.perf_counter() - t0)
            step(name if not alternative else f"{name} {_plain(params)}")
        rec = {"format": name, "params": _plain(params),
               "kernel_seconds": statistics.median(samples),
               "conversion_seconds": conversion, "alternative": alternative,
               **({"product": bench.path(impl, block_size)} if block_size > 1 else {}),
               "resolved": {k: v for k, v in impl.params.items()
                            if isinstance(v, (int, float, str, bool, type(None)))}}
        results.append(rec)
        if offer is not None and not alternative:
            baseline = next((r for r in results if (r["format"], r["params"]) ==
                             (include[0][0], _plain(include[0][1]))), None) if include else None
            best = min(results, key=lambda r: r["kernel_seconds"])
            if baseline is not None and best is rec and rec["kernel_seconds"] < \
                    OFFER_MARGIN * baseline["kernel_seconds"] and offer(name, params, impl):
                rec["handed_over"] = True
                return
        finalists.append((_score(rec, expected_calls), rec, impl, samples))
        finalists.sort(key=lambda f: f[0])
        del finalists[keep:]   # frees the others' device buffers

    def within_budget():   # for building and timing candidates; the rest re-times
        if stopped():
            return False
        elapsed = time.perf_counter() - start
        predicted = statistics.median(costs) if costs else 0.0
        return len(results) < 2 or elapsed + predicted <= (1 - CONFIRM_SHARE) * budget

    pending = [(name, params, False) for name, params in first]
    total = len(pending)
    for k, (name, params, alt) in enumerate(pending):
        if not within_budget():
            skipped += [(n, "over the time budget") for n, _, _ in pending[k:]]
            break
        if progress:
            progress(k, total, name)
        run(name, params, alt)
    # Second pass: other parameter sets of the best formats.
    by_format = sorted(results, key=lambda r: _score(r, expected_calls))
    second = []
    per_format = ALT_PARAMS if alternatives is True else int(alternatives)
    for rec in by_format[:ALT_FORMATS if per_format > 0 else 0]:
        params_list = dict(order).get(rec["format"], [])
        second += [(rec["format"], p, True) for p in params_list[1:1 + per_format]]
    for name, params, alt in second:
        if not within_budget():
            break
        if progress:
            progress(total, total + len(second), f"{name} {params}")
        run(name, params, alt)
    uploads.clear()   # every candidate is built
    # The finalists again, in alternation, for as many rounds as the budget allows: a
    # short burst of samples can catch a kernel at its best (PoCL on a 2-core machine:
    # dia's first samples at 5.0 ms, its steady state 7.5 ms, against csr-scalar's 4.6),
    # and a change of machine load while candidates were timed one after another must
    # not decide between close ones.  The decision is taken among the finalists on these
    # interleaved samples alone, and they are marked so that a later lookup agrees.
    if len(finalists) > 1:
        if progress:
            progress(1, 1, "finalists")
        confirm = [[] for _ in finalists]
        rounds, round_cost = 0, 0.0
        while rounds == 0 or (rounds < MAX_CONFIRM_ROUNDS
                              and time.perf_counter() - start + round_cost <= budget
                              and not stopped()):
            t0 = time.perf_counter()
            for samples, (_, _rec, impl, _first) in zip(confirm, finalists):
                samples += bench.time(impl, None, min_samples=3, max_samples=3, min_time=0,
                                      warmup=1)
            round_cost = time.perf_counter() - t0
            rounds += 1
        for samples, f in zip(confirm, finalists):
            f[1]["kernel_seconds"] = statistics.median(samples)
            f[1]["confirmed"] = True
        finalists.sort(key=lambda f: _score(f[1], expected_calls))
        step(f"finalists re-timed ({rounds} rounds)")
    if progress:
        progress(1, 1, "done")
    elapsed = time.perf_counter() - start
    entry = {"candidates": results, "skipped": [list(s) for s in skipped],
             "tuning_seconds": elapsed, "budget_seconds": budget,
             "created": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
             "device": profile.name, "dtype": np.dtype(dtype).name,
             "row_length_histogram": row_length_histogram(np.diff(csr.indptr)),
             "bandwidth": bandwidth(csr), "diagonals": features.diagonals,
             "steps": steps, "block_size": block_size}
    if not results:
        return entry, None, None
    # The same rule as a later lookup (_pick).
    chosen = _pick({"candidates": results}, expected_calls, registry)
    impl = next((f[2] for f in finalists if f[1] is chosen), None)
    return entry, impl, chosen


def _for_k(k):
    """How an explanation names the products a choice is for ("" for one vector)."""
    return "" if k == 1 else f" for products of {k} vectors"


def _describe(entry, chosen, expected_calls, how):
    cands = sorted(entry["candidates"], key=lambda c: _score(c, expected_calls))
    # A format timed with other parameters too: each entry says which it is (the
    # default entry and the winner both read "cmrs" before).
    varied = {c["format"] for c in cands if c.get("alternative")}

    def label(c):
        if c.get("alternative"):
            return f"{c['format']}{c['params']}"
        return c["format"] + (" (default parameters)" if c["format"] in varied else "")

    def listing(group):
        parts = []
        for c in group:
            text = f"{label(c)} {_us(c['kernel_seconds'])}"
            if c.get("product") == "column by column":
                text += " by column"
            if expected_calls:
                text += f" +conv {_us(c['conversion_seconds'])}"
            parts.append(text)
        return ", ".join(parts)

    k = entry.get("block_size", 1)
    product = f"product of {k} vectors" if k > 1 else "kernel time"
    objective = (f"{product} x {expected_calls} calls + conversion" if expected_calls
                 else product)
    finalists = [c for c in cands if c.get("confirmed")]
    handed = chosen.get("handed_over") and not chosen.get("confirmed")
    if finalists:   # their times are the re-timed ones: list them apart
        others = [c for c in cands if not c.get("confirmed")]
        if handed:   # in the caller's use since its first pass: never re-timed (_pick)
            text = (f"{how}: {label(chosen)} was handed over at its first pass "
                    f"({listing([chosen])}) and kept: lower than the {len(finalists)} "
                    f"finalists re-timed in alternation ({listing(finalists)}) among "
                    f"{len(cands)} candidates")
            others = [c for c in others if c is not chosen]
        else:
            text = (f"{how}: {label(chosen)} has the lowest {objective} of the "
                    f"{len(finalists)} finalists re-timed in alternation "
                    f"({listing(finalists)}) among {len(cands)} candidates")
        if others:
            text += f" (first pass, not re-timed: {listing(others[:4])})"
    else:
        text = (f"{how}: {label(chosen)} has the lowest {objective} of "
                f"{len(cands)} candidates ({listing(cands[:5])})")
    if entry.get("skipped"):
        groups = {}
        for name, why in entry["skipped"]:
            groups.setdefault(why, []).append(name)
        text += "; skipped " + ", ".join(f"{', '.join(names)} ({why})"
                                         for why, names in groups.items())
    return text


def _pick(entry, expected_calls, registry):
    """The candidate with the lowest score, among the finalists re-timed in alternation
    when there are any (their times are comparable; a first-pass time is not), and
    those handed over early to an online caller (never re-timed: the caller owns them)."""
    usable = [c for c in entry["candidates"] if c["format"] in registry]
    confirmed = [c for c in usable if c.get("confirmed") or c.get("handed_over")]
    return min(confirmed or usable, key=lambda c: _score(c, expected_calls)) \
        if usable else None


def select(csr, features, device, dtype, user_params=None, *, tune=None, expected_calls=None,
           budget=None, progress=None, block_size=None):
    """The :class:`Decision` for ``format="auto"`` (see the module docstring).
    ``block_size``: the vectors per product the caller will multiply (1 by default);
    above 1 the candidates are timed on blocks, and the decision is stored apart, per
    ``block_class``."""
    block_size = check_block_size(block_size)
    decision = _select(csr, features, device, dtype, user_params, tune, expected_calls,
                       budget, progress, block_size)
    decision.block_size = block_size
    return decision


def _select(csr, features, device, dtype, user_params, tune, expected_calls, budget,
            progress, block_size):
    mode = policy(tune)
    if expected_calls is not None:
        if isinstance(expected_calls, bool) or not isinstance(expected_calls, (int, np.integer)) \
                or expected_calls < 1:
            raise InvalidParameterError(
                f"expected_calls must be a positive integer, not {expected_calls!r}")
        expected_calls = int(expected_calls)
    if budget is not None:   # numpy numbers too; not a bool (True is no number of seconds)
        try:
            budget = P.number(greater_than=0)(budget)
            if not math.isfinite(budget):   # (the online trigger counts products by it)
                raise P.Invalid("finite")
        except P.Invalid:
            raise InvalidParameterError(
                f"tune_budget must be a positive, finite number of seconds, not "
                f"{budget!r}") from None
    profile = device.profile

    def rules(why, seconds=0.0):
        """The rule-based choice's Decision (the rules read the diagonals: counted only
        here), with parameters that give it block kernels for k > 1 where needed."""
        full = features.with_diagonals(csr)
        name, rule_why = choose_format(full, profile, dtype, block_size)
        return Decision(name, block_params(name, full, profile, dtype, block_size,
                                           user_params),
                        f"{why}{_for_k(block_size)}: {rule_why}", "model",
                        tuning_seconds=seconds)

    if mode == "model" or features.nnz == 0 or features.n_rows == 0:
        return rules("rules only (tune=False)" if mode == "model" else "rules (empty matrix)")

    t0 = time.perf_counter()
    # The structure hash (a pass over the indices) only where it is used: to look a
    # matrix up when the database holds entries of its shape, or to store a decision
    # (an online measurement hashes its own snapshot, in the background).
    cheap = shape_fingerprint(features)
    if user_params:
        cheap["user_params"] = {k: str(v) for k, v in sorted(user_params.items())}
    if block_size > 1:   # (k = 1 keeps the keys stored before block sizes existed)
        cheap["block_class"] = block_class(block_size)
    dtype_name = np.dtype(dtype).name

    def identify(matrix):
        fp = {**cheap, "structure_sha256": structure_digest(matrix)}
        return database.entry_key(profile, fp, dtype_name), fp

    key = fp = None
    held = database.may_hold(database.prefix_key(profile, cheap, dtype_name))
    measuring_now = mode in ("measure", "force") or (mode == "auto" and expected_calls)
    if isinstance(csr, DeviceCSR) and (held or measuring_now):
        # Read back once: the lookup or a measurement made now needs the host arrays.
        csr = csr.to_host(device.queue)
    if held:
        key, fp = identify(csr)
    if key is not None and mode == "force":
        database.forget(key)
    elif key is not None:
        entry = database.load(key)
        chosen = entry and _pick(entry, expected_calls, FORMATS)
        if chosen and not _usable(chosen, features, profile, dtype, user_params,
                                  (key, entry.get("created"), repr(chosen["params"]))):
            chosen = None   # re-decided below, and overwritten when measured
        if chosen:
            when = entry.get("created", "earlier")
            stored = Decision(chosen["format"], dict(chosen["params"]),
                              _describe(entry, chosen, expected_calls,
                                        f"tuning database (measured {when})"),
                              "database", kernel_seconds=chosen["kernel_seconds"],
                              tuning_seconds=time.perf_counter() - t0, entry=entry)
            if mode in ("auto", "online") and expected_calls is None \
                    and not conversion_is_cheap(FORMATS[chosen["format"]], csr, device,
                                                {**chosen["params"],
                                                 **chosen.get("resolved", {})}, dtype):
                handed = _database_handover(csr, features, device, dtype, user_params,
                                            stored, chosen, block_size, key)
                if handed is not None:
                    return handed
                # (None: the start's own format, built below like a cheap conversion)
            try:
                stored.impl = _build_stored(stored, csr, features, device, dtype,
                                            user_params, key, "tuning anew")
                return stored
            except PySpMVError:
                pass   # decided anew below (and stored where measured)

    if mode == "auto":
        worth, why = _worth_measuring(features, profile, dtype, expected_calls,
                                      budget or default_budget(features.nnz), block_size)
        if not worth:
            return rules(f"rules ({why})", time.perf_counter() - t0)
        if expected_calls is None:   # nobody asked to wait for a measurement
            mode = "online"
    if mode == "online":
        return _online_decision(csr, features, device, dtype, user_params, key, fp, budget,
                                time.perf_counter() - t0, identify, block_size)

    if key is None:
        key, fp = identify(csr)
    entry, impl, chosen = measure(csr, features, device, dtype, user_params, budget=budget,
                                  expected_calls=expected_calls, progress=progress,
                                  block_size=block_size)
    if chosen is None:   # nothing could be measured: the rules, and nothing stored
        return rules(f"rules (no candidate could be measured: {_skipped_text(entry)})",
                     time.perf_counter() - t0)
    return _store_decision(key, fp, entry, impl, chosen, expected_calls, "measured",
                           time.perf_counter() - t0)


def _skipped_text(entry):
    return "; ".join(f"{name} ({why})" for name, why in entry["skipped"])


def _store_decision(key, fp, entry, impl, chosen, expected_calls, source, seconds):
    """Store a measurement in the database (given a key) and make its Decision."""
    if key is not None:
        entry["fingerprint"] = fp
        database.store(key, entry)
    how = "measured" + (" online" if source == "online" else "")
    return Decision(chosen["format"], dict(chosen["params"]),
                    _describe(entry, chosen, expected_calls,
                              f"{how} in {entry['tuning_seconds']:.2f} s"),
                    source, impl=impl, kernel_seconds=chosen["kernel_seconds"],
                    tuning_seconds=seconds, entry=entry,
                    block_size=entry.get("block_size", 1))


def _usable(chosen, features, profile, dtype, user_params, tag):
    """Whether a stored choice's parameters are valid for its format: an entry edited
    or written by another version with bad parameters is ignored like a damaged one
    (one warning per entry: ``tag`` is its key, creation time and bad parameters)."""
    try:
        FORMATS[chosen["format"]].resolve_params(
            features, profile, dtype, {**(user_params or {}), **chosen["params"]})
        bits = chosen["params"].get("value_bits")
        if bits is not None and bits != full_bits(dtype):
            # format="auto" never chooses reduced precision (README): an entry that
            # does was not written by a measurement
            raise ValueError(f"value_bits={bits!r}, reduced precision, which the tuner "
                             "never chooses")
    except (TypeError, ValueError) as exc:
        store.warn_once(("tuning-invalid", tag),
                        f"pyspmv_cl: ignoring a tuning database entry with invalid "
                        f"parameters ({exc}); tuning anew")
        return False
    return True


def _build_stored(stored, csr, features, device, dtype, user_params, key, then):
    """The stored winner (``stored``, a Decision of the database's entry ``key``) built
    for this matrix.  Where it cannot be (an entry edited, or written for a matrix of
    the same fingerprint that this one's structure does not suit: dia's diagonal limit)
    the entry is removed, with one warning per entry that says what happens ``then``,
    and the error raised: it failed in every process that looked the matrix up."""
    cls = FORMATS[stored.format]
    try:
        resolved = cls.resolve_params(features, device.profile, dtype,
                                      {**(user_params or {}), **stored.params})
        return instantiate(cls, csr, device, dtype, resolved, features=features)
    except PySpMVError as exc:
        store.warn_once(("tuning-unbuildable", key, stored.entry.get("created")),
                        f"pyspmv_cl: the tuning database's choice, {stored.format}, "
                        f"cannot be built for this matrix ({str(exc).splitlines()[0]}); "
                        f"{then}")
        database.discard(key)
        raise


def _after(trigger):
    """When background work starts, as the explanations say it."""
    return "after the first product" if trigger == 1 else f"after {trigger} products"


def _database_handover(csr, features, device, dtype, user_params, stored, chosen,
                       block_size, key):
    """A stored winner that converts on the host (on CPUs ell, csr5, bccoo, ...; on GPUs
    bccoo's block shapes other than 1 x 1, or rows out of order): start on the
    online start format at once and convert the winner in the background (online.py's
    machinery, without measuring), so that a known matrix sets up as fast as a new one.
    A winner of the start's own format (sell on CPUs) is built at once: it converts as
    fast as the start would: None is returned for it, and the caller builds it at once
    through :func:`_build_stored` (an entry of it that cannot be built is removed with
    one warning and decided anew, as any other).  ``expected_calls=`` or ``tune=True``
    convert it before the first product instead."""
    profile = device.profile
    start_format, start_params, start_why = online.start_choice(
        features, profile, dtype, block_size, user_params)
    if start_format == stored.format:   # converts as fast as the start would
        return None
    conversion = float(chosen.get("conversion_seconds") or 0.0)
    trigger = online.trigger_calls(features, profile, dtype, conversion, measuring=False,
                                   block_size=block_size)

    def convert_winner(snapshot, should_stop, offer, exclusive):
        queue = cl.CommandQueue(device.context, device.cl_device)   # as run_measurement's
        # (a winner that cannot be built fails this conversion: the operator keeps its
        # start format)
        stored.impl = _build_stored(stored, snapshot, features, device.on_queue(queue), dtype,
                                    user_params, key,
                                    "removed from the database (the next SpMV of this "
                                    f"matrix tunes anew), staying on {start_format}")
        queue.finish()
        return stored

    tuning = online.OnlineTuning(convert_winner, budget=conversion, trigger=trigger,
                                 start=(start_format, start_params),
                                 inline=runs_in_calling_thread(device),
                                 block_size=block_size)
    # (on CPUs the conversion shares the cores with the caller's products: it starts
    # once they have run for a share of its cost, as a measurement does)
    when = _after(trigger)
    explanation = (f"{stored.explanation}; starting on {start_why} while "
                   f"{stored.format} converts in the background ({when})")
    return Decision(start_format, start_params, explanation, "database",
                    kernel_seconds=stored.kernel_seconds,
                    tuning_seconds=stored.tuning_seconds, entry=stored.entry, online=tuning)


def _online_decision(csr, features, device, dtype, user_params, key, fp, budget, spent,
                     identify, block_size=1):
    """Start on a CSR kernel and measure in the background (tuning/online.py)."""
    profile = device.profile
    budget = online.online_budget(features.nnz) if budget is None else float(budget)
    start_format, start_params, start_why = online.start_choice(
        features, profile, dtype, block_size, user_params)
    start = (start_format, start_params)   # timed too: a switch must be a gain
    trigger = online.trigger_calls(features, profile, dtype, budget, block_size=block_size)

    def run_measurement(snapshot, should_stop, offer, exclusive):
        # A queue of its own: the caller's products go on while candidates are timed.
        # The candidates upload and convert on it too (``device.on_queue``): on the
        # caller's queue each upload and conversion held up the caller's next product.
        queue = cl.CommandQueue(device.context, device.cl_device,
                                properties=cl.command_queue_properties.PROFILING_ENABLE)
        staging = None if device.shares_host_memory else PinnedStaging(queue)
        entry, impl, chosen = measure(snapshot, features, device.on_queue(queue), dtype,
                                      user_params, staging=staging,
                                      budget=budget,
                                      host_conversions=online.host_conversions(profile),
                                      should_stop=should_stop, queue=queue,
                                      max_formats=online.ONLINE_MAX_FORMATS,
                                      alternatives=online.online_alternatives(block_size),
                                      include=[start],
                                      offer=offer, block_size=block_size,
                                      exclusive=exclusive)
        queue.finish()
        if chosen is None:
            raise RuntimeError(f"no candidate could be measured: {_skipped_text(entry)}")
        stored_key, stored_fp = (key, fp) if key is not None else identify(snapshot)
        return _store_decision(stored_key, stored_fp, entry, impl, chosen, None, "online",
                               entry["tuning_seconds"])

    tuning = online.OnlineTuning(run_measurement, budget=budget, trigger=trigger,
                                 start=start, inline=runs_in_calling_thread(device),
                                 block_size=block_size)
    when = _after(trigger)
    return Decision(start_format, start_params,
                    f"online{_for_k(block_size)}: starting on {start_why}; measuring "
                    f"candidates in the background {when} (budget {budget:.1f} s), then "
                    "switching to the fastest", "online", tuning_seconds=spent,
                    online=tuning)


def _worth_measuring(features, profile, dtype, expected_calls, budget, block_size=1):
    if expected_calls is None:
        if features.nnz >= MEASURE_MIN_NNZ:
            return True, ""
        return False, (f"{features.nnz} non-zeros < {MEASURE_MIN_NNZ}: measuring would cost "
                       "more than it saves; tune=True or expected_calls= measures")
    nbytes = product_bytes(features.nnz, features.n_rows, features.n_cols, dtype)
    # A product of k vectors costs up to k single ones (without block kernels): the
    # gap between formats that measuring can find grows with k.
    kernel = block_size * nbytes / (20e9 if profile.is_cpu else 500e9)
    gain = PAYBACK * kernel * expected_calls
    if gain >= budget:
        return True, ""
    return False, (f"{expected_calls} calls of ~{_us(kernel)} would not repay "
                   f"a {budget:.1f} s measurement")
