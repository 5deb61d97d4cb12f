/* Cluster profiles as JSON (the layout of traces/profiles/h100.json): one table of fields
 * drives both the parser, which names the member and what is allowed for anything wrong, and
 * the writer, whose text the parser reads back to the same values; and a profile as a command
 * line names it, a preset or a JSON file. Units are SI base units
 * throughout: seconds, bytes, bytes/s, FLOP/s. */
#include "sim.h"

#include "io/fs.h"

#include <fsdp/log.h>

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- JSON -------------------------------------------------------------------------------- */

typedef enum {
    F_INT,     /* int */
    F_SIZE,    /* size_t, a non-negative integer */
    F_DOUBLE,  /* double */
    F_BOOL,    /* int 0/1 */
    F_STRING,  /* char[64] */
    F_CLASSES, /* double[3]: one node, two nodes, three or more */
    F_PROTO3,  /* double[PROTO]: [ll, ll128, simple] */
    F_TABLE,   /* double[ALGO][PROTO]: {"ring": [ll, ll128, simple], ...} */
    F_FLOPS,   /* the gpu's matmul rates: {"f32":, "tf32":, "bf16":, "f16":} */
    F_ALGOS,   /* unsigned bitmask: ["ring", "tree"] */
    F_PROTOS,  /* unsigned bitmask: ["ll", "simple"] */
    F_TREECORR, /* double[PROTO][23]: {"ll": [...], "ll128": [...], "simple": [...]} */
    F_OPS,      /* fsdp_sim_ops_t: "eager" or "fused" */
    F_ATTNSEQ   /* double[2][ATTN_SEQ_POINTS]: {"hd64": [...], "hd128": [...]} */
} field_type_t;

typedef struct field {
    const char *section; /* "" for the top level */
    const char *key;
    field_type_t type;
    size_t offset;
    int required; /* 1: without a base preset; OMIT_ZERO: optional, written only when not 0 */
} field_t;

/* A member the writer leaves out at 0 (every byte of it: its default), so that profiles that do
 * not set it write what they wrote before it existed. */
#define OMIT_ZERO 2

#define FLD(sec, key, type, member, req)                                                           \
    {                                                                                              \
        sec, key, type, offsetof(fsdp_sim_profile_t, member), req                                  \
    }

static const field_t fields[] = {
    FLD("", "name", F_STRING, name, 0),
    FLD("", "stack", F_STRING, stack, 0),
    FLD("", "nodes", F_INT, nodes, 1),
    FLD("", "gpus_per_node", F_INT, gpus_per_node, 1),
    FLD("", "ops", F_OPS, ops, 0),
    FLD("gpu", "model", F_STRING, gpu.model, 0),
    FLD("gpu", "memory_bytes", F_SIZE, gpu.memory_bytes, 1),
    FLD("gpu", "matmul_flops_per_s", F_FLOPS, gpu, 1),
    FLD("gpu", "allow_tf32", F_BOOL, gpu.allow_tf32, 0),
    FLD("gpu", "vector_flops_per_s", F_DOUBLE, gpu.vector_flops_per_s, 1),
    FLD("gpu", "hbm_bytes_per_s", F_DOUBLE, gpu.hbm_bytes_per_s, 1),
    FLD("gpu", "compute_efficiency", F_DOUBLE, gpu.compute_efficiency, 0),
    FLD("gpu", "memory_efficiency", F_DOUBLE, gpu.memory_efficiency, 0),
    FLD("gpu", "kernel_latency_s", F_DOUBLE, gpu.kernel_latency_s, 0),
    FLD("gpu", "gemm_efficiency", F_DOUBLE, gpu.gemm_efficiency, 0),
    FLD("gpu", "gemm_unaligned_efficiency", F_DOUBLE, gpu.gemm_unaligned_efficiency, 0),
    FLD("gpu", "attention_efficiency", F_DOUBLE, gpu.attention_efficiency, 0),
    FLD("gpu", "attention_seq_efficiency", F_ATTNSEQ, gpu.attention_seq_efficiency, OMIT_ZERO),
    FLD("gpu", "strided_elements_per_s", F_DOUBLE, gpu.strided_elements_per_s, 0),
    FLD("gpu", "elementwise_memory_efficiency", F_DOUBLE, gpu.elementwise_memory_efficiency, 0),
    FLD("gpu", "sms", F_INT, gpu.sms, 0),
    FLD("host", "launch_overhead_s", F_DOUBLE, host.launch_overhead_s, 0),
    FLD("host", "event_overhead_s", F_DOUBLE, host.event_overhead_s, 0),
    FLD("host", "launch_latency_s", F_DOUBLE, host.launch_latency_s, 0),
    FLD("host", "h2d_bytes_per_s", F_DOUBLE, host.h2d_bytes_per_s, 1),
    FLD("host", "d2h_bytes_per_s", F_DOUBLE, host.d2h_bytes_per_s, 1),
    FLD("nccl", "algorithms", F_ALGOS, nccl.algorithms, 0),
    FLD("nccl", "protocols", F_PROTOS, nccl.protocols, 0),
    FLD("nccl", "channels", F_INT, nccl.channels, 0),
    FLD("nccl", "base_latency_s", F_TABLE, nccl.base_latency_s, 0),
    FLD("nccl", "intra_latency_s", F_TABLE, nccl.intra_latency_s, 0),
    FLD("nccl", "inter_latency_s", F_TABLE, nccl.inter_latency_s, 0),
    FLD("nccl", "intra_bus_bytes_per_s", F_DOUBLE, nccl.intra_bus_bytes_per_s, 1),
    FLD("nccl", "nic_bytes_per_s", F_DOUBLE, nccl.nic_bytes_per_s, 0),
    FLD("nccl", "nics_per_node", F_INT, nccl.nics_per_node, 0),
    FLD("nccl", "net_overhead_s", F_DOUBLE, nccl.net_overhead_s, 0),
    FLD("nccl", "net_latency_s", F_DOUBLE, nccl.net_latency_s, 0),
    FLD("nccl", "ll_max_bytes_per_s", F_CLASSES, nccl.ll_max_bytes_per_s, 0),
    FLD("nccl", "ring_ll128_channel_bytes_per_s", F_CLASSES, nccl.ring_ll128_channel_bytes_per_s,
        0),
    FLD("nccl", "tree_channel_bytes_per_s", F_CLASSES, nccl.tree_channel_bytes_per_s, 0),
    FLD("nccl", "tree_ll128_channel_bytes_per_s", F_CLASSES, nccl.tree_ll128_channel_bytes_per_s,
        0),
    FLD("nccl", "tree_correction", F_TREECORR, nccl.tree_correction, 0),
    FLD("nccl", "ring_plateau_factor", F_DOUBLE, nccl.ring_plateau_factor, 0),
    FLD("nccl", "nvls_bus_bytes_per_s", F_DOUBLE, nccl.nvls_bus_bytes_per_s, 0),
    FLD("nccl", "call_floor_s", F_DOUBLE, nccl.call_floor_s, 0),
    FLD("nccl", "net_floor_s", F_DOUBLE, nccl.net_floor_s, 0),
    FLD("nccl", "channel_bytes", F_PROTO3, nccl.channel_bytes, 0),
    FLD("nccl", "nvls_channels", F_INT, nccl.nvls_channels, 0),
    FLD("nccl", "nvls_tree_channel_bytes_per_s", F_CLASSES, nccl.nvls_tree_channel_bytes_per_s, 0),
    FLD("nccl", "pat_bandwidth_factor", F_DOUBLE, nccl.pat_bandwidth_factor, 0),
    FLD("nccl", "sms_per_channel", F_INT, nccl.sms_per_channel, 0),
    FLD("nccl", "hbm_traffic_factor", F_DOUBLE, nccl.hbm_traffic_factor, 0),
    FLD("nccl", "version", F_INT, nccl.version, OMIT_ZERO),
};
#define N_FIELDS (sizeof(fields) / sizeof(fields[0]))

static const char *const sections[] = {"gpu", "host", "nccl"};

/* What a profile without a base starts from: neutral values (no latency, no correction, no cap,
 * efficiency 1, NCCL's ring with the Simple protocol only). */
static void profile_neutral(fsdp_sim_profile_t *p)
{
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "custom");
    p->gpu.compute_efficiency = 1.0;
    p->gpu.memory_efficiency = 1.0;
    p->gpu.gemm_efficiency = 1.0;
    p->gpu.gemm_unaligned_efficiency = 1.0;
    p->gpu.attention_efficiency = 1.0;
    p->ops = FSDP_SIM_OPS_FUSED;
    p->nccl.algorithms = 1u << FSDP_SIM_ALGO_RING;
    p->nccl.protocols = 1u << FSDP_SIM_PROTO_SIMPLE;
    p->nccl.channels = 1;
    p->nccl.nics_per_node = 1;
    p->nccl.ring_plateau_factor = 1.0;
    for (int pr = 0; pr < FSDP_SIM_PROTO_COUNT; pr++)
        for (int i = 0; i < FSDP_SIM_TREE_SIZES; i++)
            p->nccl.tree_correction[pr][i] = 1.0;
}

typedef struct parse_ctx {
    const char *source; /* file name or "(text)" */
    int quiet;          /* no logging (to_json's round trip) */
    char path[96];      /* the member being read, "gpu.hbm_bytes_per_s" */
} parse_ctx_t;

static fsdp_status_t bad(parse_ctx_t *c, const char *what)
{
    if (!c->quiet)
        fsdp_error("cluster profile %s: %s %s", c->source, c->path, what);
    return FSDP_ERR_INVALID_PARAM;
}

static fsdp_status_t get_number(parse_ctx_t *c, json_t *v, double lo, double *out)
{
    double d;

    if (!json_is_number(v))
        return bad(c, "must be a number");
    d = json_number_value(v);
    if (!isfinite(d) || d < lo || d > FSDP_SIM_PROFILE_BIG) {
        char msg[96];
        snprintf(msg, sizeof(msg), "is %g; it must be a number >= %g", d, lo);
        return bad(c, msg);
    }
    *out = d;
    return FSDP_OK;
}

static fsdp_status_t get_numbers(parse_ctx_t *c, json_t *v, size_t n, double *out)
{
    char msg[64];

    if (!json_is_array(v) || json_array_size(v) != n) {
        snprintf(msg, sizeof(msg), "must be an array of %zu numbers", n);
        return bad(c, msg);
    }
    for (size_t i = 0; i < n; i++) {
        fsdp_status_t st = get_number(c, json_array_get(v, i), 0.0, &out[i]);
        if (st != FSDP_OK)
            return st;
    }
    return FSDP_OK;
}

/* A bitmask from an array of names. */
static fsdp_status_t get_names(parse_ctx_t *c, json_t *v, const char *(*name)(int), int n,
                               const char *allowed, unsigned *out)
{
    unsigned mask = 0;
    char msg[160];

    snprintf(msg, sizeof(msg), "must be an array of names among %s", allowed);
    if (!json_is_array(v))
        return bad(c, msg);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const char *s = json_string_value(json_array_get(v, i));
        int k;
        if (s == NULL)
            return bad(c, msg);
        for (k = 0; k < n && strcmp(s, name(k)) != 0; k++)
            ;
        if (k == n) {
            snprintf(msg, sizeof(msg), "names '%s'; allowed: %s", s, allowed);
            return bad(c, msg);
        }
        mask |= 1u << k;
    }
    *out = mask;
    return FSDP_OK;
}

static const char *algo_name_i(int i)
{
    return fsdp_sim_algo_name((fsdp_sim_algo_t)i);
}

static const char *proto_name_i(int i)
{
    return fsdp_sim_proto_name((fsdp_sim_proto_t)i);
}

/* the rows of gpu.attention_seq_efficiency */
static const char *head_dim_name_i(int i)
{
    return i == 0 ? "hd64" : "hd128";
}

/* An object keyed by the names name(0..n-1), each value an array of m numbers, into rows of
 * `stride` doubles. Missing keys leave their rows alone. */
static fsdp_status_t get_keyed_rows(parse_ctx_t *c, json_t *v, const char *(*name)(int), int n,
                                    size_t m, double *rows, size_t stride)
{
    const char *key;
    json_t *val;
    size_t base_len = strlen(c->path);

    if (!json_is_object(v))
        return bad(c, "must be an object");
    json_object_foreach (v, key, val) {
        fsdp_status_t st;
        int k;
        for (k = 0; k < n && strcmp(key, name(k)) != 0; k++)
            ;
        snprintf(c->path + base_len, sizeof(c->path) - base_len, ".%s", key);
        if (k == n) {
            char msg[128];
            snprintf(msg, sizeof(msg), "is not a known member; allowed: %s, %s%s%s", name(0),
                     name(1), n > 2 ? ", " : "", n > 2 ? name(2) : "");
            return bad(c, msg);
        }
        st = get_numbers(c, val, m, rows + (size_t)k * stride);
        if (st != FSDP_OK)
            return st;
        c->path[base_len] = '\0';
    }
    return FSDP_OK;
}

static fsdp_status_t get_flops(parse_ctx_t *c, json_t *v, fsdp_sim_gpu_profile_t *gpu, int *has_f32)
{
    const char *key;
    json_t *val;
    size_t base_len = strlen(c->path);

    if (!json_is_object(v))
        return bad(c, "must be an object {\"f32\": ..., \"tf32\": ..., \"bf16\": ..., "
                      "\"f16\": ...}");
    json_object_foreach (v, key, val) {
        double *dst = NULL;
        fsdp_status_t st;
        fsdp_dtype_t dt;
        snprintf(c->path + base_len, sizeof(c->path) - base_len, ".%s", key);
        if (strcmp(key, "tf32") == 0)
            dst = &gpu->tf32_flops_per_s;
        else if (fsdp_dtype_parse(key, &dt) && fsdp_dtype_is_float(dt))
            dst = &gpu->matmul_flops_per_s[dt];
        if (dst == NULL)
            return bad(c, "is not a known member; allowed: f32, tf32, bf16, f16");
        st = get_number(c, val, 0.0, dst);
        if (st != FSDP_OK)
            return st;
        if (dst == &gpu->matmul_flops_per_s[FSDP_DTYPE_F32])
            *has_f32 = 1;
        c->path[base_len] = '\0';
    }
    return FSDP_OK;
}

static fsdp_status_t get_field(parse_ctx_t *c, const field_t *f, json_t *v, fsdp_sim_profile_t *p,
                               int *has_f32)
{
    char *addr = (char *)p + f->offset;
    double d;
    fsdp_status_t st;

    switch (f->type) {
    case F_INT:
    case F_SIZE:
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            (f->type == F_INT && json_integer_value(v) > 1000000))
            return bad(c, f->type == F_INT ? "must be an integer from 0 to 1000000"
                                           : "must be a non-negative integer");
        if (f->type == F_INT)
            *(int *)addr = (int)json_integer_value(v);
        else
            *(size_t *)addr = (size_t)json_integer_value(v);
        return FSDP_OK;
    case F_DOUBLE:
        st = get_number(c, v, 0.0, &d);
        if (st == FSDP_OK)
            *(double *)addr = d;
        return st;
    case F_BOOL:
        if (!json_is_boolean(v))
            return bad(c, "must be true or false");
        *(int *)addr = json_is_true(v);
        return FSDP_OK;
    case F_STRING:
        if (!json_is_string(v) || json_string_length(v) >= 64)
            return bad(c, "must be a string of fewer than 64 bytes");
        memset(addr, 0, 64);
        snprintf(addr, 64, "%s", json_string_value(v));
        return FSDP_OK;
    case F_CLASSES:
        return get_numbers(c, v, FSDP_SIM_NODE_CLASSES, (double *)addr);
    case F_PROTO3:
        return get_numbers(c, v, FSDP_SIM_PROTO_COUNT, (double *)addr);
    case F_TABLE:
        return get_keyed_rows(c, v, algo_name_i, FSDP_SIM_ALGO_COUNT, FSDP_SIM_PROTO_COUNT,
                              (double *)addr, FSDP_SIM_PROTO_COUNT);
    case F_TREECORR:
        return get_keyed_rows(c, v, proto_name_i, FSDP_SIM_PROTO_COUNT, FSDP_SIM_TREE_SIZES,
                              (double *)addr, FSDP_SIM_TREE_SIZES);
    case F_ATTNSEQ:
        return get_keyed_rows(c, v, head_dim_name_i, 2, FSDP_SIM_ATTN_SEQ_POINTS, (double *)addr,
                              FSDP_SIM_ATTN_SEQ_POINTS);
    case F_FLOPS:
        return get_flops(c, v, &p->gpu, has_f32);
    case F_ALGOS:
        return get_names(c, v, algo_name_i, FSDP_SIM_ALGO_COUNT, FSDP_SIM_ALGO_NAMES, (unsigned *)addr);
    case F_PROTOS:
        return get_names(c, v, proto_name_i, FSDP_SIM_PROTO_COUNT, "ll, ll128, simple",
                         (unsigned *)addr);
    case F_OPS:
        if (json_is_string(v) && strcmp(json_string_value(v), "eager") == 0)
            *(fsdp_sim_ops_t *)addr = FSDP_SIM_OPS_EAGER;
        else if (json_is_string(v) && strcmp(json_string_value(v), "fused") == 0)
            *(fsdp_sim_ops_t *)addr = FSDP_SIM_OPS_FUSED;
        else
            return bad(c, "must be \"eager\" or \"fused\"");
        return FSDP_OK;
    }
    return FSDP_ERR_INTERNAL;
}

static const field_t *field_find(const char *section, const char *key)
{
    for (size_t i = 0; i < N_FIELDS; i++) {
        if (strcmp(fields[i].section, section) == 0 && strcmp(fields[i].key, key) == 0)
            return &fields[i];
    }
    return NULL;
}

static void list_keys(const char *section, char *buf, size_t n)
{
    size_t off = 0;

    buf[0] = '\0';
    for (size_t i = 0; i < N_FIELDS && off < n; i++) {
        if (strcmp(fields[i].section, section) == 0)
            off += (size_t)snprintf(buf + off, n - off, "%s%s", off ? ", " : "", fields[i].key);
    }
}

/* Reads the members of one object (the top level, or a section). */
static fsdp_status_t parse_object(parse_ctx_t *c, const char *section, json_t *obj,
                                  fsdp_sim_profile_t *p, unsigned char *seen, int *has_f32)
{
    const char *key;
    json_t *val;

    json_object_foreach (obj, key, val) {
        const field_t *f;
        fsdp_status_t st;
        int is_section = 0;

        snprintf(c->path, sizeof(c->path), "%s%s%s", section, *section ? "." : "", key);
        /* documentation members: "description" and anything starting with '_' */
        if (key[0] == '_' || strcmp(key, "description") == 0 ||
            (*section == '\0' && strcmp(key, "base") == 0))
            continue;
        for (size_t i = 0; *section == '\0' && i < sizeof(sections) / sizeof(sections[0]); i++)
            is_section |= strcmp(key, sections[i]) == 0;
        if (is_section) {
            if (!json_is_object(val))
                return bad(c, "must be an object");
            st = parse_object(c, key, val, p, seen, has_f32);
            if (st != FSDP_OK)
                return st;
            continue;
        }
        f = field_find(section, key);
        if (f == NULL) {
            char allowed[600];
            char msg[700];
            list_keys(section, allowed, sizeof(allowed));
            snprintf(msg, sizeof(msg), "is not a known member; allowed here: %s%s", allowed,
                     *section ? "" : ", base, description, gpu, host, nccl");
            return bad(c, msg);
        }
        st = get_field(c, f, val, p, has_f32);
        if (st != FSDP_OK)
            return st;
        seen[f - fields] = 1;
    }
    return FSDP_OK;
}

/* quiet: nothing is logged and the ranges are not checked (to_json's round trip). */
static fsdp_status_t profile_from_json(json_t *root, const char *source, int quiet,
                                       fsdp_sim_profile_t *profile_p)
{
    parse_ctx_t c = {.source = source, .quiet = quiet};
    unsigned char seen[N_FIELDS] = {0};
    fsdp_sim_profile_t p;
    json_t *base;
    int has_f32 = 0;
    fsdp_status_t st;

    if (!json_is_object(root)) {
        if (!quiet)
            fsdp_error("cluster profile %s: the top level must be a JSON object", source);
        return FSDP_ERR_FORMAT;
    }
    base = quiet ? NULL : json_object_get(root, "base");
    if (base != NULL) {
        if (!json_is_string(base)) {
            fsdp_error("cluster profile %s: base must be the name of a preset (%s)", source,
                       fsdp_sim_profile_presets());
            return FSDP_ERR_INVALID_PARAM;
        }
        st = fsdp_sim_profile_preset(json_string_value(base), &p);
        if (st != FSDP_OK)
            return st;
    } else {
        profile_neutral(&p);
    }
    st = parse_object(&c, "", root, &p, seen, &has_f32);
    if (st != FSDP_OK)
        return st;
    if (base == NULL) {
        for (size_t i = 0; i < N_FIELDS; i++) {
            if (fields[i].required != 1 || seen[i])
                continue;
            if (fields[i].type == F_FLOPS && has_f32)
                continue;
            if (quiet)
                return FSDP_ERR_INVALID_PARAM;
            fsdp_error("cluster profile %s: %s%s%s%s is required (or start from a preset with "
                       "\"base\": one of %s)",
                       source, fields[i].section, *fields[i].section ? "." : "", fields[i].key,
                       fields[i].type == F_FLOPS ? ".f32" : "", fsdp_sim_profile_presets());
            return FSDP_ERR_INVALID_PARAM;
        }
        if (!has_f32) {
            if (!quiet)
                fsdp_error("cluster profile %s: gpu.matmul_flops_per_s.f32 is required", source);
            return FSDP_ERR_INVALID_PARAM;
        }
    }
    st = quiet ? FSDP_OK : fsdp_sim_profile_check(&p);
    if (st != FSDP_OK)
        return st;
    *profile_p = p;
    return FSDP_OK;
}

fsdp_status_t fsdp_sim_profile_parse(const char *text, fsdp_sim_profile_t *profile_p)
{
    json_error_t err;
    json_t *root;
    fsdp_status_t st;

    if (text == NULL || profile_p == NULL) {
        fsdp_error("fsdp_sim_profile_parse: text and profile_p must not be NULL");
        return FSDP_ERR_INVALID_PARAM;
    }
    root = json_loads(text, JSON_REJECT_DUPLICATES, &err);
    if (root == NULL) {
        fsdp_error("cluster profile (text): malformed JSON at line %d, column %d: %s", err.line,
                   err.column, err.text);
        return FSDP_ERR_FORMAT;
    }
    st = profile_from_json(root, "(text)", 0, profile_p);
    json_decref(root);
    return st;
}

fsdp_status_t fsdp_sim_profile_load(const char *path, fsdp_sim_profile_t *profile_p)
{
    json_error_t err;
    json_t *root;
    FILE *f;
    fsdp_status_t st;

    if (path == NULL || profile_p == NULL) {
        fsdp_error("fsdp_sim_profile_load: path and profile_p must not be NULL");
        return FSDP_ERR_INVALID_PARAM;
    }
    st = fsdp_fs_fopen_read(path, 1, &f);
    if (st == FSDP_ERR_NOT_FOUND)
        fsdp_error("cluster profile %s: cannot open it: %s", path, strerror(ENOENT));
    if (st != FSDP_OK)
        return st;
    root = json_loadf(f, JSON_REJECT_DUPLICATES, &err);
    fclose(f);
    if (root == NULL) {
        fsdp_error("cluster profile %s: malformed JSON at line %d, column %d: %s", path, err.line,
                   err.column, err.text);
        return FSDP_ERR_FORMAT;
    }
    st = profile_from_json(root, path, 0, profile_p);
    json_decref(root);
    return st;
}

fsdp_status_t fsdp_sim_profile_from_arg(const char *arg, fsdp_sim_profile_t *profile_p)
{
    const char *slash, *colon;
    char *name;
    size_t len;
    struct stat sb;
    fsdp_status_t st;
    int is_file;

    if (arg == NULL || profile_p == NULL) {
        fsdp_error("fsdp_sim_profile_from_arg: arg and profile_p must not be NULL");
        return FSDP_ERR_INVALID_PARAM;
    }
    slash = strrchr(arg, '/');
    colon = strchr(slash ? slash : arg, ':');
    len = colon ? (size_t)(colon - arg) : strlen(arg);
    name = strndup(arg, len);
    if (name == NULL)
        return FSDP_ERR_NO_MEMORY;
    is_file = (len > 5 && strcmp(name + len - 5, ".json") == 0) ||
              (stat(name, &sb) == 0 && S_ISREG(sb.st_mode));
    if (!is_file) {
        free(name);
        return fsdp_sim_profile_preset(arg, profile_p);
    }
    {
        fsdp_sim_profile_t p;
        st = fsdp_sim_profile_load(name, &p);
        if (st == FSDP_OK && colon != NULL)
            st = fsdp_sim_profile_apply_shape(arg, colon + 1, &p);
        if (st == FSDP_OK)
            *profile_p = p;
    }
    free(name);
    return st;
}

/* ---- to JSON ------------------------------------------------------------------------------ */

static json_t *numbers_json(const double *v, int n)
{
    json_t *a = json_array();

    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_real(v[i]));
    return a;
}

static json_t *classes_json(const double *v)
{
    return numbers_json(v, FSDP_SIM_NODE_CLASSES);
}

static json_t *rows_json(const double *rows, const char *(*name)(int), int n, size_t m,
                         size_t stride)
{
    json_t *o = json_object();

    for (int k = 0; k < n; k++) {
        json_t *a = json_array();
        for (size_t i = 0; i < m; i++)
            json_array_append_new(a, json_real(rows[(size_t)k * stride + i]));
        json_object_set_new(o, name(k), a);
    }
    return o;
}

static json_t *names_json(unsigned mask, const char *(*name)(int), int n)
{
    json_t *a = json_array();

    for (int k = 0; k < n; k++) {
        if (mask & (1u << k))
            json_array_append_new(a, json_string(name(k)));
    }
    return a;
}

static size_t field_size(const field_t *f)
{
    switch (f->type) {
    case F_INT:
    case F_BOOL:
        return sizeof(int);
    case F_SIZE:
        return sizeof(size_t);
    case F_DOUBLE:
        return sizeof(double);
    case F_STRING:
        return 64;
    case F_CLASSES:
        return FSDP_SIM_NODE_CLASSES * sizeof(double);
    case F_PROTO3:
        return FSDP_SIM_PROTO_COUNT * sizeof(double);
    case F_TABLE:
        return FSDP_SIM_ALGO_COUNT * FSDP_SIM_PROTO_COUNT * sizeof(double);
    case F_TREECORR:
        return FSDP_SIM_PROTO_COUNT * FSDP_SIM_TREE_SIZES * sizeof(double);
    case F_ATTNSEQ:
        return 2 * FSDP_SIM_ATTN_SEQ_POINTS * sizeof(double);
    case F_ALGOS:
    case F_PROTOS:
        return sizeof(unsigned);
    case F_OPS:
        return sizeof(fsdp_sim_ops_t);
    case F_FLOPS:
        return 0; /* compared member by member */
    }
    return 0;
}

static int profile_equal(const fsdp_sim_profile_t *a, const fsdp_sim_profile_t *b)
{
    for (size_t i = 0; i < N_FIELDS; i++) {
        const field_t *f = &fields[i];
        const char *x = (const char *)a + f->offset, *y = (const char *)b + f->offset;
        if (f->type == F_STRING ? strncmp(x, y, 64) != 0 : memcmp(x, y, field_size(f)) != 0)
            return 0;
    }
    return memcmp(a->gpu.matmul_flops_per_s, b->gpu.matmul_flops_per_s,
                  sizeof(a->gpu.matmul_flops_per_s)) == 0 &&
           a->gpu.tf32_flops_per_s == b->gpu.tf32_flops_per_s;
}

static json_t *field_json(const fsdp_sim_profile_t *p, const field_t *f)
{
    const char *addr = (const char *)p + f->offset;
    json_t *v = NULL;

    switch (f->type) {
    case F_INT:
        v = json_integer(*(const int *)addr);
        break;
    case F_SIZE:
        v = json_integer((json_int_t) * (const size_t *)addr);
        break;
    case F_DOUBLE:
        v = json_real(*(const double *)addr);
        break;
    case F_BOOL:
        v = json_boolean(*(const int *)addr);
        break;
    case F_STRING:
        v = json_string(addr);
        break;
    case F_CLASSES:
        v = classes_json((const double *)addr);
        break;
    case F_PROTO3:
        v = numbers_json((const double *)addr, FSDP_SIM_PROTO_COUNT);
        break;
    case F_TABLE:
        v = rows_json((const double *)addr, algo_name_i, FSDP_SIM_ALGO_COUNT, FSDP_SIM_PROTO_COUNT,
                      FSDP_SIM_PROTO_COUNT);
        break;
    case F_TREECORR:
        v = rows_json((const double *)addr, proto_name_i, FSDP_SIM_PROTO_COUNT, FSDP_SIM_TREE_SIZES,
                      FSDP_SIM_TREE_SIZES);
        break;
    case F_ATTNSEQ:
        v = rows_json((const double *)addr, head_dim_name_i, 2, FSDP_SIM_ATTN_SEQ_POINTS,
                      FSDP_SIM_ATTN_SEQ_POINTS);
        break;
    case F_FLOPS:
        v = json_object();
        json_object_set_new(v, "f32", json_real(p->gpu.matmul_flops_per_s[FSDP_DTYPE_F32]));
        json_object_set_new(v, "tf32", json_real(p->gpu.tf32_flops_per_s));
        json_object_set_new(v, "bf16", json_real(p->gpu.matmul_flops_per_s[FSDP_DTYPE_BF16]));
        json_object_set_new(v, "f16", json_real(p->gpu.matmul_flops_per_s[FSDP_DTYPE_F16]));
        break;
    case F_ALGOS:
        v = names_json(*(const unsigned *)addr, algo_name_i, FSDP_SIM_ALGO_COUNT);
        break;
    case F_PROTOS:
        v = names_json(*(const unsigned *)addr, proto_name_i, FSDP_SIM_PROTO_COUNT);
        break;
    case F_OPS:
        v = json_string(*(const fsdp_sim_ops_t *)addr == FSDP_SIM_OPS_EAGER ? "eager" : "fused");
        break;
    }
    return v;
}

static int all_zero(const char *addr, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (addr[i] != 0)
            return 0;
    return 1;
}

static char *profile_dump(const fsdp_sim_profile_t *p, int precision)
{
    json_t *root = json_object();
    char *text;

    for (size_t i = 0; i < N_FIELDS; i++) {
        const field_t *f = &fields[i];
        json_t *obj = root;
        if (f->required == OMIT_ZERO && all_zero((const char *)p + f->offset, field_size(f)))
            continue;
        if (*f->section != '\0') {
            obj = json_object_get(root, f->section);
            if (obj == NULL) {
                obj = json_object();
                json_object_set_new(root, f->section, obj);
            }
        }
        json_object_set_new(obj, f->key, field_json(p, f));
    }
    text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(precision));
    json_decref(root);
    return text;
}

char *fsdp_sim_profile_to_json(const fsdp_sim_profile_t *p)
{
    fsdp_sim_profile_t back;
    json_t *root;
    char *text = profile_dump(p, 15);
    int same = 0;

    /* 15 digits read well ("0.7", not "0.69999999999999996"); 17 when they do not read back
     * to the same doubles */
    if (text == NULL)
        return NULL;
    root = json_loads(text, 0, NULL);
    if (root != NULL) {
        same =
            profile_from_json(root, "(round trip)", 1, &back) == FSDP_OK && profile_equal(p, &back);
        json_decref(root);
    }
    if (same)
        return text;
    free(text);
    return profile_dump(p, 17);
}
