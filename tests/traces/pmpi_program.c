/* A small MPI program for tests/traces/test_mpilog.py: every call the C recorder wraps,
 * with known sizes; 20 ms of "compute" (usleep) after the first barrier. */
#include <mpi.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int me, n;
    double a[1000], b[1000];
    MPI_Request q[2];
    MPI_Comm half;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    for (int i = 0; i < 1000; i++) a[i] = 1.0;
    MPI_Barrier(MPI_COMM_WORLD);
    usleep(20000);
    MPI_Allreduce(a, b, 1000, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);        /* 8,000 B */
    MPI_Reduce(a, b, 1000, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Bcast(a, 1000, MPI_DOUBLE, n - 1, MPI_COMM_WORLD);
    MPI_Allgather(a, 1000 / n, MPI_DOUBLE, b, 1000 / n, MPI_DOUBLE, MPI_COMM_WORLD);
    MPI_Reduce_scatter_block(a, b, 1000 / n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Alltoall(a, 1000 / n, MPI_DOUBLE, b, 1000 / n, MPI_DOUBLE, MPI_COMM_WORLD);
    if (me == 0) MPI_Send(a, 10, MPI_DOUBLE, 1, 5, MPI_COMM_WORLD);       /* 80 B */
    if (me == 1) MPI_Recv(a, 10, MPI_DOUBLE, 0, 5, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    MPI_Iallreduce(a, b, 500, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &q[0]);
    if (me == 0) MPI_Isend(a, 4, MPI_DOUBLE, 1, 9, MPI_COMM_WORLD, &q[1]);
    if (me == 1) MPI_Irecv(b, 4, MPI_DOUBLE, 0, 9, MPI_COMM_WORLD, &q[1]);
    MPI_Waitall(me < 2 ? 2 : 1, q, MPI_STATUSES_IGNORE);
    MPI_Comm_split(MPI_COMM_WORLD, me % 2, me, &half);
    MPI_Allreduce(a, b, 1000, MPI_DOUBLE, MPI_SUM, half);
    MPI_Finalize();
    return 0;
}
