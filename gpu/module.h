/* The gpu backend module's entry table: the contract between libfsdp's loader (module.c) and
 * libfsdp-gpu.so (backend.c). Never installed; needs no CUDA header.
 *
 * The module holds every CUDA and NCCL call, so that libfsdp itself needs none of their
 * libraries. It exports one symbol, FSDP_GPU_MODULE_SYMBOL: a function returning this table.
 * The loader checks the table's size, ABI version and the libfsdp version the module was built
 * with (the module calls the core through include/fsdp/, whose structs must be this library's)
 * before it uses any slot. A change to the table bumps FSDP_GPU_MODULE_ABI, and with it the
 * symbol's name, so that an old module is refused rather than misread.
 */
#ifndef FSDP_GPU_MODULE_H
#define FSDP_GPU_MODULE_H

#include <fsdp/gpu.h>

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FSDP_GPU_MODULE_ABI 2
#define FSDP_GPU_MODULE_SYMBOL "fsdp_gpu_module_v2"
/* The module's file name, in the directories the loader searches. */
#define FSDP_GPU_MODULE_FILE "libfsdp-gpu.so"

typedef struct fsdp_gpu_module {
    size_t size;                   /* sizeof(fsdp_gpu_module_t) as the module was built */
    unsigned abi;                  /* FSDP_GPU_MODULE_ABI */
    const char *version;           /* FSDP_VERSION_STRING of the module's build */
    const fsdp_backend_ops_t *ops; /* complete (fsdp_backend_check) */
    /* The public entry points of fsdp/gpu.h, as documented there; params is never NULL. */
    int (*device_count)(void);
    fsdp_status_t (*unique_id)(fsdp_gpu_unique_id_t *id_p);
    fsdp_status_t (*init)(const fsdp_gpu_params_t *params, fsdp_dev_t **dev_p);
    void (*finalize)(fsdp_dev_t *dev);
    /* The rank in front of the calling thread's messages (-1: none); for tests. */
    void (*set_log_rank)(int rank);
    int (*log_rank)(void);
    /* fsdp_gpu_describe's line, past its "gpu: " */
    void (*describe)(char *buf, size_t size);
} fsdp_gpu_module_t;

typedef const fsdp_gpu_module_t *(*fsdp_gpu_module_func_t)(void);

/* The one symbol the module exports. */
const fsdp_gpu_module_t *fsdp_gpu_module_v2(void);

#ifdef __cplusplus
}
#endif
#endif
