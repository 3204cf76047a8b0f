/* The MPI transport of a build without MPI (-Ddist=disabled, or no MPI
 * found): the group is then made from the environment or is a single
 * process, and these are reached only through an MPI launch, which
 * ct_dist_init refuses with the reason. */
#include "dist_impl.h"

static ct_status absent(const char *op) {
    return cti_error(CT_ERR_UNSUPPORTED,
                     "%s: cten was built without MPI (install libopenmpi-dev and configure with "
                     "-Ddist=enabled)",
                     op);
}

bool cti_mpi_built(void) { return false; }

ct_status cti_mpi_open(const char *op, int *rank, int *world, int *local_rank) {
    *rank = 0;
    *world = 1;
    *local_rank = 0;
    return absent(op);
}

ct_status cti_mpi_start(const char *op, const cti_coll *c, cti_mpi_work **work) {
    *work = NULL;
    return absent(op);
}

ct_status cti_mpi_test(const char *op, cti_mpi_work *work, bool *done) {
    *done = true;
    return absent(op);
}

ct_status cti_mpi_wait(const char *op, cti_mpi_work *work, double deadline, bool *timed_out) {
    *timed_out = false;
    return absent(op);
}

ct_status cti_mpi_bcast_bytes(const char *op, void *buf, size_t n, int root, double deadline) {
    return absent(op);
}

ct_status cti_mpi_close(const char *op) { return CT_OK; }
