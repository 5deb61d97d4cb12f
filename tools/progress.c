/* The tools' progress bar (progress.h). */
#include "progress.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_t ticker;
    int active, stop, shown;
    int64_t total, done, first; /* first: the count at the first update */
    char unit[16], what[64], note[64];
    double t_start, t_first; /* when the bar started; when the first item was done */
} bar = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fmt_time(double s, char *buf, size_t n)
{
    long t = s > 0 && s < 1e8 ? (long)(s + 0.5) : 0;
    if (t >= 3600)
        snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

static int term_width(void)
{
    struct winsize ws;
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20)
        return ws.ws_col;
    return 80;
}

/* Under the lock: the bar on the terminal's last line, cut to its width so that it never wraps
 * (a wrapped line would not be cleared by the next redraw). */
static void draw(void)
{
    char line[512], el[32], eta[32];
    double t = now(), elapsed = t - bar.t_start;
    int off = 0, width = term_width() - 1;

    fmt_time(elapsed, el, sizeof(el));
    if (bar.total > 0) {
        enum { CELLS = 16 };
        int filled = (int)(CELLS * (bar.done < bar.total ? bar.done : bar.total) / bar.total);
        line[off++] = '[';
        for (int i = 0; i < CELLS; i++)
            line[off++] = i < filled ? '#' : '.';
        off += snprintf(line + off, sizeof(line) - (size_t)off, "] %lld/%lld", (long long)bar.done,
                        (long long)bar.total);
    }
    if (bar.done == 0) {
        off += snprintf(line + off, sizeof(line) - (size_t)off, "%s%s | elapsed %s",
                        off ? " | " : "", bar.what, el);
    } else {
        /* the rate over the items after the first, which pays the set-up */
        double rate = bar.done > bar.first && t > bar.t_first
                          ? (double)(bar.done - bar.first) / (t - bar.t_first)
                          : (double)(bar.done - bar.first + 1) / elapsed;
        off += snprintf(line + off, sizeof(line) - (size_t)off, " | elapsed %s", el);
        if (bar.total > 0 && rate > 0) {
            fmt_time((double)(bar.total - bar.done) / rate, eta, sizeof(eta));
            off += snprintf(line + off, sizeof(line) - (size_t)off, " eta %s", eta);
        }
        if (rate >= 1.0)
            off +=
                snprintf(line + off, sizeof(line) - (size_t)off, " | %.1f %ss/s", rate, bar.unit);
        else if (rate > 0.0)
            off += snprintf(line + off, sizeof(line) - (size_t)off, " | %.1f s/%s", 1.0 / rate,
                            bar.unit);
        if (bar.note[0])
            snprintf(line + off, sizeof(line) - (size_t)off, " | %s", bar.note);
    }
    if (width < (int)sizeof(line))
        line[width] = '\0';
    fprintf(stderr, "\r\033[K%s", line);
    fflush(stderr);
    bar.shown = 1;
}

static void clear(void)
{
    if (bar.shown) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
        bar.shown = 0;
    }
}

static void *tick(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&bar.lock);
    while (!bar.stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 500000000L;
        if (ts.tv_nsec >= 1000000000L)
            ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&bar.wake, &bar.lock, &ts);
        if (!bar.stop)
            draw();
    }
    pthread_mutex_unlock(&bar.lock);
    return NULL;
}

void progress_start(int64_t total, const char *unit, const char *what)
{
    if (bar.active || !isatty(STDERR_FILENO))
        return;
    pthread_mutex_lock(&bar.lock);
    bar.total = total;
    bar.done = 0;
    bar.first = 0;
    bar.note[0] = '\0';
    snprintf(bar.unit, sizeof(bar.unit), "%s", unit);
    snprintf(bar.what, sizeof(bar.what), "%s", what);
    bar.t_start = now();
    bar.stop = 0;
    bar.active = 1;
    draw();
    pthread_mutex_unlock(&bar.lock);
    if (pthread_create(&bar.ticker, NULL, tick, NULL) != 0) {
        /* no thread: the bar still moves with each item */
        pthread_mutex_lock(&bar.lock);
        bar.stop = 1;
        pthread_mutex_unlock(&bar.lock);
    }
}

void progress_update(int64_t done, const char *note)
{
    if (!bar.active)
        return;
    pthread_mutex_lock(&bar.lock);
    if (bar.done == 0 && done > 0) {
        bar.t_first = now();
        bar.first = done;
    }
    bar.done = done;
    snprintf(bar.note, sizeof(bar.note), "%s", note ? note : "");
    draw();
    pthread_mutex_unlock(&bar.lock);
}

void progress_printf(const char *fmt, ...)
{
    va_list ap;

    if (bar.active) {
        pthread_mutex_lock(&bar.lock);
        clear();
    }
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
    if (bar.active) {
        draw();
        pthread_mutex_unlock(&bar.lock);
    }
}

void progress_end(void)
{
    int stopped;

    if (!bar.active)
        return;
    pthread_mutex_lock(&bar.lock);
    stopped = bar.stop;
    bar.stop = 1;
    pthread_cond_signal(&bar.wake);
    pthread_mutex_unlock(&bar.lock);
    if (!stopped)
        pthread_join(bar.ticker, NULL);
    clear();
    bar.active = 0;
}

void progress_hide(void)
{
    if (!bar.active)
        return;
    pthread_mutex_lock(&bar.lock);
    clear();
}

void progress_show(void)
{
    if (!bar.active)
        return;
    draw();
    pthread_mutex_unlock(&bar.lock);
}
