/* libfsdp: logging.
 *
 * The level comes from FSDP_LOG_LEVEL (off, error, warn, info, debug, trace, or 0..4), read once;
 * the default is "warn". Macros test the level before formatting anything and keep errno.
 */
#ifndef FSDP_LOG_H
#define FSDP_LOG_H

#include <fsdp/api.h>

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FSDP_LOG_OFF = -1, /* nothing at all */
    FSDP_LOG_ERROR = 0,
    FSDP_LOG_WARN = 1,
    FSDP_LOG_INFO = 2,
    FSDP_LOG_DEBUG = 3,
    FSDP_LOG_TRACE = 4
} fsdp_log_level_t;

/* Current level (from FSDP_LOG_LEVEL on first use, or fsdp_log_set_level). */
FSDP_API fsdp_log_level_t fsdp_log_level(void);
FSDP_API void fsdp_log_set_level(fsdp_log_level_t level);

/* Where messages go: stderr by default. The callback receives the formatted line without a
 * trailing newline. Passing NULL restores stderr. */
typedef void (*fsdp_log_func_t)(fsdp_log_level_t level, const char *file, int line,
                                const char *func, const char *msg, void *arg);
FSDP_API void fsdp_log_set_handler(fsdp_log_func_t func, void *arg);

FSDP_API void fsdp_log_emit(fsdp_log_level_t level, const char *file, int line, const char *func,
                            const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#define fsdp_log_(lvl, ...)                                                                        \
    do {                                                                                           \
        if ((lvl) <= fsdp_log_level())                                                             \
            fsdp_log_emit((lvl), __FILE__, __LINE__, __func__, __VA_ARGS__);                       \
    } while (0)

#define fsdp_error(...) fsdp_log_(FSDP_LOG_ERROR, __VA_ARGS__)
#define fsdp_warn(...) fsdp_log_(FSDP_LOG_WARN, __VA_ARGS__)
#define fsdp_info(...) fsdp_log_(FSDP_LOG_INFO, __VA_ARGS__)
#define fsdp_debug(...) fsdp_log_(FSDP_LOG_DEBUG, __VA_ARGS__)
#define fsdp_trace_log(...) fsdp_log_(FSDP_LOG_TRACE, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif
