"""Storage formats: one module per format, registered here by canonical name."""

from .coo import COO
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
    COO,
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
