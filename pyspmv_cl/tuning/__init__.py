"""Format and parameter selection: matrix features, the rule-based choice, the
measuring tuner and its persistent database.  (The formats' own models -- ELLR-T's,
CSR5's sigma rule -- live with their formats; ``ellrt_model`` is re-exported here.)"""

from ..features import MatrixFeatures, fingerprint  # re-exported: they lived here
from ..formats.ellrt_model import ellrt_model
from .database import database_dir
from .heuristics import choose_format
from .tuner import Decision, select

__all__ = ["MatrixFeatures", "choose_format", "ellrt_model", "fingerprint", "database_dir",
           "select", "Decision"]
