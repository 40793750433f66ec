/*
 * The MPI half of dlopen_host.c: a shared library that needs libmpi and, when called, runs a
 * few collectives. Its calls to MPI_* go through the global scope first, so they land in the
 * preloaded shim, whose own calls must then reach the libmpi that only this plugin needs.
 */
#include <mpi.h>
#include <stdio.h>

int plugin_run(void) {
    if (MPI_Init(NULL, NULL) != MPI_SUCCESS) return 1;
    int rank = -1, size = 0, sum = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int i = 0; i < 10; i++) MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    printf("rank %d of %d sum %d\n", rank, size, sum);
    return MPI_Finalize() == MPI_SUCCESS ? 0 : 1;
}
