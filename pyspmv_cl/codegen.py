"""Render Mako templates (``templates/``) into OpenCL C source, and kernel signatures
from the arguments a format declares.

Every specialisation value is passed to the template and rendered into the source,
so the kernel cache key (a hash of the source) captures it.  Templates include the
hand-written helpers of ``kernels/`` through ``helper("name.cl")`` and write each
kernel's head as ``${signature("name")}``: the argument list exists once, in the
format's :class:`KernelSpec`, which also binds the arguments by name at launch time.
"""

from __future__ import annotations

import dataclasses
import functools
from importlib import resources
from pathlib import Path

import numpy as np
from mako.lookup import TemplateLookup

_C_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double",
            np.dtype(np.int32): "int", np.dtype(np.int64): "long",
            np.dtype(np.uint32): "uint", np.dtype(np.uint64): "ulong",
            np.dtype(np.int16): "short", np.dtype(np.uint16): "ushort",
            np.dtype(np.int8): "char", np.dtype(np.uint8): "uchar",
            # Complex values: (real, imaginary) in an OpenCL vector of two, the layout
            # of numpy's complex64/complex128 (and of pyopencl's cfloat_t/cdouble_t).
            np.dtype(np.complex64): "float2", np.dtype(np.complex128): "double2"}
_NUMPY_TYPES = {name: dtype for dtype, name in _C_TYPES.items()}

# Argument roles: where the value of an argument comes from when a kernel is launched.
MATRIX = "matrix"     # a device array of the format (read only), by name
SCRATCH = "scratch"   # a scratch buffer of the format (read and written), by name
SCALAR = "scalar"     # a number given with the launch, by name
X, Y, ALPHA, BETA = "x", "y", "alpha", "beta"   # the product's operands
ROLES = (MATRIX, SCRATCH, SCALAR, X, Y, ALPHA, BETA)


def c_type(dtype) -> str:
    """The OpenCL C scalar type name of a numpy dtype."""
    try:
        return _C_TYPES[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"no OpenCL C type for dtype {np.dtype(dtype)}") from None


@dataclasses.dataclass(frozen=True)
class Arg:
    """One kernel argument: its name, its OpenCL C element type (``real_t``,
    ``index_t``, a type the format defines, or a plain C type) and its role."""

    name: str
    ctype: str
    role: str
    read_only: bool = False   # a scratch buffer this kernel only reads

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"argument {self.name!r}: role must be one of {ROLES}")

    @property
    def is_pointer(self) -> bool:
        return self.role in (MATRIX, SCRATCH, X, Y)

    def declaration(self) -> str:
        if not self.is_pointer:
            return f"const {self.ctype} {self.name}"
        const = "const " if self.role in (MATRIX, X) or self.read_only else ""
        return f"__global {const}{self.ctype} *restrict {self.name}"


def matrix(name: str, ctype: str) -> Arg:
    return Arg(name, ctype, MATRIX)


def scratch(name: str, ctype: str = "real_t", *, read_only: bool = False) -> Arg:
    return Arg(name, ctype, SCRATCH, read_only)


def scalar(name: str, ctype: str) -> Arg:
    return Arg(name, ctype, SCALAR)


X_ARG = Arg("x", "real_t", X)
Y_ARG = Arg("y", "real_t", Y)
ALPHA_ARG = Arg("alpha", "real_t", ALPHA)
BETA_ARG = Arg("beta", "real_t", BETA)
#: The operands most kernels end with: x, y, alpha, beta.
PRODUCT_ARGS = (X_ARG, Y_ARG, ALPHA_ARG, BETA_ARG)
#: The operands of a multi-vector (block) kernel: x and y hold row-major blocks, entry
#: (i, j) of the block at ``x[i * ldx + x_col + j]`` (``y[i * ldy + y_col + j]``) for
#: j < the kernel's compile-time ``KB``; the four scalars are given by the driver
#: (``SpMVFormat.enqueue_block``), never by a format.
BLOCK_ARGS = (X_ARG, Y_ARG, ALPHA_ARG, BETA_ARG, Arg("ldx", "long", SCALAR),
              Arg("x_col", "long", SCALAR), Arg("ldy", "long", SCALAR),
              Arg("y_col", "long", SCALAR))


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """A kernel of a template: its name, its arguments in order, and whether its
    work-group size is fixed at compile time (``reqd_work_group_size``: the format's
    ``work_group_size``, or ``group_size`` when the kernel has a size of its own)."""

    name: str
    args: tuple
    fixed_group: bool = False
    group_size: int = None   # a required size of its own, instead of the format's

    def bind(self, values: dict, types: dict) -> tuple:
        """The arguments in declaration order from ``values`` (by name), scalars cast to
        their declared types (``types``: see ``scalar_type``); an unknown or missing
        name is refused."""
        unknown = set(values) - {a.name for a in self.args}
        missing = [a.name for a in self.args if a.name not in values]
        if unknown or missing:
            raise TypeError(f"kernel {self.name}: no argument(s) {sorted(unknown)}"
                            if unknown else f"kernel {self.name} needs a value for {missing}")
        return tuple(values[a.name] if a.is_pointer else
                     scalar_type(a.ctype, types)(values[a.name]) for a in self.args)

    def signature(self, work_group_size: int) -> str:
        head = "__kernel "
        if self.fixed_group:
            size = int(self.group_size or work_group_size)
            head += f"__attribute__((reqd_work_group_size({size}, 1, 1)))\n"
        indent = " " * (len("void ") + len(self.name) + 1)
        args = (",\n" + indent).join(a.declaration() for a in self.args)
        return f"{head}void {self.name}({args})"


def scalar_type(ctype: str, types: dict):
    """The numpy type of a scalar argument's C type: ``types`` maps the format's own
    type names (``real_t``, ``index_t``, ``pos_t``...) to dtypes."""
    if ctype in types:
        return np.dtype(types[ctype]).type
    try:
        return _NUMPY_TYPES[ctype].type
    except KeyError:
        raise TypeError(f"no numpy type for the OpenCL C type {ctype!r}") from None


def _folder(name: str) -> str:
    """``templates/`` or ``kernels/``: the checkout's top-level folder when running
    from a source tree (plain or editable), else the installed package data."""
    checkout = Path(__file__).resolve().parent.parent
    if (checkout / "setup.cfg").is_file() and (checkout / name).is_dir():
        return str(checkout / name)
    return str(resources.files(f"pyspmv_cl.{name}"))


@functools.cache
def _lookup() -> TemplateLookup:
    return TemplateLookup(directories=[_folder("templates")], strict_undefined=True,
                          input_encoding="utf-8")


@functools.cache
def helper(name: str) -> str:
    """The text of a hand-written OpenCL helper from ``kernels/``."""
    return (Path(_folder("kernels")) / name).read_text(encoding="utf-8")


def needs_fp64_pragma(opencl_c_version) -> bool:
    """OpenCL C before 1.2 requires enabling cl_khr_fp64 to use double."""
    return tuple(opencl_c_version) < (1, 2)


def full_bits(dtype) -> int:
    """The width in bits of a value of ``dtype`` (a complex value's part's): the default
    ``value_bits`` of an operator of ``dtype`` (formats/storage.py)."""
    dtype = np.dtype(dtype)
    return dtype.itemsize * 8 // (2 if dtype.kind == "c" else 1)


def value_storage(dtype, value_bits=None) -> str:
    """How values of an operator of ``dtype`` are stored with ``value_bits``
    (formats/storage.py): ``"same"`` (as ``real_t``; None or the type's own width),
    ``"half"`` (IEEE binary16, read with ``vload_half``) or ``"float"`` (float32 values
    of a float64 operator)."""
    dtype = np.dtype(dtype)
    width = full_bits(dtype)
    if value_bits is None or value_bits == width or dtype.kind not in "fc":
        return "same"
    if dtype.kind == "f" and value_bits == 16:
        return "half"
    if dtype.kind == "f" and value_bits == 32 and width == 64:
        return "float"
    raise ValueError(f"no value storage of {value_bits} bits for {dtype}")


def render(template_name: str, *, dtype, index_dtype, profile, kernels=(),
           work_group_size=None, value_bits=None, **params) -> str:
    """Render ``template_name`` for value type ``dtype`` (float32/float64, or
    complex64/complex128 as float2/double2: ``real_t`` is then the complex value type
    and ``part_t`` the type of its parts; see ``common.mako``) and index type
    ``index_dtype`` on a device with ``profile``; ``kernels`` are the KernelSpecs whose
    heads the template writes with ``signature(name)``; ``value_bits`` the width the
    matrix's values are stored in (``value_t``, ``LOADV``/``STOREV`` in
    ``common.mako``; None: as ``real_t``); ``params`` are the format's specialisation
    values."""
    dtype = np.dtype(dtype)
    specs = {k.name: k for k in kernels}

    def signature(name):
        return specs[name].signature(work_group_size)

    template = _lookup().get_template(template_name)
    complex_values = dtype.kind == "c"
    part = np.dtype(dtype.char.lower()) if complex_values else dtype   # F -> f, D -> d
    double = part == np.float64
    return template.render(
        real_t=c_type(dtype), index_t=c_type(index_dtype),
        part_t=c_type(part), is_complex=complex_values,
        is_double=double, value_storage=value_storage(dtype, value_bits),
        fp64_pragma=double and needs_fp64_pragma(profile.opencl_c_version),
        helper=helper, signature=signature, work_group_size=work_group_size, **params)
