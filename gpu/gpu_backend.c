/* The gpu backend. Placeholder replaced below. */
#include "config.h"
#include <fsdp/gpu.h>
int fsdp_gpu_built(void) { return FSDP_HAVE_GPU; }
int fsdp_gpu_device_count(void) { return 0; }
const fsdp_backend_ops_t *fsdp_gpu_backend(void) { return NULL; }
