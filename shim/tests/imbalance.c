/*
 * A load-imbalanced MPI program with a designed duty cycle, for testing the shim.
 *
 * Every iteration each rank "computes" and then joins an MPI_Allreduce. Rank 0 computes
 * k times longer than the others. Compute is a busy loop until a wall-clock deadline
 * (default), so the designed times hold even when ranks time-share cores; --mode work does
 * a fixed amount of arithmetic instead, --mode sleep sleeps. -x ends with exit() and no
 * MPI_Finalize (as a crashing solver might: the shim's final record is then written at exit).
 *
 * Designed duty cycles (compute / (compute + MPI)): rank 0 ~ 1, others ~ 1/k.
 *
 *   imbalance [-k K] [-n ITERATIONS] [-c COMPUTE_US] [-m wall|work|sleep] [-x]
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static volatile double sink;

static void compute(double us, const char *mode) {
    if (strcmp(mode, "sleep") == 0) {
        struct timespec ts = {(time_t)(us / 1e6), (long)((us - (time_t)(us / 1e6) * 1e6) * 1e3)};
        nanosleep(&ts, NULL);
    } else if (strcmp(mode, "work") == 0) {
        double x = 0;
        long n = (long)(us * 300); /* roughly 1 us per 300 iterations */
        for (long i = 0; i < n; i++) x += 1e-9 * (double)i;
        sink = x;
    } else {
        double end = now_s() + us * 1e-6;
        double x = 0;
        while (now_s() < end)
            for (int i = 0; i < 100; i++) x += 1e-9 * i;
        sink = x;
    }
}

int main(int argc, char **argv) {
    double k = 3, compute_us = 1000;
    long iterations = 200;
    const char *mode = "wall";
    int opt, no_finalize = 0;
    while ((opt = getopt(argc, argv, "k:n:c:m:x")) != -1) {
        switch (opt) {
        case 'k': k = atof(optarg); break;
        case 'n': iterations = atol(optarg); break;
        case 'c': compute_us = atof(optarg); break;
        case 'm': mode = optarg; break;
        case 'x': no_finalize = 1; break;
        default:
            fprintf(stderr, "usage: %s [-k K] [-n ITERATIONS] [-c COMPUTE_US] [-m wall|work|sleep] [-x]\n",
                    argv[0]);
            return 2;
        }
    }
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    double my_us = rank == 0 ? k * compute_us : compute_us;
    double t0 = now_s(), busy = 0;
    for (long it = 0; it < iterations; it++) {
        double c0 = now_s();
        compute(my_us, mode);
        busy += now_s() - c0;
        double v = rank, sum = 0;
        MPI_Allreduce(&v, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    }
    double wall = now_s() - t0;
    printf("rank %d compute_s %.6f wall_s %.6f measured_duty %.4f\n", rank, busy, wall,
           wall > 0 ? busy / wall : 0.0);
    fflush(stdout);
    if (no_finalize) exit(0);
    MPI_Finalize();
    return 0;
}
