/* Auto-wrap policies: PyTorch's recursive wrapping, bottom-up over a module tree. */
#include <fsdp/log.h>
#include <fsdp/wrap.h>

#include <stdlib.h>
#include <string.h>

void fsdp_wrap_policy_init(fsdp_wrap_policy_t *policy, fsdp_wrap_kind_t kind)
{
    memset(policy, 0, sizeof(*policy));
    policy->kind = kind;
    policy->min_num_params = 100000000; /* size_based_auto_wrap_policy's default, 1e8 */
}

static int wants_wrap(const fsdp_wrap_policy_t *p, const fsdp_module_desc_t *m, size_t unwrapped)
{
    switch (p->kind) {
    case FSDP_WRAP_MIN_PARAMS:
        return unwrapped >= p->min_num_params;
    case FSDP_WRAP_BY_TYPE:
        for (int i = 0; i < p->ntypes; i++) {
            if (m->type != NULL && strcmp(p->types[i], m->type) == 0)
                return 1;
        }
        return 0;
    case FSDP_WRAP_CUSTOM:
        return p->func(m, unwrapped, p->arg) != 0;
    default:
        return 0;
    }
}

fsdp_status_t fsdp_auto_wrap(const fsdp_wrap_policy_t *policy, const fsdp_module_desc_t *modules,
                             int nmodules, int *unit_of)
{
    size_t *unwrapped;
    char *wrapped;

    if (policy == NULL || modules == NULL || unit_of == NULL || nmodules < 1) {
        fsdp_error("auto-wrap: a policy and at least the root module are required");
        return FSDP_ERR_INVALID_PARAM;
    }
    if ((unsigned)policy->kind > FSDP_WRAP_CUSTOM ||
        (policy->kind == FSDP_WRAP_CUSTOM && policy->func == NULL) ||
        (policy->kind == FSDP_WRAP_BY_TYPE && policy->ntypes > 0 && policy->types == NULL)) {
        fsdp_error("auto-wrap: policy kind %d is not none, min_params, by_type (with types) or "
                   "custom (with a function)", (int)policy->kind);
        return FSDP_ERR_INVALID_PARAM;
    }
    for (int i = 0; i < nmodules; i++) {
        if ((i == 0) != (modules[i].parent < 0) || modules[i].parent >= i) {
            fsdp_error("auto-wrap: module %d ('%s') has parent %d; module 0 is the root and "
                       "every other module must follow its parent", i,
                       modules[i].name ? modules[i].name : "?", modules[i].parent);
            return FSDP_ERR_INVALID_PARAM;
        }
    }
    unwrapped = calloc((size_t)nmodules, sizeof(*unwrapped));
    wrapped = calloc((size_t)nmodules, 1);
    if (unwrapped == NULL || wrapped == NULL) {
        free(unwrapped);
        free(wrapped);
        return FSDP_ERR_NO_MEMORY;
    }
    /* children follow parents, so walking backwards visits every child before its parent */
    for (int i = nmodules - 1; i >= 0; i--) {
        unwrapped[i] += modules[i].own_numel;
        wrapped[i] = i == 0 || wants_wrap(policy, &modules[i], unwrapped[i]);
        if (i > 0 && !wrapped[i])
            unwrapped[modules[i].parent] += unwrapped[i];
    }
    for (int i = 0; i < nmodules; i++)
        unit_of[i] = wrapped[i] ? i : unit_of[modules[i].parent];
    free(unwrapped);
    free(wrapped);
    return FSDP_OK;
}
