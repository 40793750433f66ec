/*
 * Per-call cost of intercepted MPI calls, to be run with and without the shim:
 *   mpirun -np 1 build/openmpi/overhead [N]
 *   LD_PRELOAD=build/librankpack_pmpi.openmpi.so mpirun -np 1 build/openmpi/overhead [N]
 * The difference is the shim's overhead per call. Prints CSV: function,calls,ns_per_call.
 * Uses calls whose own cost is small so the wrapper's cost is visible: MPI_Wait on
 * MPI_REQUEST_NULL, MPI_Barrier and a one-double MPI_Allreduce on MPI_COMM_SELF.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    long n = argc > 1 ? atol(argv[1]) : 2000000;
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    double t, a = 1, b = 0;
    MPI_Request req;

    for (int round = 0; round < 2; round++) { /* round 0 warms up */
        t = now_ns();
        for (long i = 0; i < n; i++) {
            req = MPI_REQUEST_NULL;
            MPI_Wait(&req, MPI_STATUS_IGNORE);
        }
        double wait_ns = (now_ns() - t) / n;
        t = now_ns();
        for (long i = 0; i < n; i++) MPI_Barrier(MPI_COMM_SELF);
        double barrier_ns = (now_ns() - t) / n;
        t = now_ns();
        for (long i = 0; i < n; i++) MPI_Allreduce(&a, &b, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_SELF);
        double allreduce_ns = (now_ns() - t) / n;
        if (round == 1 && rank == 0) {
            printf("function,calls,ns_per_call\n");
            printf("MPI_Wait(REQUEST_NULL),%ld,%.1f\n", n, wait_ns);
            printf("MPI_Barrier(COMM_SELF),%ld,%.1f\n", n, barrier_ns);
            printf("MPI_Allreduce(COMM_SELF),%ld,%.1f\n", n, allreduce_ns);
        }
    }
    MPI_Finalize();
    return 0;
}
