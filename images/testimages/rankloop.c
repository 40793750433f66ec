/* rankloop: a small MPI program that is not OpenFOAM, for rankpack's test images.
 *
 * Each time step, every rank computes (a fixed number of multiply-adds) and then all ranks
 * sum one value with MPI_Allreduce; rank 0 writes an OpenFOAM-like log, which is what
 * rankpack's log reader (rankpack.case.foamlog) counts:
 *
 *     Time = 3
 *
 *     Solving for x, Initial residual = 0.25, Final residual = 0.025, No Iterations 1
 *     ExecutionTime = 0.04 s  ClockTime = 0 s
 *     ...
 *     End
 *
 * It runs in an OpenFOAM case directory as rankpack starts a solver (`rankloop -parallel`,
 * arguments ignored): the number of steps is (endTime - startTime) / deltaT of
 * system/controlDict, as rankpack reckons a case's iterations; RANKLOOP_STEPS if there is
 * no such file. RANKLOOP_WORK sets the multiply-adds per step and rank (default 5000000,
 * a few milliseconds).
 *
 * Built with -DRANKLOOP_SERIAL it links no MPI (one process, the same log): the program of
 * the test image rankpack must refuse (it cannot profile a program without MPI).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifndef RANKLOOP_SERIAL
#include <mpi.h>
#endif

#define DEFAULT_STEPS 20
#define DEFAULT_WORK 5000000L
#define MAX_STEPS 10000000L

static double now(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The number after `key` on a line "key <number>;" of the file, if there is one. */
static int read_entry(const char *path, const char *key, double *value) {
    char line[512];
    size_t n = strlen(key);
    int found = 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    while (fgets(line, sizeof line, f)) {
        char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (strncmp(p, key, n) == 0 && (p[n] == ' ' || p[n] == '\t')) {
            char *end;
            double v = strtod(p + n, &end);
            if (end != p + n) {
                *value = v;
                found = 1;
            }
        }
    }
    fclose(f);
    return found;
}

static long steps_of_case(double *start, double *delta) {
    const char *dict = "system/controlDict";
    double end = 0;
    *start = 0;
    *delta = 1;
    if (read_entry(dict, "endTime", &end) && read_entry(dict, "deltaT", delta) && *delta > 0) {
        read_entry(dict, "startTime", start);
        double steps = (end - *start) / *delta + 0.5;
        if (steps >= 1 && steps <= MAX_STEPS) return (long)steps;
    }
    const char *env = getenv("RANKLOOP_STEPS");
    long steps = env ? atol(env) : DEFAULT_STEPS;
    return steps >= 1 && steps <= MAX_STEPS ? steps : DEFAULT_STEPS;
}

static double compute(long work, double x) {
    double a = 1.0 + 1e-9 * x, s = 0.0;
    for (long i = 0; i < work; i++) s = s * 0.999999 + a;
    return s;
}

int main(int argc, char **argv) {
    int rank = 0, size = 1;
    long steps;
    double start, delta;
#ifndef RANKLOOP_SERIAL
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
#else
    (void)argc;
    (void)argv;
#endif
    setvbuf(stdout, NULL, _IOLBF, 0);
    steps = steps_of_case(&start, &delta);
    const char *w = getenv("RANKLOOP_WORK");
    long work = w ? atol(w) : DEFAULT_WORK;
    if (work < 1) work = DEFAULT_WORK;
    double cpu0 = now(CLOCK_PROCESS_CPUTIME_ID), wall0 = now(CLOCK_MONOTONIC);
    if (rank == 0)
        printf("rankloop: %d rank%s, %ld steps of %ld multiply-adds\n\nStarting time loop\n\n",
               size, size == 1 ? "" : "s", steps, work);
    for (long step = 1; step <= steps; step++) {
        double local = compute(work, (double)(rank + step)), total = local;
#ifndef RANKLOOP_SERIAL
        MPI_Allreduce(&local, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
#endif
        if (rank == 0) {
            double residual = 1.0 / (double)(step + 1);
            printf("Time = %.10g\n\n", start + (double)step * delta);
            printf("Solving for x, Initial residual = %g, Final residual = %g, "
                   "No Iterations 1\n", residual, residual / 10);
            printf("sum = %.6g\n", total);
            printf("ExecutionTime = %.2f s  ClockTime = %.0f s\n\n",
                   now(CLOCK_PROCESS_CPUTIME_ID) - cpu0, now(CLOCK_MONOTONIC) - wall0);
        }
    }
    if (rank == 0) printf("End\n\n");
#ifndef RANKLOOP_SERIAL
    MPI_Finalize();
#endif
    return 0;
}
