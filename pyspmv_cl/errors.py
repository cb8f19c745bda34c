"""Exceptions raised by pyspmv_cl.

Each subclasses the builtin a caller would naturally catch (TypeError, ValueError,
MemoryError, RuntimeError), so generic handlers keep working.
"""


class PySpMVError(Exception):
    """Base class of every pyspmv_cl error."""


class UnsupportedDtypeError(PySpMVError, TypeError):
    """A matrix or vector dtype the kernels do not support."""


class DeviceCapabilityError(PySpMVError, RuntimeError):
    """The device lacks a feature the request needs (e.g. fp64)."""


class DeviceMemoryError(PySpMVError, MemoryError):
    """A buffer would exceed the device's maximum allocation or global memory."""


class IndexOverflowError(PySpMVError, ValueError):
    """Sizes that do not fit in the index type that was asked for."""


class FormatNotSuitableError(PySpMVError, ValueError):
    """The matrix does not suit the requested storage format."""


class DeviceNotFoundError(PySpMVError, LookupError):
    """No OpenCL device matches the selection."""


class KernelBuildError(PySpMVError, RuntimeError):
    """OpenCL compilation failed; carries the build log and the source."""

    def __init__(self, message, build_log="", source="", options=()):
        self.build_log = build_log
        self.source = source
        self.options = tuple(options)
        text = message
        if build_log:
            text += "\n--- build log ---\n" + build_log.strip()
        super().__init__(text)


class InvalidParameterError(PySpMVError, ValueError):
    """A format parameter (or format name) with a value the format does not take."""


class UnknownParameterError(PySpMVError, TypeError):
    """A keyword that no format parameter (or no chosen format) has."""


class InvalidTypeError(PySpMVError, TypeError):
    """An argument of a kind the call does not take (a dense array as the matrix, a
    sparse x, a string as alpha), or a required one missing (``shape=`` with a CSR
    triple): a ``TypeError``, as Python raises for those."""


class InvalidInputError(PySpMVError, ValueError):
    """A matrix, vector or shape that is malformed or does not fit the operator."""


class UnsupportedLayoutError(InvalidInputError):
    """A device array in a memory layout a product does not take (a strided view of a
    block of vectors)."""
