/*
 * rankpack live record: the fixed-size, versioned struct each MPI rank publishes in a
 * memory-mapped file (one file per rank) while it runs.
 *
 * Writer: the PMPI shim (rankpack_pmpi.c), at most every RANKPACK_SHIM_INTERVAL_US.
 * Reader: rankpack.profile.records (Python, struct offsets kept in RECORD_LAYOUT there and
 * checked against this header by tests/unit/profile/test_record_layout.py).
 *
 * Consistency: a sequence lock. The writer makes `seq` odd, writes the dynamic fields, then
 * makes `seq` even again. A reader copies the record and accepts the copy only if `seq` was
 * even and unchanged before and after; otherwise it retries. The writer never waits for a
 * reader, so the solver is never blocked.
 *
 * Every field has an explicit size; the struct has no implicit padding (checked by the
 * static assertions below). All times are CLOCK_MONOTONIC nanoseconds (Python:
 * time.monotonic_ns()) unless stated otherwise.
 */
#ifndef RANKPACK_RECORD_H
#define RANKPACK_RECORD_H

#include <stddef.h>
#include <stdint.h>

#define RP_RECORD_MAGIC 0x4b505052u /* "RPPK" little-endian */
#define RP_RECORD_VERSION 2u
#define RP_MAX_FUNCS 48
#define RP_FUNC_NAME_LEN 24
#define RP_HOST_LEN 64

/* Wait modes (RANKPACK_SHIM_WAIT, the control word `wait_ctl`, the effective `wait_mode`). */
#define RP_WAIT_SPIN 0u
#define RP_WAIT_POLITE 1u
#define RP_WAIT_ADAPTIVE 2u

struct rp_func_stats {
    uint64_t calls;
    uint64_t ns; /* time inside the call (enter to exit) */
};

struct rp_record {
    /* --- header: written once before the first publish ----------------------------- */
    uint64_t seq;          /* seqlock counter: odd while the writer is inside an update */
    uint32_t magic;        /* RP_RECORD_MAGIC */
    uint32_t version;      /* RP_RECORD_VERSION */
    uint32_t record_size;  /* sizeof(struct rp_record) */
    uint32_t n_funcs;      /* number of valid entries in func_names / funcs */
    int32_t rank;          /* rank in MPI_COMM_WORLD */
    int32_t world_size;
    int32_t pid;
    /* Control word, the only field written by the reader side: the wait mode asked for
     * (RP_WAIT_*). The shim sets it from RANKPACK_SHIM_WAIT before the first publish;
     * afterwards only the controller writes it (rankpack.profile.records.set_wait_mode),
     * and the shim reads it with a relaxed atomic load at the start of every wait. Not
     * covered by the seqlock: one aligned 32-bit word, written and read whole. */
    uint32_t wait_ctl;
    char host[RP_HOST_LEN];                         /* NUL-terminated */
    char func_names[RP_MAX_FUNCS][RP_FUNC_NAME_LEN]; /* "MPI_Allreduce", NUL-terminated */
    uint64_t t_start_ns;   /* when MPI_Init returned: compute time is counted from here */
    uint64_t window_ns;    /* configured length of the duty-cycle window */
    uint64_t interval_ns;  /* configured minimum time between two publishes */

    /* --- dynamic: written under the seqlock ------------------------------------------ */
    uint64_t t_update_ns;  /* when this version of the record was published */
    uint64_t updates;      /* number of publishes so far */
    uint64_t compute_ns;   /* cumulative time outside intercepted MPI calls */
    uint64_t mpi_ns;       /* cumulative time inside intercepted MPI calls */
    uint64_t window_end_ns;     /* end of the last completed window (0: none yet) */
    uint64_t window_compute_ns; /* compute time in that window */
    uint64_t window_mpi_ns;     /* MPI time in that window */
    uint64_t t_last_change_ns;  /* last entry into or exit from an MPI call */
    int32_t in_func;       /* function id + 1 while inside an MPI call, 0 while computing */
    uint32_t finalized;    /* 1 once MPI_Finalize was called */
    uint32_t wait_mode;    /* RP_WAIT_* in effect at the last wait (wait_ctl as last read) */
    uint32_t wait_switches; /* number of times the shim saw wait_ctl change */
    uint64_t sleeps;       /* polite/adaptive: number of sleeps while waiting */
    uint64_t sleep_ns;     /* polite/adaptive: time requested in those sleeps */
    uint64_t spin_limit_ns; /* current spin budget before sleeping (adaptive: tuned) */
    uint64_t trace_events;  /* events held in the trace buffer */
    uint64_t trace_dropped; /* events not recorded because the buffer was full */
    struct rp_func_stats funcs[RP_MAX_FUNCS];
};

_Static_assert(sizeof(struct rp_record) ==
                   8 + 4 * 8 + RP_HOST_LEN + RP_MAX_FUNCS * RP_FUNC_NAME_LEN + 3 * 8 +
                       8 * 8 + 4 * 4 + 5 * 8 + RP_MAX_FUNCS * 16,
               "struct rp_record must have no implicit padding");
_Static_assert(offsetof(struct rp_record, funcs) % 8 == 0, "funcs must be 8-byte aligned");
_Static_assert(offsetof(struct rp_record, wait_ctl) % 4 == 0, "wait_ctl must be aligned");

/* Seqlock write side. The caller is the only writer of `r`. */
static inline void rp_record_write_begin(struct rp_record *r) {
    __atomic_store_n(&r->seq, r->seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
}

static inline void rp_record_write_end(struct rp_record *r) {
    __atomic_store_n(&r->seq, r->seq + 1, __ATOMIC_RELEASE);
}

#endif
