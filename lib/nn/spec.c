/* The language models' specs, "gpt2:layers=2,dim=64" and "llama:layers=2,eps=1e-6": one parser
 * for both families, from a table of keys (lm_int.h). */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp/log.h>

#include "nn/lm_int.h"

/* The value of key k (text v, n bytes) into its field of cfg, or -1 saying what is allowed. */
static int spec_value(const char *spec, const fsdp_nn_spec_key_t *k, const char *v, size_t n,
                      void *cfg)
{
    char *field = (char *)cfg + k->offset, *end;
    double d;

    if (n == 0 || isspace((unsigned char)v[0])) {
        fsdp_error("model '%s': %s has no value", spec, k->name);
        return -1;
    }
    switch (k->type) {
    case FSDP_NN_SPEC_CHOICE: {
        char names[128];
        size_t off = 0;
        for (int i = 0; k->choices[i] != NULL; i++) {
            if (strlen(k->choices[i]) == n && strncmp(v, k->choices[i], n) == 0) {
                *(int *)field = i;
                return 0;
            }
            off += (size_t)snprintf(names + off, sizeof(names) - off, "%s%s", i ? ", " : "",
                                    k->choices[i]);
            if (off >= sizeof(names))
                break;
        }
        fsdp_error("model '%s': %s is one of %s, not '%.*s'", spec, k->name, names, (int)n, v);
        return -1;
    }
    case FSDP_NN_SPEC_INT: {
        long l;
        errno = 0;
        l = strtol(v, &end, 10);
        if (errno != 0 || !isdigit((unsigned char)v[0]) || end != v + n || l < (long)k->lo ||
            l > (long)k->hi) {
            fsdp_error("model '%s': %s needs an integer in [%.0f, %.0f], not '%.*s'", spec, k->name,
                       k->lo, k->hi, (int)n, v);
            return -1;
        }
        *(int *)field = (int)l;
        return 0;
    }
    case FSDP_NN_SPEC_FLOAT:
    case FSDP_NN_SPEC_DOUBLE:
        errno = 0;
        d = strtod(v, &end);
        /* in the field's own type: a float's value is checked as the float it becomes */
        if (k->type == FSDP_NN_SPEC_FLOAT)
            d = (float)d;
        if (errno != 0 || end == v || end != v + n || !isfinite(d) || !(d >= k->lo) ||
            !(d <= k->hi)) {
            char range[64];
            if (k->hi >= (k->type == FSDP_NN_SPEC_FLOAT ? FLT_MAX : DBL_MAX))
                snprintf(range, sizeof(range), ">= %g", k->lo);
            else
                snprintf(range, sizeof(range), "in [%g, %g]", k->lo, k->hi);
            fsdp_error("model '%s': %s needs a finite number %s (a %s), not '%.*s'", spec, k->name,
                       range, k->type == FSDP_NN_SPEC_FLOAT ? "float" : "double", (int)n, v);
            return -1;
        }
        if (k->type == FSDP_NN_SPEC_FLOAT)
            *(float *)field = (float)d;
        else
            *(double *)field = d;
        return 0;
    }
    return -1;
}

fsdp_status_t fsdp_nn_spec_parse(const char *spec, const char *form, const fsdp_nn_spec_key_t *keys,
                                 int nkeys, void *cfg)
{
    const char *colon = strchr(spec, ':'), *p;
    unsigned seen = 0;

    p = colon + 1;
    if (*p == '\0' || *p == ',' || p[strlen(p) - 1] == ',' || strstr(p, ",,") != NULL) {
        fsdp_error("model '%s': expected %s (any of them, comma-separated) after '%.*s', without "
                   "an empty one",
                   spec, form, (int)(p - spec), spec);
        return FSDP_ERR_INVALID_PARAM;
    }
    while (*p != '\0') {
        const char *eq = strchr(p, '=');
        size_t klen = strcspn(p, ",="), vlen;
        int key = -1;

        for (int i = 0; eq != NULL && eq == p + klen && i < nkeys; i++) {
            if (strlen(keys[i].name) == klen && strncmp(p, keys[i].name, klen) == 0)
                key = i;
        }
        if (key < 0) {
            fsdp_error("model '%s': expected %s (any of them, comma-separated), not '%.*s'", spec,
                       form, (int)strcspn(p, ","), p);
            return FSDP_ERR_INVALID_PARAM;
        }
        if (seen & (1u << key)) {
            fsdp_error("model '%s': %s is given twice", spec, keys[key].name);
            return FSDP_ERR_INVALID_PARAM;
        }
        seen |= 1u << key;
        vlen = strcspn(eq + 1, ",");
        if (spec_value(spec, &keys[key], eq + 1, vlen, cfg) != 0)
            return FSDP_ERR_INVALID_PARAM;
        p = eq + 1 + vlen;
        if (*p == ',')
            p++;
    }
    return FSDP_OK;
}
