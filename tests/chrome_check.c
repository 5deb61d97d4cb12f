/* chrome_check FILE.json: checks a Chrome trace export as Perfetto reads it (docs/formats.md
 * section 4): on every track (pid, tid) the complete (X) events nest, with times compared in
 * whole nanoseconds; the host's waits (cat "sync") are on the "host" track; every flow start (s)
 * has its end (f) and the reverse. Prints what it counted; exits 1 naming the first violation. */
#include <jansson.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct slice {
    long long pid, tid, ts, end; /* ns */
    const char *name;
} slice_t;

static long long ns(json_t *v)
{
    return llround(json_number_value(v) * 1000.0);
}

static int by_track_then_start(const void *pa, const void *pb)
{
    const slice_t *a = pa, *b = pb;
    if (a->pid != b->pid)
        return a->pid < b->pid ? -1 : 1;
    if (a->tid != b->tid)
        return a->tid < b->tid ? -1 : 1;
    if (a->ts != b->ts)
        return a->ts < b->ts ? -1 : 1;
    return a->end > b->end ? -1 : a->end < b->end; /* the longer one encloses */
}

int main(int argc, char **argv)
{
    json_error_t jerr;
    json_t *root, *events, *ev;
    slice_t *slices;
    size_t n = 0, i, ntracks = 0, nflows = 0;
    long long *flow_s, *flow_f; /* counts by id, ids below the number of events */
    size_t nev;
    int fail = 0;

    if (argc != 2) {
        fprintf(stderr, "usage: chrome_check FILE.json\n");
        return 2;
    }
    root = json_load_file(argv[1], 0, &jerr);
    if (root == NULL) {
        fprintf(stderr, "chrome_check: %s: %s (line %d)\n", argv[1], jerr.text, jerr.line);
        return 1;
    }
    events = json_object_get(root, "traceEvents");
    nev = json_array_size(events);
    slices = calloc(nev + 1, sizeof(*slices));
    flow_s = calloc(nev + 1, sizeof(*flow_s));
    flow_f = calloc(nev + 1, sizeof(*flow_f));
    if (slices == NULL || flow_s == NULL || flow_f == NULL)
        return 2;
    /* the host tracks, by tid: thread_name metadata comes before a track's events */
    long long *host_tids = calloc(nev + 1, sizeof(*host_tids));
    size_t nhost = 0;
    json_array_foreach (events, i, ev) {
        const char *ph = json_string_value(json_object_get(ev, "ph"));
        const char *cat = json_string_value(json_object_get(ev, "cat"));
        long long tid = json_integer_value(json_object_get(ev, "tid"));
        if (ph == NULL)
            continue;
        if (strcmp(ph, "M") == 0 &&
            strcmp(json_string_value(json_object_get(ev, "name")), "thread_name") == 0 &&
            strcmp(json_string_value(json_object_get(json_object_get(ev, "args"), "name")),
                   "host") == 0)
            host_tids[nhost++] = tid;
        if (strcmp(ph, "X") == 0) {
            slice_t *s = &slices[n++];
            s->pid = json_integer_value(json_object_get(ev, "pid"));
            s->tid = tid;
            s->ts = ns(json_object_get(ev, "ts"));
            s->end = s->ts + ns(json_object_get(ev, "dur"));
            s->name = json_string_value(json_object_get(ev, "name"));
        }
        if (cat != NULL && strcmp(cat, "sync") == 0) {
            size_t k = 0;
            while (k < nhost && host_tids[k] != tid)
                k++;
            if (k == nhost && !fail) {
                fprintf(stderr, "chrome_check: the host wait %s is on track %lld, not a host one\n",
                        json_string_value(json_object_get(ev, "name")), tid);
                fail = 1;
            }
        }
        if (strcmp(ph, "s") == 0 || strcmp(ph, "f") == 0) {
            json_int_t id = json_integer_value(json_object_get(ev, "id"));
            if (id < 1 || (size_t)id > nev) {
                fprintf(stderr, "chrome_check: flow id %lld out of range\n", (long long)id);
                return 1;
            }
            (ph[0] == 's' ? flow_s : flow_f)[id]++;
        }
    }
    for (i = 1; i <= nev; i++) {
        if (flow_s[i] != flow_f[i]) {
            fprintf(stderr, "chrome_check: flow %zu has %lld starts and %lld ends\n", i, flow_s[i],
                    flow_f[i]);
            return 1;
        }
        nflows += flow_s[i] > 0;
    }
    /* per track, in start order: each slice ends before its enclosing one does, or starts after
     * it ended */
    qsort(slices, n, sizeof(*slices), by_track_then_start);
    slice_t **stack = calloc(n + 1, sizeof(*stack));
    size_t depth = 0;
    for (i = 0; i < n && !fail; i++) {
        slice_t *s = &slices[i];
        if (i == 0 || s->pid != slices[i - 1].pid || s->tid != slices[i - 1].tid) {
            depth = 0;
            ntracks++;
        }
        while (depth > 0 && stack[depth - 1]->end <= s->ts)
            depth--;
        if (depth > 0 && s->end > stack[depth - 1]->end) {
            fprintf(stderr,
                    "chrome_check: on pid %lld tid %lld, %s [%lld, %lld] ns overlaps %s "
                    "[%lld, %lld] ns without nesting\n",
                    s->pid, s->tid, s->name, s->ts, s->end, stack[depth - 1]->name,
                    stack[depth - 1]->ts, stack[depth - 1]->end);
            fail = 1;
        }
        stack[depth++] = s;
    }
    printf("%zu slices on %zu tracks%s; %zu flows\n", n, ntracks, fail ? "" : " nest", nflows);
    free(stack);
    free(host_tids);
    free(slices);
    free(flow_s);
    free(flow_f);
    json_decref(root);
    return fail;
}
