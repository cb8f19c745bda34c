"""Storage formats: one module per format, registered here by canonical name."""

from .csr_scalar import CSRScalar
from .csr_vector import CSRVector

FORMATS = {cls.name: cls for cls in (CSRScalar, CSRVector)}


def get_format(name):
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown format {name!r}; available: "
                         f"{', '.join(FORMATS)} or 'auto'") from None
