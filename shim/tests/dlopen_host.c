/*
 * A program that loads its MPI the way a Python extension does (mpi4py's MPI module): it
 * links no MPI itself and dlopens a plugin (which needs libmpi) with RTLD_LOCAL, so the MPI
 * library is out of the global scope, where the preloaded shim looks for it. The shim must
 * still bind to it at MPI_Init (shim/rankpack_pmpi.c, rp_bind_mpi).
 *
 *   dlopen_host PLUGIN.so     (under mpirun; the plugin is build/<flavour>/dlopen_plugin.so)
 */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: dlopen_host PLUGIN.so\n");
        return 2;
    }
    void *plugin = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!plugin) {
        fprintf(stderr, "dlopen_host: %s\n", dlerror());
        return 2;
    }
    int (*run)(void);
    *(void **)&run = dlsym(plugin, "plugin_run");
    if (!run) {
        fprintf(stderr, "dlopen_host: %s\n", dlerror());
        return 2;
    }
    return run();
}
