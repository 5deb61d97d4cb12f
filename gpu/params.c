/* Defaults of the gpu backend's parameters (built with or without CUDA). */
#include "config.h"

#include <fsdp/gpu.h>

#include <string.h>

void fsdp_gpu_params_init(fsdp_gpu_params_t *params)
{
    memset(params, 0, sizeof(*params));
    params->rank = 0;
    params->world_size = 1;
    params->local_rank = 0;
    params->local_size = 0;
    params->device = -1;
    params->timeout_s = 600.0;
    params->blocking_collectives = 0;
}
