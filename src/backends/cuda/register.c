/* The CUDA backend: the value the library's module loader looks up in
 * libcten-cuda.so (cti_backend_cuda, with cti_module_abi), its share of the
 * public API, and its lines of ct_print_info. Registration fills the CUDA
 * column of the kernel table and registers the allocator; nothing here
 * talks to the driver until a device is asked about, so a process that
 * never touches a GPU never initializes CUDA. */
#include <stdio.h>

#include "cuda_api.h"
#include "cuda_impl.h"

static void cuda_register(void) {
    cti_cuda_register_allocator();
    cti_cuda_register_copy();
    cti_cuda_register_elementwise();
    cti_cuda_register_reduce();
    cti_cuda_register_random();
    cti_cuda_register_blas();
    cti_cuda_register_conv();
    cti_cuda_register_pool();
    cti_cuda_register_norm();
    cti_cuda_register_nn();
    cti_cuda_register_optim();
    cti_cuda_register_rope();
    cti_cuda_register_seqops();
    cti_cuda_register_linear_ce();
    cti_cuda_register_attention();
    cti_cuda_register_indexing();
    cti_cuda_register_sort();
    cti_cuda_register_shape();
    cti_cuda_register_batch_norm();
}

/* "13.0" from 13000 (driver, runtime); "9.13.0" from 91300 (cuBLAS, cuDNN). */
static const char *version_s(int v, bool three, char *buf, size_t n) {
    if (three) snprintf(buf, n, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    else snprintf(buf, n, "%d.%d", v / 1000, v % 1000 / 10);
    return buf;
}

static void cuda_print_info(FILE *f) {
    int n = cti_cuda_device_count();
    if (n == 0) {
        fprintf(f, "  cuda: no device usable: %s\n", cti_cuda_unavailable_reason());
        return;
    }
    ct_cuda_device_props p;
    char v[4][16];
    cti_cuda_get_device_properties(0, &p);
    fprintf(f, "  cuda: driver %s, runtime %s, cuBLAS %s, cuDNN %s; TF32 matmul %s\n",
            version_s(p.driver_version, false, v[0], 16),
            version_s(p.runtime_version, false, v[1], 16),
            version_s(p.cublas_version, true, v[2], 16), version_s(p.cudnn_version, true, v[3], 16),
            ct_allow_tf32() ? "allowed" : "off (ct_set_allow_tf32)");
    for (int i = 0; i < n; i++) {
        if (cti_cuda_get_device_properties(i, &p) != CT_OK) continue;
        fprintf(f, "    cuda:%d %s, compute capability %d.%d, %d SMs at %.2f GHz\n", i, p.name,
                p.major, p.minor, p.multiprocessors, p.clock_khz / 1e6);
        fprintf(f,
                "      memory %.1f GiB (%d-bit bus at %.2f GHz%s), L2 %.0f MiB, shared memory "
                "%zu KiB/SM, %zu KiB/block; PCI %04x:%02x:%02x\n",
                (double)p.total_memory / (1 << 30), p.memory_bus_width, p.memory_clock_khz / 1e6,
                p.ecc_enabled ? ", ECC" : "", (double)p.l2_cache_bytes / (1 << 20),
                p.shared_memory_per_multiprocessor >> 10, p.shared_memory_per_block_optin >> 10,
                p.pci_domain, p.pci_bus, p.pci_device);
    }
}

static const cti_cuda_api api = {
    .device_count = cti_cuda_device_count,
    .get_device_properties = cti_cuda_get_device_properties,
    .synchronize = cti_cuda_synchronize,
    .stream = cti_cuda_stream,
    .memory_stats = cti_cuda_memory_stats,
    .reset_peak_memory_stats = cti_cuda_reset_peak_memory_stats,
    .empty_cache = cti_cuda_empty_cache,
    .graph_capture_begin = cti_cuda_graph_capture_begin,
    .graph_capture_end = cti_cuda_graph_capture_end,
    .graph_replay = cti_cuda_graph_replay,
    .graph_free = cti_cuda_graph_free,
#ifdef CTI_HAVE_NCCL
    .nccl = &cti_cuda_nccl,
#endif
};

const cti_abi cti_module_abi = CTI_ABI_HERE;

const cti_backend cti_backend_cuda = {
    .name = "cuda",
    .device = CT_DEVICE_CUDA,
    .register_kernels = cuda_register,
    .device_count = cti_cuda_device_count,
    .print_info = cuda_print_info,
    .synchronize = cti_cuda_synchronize,
    .api = &api,
};
