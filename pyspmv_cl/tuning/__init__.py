"""Format and parameter selection: matrix features, the rule-based choice, the
measuring tuner and its persistent database."""

from .database import database_dir
from .ellrt import ellrt_model
from .features import MatrixFeatures, fingerprint
from .heuristics import choose_format
from .tuner import Decision, select

__all__ = ["MatrixFeatures", "choose_format", "ellrt_model", "fingerprint", "database_dir",
           "select", "Decision"]
