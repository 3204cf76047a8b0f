#include "cpu_impl.h"
