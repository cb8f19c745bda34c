"""Storage formats: one module per format, registered here by canonical name."""

from .bccoo import BCCOO
from .cmrs import CMRS
from .coo import COO
from .csr5 import CSR5
from .csr_scalar import CSRScalar
from .csr_vector import CSRVector
from .dia import DIA
from .ell import ELL
from .ellr_t import ELLRT
from .hyb import HYB
from .sell import SELL

# Canonical order (DESIGN.md); formats() lists the registered ones in this order.
CANONICAL_ORDER = ("csr-scalar", "csr-vector", "coo", "dia", "ell", "ellr-t", "sell", "hyb",
                   "cmrs", "csr5", "bccoo")

_CLASSES = [
    BCCOO,
    CMRS,
    COO,
    CSR5,
    CSRScalar,
    CSRVector,
    DIA,
    ELL,
    ELLRT,
    HYB,
    SELL,
]

FORMATS = {cls.name: cls for cls in sorted(_CLASSES,
                                           key=lambda c: CANONICAL_ORDER.index(c.name))}


def get_format(name):
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown format {name!r}; available: "
                         f"{', '.join(FORMATS)} or 'auto'") from None
