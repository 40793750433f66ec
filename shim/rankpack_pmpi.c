/*
 * rankpack PMPI shim: loaded with LD_PRELOAD into every MPI rank, no change to the solver.
 *
 * - Times every intercepted MPI call (table: mpi_functions.def) and the compute time
 *   between calls; publishes a live record (rankpack_record.h) in a memory-mapped file per
 *   rank, at most every RANKPACK_SHIM_INTERVAL_US, under a sequence lock.
 * - Optionally keeps per-call trace events, written to a per-rank CSV at MPI_Finalize.
 * - Optionally writes a small final record per rank (JSON: duty, MPI time, CPU-seconds) at
 *   MPI_Finalize, or at exit if MPI_Finalize never ran, into RANKPACK_SHIM_FINAL_DIR: it
 *   outlives the live record (which may sit in a volume that vanishes with the rank's pod).
 * - Optionally makes MPI's busy-polling waits release the core (polite/adaptive), so
 *   co-located simulations can use idle time, without changing what the program sees
 *   (docs/decisions/0005-shim-transparency.md): blocking collectives always stay the
 *   library's blocking calls, made polite only through the library's progress hook (Open
 *   MPI's opal_progress, interposed); blocking point-to-point calls use the same hook, or,
 *   without it (MPICH), their nonblocking form plus test-and-back-off.
 * - The wait mode is live: the shim reads the control word `wait_ctl` of its record (a
 *   relaxed atomic load, no syscall) at the start of every wait; the controller writes it.
 *
 * Hot path (every intercepted call): a thread-local enable/re-entry check, two
 * clock_gettime(CLOCK_MONOTONIC) reads, one relaxed load of the control word, additions
 * into fixed arrays, and a memcpy of the record at most every interval. No malloc, lock or
 * I/O. Only the thread that called MPI_Init is measured (and owns the global state below);
 * calls from other threads pass straight through.
 *
 * Linked against no MPI library (shim/Makefile): compiled with one ABI family's mpi.h, it
 * binds to the MPI of that family that the solver itself loaded (see "binding to the
 * solver's MPI" below), and loads harmlessly into processes that have none.
 *
 * Configuration: RANKPACK_SHIM_* environment variables, documented in docs/shim.md.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "rankpack_record.h"

/* ---- binding to the solver's MPI ------------------------------------------------------------
 *
 * The shim has no DT_NEEDED on an MPI library: every MPI function it calls is found in the
 * process it is loaded into, so one build per ABI family serves any installation of that family
 * (a user's own MPI at its own path). LD_PRELOAD is inherited by every process around the
 * solver (the rank launcher's /bin/sh, mpirun and its daemons), most of which load no MPI, so
 * loading the shim must need nothing of MPI:
 *   - every PMPI_ function it calls is declared weak: with no MPI in the process the reference
 *     stays unbound and is never called, also under LD_BIND_NOW (a weak reference that finds
 *     nothing is 0, not an error); with MPI it binds, at its first call, to the solver's.
 *   - it holds no reference to MPI's data: Open MPI's predefined handles are addresses of
 *     objects in libmpi (MPI_COMM_WORLD is &ompi_mpi_comm_world), which would be load-time
 *     relocations; the one handle it needs is looked up at MPI_Init (rp_world).
 * A PMPI_ function called here but not declared below would be a strong reference, and the
 * shim would no longer load into a process without MPI under LD_BIND_NOW; so would any MPI
 * data: tests/unit/profile/test_shim_libraries.py (the ELF file) and
 * tests/integration/test_shim_abi.py (preloaded for real) catch either.
 */
#define RP_WEAK(name) extern __typeof__(name) name __attribute__((weak));
#define RP_FN(kind, name, params, args, nb) RP_WEAK(PMPI_##name)
#include "mpi_functions.def"
#undef RP_FN
RP_WEAK(PMPI_Init)
RP_WEAK(PMPI_Init_thread)
RP_WEAK(PMPI_Finalize)
RP_WEAK(PMPI_Comm_rank)
RP_WEAK(PMPI_Comm_size)
RP_WEAK(PMPI_Isend)
RP_WEAK(PMPI_Issend)
RP_WEAK(PMPI_Irsend)
RP_WEAK(PMPI_Irecv)
RP_WEAK(PMPI_Iprobe)
RP_WEAK(PMPI_Cancel)
RP_WEAK(PMPI_Request_free)

/* This build's ABI family, and whether the MPI in the process is of it: Open MPI's libmpi
 * defines its handles' objects (ompi_mpi_comm_world); the MPICH ABI (MPICH, Intel MPI,
 * MVAPICH) has integer handles and no such object. */
#ifdef OPEN_MPI
#define RP_FAMILY "openmpi"
#define RP_FAMILY_MATCHES(ompi_world) ((ompi_world) != NULL)
#else
#define RP_FAMILY "mpich"
#define RP_FAMILY_MATCHES(ompi_world) ((ompi_world) == NULL)
#endif

/*
 * Makes the solver's MPI visible to the shim, when a rank calls MPI_Init (`caller`: the code
 * that called it), and checks that it is of this build's family. Usually it is visible
 * already: the solver, or a library it links, needs libmpi, so libmpi is in the global scope
 * from start-up and the shim's lazy references find it at their first call. A program that
 * loads its MPI with dlopen and RTLD_LOCAL (a Python extension such as mpi4py's MPI module)
 * hides it from the shim; then the library that defines PMPI_Init for the caller is reopened
 * RTLD_GLOBAL (RTLD_NOLOAD: nothing new is loaded; it and its dependencies join the global
 * scope, as mpi4py itself does for Open MPI's plugins). Returns NULL if the shim can call the
 * MPI now, else why not. Not on the hot path: once per MPI_Init.
 */
static const char *rp_bind_mpi(const void *caller) {
    if (!dlsym(RTLD_DEFAULT, "PMPI_Init")) {
        Dl_info info;
        void *h = NULL, *init = NULL;
        if (dladdr(caller, &info) && info.dli_fname && info.dli_fname[0])
            h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
        if (h) {
            init = dlsym(h, "PMPI_Init");
            dlclose(h);
        }
        /* Kept open: the promotion lasts as long as the process. */
        if (init && dladdr(init, &info) && info.dli_fname)
            dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD | RTLD_GLOBAL);
        if (!dlsym(RTLD_DEFAULT, "PMPI_Init"))
            return "found no MPI library (PMPI_Init) in this process";
    }
    if (!RP_FAMILY_MATCHES(dlsym(RTLD_DEFAULT, "ompi_mpi_comm_world")))
        return "the MPI loaded in this process is not of the " RP_FAMILY " ABI family";
    return NULL;
}

/* MPI_Init refused: the shim cannot measure this process, and calling an MPI of another ABI
 * with this build's handles would crash somewhere less clear. */
static int rp_refuse(const char *why) {
    fprintf(stderr,
            "rankpack shim (" RP_FAMILY "): %s; preload the shim built for the solver's MPI "
            "(docs/shim.md, \"ABI families\")\n",
            why);
    return MPI_ERR_OTHER;
}

/* MPI_COMM_WORLD, once rp_bind_mpi found the MPI. Under Open MPI it is the address of a
 * libmpi object, looked up here rather than relocated at load time (see above). */
static MPI_Comm rp_world(void) {
#ifdef OPEN_MPI
    return (MPI_Comm)dlsym(RTLD_DEFAULT, "ompi_mpi_comm_world");
#else /* the MPICH ABI: handles are integer constants */
    return MPI_COMM_WORLD;
#endif
}

/* ---- function ids and names, generated from the table ------------------------------- */

enum rp_func_id {
#define RP_FN(kind, name, params, args, nb) RP_ID_##name,
#include "mpi_functions.def"
#undef RP_FN
    RP_N_FUNCS
};
_Static_assert(RP_N_FUNCS <= RP_MAX_FUNCS, "more functions than the record has room for");

static const char *const rp_func_names[RP_N_FUNCS] = {
#define RP_FN(kind, name, params, args, nb) "MPI_" #name,
#include "mpi_functions.def"
#undef RP_FN
};

/* ---- configuration --------------------------------------------------------------------- */

struct rp_config {
    unsigned wait_mode;    /* initial mode (RANKPACK_SHIM_WAIT) */
    int use_hook;          /* RANKPACK_SHIM_HOOK: use the MPI library's progress hook */
    uint64_t interval_ns;
    uint64_t window_ns;
    uint64_t spin_ns;      /* polite: spin (test) this long before the first sleep */
    uint64_t sleep_min_ns; /* first sleep; doubles up to sleep_max_ns */
    uint64_t sleep_max_ns;
    uint64_t spin_max_ns;  /* adaptive: upper bound of the tuned spin budget */
    uint64_t yield_ns;     /* after spinning, sched_yield() until this long into the wait */
    long timer_slack_ns;   /* <0: leave the kernel default */
    char dir[512];
    char trace_dir[512];
    uint64_t trace_max;
    char final_dir[512];   /* RANKPACK_SHIM_FINAL_DIR: where rank-<r>.final.json goes ("": none) */
};

static struct rp_config rp_cfg;

/* ---- per-process state (only the MPI_Init thread touches it) -------------------------- */

struct rp_trace_event {
    uint64_t enter_ns;
    uint64_t exit_ns;
    uint32_t func;
    uint32_t pad;
};

struct rp_backoff {
    uint64_t t0;
    uint64_t spin_ns;
    uint64_t sleep_ns;
    int sleeping;
};

struct rp_state {
    struct rp_record *rec; /* mmapped live record, or NULL if it could not be created */
    struct rp_record local; /* private copy updated on the hot path */
    uint32_t *ctl;          /* the control word: &rec->wait_ctl (or &local.wait_ctl) */
    struct rp_backoff wait; /* the wait in progress (polite/adaptive) */
    uint64_t adaptive_spin_ns; /* adaptive: the tuned spin budget */
    int slack_set;          /* timer slack lowered (first polite wait) */
    uint64_t last_exit_ns;
    uint64_t last_publish_ns;
    uint64_t window_start_ns;
    uint64_t window_start_compute_ns;
    uint64_t window_start_mpi_ns;
    struct rp_trace_event *trace;
    uint64_t trace_n;
    /* adaptive mode: decayed histogram of wait durations in log2(ns) buckets */
    double wait_hist[40];
    uint64_t waits_since_tune;
    int final_written;      /* the final record was written (or given up on): never again */
};

static struct rp_state rp;
static __thread int rp_owner;  /* 1 in the thread that called MPI_Init, while active */
static __thread int rp_depth;  /* re-entry guard */
static __thread int rp_armed;  /* the progress hook may back off: an owner's polite wait */
static __thread unsigned rp_busy_polls; /* consecutive fruitful polls in this polite wait */
static int rp_hooked;          /* the progress hook works here (set once at MPI_Init) */

static inline uint64_t rp_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t rp_env_u64(const char *name, uint64_t dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || *end) {
        fprintf(stderr, "rankpack shim: ignoring %s=%s (not a whole number)\n", name, v);
        return dflt;
    }
    return x;
}

static void rp_read_config(void) {
    const char *mode = getenv("RANKPACK_SHIM_WAIT");
    rp_cfg.wait_mode = RP_WAIT_SPIN;
    if (mode && strcmp(mode, "polite") == 0)
        rp_cfg.wait_mode = RP_WAIT_POLITE;
    else if (mode && strcmp(mode, "adaptive") == 0)
        rp_cfg.wait_mode = RP_WAIT_ADAPTIVE;
    else if (mode && *mode && strcmp(mode, "spin") != 0)
        fprintf(stderr, "rankpack shim: unknown RANKPACK_SHIM_WAIT=%s, using spin\n", mode);
    rp_cfg.use_hook = rp_env_u64("RANKPACK_SHIM_HOOK", 1) != 0;
    rp_cfg.interval_ns = rp_env_u64("RANKPACK_SHIM_INTERVAL_US", 2000) * 1000;
    rp_cfg.window_ns = rp_env_u64("RANKPACK_SHIM_WINDOW_MS", 1000) * 1000000;
    if (rp_cfg.window_ns < rp_cfg.interval_ns) rp_cfg.window_ns = rp_cfg.interval_ns;
    rp_cfg.spin_ns = rp_env_u64("RANKPACK_SHIM_SPIN_US", 5) * 1000;
    rp_cfg.spin_max_ns = rp_env_u64("RANKPACK_SHIM_SPIN_MAX_US", 50) * 1000;
    rp_cfg.yield_ns = rp_env_u64("RANKPACK_SHIM_YIELD_US", 1000) * 1000;
    rp_cfg.sleep_min_ns = rp_env_u64("RANKPACK_SHIM_SLEEP_MIN_US", 1) * 1000;
    rp_cfg.sleep_max_ns = rp_env_u64("RANKPACK_SHIM_SLEEP_MAX_US", 50) * 1000;
    if (rp_cfg.sleep_min_ns == 0) rp_cfg.sleep_min_ns = 1;
    if (rp_cfg.sleep_max_ns < rp_cfg.sleep_min_ns) rp_cfg.sleep_max_ns = rp_cfg.sleep_min_ns;
    const char *slack = getenv("RANKPACK_SHIM_TIMER_SLACK_NS");
    rp_cfg.timer_slack_ns = (slack && *slack) ? (long)rp_env_u64("RANKPACK_SHIM_TIMER_SLACK_NS", 1000)
                                              : 1000;
    const char *dir = getenv("RANKPACK_SHIM_DIR");
    if (dir && *dir)
        snprintf(rp_cfg.dir, sizeof rp_cfg.dir, "%s", dir);
    else /* ranks of one job on one node share their parent (mpirun/orted/hydra proxy) */
        snprintf(rp_cfg.dir, sizeof rp_cfg.dir, "/dev/shm/rankpack-shim/job-%d", (int)getppid());
    const char *trace = getenv("RANKPACK_SHIM_TRACE");
    if (trace && *trace) snprintf(rp_cfg.trace_dir, sizeof rp_cfg.trace_dir, "%s", trace);
    rp_cfg.trace_max = rp_env_u64("RANKPACK_SHIM_TRACE_MAX", 1000000);
    const char *final_dir = getenv("RANKPACK_SHIM_FINAL_DIR");
    if (final_dir && *final_dir)
        snprintf(rp_cfg.final_dir, sizeof rp_cfg.final_dir, "%s", final_dir);
}

static int rp_mkdirs(const char *path) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
            *p = '/';
        }
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
    return 0;
}

/* ---- publishing ------------------------------------------------------------------------ */

static void rp_publish(uint64_t now) {
    struct rp_record *l = &rp.local;
    l->t_update_ns = now;
    l->updates++;
    if (now - rp.window_start_ns >= rp_cfg.window_ns) {
        l->window_end_ns = now;
        l->window_compute_ns = l->compute_ns - rp.window_start_compute_ns;
        l->window_mpi_ns = l->mpi_ns - rp.window_start_mpi_ns;
        rp.window_start_ns = now;
        rp.window_start_compute_ns = l->compute_ns;
        rp.window_start_mpi_ns = l->mpi_ns;
    }
    rp.last_publish_ns = now;
    struct rp_record *r = rp.rec;
    if (!r) return;
    rp_record_write_begin(r);
    /* Dynamic part only: from t_update_ns to the end of the struct. */
    memcpy((char *)r + offsetof(struct rp_record, t_update_ns),
           (const char *)l + offsetof(struct rp_record, t_update_ns),
           sizeof(struct rp_record) - offsetof(struct rp_record, t_update_ns));
    rp_record_write_end(r);
}

static inline void rp_maybe_publish(uint64_t now) {
    if (now - rp.last_publish_ns >= rp_cfg.interval_ns) rp_publish(now);
}

/* ---- hot path -------------------------------------------------------------------------- */

static inline uint64_t rp_enter(int id) {
    uint64_t now = rp_now();
    rp.local.compute_ns += now - rp.last_exit_ns;
    rp.local.in_func = id + 1;
    rp.local.t_last_change_ns = now;
    rp_maybe_publish(now);
    return now;
}

static inline void rp_exit(int id, uint64_t t0) {
    uint64_t now = rp_now();
    uint64_t d = now - t0;
    rp.local.mpi_ns += d;
    rp.local.funcs[id].calls++;
    rp.local.funcs[id].ns += d;
    rp.local.in_func = 0;
    rp.local.t_last_change_ns = now;
    rp.last_exit_ns = now;
    if (rp.trace) {
        if (rp.trace_n < rp_cfg.trace_max) {
            struct rp_trace_event *e = &rp.trace[rp.trace_n++];
            e->enter_ns = t0;
            e->exit_ns = now;
            e->func = (uint32_t)id;
            rp.local.trace_events = rp.trace_n;
        } else {
            rp.local.trace_dropped++;
        }
    }
    rp_maybe_publish(now);
}

/* ---- polite waiting -------------------------------------------------------------------- */

static void rp_switch_mode(unsigned m) {
    rp.local.wait_mode = m;
    rp.local.wait_switches++;
    rp.local.spin_limit_ns = m == RP_WAIT_SPIN     ? 0
                             : m == RP_WAIT_POLITE ? rp_cfg.spin_ns
                                                   : rp.adaptive_spin_ns;
    if (m != RP_WAIT_SPIN && !rp.slack_set) {
        rp.slack_set = 1;
        if (rp_cfg.timer_slack_ns >= 0)
            prctl(PR_SET_TIMERSLACK, rp_cfg.timer_slack_ns > 0 ? rp_cfg.timer_slack_ns : 1, 0, 0,
                  0);
    }
}

/*
 * Start of every wait (any intercepted call that can block): read the control word (one
 * relaxed load; the controller may have changed it since the last wait) and, if the mode is
 * polite/adaptive and this call can wait politely, start the back-off. Returns 1 if the
 * call should wait politely.
 */
static inline int rp_wait_begin(uint64_t t0, int can_polite) {
    unsigned m = __atomic_load_n(rp.ctl, __ATOMIC_RELAXED);
    if (m > RP_WAIT_ADAPTIVE) m = RP_WAIT_SPIN;
    if (__builtin_expect(m != rp.local.wait_mode, 0)) rp_switch_mode(m);
    if (m == RP_WAIT_SPIN || !can_polite) return 0;
    rp.wait.t0 = t0;
    rp.wait.spin_ns = rp.local.spin_limit_ns;
    rp.wait.sleeping = 0;
    rp_busy_polls = 0;
    rp.wait.sleep_ns = rp_cfg.sleep_min_ns;
    return 1;
}

static inline void rp_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/*
 * Called after a test found the operation incomplete. Three phases:
 *   spin  (spin budget): re-test at once; a peer that is running answers within microseconds.
 *   yield (until yield_ns into the wait): sched_yield() hands the core to any other runnable
 *         task on it (often the very peer we wait for, or a co-located simulation) and
 *         returns at once if there is none, so no wake-up latency is added.
 *   sleep (after that): nanosleep with doubling back-off, releasing the core even where a
 *         yield cannot (a rank alone in its cgroup: yield only reorders within the group).
 */
static void rp_backoff_step(struct rp_backoff *b) {
    if (!b->sleeping) {
        uint64_t waited = rp_now() - b->t0;
        if (waited < b->spin_ns) {
            rp_cpu_relax();
            return;
        }
        if (waited < rp_cfg.yield_ns) {
            sched_yield();
            return;
        }
        b->sleeping = 1;
    }
    rp.local.sleeps++;
    struct timespec ts = {(time_t)(b->sleep_ns / 1000000000ull), (long)(b->sleep_ns % 1000000000ull)};
    nanosleep(&ts, NULL);
    rp.local.sleep_ns += b->sleep_ns;
    b->sleep_ns *= 2;
    if (b->sleep_ns > rp_cfg.sleep_max_ns) b->sleep_ns = rp_cfg.sleep_max_ns;
}

static int rp_log2(uint64_t x) {
    return x ? 63 - __builtin_clzll(x) : 0;
}

/*
 * Adaptive mode: spin as long as most waits last, sleep beyond that. Waits that end while
 * spinning cost no wake-up latency; waits longer than the budget waste at most the budget.
 * The budget is the 60th percentile of recent wait durations (decayed log2 histogram),
 * bounded by RANKPACK_SHIM_SPIN_MAX_US, retuned every 256 waits.
 */
static void rp_backoff_done(struct rp_backoff *b) {
    if (rp.local.wait_mode != RP_WAIT_ADAPTIVE) return;
    uint64_t d = rp_now() - b->t0;
    int k = rp_log2(d);
    if (k > 39) k = 39;
    rp.wait_hist[k] += 1.0;
    if (++rp.waits_since_tune < 256) return;
    rp.waits_since_tune = 0;
    double total = 0;
    for (int i = 0; i < 40; i++) total += rp.wait_hist[i];
    double acc = 0;
    uint64_t budget = rp_cfg.spin_max_ns;
    for (int i = 0; i < 40; i++) {
        acc += rp.wait_hist[i];
        if (acc >= 0.6 * total) {
            budget = 2ull << i; /* upper edge of the bucket */
            break;
        }
    }
    if (budget > rp_cfg.spin_max_ns) budget = rp_cfg.spin_max_ns;
    rp.adaptive_spin_ns = budget;
    rp.local.spin_limit_ns = budget;
    for (int i = 0; i < 40; i++) rp.wait_hist[i] *= 0.5;
}

static int rp_polite_Wait(MPI_Request *request, MPI_Status *status) {
    struct rp_backoff *b = &rp.wait;
    int flag = 0, rc;
    while ((rc = PMPI_Test(request, &flag, status)) == MPI_SUCCESS && !flag) rp_backoff_step(b);
    return rc;
}

static int rp_polite_Waitall(int count, MPI_Request reqs[], MPI_Status statuses[]) {
    struct rp_backoff *b = &rp.wait;
    int flag = 0, rc;
    while ((rc = PMPI_Testall(count, reqs, &flag, statuses)) == MPI_SUCCESS && !flag)
        rp_backoff_step(b);
    return rc;
}

static int rp_polite_Waitany(int count, MPI_Request reqs[], int *indx, MPI_Status *status) {
    struct rp_backoff *b = &rp.wait;
    int flag = 0, rc;
    while ((rc = PMPI_Testany(count, reqs, indx, &flag, status)) == MPI_SUCCESS && !flag)
        rp_backoff_step(b);
    return rc;
}

static int rp_polite_Waitsome(int incount, MPI_Request reqs[], int *outcount, int indices[],
                              MPI_Status statuses[]) {
    struct rp_backoff *b = &rp.wait;
    int rc;
    while ((rc = PMPI_Testsome(incount, reqs, outcount, indices, statuses)) == MPI_SUCCESS &&
           *outcount == 0)
        rp_backoff_step(b);
    return rc;
}

static int rp_polite_Probe(int source, int tag, MPI_Comm comm, MPI_Status *status) {
    struct rp_backoff *b = &rp.wait;
    int flag = 0, rc;
    while ((rc = PMPI_Iprobe(source, tag, comm, &flag, status)) == MPI_SUCCESS && !flag)
        rp_backoff_step(b);
    return rc;
}

static int rp_polite_Recv(void *buf, int count, MPI_Datatype datatype, int source, int tag,
                          MPI_Comm comm, MPI_Status *status) {
    MPI_Request rq;
    int rc = PMPI_Irecv(buf, count, datatype, source, tag, comm, &rq);
    if (rc != MPI_SUCCESS) return rc;
    return rp_polite_Wait(&rq, status);
}

/*
 * The receive and the send are completed one after the other, each with its own wait, so
 * that an error comes back with its own code (a Waitall would turn it into
 * MPI_ERR_IN_STATUS, which MPI_Sendrecv never returns) and the status is the receive's.
 */
static int rp_polite_Sendrecv(const void *sendbuf, int sendcount, MPI_Datatype sendtype,
                              int dest, int sendtag, void *recvbuf, int recvcount,
                              MPI_Datatype recvtype, int source, int recvtag, MPI_Comm comm,
                              MPI_Status *status) {
    MPI_Request rrq, srq;
    int rc = PMPI_Irecv(recvbuf, recvcount, recvtype, source, recvtag, comm, &rrq);
    if (rc != MPI_SUCCESS) return rc;
    rc = PMPI_Isend(sendbuf, sendcount, sendtype, dest, sendtag, comm, &srq);
    if (rc != MPI_SUCCESS) {
        PMPI_Cancel(&rrq);
        PMPI_Request_free(&rrq);
        return rc;
    }
    rc = rp_polite_Wait(&rrq, status);
    int rc_send = rp_polite_Wait(&srq, MPI_STATUS_IGNORE);
    return rc != MPI_SUCCESS ? rc : rc_send;
}

/* NB kind: the non-blocking variant plus the polite wait (generated from the table). */
#define RP_WITH_REQ(...) __VA_ARGS__, &rp_req
#define RP_POLITE_NB(name, params, args, nb)                                                 \
    static int rp_polite_##name params {                                                    \
        MPI_Request rp_req;                                                                 \
        int rc = PMPI_##nb(RP_WITH_REQ args);                                               \
        if (rc != MPI_SUCCESS) return rc;                                                   \
        return rp_polite_Wait(&rp_req, MPI_STATUS_IGNORE);                                  \
    }
#define RP_POLITE_CUSTOM(name, params, args, nb) /* hand-written above */
#define RP_POLITE_COLL(name, params, args, nb)   /* always the blocking call */
#define RP_POLITE_LOCAL(name, params, args, nb)  /* never waits */
#define RP_FN(kind, name, params, args, nb) RP_POLITE_##kind(name, params, args, nb)
#include "mpi_functions.def"
#undef RP_FN

/*
 * The progress hook (Open MPI). Every wait loop in Open MPI - inside any blocking call -
 * turns on opal_progress(), which polls the transports and returns the number of events
 * it found. libmpi calls it in libopen-pal through the PLT, so the shim interposes it: the
 * real opal_progress() runs first, and only if that poll found nothing and the MPI_Init
 * thread is in a polite wait does the shim take one back-off step. That is exactly the
 * old test loop (poll, back off only after a fruitless poll), but inside the library's own
 * blocking call, so the call - algorithm, matching, error handling - stays what the
 * program called. Other threads, and progress outside a polite wait (MPI_Test*,
 * nonblocking calls), pass straight through. Under MPICH nobody calls it.
 */
#define RP_BUSY_POLLS 64
typedef int (*rp_progress_fn)(void);
static rp_progress_fn rp_real_progress;

static rp_progress_fn rp_find_real_progress(void) {
    rp_progress_fn f = __atomic_load_n(&rp_real_progress, __ATOMIC_RELAXED);
    if (!f) { /* first call (during MPI_Init): every thread finds the same address */
        *(void **)&f = dlsym(RTLD_NEXT, "opal_progress");
        __atomic_store_n(&rp_real_progress, f, __ATOMIC_RELAXED);
    }
    return f;
}

int opal_progress(void) {
    rp_progress_fn real = rp_find_real_progress();
    int events = real ? real() : 0;
    if (!rp_armed) return events;
    /* Back off after a fruitless poll; and after RP_BUSY_POLLS fruitful ones in a row. In
     * about one Open MPI run of three, opal_progress reports "events" on every poll for the
     * whole job (72 million in 1 s of waiting, decided at start-up): taking that for progress
     * made such runs spin through every polite wait. A poll that ends the wait is followed
     * by no step, as before. */
    if (events <= 0 || ++rp_busy_polls >= RP_BUSY_POLLS) {
        rp_busy_polls = 0;
        rp_backoff_step(&rp.wait);
    }
    return events;
}

static void rp_hook_register(void) {
    if (rp_cfg.use_hook && rp_find_real_progress()) rp_hooked = 1;
}

/* ---- the wrappers, generated from the table ---------------------------------------------- */

/* Can the call block (read the mode)? Can it wait politely (hook or test loop)? How? */
#define RP_WAITS_COLL 1
#define RP_WAITS_NB 1
#define RP_WAITS_CUSTOM 1
#define RP_WAITS_LOCAL 0
#define RP_CAN_POLITE_COLL rp_hooked
#define RP_CAN_POLITE_NB 1
#define RP_CAN_POLITE_CUSTOM 1
#define RP_CAN_POLITE_LOCAL 0
#define RP_POLITE_CALL_COLL(name, args) PMPI_##name args
#define RP_POLITE_CALL_NB(name, args) (rp_hooked ? PMPI_##name args : rp_polite_##name args)
#define RP_POLITE_CALL_CUSTOM(name, args) RP_POLITE_CALL_NB(name, args)
#define RP_POLITE_CALL_LOCAL(name, args) PMPI_##name args

#define RP_FN(kind, name, params, args, nb)                                                   \
    int MPI_##name params {                                                                   \
        if (!rp_owner || rp_depth) return PMPI_##name args;                                   \
        rp_depth = 1;                                                                         \
        uint64_t rp_t0 = rp_enter(RP_ID_##name);                                              \
        int rc;                                                                               \
        if (RP_WAITS_##kind && rp_wait_begin(rp_t0, RP_CAN_POLITE_##kind)) {                  \
            rp_armed = rp_hooked;                                                             \
            rc = RP_POLITE_CALL_##kind(name, args);                                           \
            rp_armed = 0;                                                                     \
            rp_backoff_done(&rp.wait);                                                        \
        } else {                                                                              \
            rc = PMPI_##name args;                                                            \
        }                                                                                     \
        rp_exit(RP_ID_##name, rp_t0);                                                         \
        rp_depth = 0;                                                                         \
        return rc;                                                                            \
    }
#include "mpi_functions.def"
#undef RP_FN

/* ---- the final record ------------------------------------------------------------------- */

/* The host name as the JSON carries it: [A-Za-z0-9._-] kept, anything else '_' (so it
 * needs no escaping, and a reader can check it). */
static void rp_safe_host(char *out, size_t n, const char *host) {
    size_t i = 0;
    for (; i + 1 < n && host[i]; i++) {
        char c = host[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-';
        out[i] = ok ? c : '_';
    }
    out[i] = 0;
}

/*
 * The rank's totals as JSON in RANKPACK_SHIM_FINAL_DIR/rank-<r>.final.json, once per
 * process: at MPI_Finalize (finalized = 1) or at exit (0) if MPI_Finalize never ran. The
 * live record may sit in a volume that goes with the rank (a pod's emptyDir); this file
 * goes where the run's results are kept. Written under a temporary name in the same
 * directory and renamed into place, so a reader sees a whole file or none. At exit the time
 * since the rank's last MPI call still counts (as MPI time if it exits inside a call). A
 * process forked from the rank (another pid) writes nothing. Not on the hot path.
 */
static void rp_write_final(int finalized) {
    struct rp_record *l = &rp.local;
    if (rp.final_written || !rp_cfg.final_dir[0] || getpid() != (pid_t)l->pid) return;
    rp.final_written = 1; /* whatever happens below: once */
    uint64_t now = rp_now();
    uint64_t compute_ns = l->compute_ns, mpi_ns = l->mpi_ns;
    if (!l->finalized) {
        if (l->in_func)
            mpi_ns += now - l->t_last_change_ns;
        else
            compute_ns += now - rp.last_exit_ns;
    }
    struct rusage ru;
    uint64_t cpu_ns = 0;
    if (getrusage(RUSAGE_SELF, &ru) == 0) /* every thread of the rank, MPI's own included */
        cpu_ns = ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * 1000000000ull +
                 ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000ull;
    char host[RP_HOST_LEN];
    rp_safe_host(host, sizeof host, l->host);
    char json[1024];
    int len = snprintf(
        json, sizeof json,
        "{\"version\": 1, \"rank\": %d, \"world_size\": %d, \"pid\": %d, \"host\": \"%s\", "
        "\"compute_ns\": %llu, \"mpi_ns\": %llu, \"cpu_ns\": %llu, \"wall_ns\": %llu, "
        "\"finalized\": %d, \"wait_mode\": %u, \"wait_switches\": %u, \"sleeps\": %llu}\n",
        l->rank, l->world_size, l->pid, host, (unsigned long long)compute_ns,
        (unsigned long long)mpi_ns, (unsigned long long)cpu_ns,
        (unsigned long long)(now - l->t_start_ns), finalized ? 1 : 0, l->wait_mode,
        l->wait_switches, (unsigned long long)l->sleeps);
    char path[600], tmp[640];
    snprintf(path, sizeof path, "%s/rank-%d.final.json", rp_cfg.final_dir, l->rank);
    snprintf(tmp, sizeof tmp, "%s/.rank-%d.final.json.%d", rp_cfg.final_dir, l->rank, l->pid);
    int fd = -1, ok = len > 0 && (size_t)len < sizeof json && rp_mkdirs(rp_cfg.final_dir) == 0;
    if (ok) {
        unlink(tmp); /* left by an earlier process of this pid; never followed if a link */
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        ok = fd >= 0;
    }
    for (ssize_t off = 0, n; ok && off < len; off += n) {
        n = write(fd, json + off, (size_t)(len - off));
        if (n < 0 && errno == EINTR) n = 0;
        else if (n <= 0) ok = 0;
    }
    if (ok) ok = fchmod(fd, 0644) == 0; /* whatever the umask */
    if (fd >= 0 && close(fd) != 0) ok = 0;
    if (ok) ok = rename(tmp, path) == 0;
    if (!ok) {
        fprintf(stderr, "rankpack shim: rank %d: cannot write final record %s: %s\n", l->rank,
                path, strerror(errno));
        if (fd >= 0) unlink(tmp);
    }
}

static void rp_final_at_exit(void) {
    rp_write_final(0);
}

/* ---- set-up and tear-down ---------------------------------------------------------------- */

static void rp_setup(void) {
    rp_read_config();
    memset(&rp, 0, sizeof rp);
    struct rp_record *l = &rp.local;
    l->magic = RP_RECORD_MAGIC;
    l->version = RP_RECORD_VERSION;
    l->record_size = sizeof(struct rp_record);
    l->n_funcs = RP_N_FUNCS;
    int rank = 0, size = 1;
    MPI_Comm world = rp_world();
    PMPI_Comm_rank(world, &rank);
    PMPI_Comm_size(world, &size);
    l->rank = rank;
    l->world_size = size;
    l->pid = (int32_t)getpid();
    l->wait_ctl = rp_cfg.wait_mode;
    l->wait_mode = RP_WAIT_SPIN;
    gethostname(l->host, RP_HOST_LEN - 1);
    for (int i = 0; i < RP_N_FUNCS; i++)
        snprintf(l->func_names[i], RP_FUNC_NAME_LEN, "%s", rp_func_names[i]);
    l->window_ns = rp_cfg.window_ns;
    l->interval_ns = rp_cfg.interval_ns;
    rp.adaptive_spin_ns = rp_cfg.spin_ns;
    if (rp_cfg.wait_mode != RP_WAIT_SPIN) {
        rp_switch_mode(rp_cfg.wait_mode);
        l->wait_switches = 0; /* the initial mode is not a switch */
    }

    if (rp_cfg.trace_dir[0]) {
        rp.trace = malloc(rp_cfg.trace_max * sizeof *rp.trace);
        if (!rp.trace) fprintf(stderr, "rankpack shim: rank %d: no memory for the trace\n", rank);
    }

    /*
     * A new file renamed into place, never an existing one truncated: another process of the
     * same rank number (an MPI_Comm_spawn child, a second job sharing the directory) may
     * still have the old file mapped, and truncating a mapped file kills it with SIGBUS.
     */
    char path[600], tmp[640];
    snprintf(path, sizeof path, "%s/rank-%d.rec", rp_cfg.dir, rank);
    snprintf(tmp, sizeof tmp, "%s/.rank-%d.rec.%d", rp_cfg.dir, rank, (int)getpid());
    int fd = -1;
    if (rp_mkdirs(rp_cfg.dir) == 0) fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0 && ftruncate(fd, sizeof(struct rp_record)) == 0) {
        void *m = mmap(NULL, sizeof(struct rp_record), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m != MAP_FAILED) rp.rec = m;
    }
    if (fd >= 0) close(fd);
    if (!rp.rec) {
        fprintf(stderr, "rankpack shim: rank %d: cannot create live record %s: %s\n", rank, path,
                strerror(errno));
        if (fd >= 0) unlink(tmp);
    }

    uint64_t now = rp_now();
    l->t_start_ns = now;
    l->t_last_change_ns = now;
    rp.last_exit_ns = now;
    rp.window_start_ns = now;
    if (rp.rec) {
        /* Header first (seq stays 0, updates 0: "not published yet"), then a first publish. */
        memcpy(rp.rec, l, sizeof *l);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        if (rename(tmp, path) != 0) {
            fprintf(stderr, "rankpack shim: rank %d: cannot create live record %s: %s\n", rank,
                    path, strerror(errno));
            unlink(tmp);
        }
    }
    rp.ctl = rp.rec ? &rp.rec->wait_ctl : &l->wait_ctl;
    rp_hook_register();
    rp_publish(now);
    rp_owner = 1;
    static int at_exit_registered;
    if (rp_cfg.final_dir[0] && !at_exit_registered) /* a rank that never reaches MPI_Finalize */
        at_exit_registered = atexit(rp_final_at_exit) == 0;
}

static void rp_write_trace(void) {
    if (!rp.trace) return;
    if (rp_mkdirs(rp_cfg.trace_dir) != 0) {
        fprintf(stderr, "rankpack shim: cannot create trace directory %s\n", rp_cfg.trace_dir);
        return;
    }
    char path[600];
    int fd = -1;
    /* Never overwrite: rank-R.csv, then rank-R.1.csv, rank-R.2.csv, ... */
    for (int k = 0; k < 10000 && fd < 0; k++) {
        if (k == 0)
            snprintf(path, sizeof path, "%s/rank-%d.csv", rp_cfg.trace_dir, rp.local.rank);
        else
            snprintf(path, sizeof path, "%s/rank-%d.%d.csv", rp_cfg.trace_dir, rp.local.rank, k);
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
        if (fd < 0 && errno != EEXIST) break;
    }
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        fprintf(stderr, "rankpack shim: cannot write trace in %s: %s\n", rp_cfg.trace_dir,
                strerror(errno));
        if (fd >= 0) close(fd);
        return;
    }
    fprintf(f, "rank,function,enter_us,exit_us\n");
    for (uint64_t i = 0; i < rp.trace_n; i++) {
        const struct rp_trace_event *e = &rp.trace[i];
        fprintf(f, "%d,%s,%llu.%03llu,%llu.%03llu\n", rp.local.rank, rp_func_names[e->func],
                (unsigned long long)(e->enter_ns / 1000), (unsigned long long)(e->enter_ns % 1000),
                (unsigned long long)(e->exit_ns / 1000), (unsigned long long)(e->exit_ns % 1000));
    }
    fclose(f);
    if (rp.local.trace_dropped)
        fprintf(stderr,
                "rankpack shim: rank %d: trace buffer full, %llu events not recorded "
                "(raise RANKPACK_SHIM_TRACE_MAX)\n",
                rp.local.rank, (unsigned long long)rp.local.trace_dropped);
    free(rp.trace);
    rp.trace = NULL;
}

int MPI_Init(int *argc, char ***argv) {
    const char *why = rp_bind_mpi(__builtin_return_address(0));
    if (why) return rp_refuse(why);
    int rc = PMPI_Init(argc, argv);
    if (rc == MPI_SUCCESS) rp_setup();
    return rc;
}

int MPI_Init_thread(int *argc, char ***argv, int required, int *provided) {
    const char *why = rp_bind_mpi(__builtin_return_address(0));
    if (why) return rp_refuse(why);
    int rc = PMPI_Init_thread(argc, argv, required, provided);
    if (rc == MPI_SUCCESS) rp_setup();
    return rc;
}

int MPI_Finalize(void) {
    if (rp_owner) {
        uint64_t now = rp_now();
        rp.local.compute_ns += now - rp.last_exit_ns;
        rp.last_exit_ns = now;
        rp.local.finalized = 1;
        rp_publish(now);
        rp_owner = 0;
        rp_write_trace();
    }
    rp_write_final(1);
    rp_hooked = 0;
    return PMPI_Finalize();
}
