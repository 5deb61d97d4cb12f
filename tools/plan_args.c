/* fsdp-plan's command line (plan.h): the options, their checks and --help. */
#include "plan.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static void usage(FILE *f)
{
    fputs("usage: fsdp-plan --model SPEC [options]\n"
          "  --model SPEC               mlp:D0,D1,...,DL, a GPT preset (gpt2, gpt3-175b, ...), or\n"
          "                             another named model (--list-models)\n"
          "  --profile P                cluster: a preset (h100, a100) or a JSON file, optionally\n"
          "                             with :nodes=N,gpus_per_node=G (default h100)\n"
          "  --nodes N, --gpus-per-node G   the cluster's shape (override the profile's)\n"
          "  --world W                  ranks (default nodes x gpus per node; at most 2^20)\n"
          "  --capacity BYTES           device memory per GPU, with K/M/G/T; 0 is unlimited\n"
          "                             (default: the profile's GPU memory)\n"
          "  --batch B                  global batch of a step: rows (mlp) or sequences (gpt),\n"
          "                             divisible by the world times --grad-accum\n"
          "  --local-batch B            per-rank batch of each micro-batch (default: 8 rows for\n"
          "                             an mlp, 2048 for mlp-175b, one sequence for a GPT)\n"
          "  --grad-accum K             K micro-batches of --local-batch per optimizer step,\n"
          "                             the first K-1 under no_sync (fsdp2: gradient sync off),\n"
          "                             as fsdp-train --grad-accum K runs them; the step\n"
          "                             time, tokens and memory are the whole step's\n"
          "                             (default 1)\n"
          "  --seq T                    gpt, llama: tokens per sequence (default: the model's\n"
          "                             positions, at most 8192 for a Llama)\n"
          "  --strategy S               full_shard | shard_grad_op | no_shard | hybrid_shard |\n"
          "                             hybrid_shard_zero2 (default full_shard)\n"
          "  --api fsdp1|fsdp2          FullyShardedDataParallel (default) or fully_shard:\n"
          "                             each unit fully_shard'ed in model order, then the root\n"
          "  --reshard-after-forward true|false|N   fsdp2: free the unsharded parameters\n"
          "                             after forward (default: all units but the root)\n"
          "  --tp N                     fsdp2, gpt, llama: tensor parallelism over N consecutive\n"
          "                             ranks of a node (Megatron with sequence parallelism), FSDP\n"
          "                             over the world / N ranks of each tp index (default 1)\n"
          "  --tp-loss-parallel         with --tp: the logits stay sharded by the vocabulary and\n"
          "                             the loss is computed across the tp group (torch's\n"
          "                             loss_parallel); default: they are all-gathered\n"
          "  --backward-prefetch P      pre | post | none (default pre); fsdp2: explicit, each\n"
          "                             unit prefetching the previous one (default: implicit)\n"
          "  --output-dtype D           fsdp2: MixedPrecisionPolicy.output_dtype, each unit's\n"
          "                             floating outputs cast to D (f32, bf16, f16)\n"
          "  --forward-prefetch         prefetch the next unit's all-gather in forward\n"
          "  --limit-all-gathers, --no-limit-all-gathers   CPU rate limiter (default on)\n"
          "  --mixed-precision SPEC     D, PyTorch's MixedPrecision(param_dtype=D); or\n"
          "                             param=D,reduce=D,buffer=D, any subset (D: fp32, bf16,\n"
          "                             fp16): the all-gathers and compute in param's dtype\n"
          "  --cpu-offload              sharded parameters and gradients in pinned host memory\n"
          "  --checkpoint-activations   GPT and Llama models: recompute each block in backward\n"
          "  --activation-checkpointing none|full|selective-layer[:K]|selective-op\n"
          "                             full is the above; selective-layer checkpoints every K-th\n"
          "                             block (default 2); selective-op (llama) keeps the outputs\n"
          "                             of attention and every other matmul, recomputes the rest\n"
          "  --attention eager|fused    gpt: HF's eager attention (the default), which keeps\n"
          "                             the T x T probabilities, or one fused kernel\n"
          "                             (FlashAttention's contract; llama: always)\n"
          "  --ops eager|fused          how the job runs its element-wise work: eager PyTorch\n"
          "                             ops as HF's model runs them, or one fused kernel each\n"
          "                             (torch.compile, fused kernels); default: the profile's\n"
          "                             \"ops\" (eager in the presets). Eager also holds a\n"
          "                             Llama's memory as eager autograd does\n"
          "  --optim adamw|sgd          optimizer state to hold (default adamw)\n"
          "  --steps N                  simulated steps; the last is reported (default 2)\n"
          "  --sweep                    try every strategy, backward prefetch, limiter setting,\n"
          "                             activation checkpointing (GPT models) and precision\n"
          "                             (fp32, bf16) that the command line does not set, and\n"
          "                             name the fastest configuration that fits\n"
          "  --fit-status               exit status says whether the job fits: 0 it fits (a\n"
          "                             sweep: some configuration does), 3 it does not, 1 the\n"
          "                             simulation failed, 2 bad usage (without it: 0 either way)\n"
          "  --trace FILE               write each simulated run's events to FILE (SQLite)\n"
          "  --plot FILE.svg            draw the reported (last) step: memory by category over\n"
          "                             time and the stream timelines of one rank of each\n"
          "                             class (--no-symmetry: rank 0), from the trace (--trace's\n"
          "                             file, or a temporary one); not with --sweep\n"
          "  --no-symmetry              simulate every rank, not one rank per class of ranks\n"
          "                             that run alike (the figures are the same; a trace\n"
          "                             holds the simulated ranks, each with the ranks it\n"
          "                             stands for)\n"
          "  --print-profile            print the cluster profile as JSON and exit\n"
          "  --list-models              the named models\n"
          "  --timeout S                collective timeout in wall seconds (default 600)\n"
          "  --version, --help\n"
          "fsdp-train's options that plan has not: the training ones, as a plan has no values\n"
          "to train (--lr, --betas, --eps, --weight-decay, --momentum, --dampening, --nesterov,\n"
          "--no-decay-1d, --seed, --init, --data, --tokens, --save, --save-checkpoint,\n"
          "--checkpoint-every, --state-dict, --resume, --consolidate, --clip-grad-norm), --backend\n"
          "(a plan simulates), --ranks-per-node (--gpus-per-node), --threads, --host-memory and\n"
          "--no-pack-cache (a plan holds no data), --quiet.\n"
          "Environment:\n"
          "  FSDP_LOG_LEVEL             error | warn | info | debug | trace (default warn)\n",
          f);
}

enum {
    OPT_MODEL = 256,
    OPT_PROFILE,
    OPT_NODES,
    OPT_GPN,
    OPT_WORLD,
    OPT_CAPACITY,
    OPT_BATCH,
    OPT_LOCAL_BATCH,
    OPT_GRAD_ACCUM,
    OPT_SEQ,
    OPT_OPTIM,
    OPT_STEPS,
    OPT_SWEEP,
    OPT_PRINT_PROFILE,
    OPT_LIST,
    OPT_TIMEOUT,
    OPT_OPS,
    OPT_VERSION,
    OPT_HELP,
    OPT_MP,
    OPT_CKPT_ACT,
    OPT_AC,
    OPT_ATTENTION,
    OPT_CPU_OFFLOAD,
    OPT_TRACE,
    OPT_PLOT,
    OPT_FIT_STATUS,
    OPT_NO_SYMMETRY
};

void plan_parse_args(int argc, char **argv, plan_args_t *a)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, OPT_MODEL},
        {"profile", required_argument, NULL, OPT_PROFILE},
        {"nodes", required_argument, NULL, OPT_NODES},
        {"gpus-per-node", required_argument, NULL, OPT_GPN},
        {"world", required_argument, NULL, OPT_WORLD},
        {"capacity", required_argument, NULL, OPT_CAPACITY},
        {"batch", required_argument, NULL, OPT_BATCH},
        {"local-batch", required_argument, NULL, OPT_LOCAL_BATCH},
        {"grad-accum", required_argument, NULL, OPT_GRAD_ACCUM},
        {"seq", required_argument, NULL, OPT_SEQ},
        CLI_FSDP_LONG_OPTIONS,
        {"optim", required_argument, NULL, OPT_OPTIM},
        {"steps", required_argument, NULL, OPT_STEPS},
        {"sweep", no_argument, NULL, OPT_SWEEP},
        {"trace", required_argument, NULL, OPT_TRACE},
        {"plot", required_argument, NULL, OPT_PLOT},
        {"fit-status", no_argument, NULL, OPT_FIT_STATUS},
        {"no-symmetry", no_argument, NULL, OPT_NO_SYMMETRY},
        {"print-profile", no_argument, NULL, OPT_PRINT_PROFILE},
        {"list-models", no_argument, NULL, OPT_LIST},
        {"timeout", required_argument, NULL, OPT_TIMEOUT},
        {"ops", required_argument, NULL, OPT_OPS},
        {"mixed-precision", required_argument, NULL, OPT_MP},
        {"checkpoint-activations", no_argument, NULL, OPT_CKPT_ACT},
        {"activation-checkpointing", required_argument, NULL, OPT_AC},
        {"attention", required_argument, NULL, OPT_ATTENTION},
        {"cpu-offload", no_argument, NULL, OPT_CPU_OFFLOAD},
        {"version", no_argument, NULL, OPT_VERSION},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0},
    };
    const char *profile = FSDP_SIM_DEFAULT_PROFILE, *capacity = NULL;
    long nodes = 0, gpn = 0, batch = 0, local_batch = 0, seq = 0;
    int ops = -1, attention = -1;
    size_t positions, default_seq;
    int c, print_profile = 0, ckpt_act = 0, show = 0; /* 1: --version, 2: --help */

    memset(a, 0, sizeof(*a));
    fsdp_config_init(&a->fsdp);
    a->optim = FSDP_OPTIM_ADAMW;
    a->steps = 2;
    a->grad_accum = 1;
    a->timeout_s = 600.0;
    a->symmetry = 1;
    opterr = 0;
    /* ":" first: a missing value is reported as such, not as an unknown option */
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        switch (c) {
        case OPT_MODEL:
            a->model_spec = optarg;
            break;
        case OPT_PROFILE:
            profile = optarg;
            break;
        case OPT_OPS:
            ops = cli_ops(optarg);
            break;
        case OPT_NODES:
            nodes = cli_parse_long("--nodes", optarg, 1, 1000000);
            break;
        case OPT_GPN:
            gpn = cli_parse_long("--gpus-per-node", optarg, 1, 1024);
            break;
        case OPT_WORLD:
            a->world = (int)cli_parse_long("--world", optarg, 1, FSDP_MAX_WORLD);
            break;
        case OPT_CAPACITY:
            capacity = optarg;
            break;
        case OPT_BATCH:
            batch = cli_parse_long("--batch", optarg, 1, 1L << 30);
            break;
        case OPT_LOCAL_BATCH:
            local_batch = cli_parse_long("--local-batch", optarg, 1, 1L << 30);
            break;
        case OPT_GRAD_ACCUM:
            a->grad_accum = (int)cli_parse_long("--grad-accum", optarg, 1, 1L << 20);
            break;
        case OPT_SEQ:
            seq = cli_parse_long("--seq", optarg, 1, 1L << 24);
            break;
        case OPT_OPTIM:
            if (strcmp(optarg, "adamw") == 0)
                a->optim = FSDP_OPTIM_ADAMW;
            else if (strcmp(optarg, "sgd") == 0)
                a->optim = FSDP_OPTIM_SGD;
            else
                cli_die("--optim: '%s' is not one of adamw, sgd", optarg);
            break;
        case OPT_STEPS:
            a->steps = (int)cli_parse_long("--steps", optarg, 1, 1000);
            break;
        case OPT_TRACE:
            a->trace_path = optarg;
            break;
        case OPT_PLOT:
            a->plot_path = optarg;
            break;
        case OPT_NO_SYMMETRY:
            a->symmetry = 0;
            break;
        case OPT_SWEEP:
            a->sweep = 1;
            break;
        case OPT_FIT_STATUS:
            a->fit_status = 1;
            break;
        case OPT_MP:
            cli_parse_mixed_precision(optarg, &a->fsdp.mixed_precision);
            a->fixed |= FIX_PRECISION;
            break;
        case OPT_CKPT_ACT:
            ckpt_act = 1;
            a->fixed |= FIX_CKPT_ACT;
            break;
        case OPT_AC:
            ckpt_act = cli_activation_checkpointing(optarg);
            a->fixed |= FIX_CKPT_ACT;
            break;
        case OPT_ATTENTION:
            attention = cli_attention(optarg);
            break;
        case OPT_CPU_OFFLOAD:
            a->fsdp.cpu_offload = 1;
            break;
        case OPT_PRINT_PROFILE:
            print_profile = 1;
            break;
        case OPT_LIST: {
            int n = 0;
            size_t n_models;
            const model_entry_t *models = plan_models(&n_models);
            const fsdp_gpt2_preset_t *gp = fsdp_gpt2_presets(&n);
            for (size_t i = 0; i < n_models; i++)
                printf("%-14s %s\n", models[i].name, models[i].what);
            for (int i = 0; i < n; i++)
                printf("  %-12s %.4g parameters: %s\n", gp[i].name,
                       (double)fsdp_gpt2_num_params(&gp[i].cfg), gp[i].description);
            {
                const fsdp_llama_preset_t *lp = fsdp_llama_presets(&n);
                for (int i = 0; i < n; i++)
                    printf("  %-13s %llu parameters: %s\n", lp[i].name,
                           (unsigned long long)fsdp_llama_num_params(&lp[i].cfg),
                           lp[i].description);
            }
            exit(0);
        }
        case OPT_TIMEOUT: {
            char *end;
            a->timeout_s = strtod(optarg, &end);
            if (end == optarg || *end != '\0' || !(a->timeout_s > 0) || a->timeout_s > 1e6)
                cli_die("--timeout: '%s' is not a number of seconds in (0, 1e6]", optarg);
            break;
        }
        case OPT_VERSION:
            show = 1;
            break;
        case OPT_HELP:
            show = 2;
            break;
        default:
            a->fixed |= c == CLI_OPT_STRATEGY                         ? FIX_STRATEGY
                        : c == CLI_OPT_BWD_PREFETCH                   ? FIX_PREFETCH
                        : c == CLI_OPT_LIMIT || c == CLI_OPT_NO_LIMIT ? FIX_LIMITER
                        : c == CLI_OPT_RAF                            ? FIX_LIMITER
                        : c == CLI_OPT_TP                             ? FIX_TP
                                                                      : 0u;
            cli_other_option(c, argv, &a->fsdp);
            break;
        }
    }
    cli_no_arguments(argc, argv, &a->fsdp);
    cli_command_line(argc, argv, a->command_line, sizeof(a->command_line));
    if (show == 1)
        printf("fsdp-plan (libfsdp) %s\n", fsdp_version_string());
    if (show == 2)
        usage(stdout);
    if (show != 0)
        exit(0);
    {
        char why[512];
        if (cli_check_output("--trace", a->trace_path, 0, why, sizeof(why)) != 0 ||
            cli_check_output("--plot", a->plot_path, 0, why, sizeof(why)) != 0)
            cli_die("%s", why);
    }
    if (a->plot_path != NULL && a->sweep)
        cli_die("--plot draws one plan, not a sweep: plot the configuration the sweep names");
    if (a->plot_path != NULL && a->trace_path != NULL && strcmp(a->plot_path, a->trace_path) == 0)
        cli_die("--plot and --trace name the same file '%s'", a->plot_path);

    if (fsdp_sim_profile_from_arg(profile, &a->profile) != FSDP_OK)
        cli_fail_quietly(); /* the library said why */
    if (nodes > 0)
        a->profile.nodes = (int)nodes;
    if (gpn > 0)
        a->profile.gpus_per_node = (int)gpn;
    if (ops >= 0)
        a->profile.ops = (fsdp_sim_ops_t)ops;
    if (print_profile) {
        char *json = fsdp_sim_profile_to_json(&a->profile);
        if (json == NULL)
            cli_die("out of host memory");
        printf("%s\n", json);
        free(json);
        exit(0);
    }
    if (a->model_spec == NULL)
        cli_die("--model is required (see --help and --list-models)");
    a->model = plan_model_find(a->model_spec);
    if (a->model == NULL)
        cli_die("--model: '%s' is not a model; expected mlp:D0,D1,...,DL with 2 to %d positive "
                "widths, or one of --list-models",
                a->model_spec, MAX_DIMS);
    if (a->model->ops->parse(a->model_spec, &a->mcfg) != 0) {
        if (a->model->family == MODEL_GPT || a->model->family == MODEL_LLAMA)
            cli_fail_quietly(); /* the library said what is allowed */
        cli_die("--model: '%s' is not a model; expected mlp:D0,D1,...,DL with 2 to %d positive "
                "widths, or one of --list-models",
                a->model_spec, MAX_DIMS);
    }
    cli_apply_attention(attention, a->model->family == MODEL_GPT ? &a->mcfg.gpt : NULL,
                        a->model->family == MODEL_LLAMA);
    if (ckpt_act && a->model->family != MODEL_GPT && a->model->family != MODEL_LLAMA)
        cli_die("activation checkpointing needs a GPT or Llama model");
    if (ckpt_act == CLI_AC_SELECTIVE_OP && a->model->family != MODEL_LLAMA)
        cli_die("--activation-checkpointing selective-op needs a Llama model (GPT-2 has full and "
                "selective-layer)");
    a->mcfg.checkpoint_activations = ckpt_act;
    a->mcfg.eager_memory = a->profile.ops == FSDP_SIM_OPS_EAGER;
    positions = plan_model_positions(a->model, &a->mcfg, &default_seq);
    if (seq > 0 && positions == 1)
        cli_die("--seq needs a GPT or Llama model (an mlp's batch is rows)");
    if ((size_t)seq > positions)
        cli_die("--seq %ld is longer than the model's %zu positions (seq= in the model spec sets "
                "them)",
                seq, positions);
    a->mcfg.seq = seq > 0 ? (size_t)seq : default_seq;
    a->per_node = a->profile.gpus_per_node;
    if (a->world == 0) {
        if ((double)a->profile.nodes * a->per_node > FSDP_MAX_WORLD)
            cli_die("%d nodes x %d GPUs is more than %d ranks", a->profile.nodes, a->per_node,
                    FSDP_MAX_WORLD);
        a->world = a->profile.nodes * a->per_node;
    }
    if (a->world < a->per_node)
        a->per_node = a->world; /* part of one node */
    else if (a->world % a->per_node != 0)
        cli_die("--world %d is not a whole number of nodes of %d GPUs (set --gpus-per-node)",
                a->world, a->per_node);
    a->capacity = capacity ? cli_parse_bytes("--capacity", capacity) : a->profile.gpu.memory_bytes;
    a->dp = a->world;
    if (a->fsdp.tp_size > 1) {
        const int tp = a->fsdp.tp_size;
        if (a->model->family == MODEL_MLP)
            cli_die("--tp %d: tensor parallelism is planned for gpt and llama models only (an "
                    "mlp has no tensor-parallel layout here)",
                    tp);
        if (a->per_node % tp != 0 || a->world % tp != 0)
            cli_die("--tp %d must divide the %d GPUs per node (tp groups stay inside a node) and "
                    "--world %d",
                    tp, a->per_node, a->world);
        a->dp = a->world / tp;
    }
    if (batch > 0 && batch % a->dp != 0) {
        char ranks[64]; /* what the batch is split over */
        if (a->dp < a->world)
            snprintf(ranks, sizeof(ranks), "the %d dp ranks (--world %d / --tp %d)", a->dp,
                     a->world, a->world / a->dp);
        else
            snprintf(ranks, sizeof(ranks), "--world %d", a->world);
        cli_die("--batch %ld is not divisible by %s: every rank needs the same number of "
                "%s (--local-batch B gives each rank B)",
                batch, ranks, plan_seq_len(a) > 1 ? "sequences" : "rows");
    }
    /* --batch is a step's: --grad-accum micro-batches of --local-batch on each rank */
    if (batch > 0 && batch / a->dp % a->grad_accum != 0)
        cli_die("--grad-accum %d does not divide the %ld %s of each rank (--batch %ld / %d ranks)",
                a->grad_accum, batch / a->dp, plan_seq_len(a) > 1 ? "sequences" : "rows", batch,
                a->dp);
    if (batch > 0 && local_batch > 0 &&
        (double)batch != (double)local_batch * a->dp * a->grad_accum) {
        if (a->grad_accum > 1)
            cli_die("--batch %ld and --local-batch %ld disagree on %d ranks with --grad-accum %d "
                    "(--local-batch is a micro-batch's): give one",
                    batch, local_batch, a->dp, a->grad_accum);
        cli_die("--batch %ld and --local-batch %ld disagree on %d ranks: give one", batch,
                local_batch, a->dp);
    }
    if (local_batch == 0)
        local_batch = batch > 0 ? batch / a->dp / a->grad_accum : (long)a->model->default_rows;
    if (local_batch == 0) /* one sequence */
        local_batch = 1;
    if ((double)local_batch * a->dp * a->grad_accum * (double)plan_seq_len(a) > 0x1p62)
        cli_die("--local-batch %ld x %d ranks x --grad-accum %d: more than 2^62 %s a step",
                local_batch, a->dp, a->grad_accum, plan_seq_len(a) > 1 ? "tokens" : "rows");
    a->local_batch = (size_t)local_batch;
    /* tokens per rank: the tp ranks of a dp rank share its sequences */
    a->rows = a->local_batch * plan_seq_len(a) / (size_t)(a->world / a->dp);
}
