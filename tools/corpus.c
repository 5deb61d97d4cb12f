/* The default corpus: the libfsdp source tree, found from the build or the running program
 * (corpus.h). */
#include "corpus.h"

#include <fsdp/log.h>

#include <glob.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int is_source_tree(const char *dir)
{
    char path[PATH_MAX];
    struct stat st;
    int n = snprintf(path, sizeof(path), "%s/lib/nn/data.c", dir);
    return n > 0 && (size_t)n < sizeof(path) && stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Candidate trees: the build's source directory, then the directory of the program and up to
 * three levels above it (tools/, tools/.libs/, an installed bin/). */
static int find_tree(const char *argv0, char *out, size_t len, char *tried, size_t tried_len)
{
    char exe[PATH_MAX], dir[PATH_MAX];
    size_t off = 0;

    tried[0] = '\0';
#ifdef FSDP_SRCDIR
    if (is_source_tree(FSDP_SRCDIR)) {
        snprintf(out, len, "%s", FSDP_SRCDIR);
        return 1;
    }
    off += (size_t)snprintf(tried + off, tried_len - off, "%s", FSDP_SRCDIR);
#endif
    if (argv0 != NULL && strchr(argv0, '/') != NULL) {
        snprintf(exe, sizeof(exe), "%s", argv0);
    } else {
        ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
        if (n <= 0)
            return 0;
        exe[n] = '\0';
    }
    snprintf(dir, sizeof(dir), "%s", exe);
    for (int up = 0; up < 4; up++) {
        char *slash = strrchr(dir, '/');
        if (slash == NULL)
            break;
        if (slash == dir)
            slash[1] = '\0';
        else
            *slash = '\0';
        if (is_source_tree(dir)) {
            snprintf(out, len, "%s", dir);
            return 1;
        }
        if (off < tried_len)
            off += (size_t)snprintf(tried + off, tried_len - off, "%s%s", off ? ", " : "", dir);
        if (strcmp(dir, "/") == 0)
            break;
    }
    return 0;
}

fsdp_status_t corpus_open_default(const char *argv0, fsdp_tokens_t **tokens_p)
{
    static const char *const patterns[] = {"README.md", "DESIGN.md", "lib/*/*.c"};
    char tree[PATH_MAX], tried[2048], label[PATH_MAX + 32];
    const char **paths = NULL;
    size_t n = 0;
    glob_t g[sizeof(patterns) / sizeof(patterns[0])];
    int globbed[sizeof(patterns) / sizeof(patterns[0])] = {0};
    fsdp_status_t status = FSDP_OK;

    if (!find_tree(argv0, tree, sizeof(tree), tried, sizeof(tried))) {
        fsdp_error("no default corpus: the libfsdp source tree (README.md, DESIGN.md, lib/*/*.c) "
                   "is not at %s; pass a text file with --data",
                   tried[0] ? tried : "the build's source directory");
        return FSDP_ERR_IO;
    }
    for (size_t p = 0; p < sizeof(patterns) / sizeof(patterns[0]); p++) {
        char pat[PATH_MAX + 16];
        snprintf(pat, sizeof(pat), "%s/%s", tree, patterns[p]);
        /* sorted; a missing README.md is no error */
        globbed[p] = glob(pat, 0, NULL, &g[p]) == 0;
        if (globbed[p])
            n += g[p].gl_pathc;
    }
    if (n == 0) {
        fsdp_error("no default corpus: %s holds no sources", tree);
        status = FSDP_ERR_IO;
        goto out;
    }
    paths = malloc(n * sizeof(*paths));
    if (paths == NULL) {
        status = FSDP_ERR_NO_MEMORY;
        goto out;
    }
    n = 0;
    for (size_t p = 0; p < sizeof(patterns) / sizeof(patterns[0]); p++)
        for (size_t i = 0; globbed[p] && i < g[p].gl_pathc; i++)
            paths[n++] = g[p].gl_pathv[i];
    snprintf(label, sizeof(label), "the libfsdp sources in %s", tree);
    status = fsdp_tokens_open_texts(paths, n, label, SIZE_MAX, tokens_p); /* the sources */
out:
    free(paths);
    for (size_t p = 0; p < sizeof(patterns) / sizeof(patterns[0]); p++)
        if (globbed[p])
            globfree(&g[p]);
    return status;
}
