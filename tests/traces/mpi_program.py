"""A small mpi4py program for tests/traces/test_mpilog.py: every call kind the recorder logs,
with known sizes (run under ``python -m ddlsim.traces.mpirecord``)."""

import time

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
me, n = comm.Get_rank(), comm.Get_size()
a = np.ones(1000, dtype=np.float64)          # 8,000 bytes
comm.Barrier()
time.sleep(0.02)                             # "compute": 20 ms between calls
comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)
comm.Reduce(MPI.IN_PLACE if me == 0 else a, a if me == 0 else None, op=MPI.SUM, root=0)
comm.Bcast(a, root=n - 1)
comm.Allgather(MPI.IN_PLACE, a)              # gathered output: 8,000 bytes
comm.Reduce_scatter_block(a, a[: 1000 // n], op=MPI.SUM)   # full input: 8,000 bytes
if me == 0:
    comm.Send(a[:10], dest=1, tag=5)         # 80 bytes
elif me == 1:
    comm.Recv(a[:10], source=0, tag=5)
reqs = [comm.Ibcast(a, root=0), comm.Iallreduce(MPI.IN_PLACE, a[:500])]
MPI.Request.Waitall(reqs)
half = comm.Split(me % 2, me)
half.Allreduce(MPI.IN_PLACE, a)
comm.barrier()
