/* The gpu backend as libfsdp sees it: the module libfsdp-gpu.so (every CUDA and NCCL call),
 * loaded on first use, behind the public entry points of fsdp/gpu.h.
 *
 * libfsdp itself links no CUDA or NCCL library, so that the simulator runs where they are
 * absent. The first call that needs the backend loads the module, once per process
 * (pthread_once), from the first of:
 *  - FSDP_GPU_MODULE, a path, when it is set (and then only there);
 *  - for a libfsdp that runs from its own build tree (the tests, the tools before make
 *    install): that tree's gpu/.libs, and only there;
 *  - else fsdp/libfsdp-gpu.so beside the libfsdp that is running (an installed tree, wherever
 *    it was moved or staged), then the install directory, $(libdir)/fsdp, as configured.
 * A file that is not there is skipped; the first that is there is the module, or the reason the
 * backend is unavailable: a library it needs is missing (dlerror names it), or it is not a
 * module of this libfsdp. Without a module, every slot of the ops table returns
 * FSDP_ERR_UNSUPPORTED, and init says why in one line. Compare UCX's ucs_module_load. */
#include "config.h"

#include "module.h"

#include <fsdp/log.h>
#include <fsdp/version.h>

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The stand-in where no module is loaded: no NULL slot, each answers FSDP_ERR_UNSUPPORTED. */

static fsdp_status_t none_segment_alloc(fsdp_dev_t *dev, fsdp_memkind_t kind, size_t bytes,
                                        void **ptr_p)
{
    return FSDP_ERR_UNSUPPORTED;
}

static void none_segment_free(fsdp_dev_t *dev, fsdp_memkind_t kind, void *ptr) {}

static fsdp_stream_t *none_compute_stream(fsdp_dev_t *dev)
{
    return NULL;
}

static fsdp_status_t none_stream_create(fsdp_dev_t *dev, const char *name, int priority,
                                        fsdp_stream_t **stream_p)
{
    return FSDP_ERR_UNSUPPORTED;
}

static void none_stream_destroy(fsdp_dev_t *dev, fsdp_stream_t *stream) {}

static fsdp_status_t none_stream_synchronize(fsdp_dev_t *dev, fsdp_stream_t *stream)
{
    return FSDP_ERR_UNSUPPORTED;
}

static fsdp_status_t none_event_create(fsdp_dev_t *dev, fsdp_event_t **event_p)
{
    return FSDP_ERR_UNSUPPORTED;
}

static void none_event_destroy(fsdp_dev_t *dev, fsdp_event_t *event) {}

static fsdp_status_t none_event_record(fsdp_dev_t *dev, fsdp_event_t *event, fsdp_stream_t *stream)
{
    return FSDP_ERR_UNSUPPORTED;
}

static fsdp_status_t none_stream_wait_event(fsdp_dev_t *dev, fsdp_stream_t *stream,
                                            fsdp_event_t *event)
{
    return FSDP_ERR_UNSUPPORTED;
}

static fsdp_status_t none_event_query(fsdp_dev_t *dev, fsdp_event_t *event, int *done_p)
{
    return FSDP_ERR_UNSUPPORTED;
}

static fsdp_status_t none_event_synchronize(fsdp_dev_t *dev, fsdp_event_t *event)
{
    return FSDP_ERR_UNSUPPORTED;
}

/* The host clock needs no device. */
static double none_host_time(fsdp_dev_t *dev)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static fsdp_status_t none_memcpy_async(fsdp_dev_t *dev, void *dst, const void *src, size_t bytes,
                                       fsdp_stream_t *stream)
{
    return FSDP_ERR_UNSUPPORTED;
}

static fsdp_group_t *none_group_world(fsdp_dev_t *dev)
{
    return NULL;
}

static fsdp_status_t none_group_split(fsdp_dev_t *dev, fsdp_group_t *parent, int color, int key,
                                      fsdp_group_t **group_p)
{
    return FSDP_ERR_UNSUPPORTED;
}

static void none_group_destroy(fsdp_dev_t *dev, fsdp_group_t *group) {}

static fsdp_status_t none_all_gather(fsdp_dev_t *dev, fsdp_group_t *group, const void *send,
                                     void *recv, size_t count, fsdp_dtype_t dtype,
                                     fsdp_stream_t *stream)
{
    return FSDP_ERR_UNSUPPORTED;
}

static fsdp_status_t none_reduce_scatter(fsdp_dev_t *dev, fsdp_group_t *group, const void *send,
                                         void *recv, size_t count, fsdp_dtype_t dtype,
                                         fsdp_reduce_op_t op, fsdp_stream_t *stream)
{
    return FSDP_ERR_UNSUPPORTED;
}

static fsdp_status_t none_all_reduce(fsdp_dev_t *dev, fsdp_group_t *group, const void *send,
                                     void *recv, size_t count, fsdp_dtype_t dtype,
                                     fsdp_reduce_op_t op, fsdp_stream_t *stream)
{
    return FSDP_ERR_UNSUPPORTED;
}

static fsdp_status_t none_broadcast(fsdp_dev_t *dev, fsdp_group_t *group, void *buf, size_t count,
                                    fsdp_dtype_t dtype, int root, fsdp_stream_t *stream)
{
    return FSDP_ERR_UNSUPPORTED;
}

static fsdp_status_t none_barrier(fsdp_dev_t *dev, fsdp_group_t *group)
{
    return FSDP_ERR_UNSUPPORTED;
}

static fsdp_status_t none_kernel(fsdp_dev_t *dev, fsdp_stream_t *stream, const fsdp_kernel_t *k)
{
    return FSDP_ERR_UNSUPPORTED;
}

static const fsdp_backend_ops_t none_ops = {
    .size = sizeof(fsdp_backend_ops_t),
    .name = "gpu (no module)",
    .segment_alloc = none_segment_alloc,
    .segment_free = none_segment_free,
    .compute_stream = none_compute_stream,
    .stream_create = none_stream_create,
    .stream_destroy = none_stream_destroy,
    .stream_synchronize = none_stream_synchronize,
    .event_create = none_event_create,
    .event_destroy = none_event_destroy,
    .event_record = none_event_record,
    .stream_wait_event = none_stream_wait_event,
    .event_query = none_event_query,
    .event_synchronize = none_event_synchronize,
    .host_time = none_host_time,
    .memcpy_async = none_memcpy_async,
    .group_world = none_group_world,
    .group_split = none_group_split,
    .group_destroy = none_group_destroy,
    .all_gather = none_all_gather,
    .reduce_scatter = none_reduce_scatter,
    .all_reduce = none_all_reduce,
    .broadcast = none_broadcast,
    .barrier = none_barrier,
    .kernel = none_kernel,
};

/* ---- loading ---- */

#define LOAD_ERROR_SIZE 2048

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
/* Written once under load_once; `loaded` last, so a thread that reads it non-NULL without going
 * through load_once (fsdp_dev_is_gpu) sees the rest. */
static const fsdp_gpu_module_t *_Atomic loaded;
static char module_path[PATH_MAX];
static char load_error[LOAD_ERROR_SIZE];

/* The directory of the libfsdp this code runs in, resolved; "" when unknown. */
static void self_dir(char dir[PATH_MAX])
{
    Dl_info info;
    char *slash;

    if (dladdr((void *)self_dir, &info) == 0 || info.dli_fname == NULL ||
        realpath(info.dli_fname, dir) == NULL) {
        dir[0] = '\0';
        return;
    }
    slash = strrchr(dir, '/');
    if (slash != NULL)
        *slash = '\0';
}

/* Appends ", path" (or "path" first) to the list of paths tried. */
static void tried_add(char *tried, size_t size, const char *path)
{
    size_t len = strlen(tried);

    snprintf(tried + len, size - len, "%s%s", len > 0 ? ", " : "", path);
}

/* Opens the module at path and checks its table. Sets load_error on failure. */
static const fsdp_gpu_module_t *open_module(const char *path)
{
    fsdp_gpu_module_func_t entry;
    const fsdp_gpu_module_t *m;
    const char *err;
    void *handle, *sym;

    handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        err = dlerror();
        if (err == NULL)
            err = "unknown error";
        if (strstr(err, "cannot open shared object file") != NULL)
            snprintf(load_error, sizeof(load_error),
                     "gpu backend module %s: a library it needs is missing: %s", path, err);
        else
            snprintf(load_error, sizeof(load_error), "gpu backend module %s cannot be loaded: %s",
                     path, err);
        return NULL;
    }
    sym = dlsym(handle, FSDP_GPU_MODULE_SYMBOL);
    if (sym == NULL) {
        snprintf(load_error, sizeof(load_error),
                 "gpu backend module %s cannot be loaded: it has no %s (not a libfsdp gpu "
                 "module of ABI %d)",
                 path, FSDP_GPU_MODULE_SYMBOL, FSDP_GPU_MODULE_ABI);
        goto err_close;
    }
    memcpy(&entry, &sym, sizeof(entry));
    m = entry();
    if (m == NULL || m->size != sizeof(*m) || m->abi != FSDP_GPU_MODULE_ABI) {
        snprintf(load_error, sizeof(load_error),
                 "gpu backend module %s cannot be loaded: its entry table (%zu bytes, ABI %u) "
                 "is not this libfsdp's (%zu bytes, ABI %d)",
                 path, m != NULL ? m->size : 0, m != NULL ? m->abi : 0, sizeof(*m),
                 FSDP_GPU_MODULE_ABI);
        goto err_close;
    }
    if (m->version == NULL || strcmp(m->version, FSDP_VERSION_STRING) != 0) {
        snprintf(load_error, sizeof(load_error),
                 "gpu backend module %s cannot be loaded: it was built for libfsdp %s, this is "
                 "libfsdp %s",
                 path, m->version != NULL ? m->version : "(unknown)", FSDP_VERSION_STRING);
        goto err_close;
    }
    if (fsdp_backend_check(m->ops) != FSDP_OK || m->device_count == NULL || m->unique_id == NULL ||
        m->init == NULL || m->finalize == NULL || m->set_log_rank == NULL || m->log_rank == NULL ||
        m->describe == NULL) {
        snprintf(load_error, sizeof(load_error),
                 "gpu backend module %s cannot be loaded: its entry table has an empty slot", path);
        goto err_close;
    }
    return m;

err_close:
    dlclose(handle);
    return NULL;
}

static void load(void)
{
    static const char installed[] = FSDP_GPU_MODULE_DIR "/" FSDP_GPU_MODULE_FILE;
    static const char uninstalled[] = FSDP_BUILDDIR "/gpu/.libs/" FSDP_GPU_MODULE_FILE;
    char self[PATH_MAX], build[PATH_MAX], beside[PATH_MAX + 64], tried[LOAD_ERROR_SIZE / 2];
    const char *env = getenv("FSDP_GPU_MODULE"), *candidates[3], *path = NULL;
    const fsdp_gpu_module_t *m = NULL;
    int n = 0;

    if (env != NULL && env[0] != '\0') {
        /* Named by the user: that file or none. */
        if (access(env, F_OK) == 0)
            path = env;
        else
            snprintf(load_error, sizeof(load_error),
                     "gpu backend module missing: no file at FSDP_GPU_MODULE=%s", env);
    } else {
        self_dir(self);
        if (self[0] != '\0' && realpath(FSDP_BUILDDIR "/.libs", build) != NULL &&
            strcmp(self, build) == 0) {
            /* The libfsdp of a build tree (in its .libs) takes that tree's module only: an
             * installed one of the same version may be older. */
            candidates[n++] = uninstalled;
        } else {
            if (self[0] != '\0') {
                snprintf(beside, sizeof(beside), "%s/fsdp/%s", self, FSDP_GPU_MODULE_FILE);
                candidates[n++] = beside;
            }
            if (n == 0 || strcmp(beside, installed) != 0)
                candidates[n++] = installed;
        }
        tried[0] = '\0';
        for (int i = 0; i < n && path == NULL; i++) {
            if (access(candidates[i], F_OK) == 0)
                path = candidates[i];
            else
                tried_add(tried, sizeof(tried), candidates[i]);
        }
        if (path == NULL)
            snprintf(load_error, sizeof(load_error),
                     "gpu backend module missing: no %s (tried %s)%s", FSDP_GPU_MODULE_FILE, tried,
                     FSDP_HAVE_GPU ? ""
                                   : "; this libfsdp was built without CUDA and NCCL "
                                     "(configure found none)");
    }
    if (path != NULL)
        m = open_module(path);
    if (m == NULL) {
        fsdp_debug("%s", load_error);
        return;
    }
    snprintf(module_path, sizeof(module_path), "%s", path);
    fsdp_debug("gpu backend module %s (libfsdp %s)", module_path, m->version);
    loaded = m;
}

/* The module, loading it on the first call; NULL when it cannot be. */
static const fsdp_gpu_module_t *module(void)
{
    pthread_once(&load_once, load);
    return loaded;
}

const char *fsdp_gpu_module_path(void)
{
    return module() != NULL ? module_path : NULL;
}

const char *fsdp_gpu_load_error(void)
{
    return module() != NULL ? "" : load_error;
}

/* ---- the public entry points ---- */

int fsdp_gpu_built(void)
{
    return module() != NULL;
}

int fsdp_gpu_device_count(void)
{
    const fsdp_gpu_module_t *m = module();

    return m != NULL ? m->device_count() : 0;
}

void fsdp_gpu_describe(char *buf, size_t size)
{
    const fsdp_gpu_module_t *m = module();
    int len;

    if (buf == NULL || size == 0)
        return;
    len = snprintf(buf, size, "gpu: ");
    if (len < 0 || (size_t)len >= size)
        return;
    if (m != NULL)
        m->describe(buf + len, size - (size_t)len);
    else
        snprintf(buf + len, size - (size_t)len, "%s", load_error);
}

const fsdp_backend_ops_t *fsdp_gpu_backend(void)
{
    const fsdp_gpu_module_t *m = module();

    return m != NULL ? m->ops : &none_ops;
}

int fsdp_dev_is_gpu(const fsdp_dev_t *dev)
{
    /* No dev of the module exists before it is loaded: asking loads nothing. */
    const fsdp_gpu_module_t *m = loaded;

    return dev != NULL && m != NULL && dev->ops == m->ops;
}

fsdp_status_t fsdp_gpu_unique_id(fsdp_gpu_unique_id_t *id_p)
{
    const fsdp_gpu_module_t *m = module();

    if (m == NULL) {
        fsdp_error("fsdp_gpu_unique_id: %s", load_error);
        return FSDP_ERR_UNSUPPORTED;
    }
    return m->unique_id(id_p);
}

fsdp_status_t fsdp_gpu_init(const fsdp_gpu_params_t *params, fsdp_dev_t **dev_p)
{
    const fsdp_gpu_module_t *m = module();
    fsdp_gpu_params_t defaults;

    if (m == NULL) {
        fsdp_error("fsdp_gpu_init: %s", load_error);
        return FSDP_ERR_UNSUPPORTED;
    }
    if (params == NULL) {
        fsdp_gpu_params_init(&defaults);
        params = &defaults;
    }
    return m->init(params, dev_p);
}

void fsdp_gpu_finalize(fsdp_dev_t *dev)
{
    const fsdp_gpu_module_t *m = loaded;

    if (dev != NULL && m != NULL)
        m->finalize(dev);
}
