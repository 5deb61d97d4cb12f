/* libfsdp: status codes.
 *
 * Every code and its message come from one table, so they cannot drift apart.
 */
#ifndef FSDP_STATUS_H
#define FSDP_STATUS_H

#include <fsdp/api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, value, message) */
#define FSDP_FOREACH_STATUS(X)                                                                     \
    X(OK, 0, "success")                                                                            \
    X(ERR_INVALID_PARAM, -1, "invalid parameter")                                                  \
    X(ERR_NO_MEMORY, -2, "out of host memory")                                                     \
    X(ERR_OUT_OF_MEMORY, -3, "device out of memory")                                               \
    X(ERR_UNSUPPORTED, -4, "operation not supported by this backend")                              \
    X(ERR_COLLECTIVE_MISMATCH, -5, "collective calls differ across ranks")                        \
    X(ERR_TIMEOUT, -6, "timed out")                                                                \
    X(ERR_RANK_FAILED, -7, "a peer rank failed")                                                   \
    X(ERR_STATE, -8, "illegal training-state transition")                                          \
    X(ERR_IO, -9, "input/output error")                                                            \
    X(ERR_FORMAT, -10, "malformed file")                                                           \
    X(ERR_NOT_FOUND, -11, "not found")                                                             \
    X(ERR_BACKEND, -12, "backend error")                                                           \
    X(ERR_NO_DEVICE, -13, "no device available")                                                   \
    X(ERR_INTERNAL, -14, "internal error")

typedef enum {
#define FSDP_STATUS_ENUM_(name, value, msg) FSDP_##name = (value),
    FSDP_FOREACH_STATUS(FSDP_STATUS_ENUM_)
#undef FSDP_STATUS_ENUM_
} fsdp_status_t;

/* Never returns NULL; unknown codes give "unknown status". */
FSDP_API const char *fsdp_status_string(fsdp_status_t status);

/* The symbolic name, e.g. "FSDP_ERR_TIMEOUT". Never returns NULL. */
FSDP_API const char *fsdp_status_name(fsdp_status_t status);

#ifdef __cplusplus
}
#endif
#endif
