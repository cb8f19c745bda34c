"""Format and parameter selection."""

from .features import MatrixFeatures
from .heuristics import choose_format

__all__ = ["MatrixFeatures", "choose_format"]
