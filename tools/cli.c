/* Command-line options that fsdp-train and fsdp-plan share (cli.h). */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int cli_fsdp_option(int opt, const char *arg, const char *spelled, fsdp_config_t *cfg, char *why,
                    size_t why_len)
{
    switch (opt) {
    case CLI_OPT_STRATEGY:
        if (!fsdp_strategy_parse(arg, &cfg->strategy)) {
            snprintf(why, why_len,
                     "--strategy: '%s' is not one of full_shard, shard_grad_op, no_shard, "
                     "hybrid_shard, hybrid_shard_zero2",
                     arg);
            return -1;
        }
        return 0;
    case CLI_OPT_BWD_PREFETCH:
        if (!fsdp_backward_prefetch_parse(arg, &cfg->backward_prefetch)) {
            snprintf(why, why_len, "--backward-prefetch: '%s' is not one of pre, post, none", arg);
            return -1;
        }
        return 0;
    case CLI_OPT_FWD_PREFETCH:
        cfg->forward_prefetch = 1;
        return 0;
    case CLI_OPT_LIMIT:
        cfg->limit_all_gathers = 1;
        return 0;
    case CLI_OPT_NO_LIMIT:
        cfg->limit_all_gathers = 0;
        return 0;
    default:
        snprintf(why, why_len, "unknown option '%s' (see --help)", spelled);
        return -1;
    }
}

int cli_check_output(const char *opt, const char *path, int dir, char *why, size_t why_len)
{
    char parent[4096];
    const char *slash;
    struct stat st;

    if (path == NULL)
        return 0;
    if (path[0] == '\0') {
        snprintf(why, why_len, "%s: the path is empty", opt);
        return -1;
    }
    if (stat(path, &st) == 0) {
        if (dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)) {
            snprintf(why, why_len, "%s: '%s' exists and is not a %s", opt, path,
                     dir ? "directory" : "regular file");
            return -1;
        }
        if (dir && access(path, W_OK | X_OK) != 0) {
            snprintf(why, why_len, "%s: cannot write into '%s': %s", opt, path, strerror(errno));
            return -1;
        }
        if (dir)
            return 0;
    }
    /* the file (or the directory) is created or replaced in its parent */
    slash = strrchr(path, '/');
    if (slash == NULL)
        snprintf(parent, sizeof(parent), ".");
    else
        snprintf(parent, sizeof(parent), "%.*s", slash == path ? 1 : (int)(slash - path), path);
    if (access(parent, W_OK | X_OK) != 0) {
        snprintf(why, why_len, "%s: cannot write into '%s': %s", opt, parent, strerror(errno));
        return -1;
    }
    return 0;
}
