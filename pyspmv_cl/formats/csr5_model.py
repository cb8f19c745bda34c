"""CSR5's tile height sigma (Liu & Vinter, section 3.2): the rule, the paper's bounds per
device class and the bounds remembered for a device by a calibration
(:mod:`pyspmv_cl.formats.csr5_calibration`).

The rule maps the mean row length ``nnz/row`` to sigma through four device bounds
``<r, s, t, u>``: sigma = r for short rows, nnz/row between r and s, s up to t, and the
small u beyond t (a tile then usually lies inside one row, where the segmented sum is
a plain reduction).  The paper's values are defaults per device class;
``calibrate_bounds`` measures bounds for the device at hand (explicitly: never run
implicitly by SpMV) and remembers them in the cache directory (one small JSON file per
device, dtype and omega), which the rule reads from then on.
"""

import hashlib

import numpy as np

from ..store import JsonStore, cache_dir

#: The paper's bounds <r, s, t, u>: Maxwell and GCN GPUs (double precision, section
#: 3.2); on CPUs and Xeon Phi sigma is fixed (16 and 12), i.e. r = s = u.
DEFAULT_BOUNDS = {
    "nvidia": (4, 32, 256, 4),
    "amd": (4, 7, 256, 4),
    "gpu": (4, 32, 256, 4),
    "cpu": (16, 16, 256, 16),
    "accelerator": (12, 12, 256, 12),
}

#: The largest tile height csr5 takes (its ``sigma`` parameter's range is [1, MAX_SIGMA]):
#: bounds that give a sigma beyond it are damaged, and the rule never returns one.
MAX_SIGMA = 512

# One small JSON file per (device, dtype, omega) under the cache directory, so that
# calibrations of several devices never overwrite each other's results.
BOUNDS_DIR = "csr5-bounds-v2"


def sigma_rule(nnz_per_row, bounds):
    """The paper's sigma for a mean row length (integer part, as the authors' code),
    kept within csr5's range [1, MAX_SIGMA] whatever the bounds."""
    r, s, t, u = bounds
    npr = int(nnz_per_row)
    if npr <= r:
        sigma = r
    elif npr <= s:
        sigma = npr
    elif npr <= t:
        sigma = s
    else:
        sigma = u
    return min(max(int(sigma), 1), MAX_SIGMA)


def device_class(profile):
    if profile.is_gpu:
        return profile.vendor_family if profile.vendor_family in ("nvidia", "amd") else "gpu"
    return "accelerator" if profile.device_type == "accelerator" else "cpu"


def _bounds_key(profile, dtype, omega):
    """The file key (a hex digest) of the bounds for this device, dtype and omega."""
    name = "|".join((*profile.identity(), profile.device_type, f"omega={omega}",
                     np.dtype(dtype).name))
    return hashlib.sha256(name.encode("utf-8")).hexdigest()


def bounds_dir():
    """The directory of the remembered bounds, or None when the cache directory is off."""
    root = cache_dir()
    return None if root is None else root / BOUNDS_DIR


def _valid_bounds(value):
    """``value`` as bounds (r, s, t, u), or None where it is none: integers >= 1 with
    r <= s <= t, and the sigmas they give (r, s, u) at most MAX_SIGMA (t is a row
    length, not a sigma)."""
    if not isinstance(value, (list, tuple)) or len(value) != 4:
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value):
        return None
    r, s, t, u = value
    if max(r, s, u) > MAX_SIGMA:
        return None
    return (r, s, t, u) if r <= s <= t else None


def _valid_entry(entry, key):
    ok = isinstance(entry, dict) and entry.get("key") == key and _valid_bounds(
        entry.get("bounds")) is not None
    return None if ok else "damaged"


_store = JsonStore(bounds_dir, _valid_entry, label="CSR5 bounds store",
                   entry_label="CSR5 bounds entry", fallback="using the default bounds",
                   memory_note="calibrated bounds are kept in memory only")
clear_memory = _store.clear_memory


def remembered_bounds(profile, dtype, omega):
    """Bounds measured earlier for this device, dtype and omega, or None."""
    entry = _store.load(_bounds_key(profile, dtype, omega))
    return None if entry is None else _valid_bounds(entry["bounds"])


def bounds_for(profile, dtype, omega):
    """Remembered bounds when present, else the paper's default for the device class."""
    return remembered_bounds(profile, dtype, omega) or DEFAULT_BOUNDS[device_class(profile)]


def remember_bounds(profile, dtype, omega, bounds):
    """Store ``bounds`` for this device, dtype and omega (one file each, written
    atomically; other devices' entries are untouched).  Returns the path, or None when
    they are kept in memory only (cache directory off or unwritable)."""
    key = _bounds_key(profile, dtype, omega)
    entry = {"key": key, "bounds": [int(b) for b in bounds],
             "device": list(profile.identity()), "dtype": np.dtype(dtype).name,
             "omega": omega}
    return _store.store(key, entry)


def fit_bounds(best_sigma):
    """Bounds <r, s, t, u> from the best sigma measured at a few mean row lengths
    (dict row length -> sigma): r from the shortest rows, s the largest best sigma of
    the medium ones (at least r), u from the longest rows, t between the last medium
    and the long length (the paper's 256 when that lies between them)."""
    lengths = sorted(best_sigma)
    r = best_sigma[lengths[0]]
    medium = lengths[1:-1] or lengths[:1]
    s = max([r] + [best_sigma[n] for n in medium])
    u = best_sigma[lengths[-1]]
    t = 256 if medium[-1] < 256 < lengths[-1] else (medium[-1] + lengths[-1]) // 2
    return (r, s, max(s, t), u)
