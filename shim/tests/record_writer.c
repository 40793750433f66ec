/*
 * Writes a live record the way the shim does (same header, same seqlock), for the Python
 * reader's tests.
 *   record_writer once PATH      one record with known values (parsing test)
 *   record_writer spin PATH SECS updates as fast as possible for SECS seconds; every
 *                                published version k satisfies invariants the reader checks:
 *                                updates=k, compute_ns=3k, mpi_ns=5k, t_update_ns=k,
 *                                funcs[i].calls=k, funcs[i].ns=k*(i+1), window_*=(7k, 11k).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "rankpack_record.h"

static void fill(struct rp_record *r, uint64_t k) {
    r->t_update_ns = k;
    r->updates = k;
    r->compute_ns = 3 * k;
    r->mpi_ns = 5 * k;
    r->window_end_ns = k;
    r->window_compute_ns = 7 * k;
    r->window_mpi_ns = 11 * k;
    r->t_last_change_ns = k;
    r->in_func = (int32_t)(k % 3);
    r->sleeps = k;
    r->sleep_ns = 2 * k;
    r->spin_limit_ns = 20000;
    for (int i = 0; i < RP_MAX_FUNCS; i++) {
        r->funcs[i].calls = k;
        r->funcs[i].ns = k * (uint64_t)(i + 1);
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: record_writer once|spin PATH [SECS]\n");
        return 2;
    }
    int fd = open(argv[2], O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ftruncate(fd, sizeof(struct rp_record)) != 0) {
        perror(argv[2]);
        return 1;
    }
    struct rp_record *r =
        mmap(NULL, sizeof(struct rp_record), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (r == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    r->magic = RP_RECORD_MAGIC;
    r->version = RP_RECORD_VERSION;
    r->record_size = sizeof(struct rp_record);
    r->n_funcs = 3;
    r->rank = 2;
    r->world_size = 4;
    r->pid = 4242;
    r->wait_ctl = RP_WAIT_POLITE;
    snprintf(r->host, RP_HOST_LEN, "node-a");
    snprintf(r->func_names[0], RP_FUNC_NAME_LEN, "MPI_Barrier");
    snprintf(r->func_names[1], RP_FUNC_NAME_LEN, "MPI_Allreduce");
    snprintf(r->func_names[2], RP_FUNC_NAME_LEN, "MPI_Waitall");
    r->t_start_ns = 1000;
    r->window_ns = 1000000000ull;
    r->interval_ns = 2000000ull;
    if (strcmp(argv[1], "once") == 0) {
        rp_record_write_begin(r);
        fill(r, 1000);
        r->finalized = 1;
        r->wait_mode = RP_WAIT_ADAPTIVE;
        r->wait_switches = 1;
        rp_record_write_end(r);
        return 0;
    }
    double secs = argc > 3 ? atof(argv[3]) : 1.0;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (uint64_t k = 1;; k++) {
        rp_record_write_begin(r);
        fill(r, k);
        rp_record_write_end(r);
        if ((k & 1023) == 0) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            if ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) * 1e-9 > secs) {
                printf("%llu\n", (unsigned long long)k);
                break;
            }
        }
    }
    return 0;
}
