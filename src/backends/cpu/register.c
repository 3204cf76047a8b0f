/* The CPU backend: its entry in the backend list, which fills the CPU
 * column of the kernel table. */
#include "cpu_impl.h"

#define DECLARE_(sfx) void CTI_ISA_CAT(cti_cpu_register_kernels, sfx)(void);
CTI_CPU_KERNEL_SETS(DECLARE_)
#undef DECLARE_

/* The kernel set of the chosen level: a native build has one; otherwise
 * the sets are baseline, avx2, avx512 in cti_isa order. */
static void register_level(cti_isa level) {
    static void (*const sets[])(void) = {
#define REF_(sfx) CTI_ISA_CAT(cti_cpu_register_kernels, sfx),
        CTI_CPU_KERNEL_SETS(REF_)
#undef REF_
    };
    int n = (int)(sizeof sets / sizeof sets[0]);
    sets[(int)level < n ? (int)level : n - 1]();
}

static void cpu_register(void) {
    cti_cpu_isa_init();
    cti_blas_init();
    register_level(cti_cpu_isa());
}

static int cpu_device_count(void) { return 1; }

static void cpu_print_info(FILE *f) {
    fprintf(f, "  cpu: %d threads (ct_set_num_threads / CT_NUM_THREADS)\n", cti_cpu_threads());
    char isa[256];
    cti_cpu_isa_describe(isa, sizeof isa);
    fprintf(f, "    kernels: %s\n", isa);
    fprintf(f, "    BLAS: %s\n", cti_cpu_blas_info());
}

static ct_status cpu_synchronize(int device) {
    (void)device;
    return CT_OK;
}

const cti_backend cti_backend_cpu = {
    .name = "cpu",
    .device = CT_DEVICE_CPU,
    .register_kernels = cpu_register,
    .device_count = cpu_device_count,
    .print_info = cpu_print_info,
    .synchronize = cpu_synchronize,
};

const char *ct_blas_info(void) {
    cti_init();
    return cti_cpu_blas_info();
}
