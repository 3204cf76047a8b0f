#include "dispatch_impl.h"
