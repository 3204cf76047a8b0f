#include "cpu_impl.h"

void cti_cpu_register_conv(void) {}
