"""Distributed SpMV and CG over MPI (mpi4py): one rank per device, PETSc's MATMPIAIJ
layout (contiguous row blocks, each split into a diagonal block and an off-diagonal
block over compacted ghost columns).

    import pyspmv_cl.distributed as psd
    op = psd.SpMV.from_global(A if comm.rank == 0 else None, comm)
    y_local = op @ x_local
    x_local, info = psd.cg(op, b_local, M="jacobi")

Importing this package does not import mpi4py: the partition and plan functions
(``psd.plan``, ``psd.partition``) work without MPI; making an operator needs ``pip
install 'pyspmv-cl[mpi]'``, graph partitioning (``partition="metis"``, which permutes
rows and columns) ``pip install 'pyspmv-cl[metis]'``.
"""

from . import partition, plan
from .operator import DistributedInputError, SpMV, node_local_device, node_position
from .plan import CommPlan, partition_rows
from .solvers import cg

__all__ = ["SpMV", "cg", "plan", "partition", "CommPlan", "partition_rows",
           "DistributedInputError", "node_local_device", "node_position"]
