#include "cuda_impl.h"
