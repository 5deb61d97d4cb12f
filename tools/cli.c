/* Command-line options that fsdp-train and fsdp-plan share (cli.h). */
#include "cli.h"

#include <stdio.h>

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
