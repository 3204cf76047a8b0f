/* One kernel set: compiled once per instruction-set level with that
 * level's flags and -DCTI_ISA_SFX=<level> (cpu_impl.h), so this function
 * and the ones it calls are cti_cpu_register_*_<level>. */
#include "cpu_impl.h"

void cti_cpu_register_kernels(void) {
    cti_cpu_register_copy();
    cti_cpu_register_elementwise();
    cti_cpu_register_reduce();
    cti_cpu_register_linalg();
    cti_cpu_register_conv();
    cti_cpu_register_norm();
    cti_cpu_register_softmax();
    cti_cpu_register_loss();
    cti_cpu_register_embedding();
    cti_cpu_register_dropout();
    cti_cpu_register_optim();
    cti_cpu_register_rope();
    cti_cpu_register_seqops();
    cti_cpu_register_linear_ce();
    cti_cpu_register_attention();
    cti_cpu_register_indexing();
    cti_cpu_register_sort();
    cti_cpu_register_shape();
    cti_cpu_register_batch_norm();
}
