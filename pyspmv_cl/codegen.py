"""Render Mako templates (``templates/``) into OpenCL C source.

Every specialisation value is passed to the template and rendered into the source,
so the kernel cache key (a hash of the source) captures it.  Templates include the
hand-written helpers of ``kernels/`` through ``helper("name.cl")``.
"""

import functools
from importlib import resources

import numpy as np
from mako.lookup import TemplateLookup

_C_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double",
            np.dtype(np.int32): "int", np.dtype(np.int64): "long",
            np.dtype(np.uint32): "uint", np.dtype(np.uint64): "ulong"}


def c_type(dtype):
    """The OpenCL C scalar type name of a numpy dtype."""
    try:
        return _C_TYPES[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"no OpenCL C type for dtype {np.dtype(dtype)}") from None


def _package_dir(name):
    # Installed non-editable, the package data are plain files beside the modules.
    return str(resources.files(f"pyspmv_cl.{name}"))


@functools.cache
def _lookup():
    return TemplateLookup(directories=[_package_dir("templates")], strict_undefined=True,
                          input_encoding="utf-8")


@functools.cache
def helper(name):
    """The text of a hand-written OpenCL helper from ``kernels/``."""
    return resources.files("pyspmv_cl.kernels").joinpath(name).read_text(encoding="utf-8")


def needs_fp64_pragma(opencl_c_version):
    """OpenCL C before 1.2 requires enabling cl_khr_fp64 to use double."""
    return tuple(opencl_c_version) < (1, 2)


def render(template_name, *, dtype, index_dtype, profile, **params):
    """Render ``template_name`` for value type ``dtype`` and index type
    ``index_dtype`` on a device with ``profile``; ``params`` are the format's
    specialisation values."""
    dtype = np.dtype(dtype)
    template = _lookup().get_template(template_name)
    return template.render(
        real_t=c_type(dtype), index_t=c_type(index_dtype),
        is_double=dtype == np.float64,
        fp64_pragma=dtype == np.float64 and needs_fp64_pragma(profile.opencl_c_version),
        helper=helper, **params)
