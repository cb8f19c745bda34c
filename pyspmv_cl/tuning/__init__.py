"""Format and parameter selection."""

from .ellrt import ellrt_model
from .features import MatrixFeatures
from .heuristics import choose_format

__all__ = ["MatrixFeatures", "choose_format", "ellrt_model"]
