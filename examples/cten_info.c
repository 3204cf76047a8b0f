/* cten-info: prints the stack cten runs on (version, backends, BLAS kernel,
 * devices), as the design's drawing shows it. */
#include <stdio.h>

#include <tensor/tensor.h>

int main(void) {
    ct_print_info(stdout);
    return 0;
}
