/* Logging: level from FSDP_LOG_LEVEL, one formatted line per message, errno preserved. */
#include <fsdp/log.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define LOG_LEVEL_UNSET (-2)
#define LOG_LEVEL_BAD (-3) /* FSDP_LOG_LEVEL names no level */

static atomic_int log_level = LOG_LEVEL_UNSET;
static fsdp_log_func_t log_func;
static void *log_arg;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *const level_names[] = {"error", "warn", "info", "debug", "trace"};

/* The level s names, or LOG_LEVEL_BAD. */
static int parse_level(const char *s)
{
    if (s == NULL || *s == '\0')
        return FSDP_LOG_WARN;
    for (int i = 0; i < 5; i++) {
        if (strcasecmp(s, level_names[i]) == 0)
            return i;
    }
    if (strcasecmp(s, "off") == 0 || strcasecmp(s, "none") == 0)
        return FSDP_LOG_OFF;
    if (strcasecmp(s, "warning") == 0)
        return FSDP_LOG_WARN;
    if (s[0] >= '0' && s[0] <= '4' && s[1] == '\0')
        return s[0] - '0';
    return LOG_LEVEL_BAD;
}

fsdp_log_level_t fsdp_log_level(void)
{
    int lvl = atomic_load_explicit(&log_level, memory_order_relaxed);
    if (lvl == LOG_LEVEL_UNSET) {
        const char *s = getenv("FSDP_LOG_LEVEL");
        int parsed = parse_level(s), unset = LOG_LEVEL_UNSET;
        lvl = parsed != LOG_LEVEL_BAD ? parsed : FSDP_LOG_WARN;
        /* the thread that settles the level says, through the handler, that it was not valid */
        if (atomic_compare_exchange_strong(&log_level, &unset, lvl) && parsed == LOG_LEVEL_BAD)
            fsdp_log_emit(FSDP_LOG_WARN, __FILE__, __LINE__, __func__,
                          "FSDP_LOG_LEVEL='%s' is not one of off, error, warn, info, debug, trace "
                          "or 0..4; using warn",
                          s);
        lvl = atomic_load(&log_level);
    }
    return (fsdp_log_level_t)lvl;
}

void fsdp_log_set_level(fsdp_log_level_t level)
{
    atomic_store(&log_level, (int)level);
}

void fsdp_log_set_handler(fsdp_log_func_t func, void *arg)
{
    pthread_mutex_lock(&log_lock);
    log_func = func;
    log_arg = arg;
    pthread_mutex_unlock(&log_lock);
}

void fsdp_log_emit(fsdp_log_level_t level, const char *file, int line, const char *func,
                   const char *fmt, ...)
{
    int saved_errno = errno;
    char msg[1024];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);

    pthread_mutex_lock(&log_lock);
    if (log_func != NULL) {
        log_func(level, file, line, func, msg, log_arg);
    } else {
        const char *base = strrchr(file, '/');
        int lvl = (int)level < 0 || (int)level > 4 ? 0 : (int)level;
        if (fsdp_log_level() >= FSDP_LOG_DEBUG)
            fprintf(stderr, "fsdp: %s: %s:%d %s(): %s\n", level_names[lvl],
                    base ? base + 1 : file, line, func, msg);
        else
            fprintf(stderr, "fsdp: %s: %s\n", level_names[lvl], msg);
    }
    pthread_mutex_unlock(&log_lock);
    errno = saved_errno;
}
