// Under emulation (-I tests/shim) `#include <cuda_runtime.h>` resolves here: the host shim.
#pragma once
#include "cuda_shim.h"
