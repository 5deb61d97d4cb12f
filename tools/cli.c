/* Command-line options that fsdp-train and fsdp-plan share (cli.h). */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int cli_activation_checkpointing(const char *arg)
{
    const char *sel = "selective-layer";
    size_t n = strlen(sel);
    char *end;
    long k;

    if (strcmp(arg, "none") == 0)
        return 0;
    if (strcmp(arg, "full") == 0)
        return 1;
    if (strncmp(arg, sel, n) != 0)
        return -1;
    if (arg[n] == '\0')
        return 2;
    if (arg[n] != ':' || arg[n + 1] < '0' || arg[n + 1] > '9')
        return -1;
    k = strtol(arg + n + 1, &end, 10);
    return *end == '\0' && k >= 1 && k <= 1 << 20 ? (int)k : -1;
}
