/* Rows decoded into the structs of trace.h: an event or a step row, selected with the columns
 * of trace_int.h. */
#include "trace/trace_int.h"

void fsdp_trace_row_event(sqlite3_stmt *st, int *rank_p, uint64_t *seq_p, fsdp_trace_event_t *ev)
{
    fsdp_event_kind_t kind = FSDP_EV_KIND_COUNT;
    fsdp_dtype_t dtype;
    const char *dt;

    *rank_p = sqlite3_column_int(st, 0);
    *seq_p = (uint64_t)sqlite3_column_int64(st, 1);
    if (fsdp_event_kind_parse(fsdp_trace_col_text(st, 2), &kind) != 0)
        kind = FSDP_EV_KIND_COUNT; /* written by a newer library */
    ev->kind = kind;
    ev->name = fsdp_trace_col_text(st, 3);
    if (ev->name == NULL)
        ev->name = "";
    ev->unit = fsdp_trace_col_text(st, 4);
    ev->stream = fsdp_trace_col_text(st, 5);
    ev->host_time = sqlite3_column_double(st, 6);
    ev->start = sqlite3_column_double(st, 7);
    ev->end = sqlite3_column_double(st, 8);
    ev->bytes = (uint64_t)sqlite3_column_int64(st, 9);
    ev->count = (uint64_t)sqlite3_column_int64(st, 10);
    dt = fsdp_trace_col_text(st, 11);
    ev->dtype = (dt != NULL && fsdp_dtype_parse(dt, &dtype)) ? (int)dtype : -1;
    ev->group = fsdp_trace_col_text(st, 12);
    ev->allocated = (uint64_t)sqlite3_column_int64(st, 13);
    ev->reserved = (uint64_t)sqlite3_column_int64(st, 14);
}

void fsdp_trace_row_step(sqlite3_stmt *st, fsdp_trace_step_row_t *row)
{
    int col = 7;

    row->rank = sqlite3_column_int(st, 0);
    row->step = sqlite3_column_int64(st, 1);
    row->loss = sqlite3_column_double(st, 2);
    row->step_time = sqlite3_column_double(st, 3);
    row->seq_end = (uint64_t)sqlite3_column_int64(st, 4);
    row->peak_allocated = (uint64_t)sqlite3_column_int64(st, 5);
    row->peak_reserved = (uint64_t)sqlite3_column_int64(st, 6);
    for (int c = 0; c < FSDP_MEM_CATEGORY_COUNT; c++)
        row->peak_by_category[c] = (uint64_t)sqlite3_column_int64(st, col++);
    for (int c = 0; c < FSDP_MEM_CATEGORY_COUNT; c++)
        row->at_peak_by_category[c] = (uint64_t)sqlite3_column_int64(st, col++);
}
