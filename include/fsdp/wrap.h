/* libfsdp: auto-wrap policies — which modules of a model become FSDP units.
 *
 * A model describes its module tree (parents before children); a policy decides, bottom-up as
 * PyTorch's recursive wrapping does, which modules get their own unit. A module's parameters
 * belong to the nearest wrapped ancestor-or-self; the root is always wrapped.
 */
#ifndef FSDP_WRAP_H
#define FSDP_WRAP_H

#include <fsdp/api.h>

#include <fsdp/status.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_module_desc {
    const char *name;  /* "h.3", "h.3.attn" */
    const char *type;  /* "Block", "Linear", "LayerNorm", ... */
    size_t own_numel;  /* parameters held by this module itself (not its children) */
    int parent;        /* index of the parent module, -1 for the root (index 0) */
} fsdp_module_desc_t;

typedef enum {
    FSDP_WRAP_NONE = 0,       /* only the root is a unit */
    FSDP_WRAP_MIN_PARAMS = 1, /* size_based_auto_wrap_policy */
    FSDP_WRAP_BY_TYPE = 2,    /* ModuleWrapPolicy */
    FSDP_WRAP_CUSTOM = 3      /* CustomPolicy / a callable */
} fsdp_wrap_kind_t;

/* Returns 1 to wrap the module; unwrapped_numel counts its parameters and those of its
 * descendants that no wrapped descendant took. */
typedef int (*fsdp_wrap_func_t)(const fsdp_module_desc_t *module, size_t unwrapped_numel,
                                void *arg);

typedef struct fsdp_wrap_policy {
    fsdp_wrap_kind_t kind;
    size_t min_num_params;         /* MIN_PARAMS: default 1e8, as PyTorch */
    const char *const *types;      /* BY_TYPE: the types to wrap */
    int ntypes;
    fsdp_wrap_func_t func;         /* CUSTOM */
    void *arg;
} fsdp_wrap_policy_t;

FSDP_API void fsdp_wrap_policy_init(fsdp_wrap_policy_t *policy, fsdp_wrap_kind_t kind);

/* Decides the units: unit_of[i] = the index of the wrapped module that owns module i's
 * parameters (itself when wrapped). Modules must be listed parents first. */
FSDP_API fsdp_status_t fsdp_auto_wrap(const fsdp_wrap_policy_t *policy,
                                      const fsdp_module_desc_t *modules, int nmodules,
                                      int *unit_of);

#ifdef __cplusplus
}
#endif
#endif
