/* Prints the live record's layout as "name offset size" lines (tests compare it with
 * rankpack.profile.records.RECORD_LAYOUT). */
#include <stdio.h>

#include "rankpack_record.h"

#define F(name) printf("%s %zu %zu\n", #name, offsetof(struct rp_record, name), \
                       sizeof(((struct rp_record *)0)->name))

int main(void) {
    printf("SIZE %zu 0\n", sizeof(struct rp_record));
    printf("MAGIC %u 0\nVERSION %u 0\nMAX_FUNCS %d 0\nFUNC_NAME_LEN %d 0\nHOST_LEN %d 0\n",
           RP_RECORD_MAGIC, RP_RECORD_VERSION, RP_MAX_FUNCS, RP_FUNC_NAME_LEN, RP_HOST_LEN);
    F(seq); F(magic); F(version); F(record_size); F(n_funcs); F(rank); F(world_size); F(pid);
    F(wait_ctl); F(host); F(func_names); F(t_start_ns); F(window_ns); F(interval_ns);
    F(t_update_ns); F(updates); F(compute_ns); F(mpi_ns); F(window_end_ns);
    F(window_compute_ns); F(window_mpi_ns); F(t_last_change_ns); F(in_func); F(finalized); F(wait_mode); F(wait_switches);
    F(sleeps); F(sleep_ns); F(spin_limit_ns); F(trace_events); F(trace_dropped); F(funcs);
    return 0;
}
