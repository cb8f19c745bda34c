"""Online tuning: the default for a matrix the tuning database does not know.

The operator starts at once on a kernel that costs little setup (``start_choice``:
csr-vector on GPUs, its adaptive mapping where the rows allow, no conversion but its
16-bit columns (one pass on the device); on CPUs
sell, whose host conversion takes a few ms up to a million non-zeros, else csr-scalar),
so setup costs little more than the upload.  Once the caller has run enough products for
tuning to pay (``trigger_calls``: once the products already run would have paid for
the measurement: on CPUs its budget, since it shares the cores; on GPUs what it costs
the caller's products while the device runs both), a
background thread snapshots the matrix from the device, runs the measuring tuner
(``tuner.measure``) on the device's profiling queue within a budget, and stores the
decision in the tuning database.  The operator switches to the winner at the start of
its next product (in the caller's thread: no implementation is ever used by two threads).
A candidate that already beats the start format by a margin is handed over as soon as
it is timed (``offer``), before the others are measured; the final winner, if another,
follows.  While a measurement runs, the interpreter's switch interval is lowered
(``TUNING_SWITCH_INTERVAL``) so that the caller's thread gets the GIL back quickly
after each queue wait; the caller's own value is restored afterwards.

On a device that runs commands in the enqueuing thread (PoCL's ``basic`` driver:
``device.runs_in_calling_thread``) two threads must not enqueue at once, so the
measurement runs in the caller's thread instead, inside the product that reaches the
trigger: that one product takes the measurement's time, which the products before it
have paid for (on CPUs the trigger waits for that).

Each format is deterministic; after a switch results may differ from the start
format's in the last bits (another summation order), never in anything else.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import sys
import threading
import time

import numpy as np
import pyopencl as cl
import scipy.sparse as sp

from ..features import product_bytes
from ..formats import FORMATS
from ..launching import poll_event
from ..pinned_staging import PinnedStaging
from .heuristics import block_sets_first

#: Budget of a background measurement: seconds per million non-zeros, and at least.
ONLINE_SECONDS_PER_MNNZ = 0.3
ONLINE_MIN_BUDGET = 0.5
#: Formats a background measurement times (the model's best; alternative parameter sets
#: only for block products, ``online_alternatives``): a switch within the caller's
#: first few thousand products matters more than the last per cent, and ``tune=True``
#: measures everything.
ONLINE_MAX_FORMATS = 4
#: CPUs: start once the products run (estimated) add up to this share of the budget.
CPU_TRIGGER_SHARE = 1.0
#: CPUs start on sell up to this many non-zeros (csr-scalar above).  On PoCL (2-core
#: development machine, basic driver, the shared matrices of 114k-243k non-zeros) its
#: host conversion added 0.6-2.6 ms to csr-scalar's 1.1-2.2 ms of setup, and its
#: products were 1.2-2.7x faster in 11 of 12 cases (szdMat float64: 9% slower), so it
#: is ahead after a few tens of products; the CPU measurement starts only after
#: thousands.  Not measured beyond; the conversion grows with the matrix.
CPU_SELL_START_MAX_NNZ = 1_000_000
#: Kernel-time guesses (bytes per second) for the CPU trigger, as the tuner's payback rule.
CPU_BYTES_PER_SECOND = 20e9
#: GPUs: the ski-rental rule of ``trigger_calls``.  Measuring is "buying": one
#: background measurement cost the caller's products 0.01-0.25 s at 20M non-zeros on an
#: H100 (astro-ph, cage10, Groebner_id2003_aug, wing, float32 and float64; mean 0.12 s:
#: the candidates' conversions and timing bursts, the host work of ranking them, the
#: read-back and upload through pinned memory), about
#: ``GPU_MEASUREMENT_SECONDS_PER_MNNZ``.  Not measuring is "renting": each product pays
#: what a switch would save, on average ``GPU_SWITCH_GAIN`` of its kernel time (the same
#: eight cases: the pick's kernel 5-19% faster than csr-vector's on cage10 and wing,
#: csr-vector kept on astro-ph and Groebner_id2003_aug; mean 6%), the kernel time
#: guessed from its bytes at ``GPU_BYTES_PER_SECOND``.  The measurement starts once the
#: rent paid equals its cost: at most twice what the better choice costs.  (Session
#: 11, on an H200: 0.02 s and a guessed quarter.)
GPU_MEASUREMENT_SECONDS_PER_MNNZ = 0.006
GPU_SWITCH_GAIN = 0.06
GPU_BYTES_PER_SECOND = 2e12


def vector_products(k: int) -> float:
    """What one product of ``k`` vectors through block kernels weighs against a single
    product, for the triggers: about sqrt(k).  On an H100 (20M non-zeros, session 23's
    kernels) a block of 8 took 2.7-3.2 single products' time and a block of 32
    4.5-7.1; a format without block kernels runs its columns as single products,
    each counted on its own."""
    return math.sqrt(max(int(k), 1))


#: Longest wait (seconds) of a timing burst for the caller's last product to finish before
#: it times anyway (that product may wait on an event the caller sets later).
EXCLUSIVE_WAIT = 0.1
#: Polling step (seconds) of that wait: a status read does not block the driver.
EXCLUSIVE_POLL = 5e-5

#: The interpreter's switch interval while a background measurement runs (seconds).
#: The caller's thread gives up the GIL at every queue wait; with the default 5 ms it may
#: then wait that long for the tuning thread to hand it back, every product.
TUNING_SWITCH_INTERVAL = 2e-4


class _SwitchInterval:
    """Lowers ``sys.setswitchinterval`` while any measurement runs, and puts the
    caller's value back after the last one (unless someone changed it meanwhile)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._running = 0
        self._saved = None

    def __enter__(self):
        with self._lock:
            if self._running == 0:
                self._saved = sys.getswitchinterval()
                if self._saved > TUNING_SWITCH_INTERVAL:
                    sys.setswitchinterval(TUNING_SWITCH_INTERVAL)
            self._running += 1

    def __exit__(self, *exc):
        with self._lock:
            self._running -= 1
            # (the interpreter keeps microseconds: compare within one)
            if self._running == 0 and abs(sys.getswitchinterval()
                                          - TUNING_SWITCH_INTERVAL) < 1e-6:
                sys.setswitchinterval(self._saved)


_switch_interval = _SwitchInterval()


def online_budget(nnz: int) -> float:
    return max(ONLINE_MIN_BUDGET, ONLINE_SECONDS_PER_MNNZ * nnz / 1e6)


def host_conversions(profile) -> bool:
    """Whether the online measurement times candidates that convert on the host
    (bccoo's block shapes other than 1 x 1, and matrices a format's device conversion
    does not take, e.g. dia's with duplicates; ``tuner.measure``'s
    ``host_conversions``).  Not on GPUs, unless the rules choose one (dia on a stencil):
    their conversions take 0.5-3 s of host work at 20M non-zeros, in a thread whose GIL
    the caller's products wait for, for a kernel a few per cent faster at most (bccoo at
    0.83x cuSPARSE against csr-vector's 0.79x on astro-ph float32, H200).  The measuring
    tuner (``tune=True``, ``expected_calls``) still times them."""
    return not profile.is_gpu


def online_alternatives(block_size: int) -> int:
    """Other parameter sets the online measurement times for each of its best formats
    (``tuner.measure``'s ``alternatives``): none for single products; two for products
    of several vectors, which a caller asked for with ``block_size`` and whose kernels
    have the most to gain: the CSR formats' lanes kernels with a row split, with the
    rows taken longest first, and with the other column count come first, as the rows
    call for them (``tuner.with_lane_columns``)."""
    return 0 if block_size == 1 else 2


def start_choice(features, profile, dtype, block_size=1, user_params=None):
    """(format, params, why): on GPUs a CSR kernel that needs no conversion (the
    adaptive mapping's 16-bit columns aside: one pass on the device).  For
    products of ``block_size`` > 1 vectors, csr-vector's first parameter set that has
    block kernels with the caller's ``user_params`` (the row mapping when
    ``block_mapping="items"`` leaves the adaptive one none).  On CPUs sell, up to
    ``CPU_SELL_START_MAX_NNZ`` non-zeros and without parameters of the caller's (which
    may be csr-scalar's), else csr-scalar."""
    if profile.is_gpu:
        cls = FORMATS["csr-vector"]
        candidates = cls.tuning_candidates(features, profile, dtype)
        if block_size > 1:
            candidates = block_sets_first(cls, features, profile, dtype, candidates,
                                          user_params)
        params = candidates[0] if candidates else {}
        if params.get("mapping") == "adaptive":
            return "csr-vector", dict(params), ("csr-vector (adaptive row blocks): no "
                                                "conversion but 16-bit columns where they fit")
        return "csr-vector", dict(params), "csr-vector (rows): no conversion"
    if features.nnz <= CPU_SELL_START_MAX_NNZ and not user_params:
        return "sell", {}, "sell: a host conversion of a few ms"
    return "csr-scalar", {}, "csr-scalar: no conversion"


def trigger_calls(features, profile, dtype, budget, measuring=True, block_size=1) -> int:
    """Products (of ``block_size`` vectors each: ``vector_products``) after which the
    background work starts: on CPUs once the products run would have taken
    ``budget``; on GPUs, for a measurement (``measuring``), once the time a switch
    might have saved them adds up to what the measurement costs them
    (``GPU_SWITCH_GAIN``), else (converting a known winner) at once."""
    nbytes = product_bytes(features.nnz, features.n_rows, features.n_cols, dtype)
    nbytes *= vector_products(block_size)
    if profile.is_gpu:
        if not measuring:
            return 1
        rent = GPU_SWITCH_GAIN * nbytes / GPU_BYTES_PER_SECOND
        cost = GPU_MEASUREMENT_SECONDS_PER_MNNZ * features.nnz / 1e6
        return max(1, int(np.ceil(cost / max(rent, 1e-12))))
    per_call = nbytes / CPU_BYTES_PER_SECOND
    return max(1, int(np.ceil(CPU_TRIGGER_SHARE * budget / per_call)))


class OnlineTuning:
    """The background measurement of one operator; ``state`` is "waiting" (for the
    trigger), "running", "done" (a winner is ready or was taken), "failed" or
    "cancelled".  ``calls`` counts the products seen, ``work`` the same in products of
    ``block_size`` vectors (``vector_products``: what ``trigger`` counts, so that a caller
    mixing single and block products reaches it when their time does); ``started``/``finished`` are
    ``time.time()`` stamps; ``switched_at_call`` the product before which the operator
    switched (None if it kept its start format)."""

    def __init__(self, run_measurement, *, budget, trigger, start, inline=False,
                 block_size=1):
        # run_measurement(csr, should_stop, offer, exclusive) -> Decision (impl=the
        # winner, built, None when it was handed over by offer), or raises
        self._run_measurement = run_measurement
        self.budget, self.trigger = float(budget), int(trigger)
        self.start = start            # (format, params) the operator starts on
        self.inline = bool(inline)    # measure in the caller's thread (no thread)
        self.state = "waiting"
        self.calls = 0
        self.work = 0.0
        self._unit = vector_products(block_size)
        self._now = False   # start at the next product (``start_at_next``)
        self.started = self.finished = None
        self.switched_at_call = None
        self.switches = []   # (product count, format) of each switch the operator made
        self._interim = None   # (format, params, impl) handed over, not yet taken
        self._taken = None     # (format, params) of the last one the operator took
        self.error = None
        self.decision = None       # the final Decision (impl taken by the operator)
        self.values_version = None   # the operator's values when the snapshot was taken
        #: The snapshot's (indices, indptr), for an operator that switches from a format
        #: reading its pattern back to one that cannot (dropped once it has finished).
        self.structure = None
        self._thread = None
        self._stop = False
        self._lock = threading.Lock()
        # Timing bursts (``exclusive``) against the caller's products (``product_slot``).
        self._gate = threading.Condition()
        self._bursting = False
        self._last = None   # (queue, event) of the caller's latest product

    # -- called by the operator, in the caller's thread ------------------------------------
    @property
    def gates_products(self) -> bool:
        """Whether the caller's products go through ``product_slot``: while a
        measurement runs in a thread of its own (it starts only in ``note_call``, in the
        caller's thread, so a product that reads False is never timed beside)."""
        return self.state == "running" and not self.inline

    @contextlib.contextmanager
    def product_slot(self):
        """Around the enqueue of one of the caller's products and its ``note_call``:
        while a measurement runs in a thread, wait out a timing burst (``exclusive``)."""
        if not self.gates_products:
            yield
            return
        with self._gate:
            while self._bursting:
                self._gate.wait()
            yield

    def start_at_next(self) -> None:
        """Start the measurement at the next product, whatever the trigger says."""
        self._now = True

    def note_call(self, impl, values_version, queue=None, event=None, vectors=1) -> None:
        """Count one product of ``vectors`` vectors (``event``: its last, on ``queue``);
        start the measurement when the trigger is reached."""
        self.calls += 1
        self.work += vector_products(vectors) / self._unit
        if event is not None:
            self._last = (queue, event)
        if self.state == "waiting" and (self._now or self.work >= self.trigger - 1e-9):
            # The read-back happens in the thread, on a queue of its own: a read into
            # pageable memory returns only when done on NVIDIA (10-20 ms at 20M
            # non-zeros), which the caller's product must not wait for.  Kernels only
            # read the matrix; values updated during the read reach the winner anyway
            # (the version is taken first, and a newer one makes the operator apply
            # them), and the candidates and their reference share the snapshot.
            self.values_version = values_version
            _running.add(self)
            self.state = "running"
            self.started = time.time()
            if self.inline:   # nothing may enqueue beside the caller (see above)
                self._measure([impl])
                return
            self._thread = threading.Thread(target=self._run, args=([impl],),
                                            name="pyspmv_cl-online-tuning", daemon=True)
            self._thread.start()

    def take(self):
        """``(format, impl)`` to switch to now, or None: a candidate handed over while
        the measurement runs, or the final winner once done; each handed over once."""
        with self._lock:
            if self._interim is not None:
                fmt, params, impl = self._interim
                self._interim = None
            elif self.state == "done" and self.decision is not None \
                    and self.decision.impl is not None:
                fmt, params, impl = (self.decision.format, self.decision.params,
                                     self.decision.impl)
                self.decision.impl = None
            else:
                return None
            self._taken = (fmt, dict(params))
            self.switched_at_call = self.calls
            self.switches.append((self.calls, fmt))
            return fmt, impl

    def _offer(self, fmt, params, impl) -> bool:
        """From the measurement: hand ``impl`` over now (replacing one not yet taken)."""
        with self._lock:
            if self._stop or self.state != "running":
                return False
            self._interim = (fmt, dict(params), impl)
            return True

    def wait(self, timeout=None) -> bool:
        """Wait for a running measurement; True when none is running any more."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def cancel(self) -> None:
        """Stop waiting, or stop a running measurement after its current candidate."""
        with self._lock:
            if self.state == "waiting":
                self.state = "cancelled"
        self._stop = True

    # -- the background thread -----------------------------------------------------------
    @contextlib.contextmanager
    def exclusive(self):
        """A timing burst of the measurement: the caller's next products wait until it
        ends, and it starts once the caller's last product is done (``EXCLUSIVE_WAIT`` at
        most).  Candidates timed beside the caller's products share the device's
        bandwidth with them, which hides their differences (H100, cage10 at 20M
        non-zeros, float32: sell 82-96 against csr-vector's 85-97 us timed so, 54-56
        against 66-68 in bursts).  The caller loses about what the shared timing cost
        it."""
        if self.inline:   # the caller is inside the measurement: nothing to keep out
            yield
            return
        with self._gate:
            self._bursting = True
            last = self._last
        try:
            if last is not None:
                try:
                    poll_event(*last, EXCLUSIVE_WAIT, EXCLUSIVE_POLL)
                except cl.Error:   # a failed command ends the wait; the caller hears of it
                    pass
            yield
        finally:
            with self._gate:
                self._bursting = False
                self._gate.notify_all()

    def _run(self, holder):
        with _switch_interval:
            self._measure(holder)

    def _measure(self, holder):
        try:
            impl = holder.pop()   # the only reference here: dropped after the read-back
            queue = cl.CommandQueue(impl.device.context, impl.device.cl_device)
            # Through pinned memory where the device has memory of its own: a read into
            # pageable memory held up the caller's products for its whole length.
            staging = None if impl.device.shares_host_memory else PinnedStaging(queue)
            arrays, events = impl.read_csr(queue, staging=staging)
            shape = impl.shape
            del impl   # the operator may switch away and free it
            if events:
                cl.wait_for_events(events)
            indptr, indices, data = arrays
            csr = sp.csr_matrix(shape, dtype=data.dtype)
            csr.data, csr.indices, csr.indptr = data, indices, indptr
            self.structure = (indices, indptr)
            decision = self._run_measurement(csr, lambda: self._stop, self._offer,
                                             self.exclusive)
            with self._lock:
                chosen = (decision.format, dict(decision.params))
                if self._interim is not None:   # handed over, not taken: final or dropped
                    if (self._interim[0], self._interim[1]) == chosen:
                        decision.impl = self._interim[2]
                    self._interim = None
                current = self._taken or (self.start[0], dict(self.start[1]))
                if chosen == current:
                    decision.impl = None    # the operator runs the winner already
                self.decision, self.state = decision, "done"
        except Exception as exc:  # the operator keeps its start format
            with self._lock:
                self.error, self.state = f"{type(exc).__name__}: {exc}", "failed"
        finally:
            self.finished = time.time()
            _running.discard(self)


_running: set = set()


@atexit.register
def _stop_running() -> None:
    """At exit, let running measurements stop after their current candidate: a thread
    still inside the OpenCL runtime while the interpreter tears it down may crash it."""
    for tuning in list(_running):
        tuning.cancel()
    for tuning in list(_running):
        tuning.wait(30)
