/* libfsdp: Fully Sharded Data Parallel training in C. The one header to include. */
#ifndef FSDP_FSDP_H
#define FSDP_FSDP_H

#include <fsdp/backend.h>
#include <fsdp/calibrate.h>
#include <fsdp/checkpoint.h>
#include <fsdp/core.h>
#include <fsdp/data.h>
#include <fsdp/gpt2.h>
#include <fsdp/gpu.h>
#include <fsdp/kernel.h>
#include <fsdp/llama.h>
#include <fsdp/lm.h>
#include <fsdp/log.h>
#include <fsdp/memory.h>
#include <fsdp/nn.h>
#include <fsdp/safetensors.h>
#include <fsdp/sim.h>
#include <fsdp/status.h>
#include <fsdp/trace.h>
#include <fsdp/types.h>
#include <fsdp/version.h>
#include <fsdp/wrap.h>

#endif
