#include "cpu_impl.h"

void cti_blas_init(void) {}
void cti_blas_set_threads(int n) { (void)n; }
const char *cti_cpu_blas_info(void) { return "OpenBLAS"; }
