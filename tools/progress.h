/* A progress bar on stderr for the tools' long runs, as tqdm draws one: the tool's own lines
 * (step lines, table rows) print cleanly above it, and the bar is redrawn on the last line of the
 * terminal, cleared first, with the count, the rate, the elapsed time and an estimate of the time
 * left. Between updates (a model's set-up, a long step) a thread redraws the elapsed time twice
 * a second, so that something shows before the first step. When stderr is not a terminal there
 * is no bar and progress_printf is printf. */
#ifndef FSDP_TOOLS_PROGRESS_H
#define FSDP_TOOLS_PROGRESS_H

#include <stdint.h>

/* Starts a bar over total items called unit ("step", "config"); total 0 draws the elapsed
 * time only. what says what happens before the first item ("setting up"). */
void progress_start(int64_t total, const char *unit, const char *what);
/* done items of total; note (the loss, say) shown after the count, or NULL. */
void progress_update(int64_t done, const char *note);
/* A line on stdout (fmt without its newline) above the bar. */
void progress_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Removes the bar and stops its thread; the lines printed after it are the tool's own. */
void progress_end(void);

/* Around any other write to the terminal (the tools' error and log lines): the bar is cleared
 * and drawn again after it. */
void progress_hide(void);
void progress_show(void);

#endif
