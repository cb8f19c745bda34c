"""pyspmv_cl: sparse matrix-vector multiplication on any OpenCL device.

    import pyspmv_cl as psc
    op = psc.SpMV(A)            # A: any scipy.sparse matrix
    y = op @ x
"""

from ._version import __version__
from .device import Device, DeviceProfile, get_device
from .device import devices as _all_devices
from .errors import (
    DeviceCapabilityError,
    DeviceMemoryError,
    DeviceNotFoundError,
    FormatNotSuitableError,
    IndexOverflowError,
    InvalidInputError,
    InvalidParameterError,
    InvalidTypeError,
    KernelBuildError,
    PySpMVError,
    UnknownParameterError,
    UnsupportedDtypeError,
    UnsupportedLayoutError,
)
from .formats import FORMATS as _FORMATS
from .matrix import SpMV, spmv


def formats():
    """Canonical names of the storage formats available (besides ``"auto"``)."""
    return list(_FORMATS)


def devices():
    """Every OpenCL device found, as :class:`Device` objects (profile fields readable as
    attributes: ``simd_width``, ``fp64``, ``compute_units``...)."""
    return _all_devices()


__all__ = [
    "__version__", "formats", "devices", "get_device", "SpMV", "spmv", "Device",
    "DeviceProfile", "PySpMVError", "UnsupportedDtypeError", "DeviceCapabilityError",
    "DeviceMemoryError", "IndexOverflowError", "FormatNotSuitableError",
    "DeviceNotFoundError", "KernelBuildError", "InvalidParameterError", "UnknownParameterError",
    "InvalidInputError", "UnsupportedLayoutError", "InvalidTypeError",
]
