/* fsdp-train: trains a built-in model with FSDP on simulated ranks, or on GPUs (--backend gpu:
 * one process per rank, as a launcher starts them; train_launch.c).
 *
 *   fsdp-train --model mlp:16,32,4 --world 4 --strategy full_shard --optim adamw --lr 1e-2
 *              --steps 10
 *
 * Prints "step N loss X" per step (X as %.9g, the mean over the global batch; rank 0 only) and
 * each rank's peak allocated bytes (on the gpu backend, each process its own rank's). */
#include <fsdp/fsdp.h>

#include "cli.h"
#include "progress.h"
#include "train_trace.h"

#include "train_gpt2.h"
#include "train_launch.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct train_args {
    int dims[FSDP_MLP_MAX_LAYERS + 1];
    int nlayers;
    int world;
    fsdp_config_t fsdp;
    fsdp_optim_config_t optim;
    int steps;
    int batch;
    uint64_t seed;
    double timeout_s;
    int threads; /* --threads: 0 = the online CPUs */
    const char *init_path;
    const char *save_path;
    const char *data_path;
    int quiet;
    int grad_accum;          /* micro-batches per step */
    double clip_grad_norm;   /* 0 = off */
    const char *ckpt_dir;    /* --save-checkpoint */
    int ckpt_every;          /* steps between checkpoints; 0 = at the end only */
    fsdp_state_dict_type_t state_dict;
    const char *resume_dir;
    const char *consolidate_dir; /* --consolidate: write its model as --save, train nothing */
    const char *trace_path;
    const char *profile_arg;       /* --profile, or NULL for the default */
    int ops;                       /* --ops: fsdp_sim_ops_t, or -1 for the profile's */
    fsdp_sim_profile_t profile;
    /* --model gpt2... or llama...: the language-model path (train_gpt2.c) */
    int gpt; /* either */
    int llama;
    const char *model_name;
    fsdp_gpt2_config_t gpt_cfg;
    fsdp_llama_config_t llama_cfg;
    const char *tokens_path;
    int seq; /* 0: the model's positions */
    int checkpoint_activations; /* 1: every layer, K: every K-th, or CLI_AC_SELECTIVE_OP */
    train_launch_t launch; /* --backend: how the ranks run */
} train_args_t;

typedef struct train_shared {
    const train_args_t *args;
    float *x, *y;          /* the global batch */
    float **init_weights;  /* per layer [out*in], or NULL */
    float **init_biases;   /* per layer [out], or NULL */
    size_t *peak;          /* per rank */
    float *losses;         /* per step (rank 0 writes) */
    int64_t steps_run;     /* rank 0's: steps trained in this process */
    double step_time_sum;  /* rank 0's step times, seconds */
    fsdp_trace_t *trace;   /* --trace, or NULL */
    int64_t resumed_step;  /* rank 0's: the step --resume loaded */
} train_shared_t;

/* The library already said what was wrong. */
static void fail_quietly(void) __attribute__((noreturn));

static void fail_quietly(void)
{
    exit(2);
}

static void usage(FILE *f)
{
    fputs(
        "usage: fsdp-train [options]\n"
        "  --model mlp:D0,D1,...,DL   Linear/ReLU stack (default mlp:16,32,4)\n"
        "  --model M                  GPT-2: gpt2-tiny | gpt2 | gpt2-medium | gpt2-large |\n"
        "                             gpt2-xl | gpt3-small ... gpt3-175b |\n"
        "                             gpt2:layers=L,heads=H,dim=D,seq=T,vocab=V\n"
        "  --model M                  Llama: llama-tiny | llama2-7b | llama2-13b | llama2-70b |\n"
        "                             llama3-8b | llama3-70b | llama3.1-405b | llama3.2-1b |\n"
        "                             llama3.2-3b | llama:layers=L,heads=H,kv_heads=K,dim=D,\n"
        "                             ffn=F,seq=T,vocab=V,rope_theta=X,eps=E[,tie=1]\n"
        "                             [,rope_scaling=llama3][,head_dim=hd]\n"
        "  --backend sim|gpu          simulated ranks in this process (default), or this\n"
        "                             process one GPU rank of a job (torchrun, srun, mpirun)\n"
        "  --world W                  simulated ranks (default 4; gpu: the launcher's)\n"
        "  --strategy S               full_shard | shard_grad_op | no_shard | hybrid_shard |\n"
        "                             hybrid_shard_zero2 (default full_shard)\n"
        "  --ranks-per-node R         hybrid sharding: shard within R ranks, replicate across\n"
        "  --cpu-offload              sharded parameters and gradients in pinned host memory\n"
        "  --mixed-precision SPEC     D, PyTorch's MixedPrecision(param_dtype=D); or\n"
        "                             param=D,reduce=D,buffer=D, any subset; D is fp32, bf16\n"
        "                             or fp16 (default: full precision); add\n"
        "                             keep_low_precision_grads to keep the gradients in\n"
        "                             param's dtype\n"
        "  --grad-accum K             K micro-batches per step (no_sync for the first K-1)\n"
        "  --clip-grad-norm X         clip the total gradient norm (L2) to X\n"
        "  --save-checkpoint DIR      write checkpoints to DIR (at the end, or see below)\n"
        "  --checkpoint-every N       also every N steps\n"
        "  --state-dict full|sharded|local  checkpoint format (default full)\n"
        "  --resume DIR               continue from the newest checkpoint in DIR\n"
        "  --consolidate DIR --save FILE  write the model of DIR's newest checkpoint (full or\n"
        "                             sharded) as one safetensors file, the model.safetensors\n"
        "                             of a full checkpoint (HF names for gpt and llama), and\n"
        "                             train nothing\n"
        "  --trace FILE               write the event trace to FILE (SQLite; fsdp-trace reads it)\n"
        "  --profile P                cluster profile the simulated times come from: a preset\n"
        "                             (h100, a100, h100:nodes=N,gpus_per_node=G) or a JSON file\n"
        "  --ops eager|fused          sim: price element-wise work as eager PyTorch's ops (the\n"
        "                             presets' default) or one fused kernel each, as the gpu\n"
        "                             backend runs them (to compare with a --backend gpu run)\n"
        "  --backward-prefetch P      pre | post | none (default pre)\n"
        "  --forward-prefetch         prefetch the next unit's all-gather in forward\n"
        "  --limit-all-gathers, --no-limit-all-gathers   CPU rate limiter (default on)\n"
        "  --optim adamw|sgd          optimizer (default adamw)\n"
        "  --lr X                     learning rate (default 1e-3)\n"
        "  --betas B1,B2              AdamW betas (default 0.9,0.999)\n"
        "  --eps X                    AdamW eps (default 1e-8)\n"
        "  --weight-decay X           (default 1e-2 for adamw, 0 for sgd)\n"
        "  --momentum X, --dampening X, --nesterov   SGD options\n"
        "  --steps N                  training steps (default 10)\n"
        "  --batch B                  global batch: rows (mlp) or sequences (gpt), divisible\n"
        "                             by the world (default 32 rows, 8 sequences; rounded up\n"
        "                             to a multiple of the world, with a note)\n"
        "  --local-batch B            per-rank batch: the global batch is B x the world\n"
        "  --seq T                    gpt, llama: tokens per row (default: the model's seq)\n"
        "  --checkpoint-activations   gpt, llama: recompute each block's forward in backward\n"
        "  --activation-checkpointing none|full|selective-layer[:K]|selective-op\n"
        "                             gpt, llama: full is --checkpoint-activations;\n"
        "                             selective-layer every K-th block (default 2);\n"
        "                             selective-op (llama): attention's and every other\n"
        "                             matmul's outputs kept, the rest recomputed\n"
        "  --attention eager|fused    gpt: HF's eager attention (the default) or one fused\n"
        "                             kernel (FlashAttention's contract; llama: always)\n"
        "  --no-decay-1d              no weight decay for biases and LayerNorm weights\n"
        "  --seed N                   seed of the init and the synthetic data (default 0)\n"
        "  --init FILE                initial weights (safetensors: layers.<i>.weight/bias;\n"
        "                             gpt: an HF GPT-2 checkpoint; llama: an HF Llama\n"
        "                             model.safetensors, or model.safetensors.index.json and\n"
        "                             its files, or their directory: each rank reads its shard)\n"
        "  --data FILE                global batch (safetensors: x [B, D0], y [B, DL]);\n"
        "                             gpt: any text file, as bytes (default: the sources)\n"
        "  --tokens FILE              gpt, llama: an llm.c token shard (uint16, magic\n"
        "                             20240520; or uint32, magic 20240801, Llama 3's)\n"
        "  --save FILE                write the final weights (safetensors; gpt, llama: HF's\n"
        "                             names and layouts)\n"
        "  --timeout S                collective timeout in seconds (default 60)\n"
        "  --threads N                sim: CPU threads of the whole run (default: the online\n"
        "                             CPUs); with fewer ranks than N each rank splits its\n"
        "                             GEMMs and large element-wise kernels across N / world\n"
        "                             threads, with the same results bit for bit\n"
        "  --host-memory BYTES        sim: the most host memory the simulated ranks' memory\n"
        "                             may take, all together, with K/M/G/T; 0 is unlimited\n"
        "                             (default 90% of the memory available); a model that\n"
        "                             needs more is refused at once\n"
        "  --quiet                    only the final summary\n"
        "  --version, --help\n"
        "fsdp-plan's options that train has not: --nodes, --gpus-per-node, --capacity (the\n"
        "simulated device's memory is unlimited here; --profile sets the cluster), --sweep,\n"
        "--fit-status, --print-profile, --list-models, --plot (fsdp-trace plot draws a\n"
        "--trace), --no-symmetry (training runs every rank).\n"
        "Environment:\n"
        "  FSDP_LOG_LEVEL             error | warn | info | debug | trace (default warn)\n"
        "  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT\n"
        "                             --backend gpu: torchrun's launcher variables\n"
        "  SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE,\n"
        "  SLURM_TASKS_PER_NODE, SLURM_JOB_NODELIST   --backend gpu under srun\n"
        "  OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE   --backend gpu under mpirun\n"
        "  FSDP_JOB_TOKEN             --backend gpu: the job's secret for the rendezvous\n"
        "  CUDA_VISIBLE_DEVICES       --backend gpu: the GPUs this process sees\n"
        "  FSDP_GPU_MODULE            --backend gpu: the libfsdp-gpu.so to load\n",
        f);
}

enum {
    OPT_MODEL = 256,
    OPT_WORLD,
    OPT_OPTIM,
    OPT_LR,
    OPT_BETAS,
    OPT_EPS,
    OPT_WD,
    OPT_MOMENTUM,
    OPT_DAMPENING,
    OPT_NESTEROV,
    OPT_STEPS,
    OPT_BATCH,
    OPT_SEED,
    OPT_INIT,
    OPT_DATA,
    OPT_SAVE,
    OPT_TIMEOUT,
    OPT_QUIET,
    OPT_VERSION,
    OPT_HELP,
    OPT_RPN,
    OPT_OFFLOAD,
    OPT_ACCUM,
    OPT_CLIP,
    OPT_CKPT,
    OPT_CKPT_EVERY,
    OPT_STATE_DICT,
    OPT_RESUME,
    OPT_CONSOLIDATE,
    OPT_TRACE,
    OPT_PROFILE,
    OPT_OPS,
    OPT_TOKENS,
    OPT_SEQ,
    OPT_CKPT_ACT,
    OPT_NO_DECAY,
    OPT_MIXED,
    OPT_BACKEND,
    OPT_LOCAL_BATCH,
    OPT_AC,
    OPT_ATTENTION,
    OPT_THREADS,
    OPT_HOST_MEMORY
};

static void parse_args(int argc, char **argv, train_args_t *a)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, OPT_MODEL},
        {"world", required_argument, NULL, OPT_WORLD},
        {"backend", required_argument, NULL, OPT_BACKEND},
        CLI_FSDP_LONG_OPTIONS,
        {"optim", required_argument, NULL, OPT_OPTIM},
        {"lr", required_argument, NULL, OPT_LR},
        {"betas", required_argument, NULL, OPT_BETAS},
        {"eps", required_argument, NULL, OPT_EPS},
        {"weight-decay", required_argument, NULL, OPT_WD},
        {"momentum", required_argument, NULL, OPT_MOMENTUM},
        {"dampening", required_argument, NULL, OPT_DAMPENING},
        {"nesterov", no_argument, NULL, OPT_NESTEROV},
        {"steps", required_argument, NULL, OPT_STEPS},
        {"batch", required_argument, NULL, OPT_BATCH},
        {"local-batch", required_argument, NULL, OPT_LOCAL_BATCH},
        {"seed", required_argument, NULL, OPT_SEED},
        {"init", required_argument, NULL, OPT_INIT},
        {"data", required_argument, NULL, OPT_DATA},
        {"save", required_argument, NULL, OPT_SAVE},
        {"timeout", required_argument, NULL, OPT_TIMEOUT},
        {"threads", required_argument, NULL, OPT_THREADS},
        {"host-memory", required_argument, NULL, OPT_HOST_MEMORY},
        {"quiet", no_argument, NULL, OPT_QUIET},
        {"ranks-per-node", required_argument, NULL, OPT_RPN},
        {"cpu-offload", no_argument, NULL, OPT_OFFLOAD},
        {"mixed-precision", required_argument, NULL, OPT_MIXED},
        {"grad-accum", required_argument, NULL, OPT_ACCUM},
        {"clip-grad-norm", required_argument, NULL, OPT_CLIP},
        {"save-checkpoint", required_argument, NULL, OPT_CKPT},
        {"checkpoint-every", required_argument, NULL, OPT_CKPT_EVERY},
        {"state-dict", required_argument, NULL, OPT_STATE_DICT},
        {"resume", required_argument, NULL, OPT_RESUME},
        {"consolidate", required_argument, NULL, OPT_CONSOLIDATE},
        {"trace", required_argument, NULL, OPT_TRACE},
        {"profile", required_argument, NULL, OPT_PROFILE},
        {"ops", required_argument, NULL, OPT_OPS},
        {"tokens", required_argument, NULL, OPT_TOKENS},
        {"seq", required_argument, NULL, OPT_SEQ},
        {"checkpoint-activations", no_argument, NULL, OPT_CKPT_ACT},
        {"activation-checkpointing", required_argument, NULL, OPT_AC},
        {"attention", required_argument, NULL, OPT_ATTENTION},
        {"no-decay-1d", no_argument, NULL, OPT_NO_DECAY},
        {"version", no_argument, NULL, OPT_VERSION},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0},
    };
    /* optimizer options are applied after --optim picks the defaults */
    const char *lr = NULL, *betas = NULL, *eps = NULL, *wd = NULL, *momentum = NULL,
               *dampening = NULL;
    int nesterov = 0, c, state_dict_given = 0, batch_given = 0, no_decay_1d = 0, local_batch = 0;
    int show = 0;       /* 1: --version, 2: --help */
    int attention = -1; /* --attention, when given */
    train_backend_t backend = TRAIN_BACKEND_SIM;
    fsdp_optim_kind_t kind = FSDP_OPTIM_ADAMW;
    size_t host_memory = 0; /* --host-memory: 0 = the library's default */

    memset(a, 0, sizeof(*a));
    a->nlayers = fsdp_mlp_parse_spec("16,32,4", a->dims, FSDP_MLP_MAX_LAYERS + 1);
    a->world = 0; /* --world, else the backend's */
    fsdp_config_init(&a->fsdp);
    a->steps = 10;
    a->batch = 32;
    a->grad_accum = 1;
    a->state_dict = FSDP_STATE_DICT_FULL;
    a->timeout_s = 60.0;
    a->ops = -1; /* the profile's */

    opterr = 0;
    /* ":" first: a missing value is reported as such, not as an unknown option */
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        switch (c) {
        case OPT_MODEL:
            a->gpt = fsdp_gpt2_spec_is_gpt(optarg);
            a->llama = fsdp_llama_spec_is_llama(optarg);
            a->model_name = optarg;
            if (a->llama) {
                if (fsdp_llama_config_parse(optarg, &a->llama_cfg) != FSDP_OK)
                    fail_quietly();
                a->gpt = 1;
                break;
            }
            if (a->gpt) {
                if (fsdp_gpt2_config_parse(optarg, &a->gpt_cfg) != FSDP_OK)
                    fail_quietly();
                break;
            }
            a->nlayers = fsdp_mlp_parse_spec(optarg, a->dims, FSDP_MLP_MAX_LAYERS + 1);
            if (a->nlayers < 1)
                cli_die("--model: '%s' is not a model spec; expected mlp:D0,D1,...,DL with 2 to %d "
                        "positive widths, a gpt model (%s, gpt2:layers=L,heads=H,dim=D,seq=T,"
                        "vocab=V) or a llama model (%s, llama:...)",
                        optarg, FSDP_MLP_MAX_LAYERS + 1, fsdp_gpt2_preset_names(),
                        fsdp_llama_preset_names());
            break;
        case OPT_WORLD:
            a->world = (int)cli_parse_long("--world", optarg, 1, 4096);
            break;
        case OPT_BACKEND:
            if (train_backend_parse(optarg, &backend) != 0)
                cli_die("--backend: '%s' is not one of sim, gpu", optarg);
            break;
        case OPT_OPTIM:
            if (strcmp(optarg, "adamw") == 0)
                kind = FSDP_OPTIM_ADAMW;
            else if (strcmp(optarg, "sgd") == 0)
                kind = FSDP_OPTIM_SGD;
            else
                cli_die("--optim: '%s' is not one of adamw, sgd", optarg);
            break;
        case OPT_LR: lr = optarg; break;
        case OPT_BETAS: betas = optarg; break;
        case OPT_EPS: eps = optarg; break;
        case OPT_WD: wd = optarg; break;
        case OPT_MOMENTUM: momentum = optarg; break;
        case OPT_DAMPENING: dampening = optarg; break;
        case OPT_NESTEROV: nesterov = 1; break;
        case OPT_STEPS:
            a->steps = (int)cli_parse_long("--steps", optarg, 0, 100000000);
            break;
        case OPT_BATCH:
            a->batch = (int)cli_parse_long("--batch", optarg, 1, 1 << 24);
            batch_given = 1;
            break;
        case OPT_LOCAL_BATCH:
            local_batch = (int)cli_parse_long("--local-batch", optarg, 1, 1 << 24);
            break;
        case OPT_SEED:
            a->seed = (uint64_t)cli_parse_long("--seed", optarg, 0, 0x7fffffffffffffffL);
            break;
        case OPT_INIT: a->init_path = optarg; break;
        case OPT_DATA: a->data_path = optarg; break;
        case OPT_SAVE: a->save_path = optarg; break;
        case OPT_TIMEOUT:
            a->timeout_s = cli_parse_double("--timeout", optarg, 1e-3, 1e6);
            break;
        case OPT_THREADS:
            a->threads = (int)cli_parse_long("--threads", optarg, 1, 4096);
            break;
        case OPT_HOST_MEMORY:
            host_memory = cli_parse_bytes("--host-memory", optarg);
            if (host_memory == 0)
                host_memory = SIZE_MAX; /* unlimited */
            break;
        case OPT_QUIET: a->quiet = 1; break;
        case OPT_RPN:
            a->fsdp.ranks_per_node = (int)cli_parse_long("--ranks-per-node", optarg, 1, 4096);
            break;
        case OPT_OFFLOAD: a->fsdp.cpu_offload = 1; break;
        case OPT_MIXED:
            cli_parse_mixed_precision(optarg, &a->fsdp.mixed_precision);
            break;
        case OPT_ACCUM:
            a->grad_accum = (int)cli_parse_long("--grad-accum", optarg, 1, 1 << 20);
            break;
        case OPT_CLIP:
            a->clip_grad_norm = cli_parse_double("--clip-grad-norm", optarg, 1e-30, 1e30);
            break;
        case OPT_CKPT: a->ckpt_dir = optarg; break;
        case OPT_CKPT_EVERY:
            a->ckpt_every = (int)cli_parse_long("--checkpoint-every", optarg, 1, 100000000);
            break;
        case OPT_STATE_DICT:
            if (!fsdp_state_dict_type_parse(optarg, &a->state_dict))
                cli_die("--state-dict: '%s' is not one of full, sharded", optarg);
            state_dict_given = 1;
            break;
        case OPT_RESUME: a->resume_dir = optarg; break;
        case OPT_CONSOLIDATE:
            a->consolidate_dir = optarg;
            break;
        case OPT_TRACE: a->trace_path = optarg; break;
        case OPT_PROFILE: a->profile_arg = optarg; break;
        case OPT_OPS: a->ops = cli_ops(optarg); break;
        case OPT_TOKENS: a->tokens_path = optarg; break;
        case OPT_SEQ:
            a->seq = (int)cli_parse_long("--seq", optarg, 1, 1 << 20);
            break;
        case OPT_CKPT_ACT: a->checkpoint_activations = 1; break;
        case OPT_AC:
            a->checkpoint_activations = cli_activation_checkpointing(optarg);
            break;
        case OPT_ATTENTION: attention = cli_attention(optarg); break;
        case OPT_NO_DECAY: no_decay_1d = 1; break;
        case OPT_VERSION: show = 1; break;
        case OPT_HELP: show = 2; break;
        default:
            cli_other_option(c, argv, &a->fsdp);
            break;
        }
    }
    cli_no_arguments(argc, argv);
    if (show == 1)
        printf("fsdp-train (libfsdp) %s\n", fsdp_version_string());
    if (show == 2)
        usage(stdout);
    if (show != 0)
        exit(0);
    {
        char why[512];
        if (cli_check_output("--save", a->save_path, 0, why, sizeof(why)) != 0 ||
            cli_check_output("--save-checkpoint", a->ckpt_dir, 1, why, sizeof(why)) != 0)
            cli_die("%s", why);
    }
    {
        fsdp_sim_params_t defaults;
        fsdp_sim_params_init(&defaults);
        a->profile = defaults.profile;
        if (a->profile_arg != NULL &&
            fsdp_sim_profile_from_arg(a->profile_arg, &a->profile) != FSDP_OK)
            fail_quietly(); /* the library said what is wrong and what is allowed */
        if (a->ops >= 0)
            a->profile.ops = (fsdp_sim_ops_t)a->ops;
    }
    if (train_launch_prepare(&a->launch, backend, a->world, a->timeout_s, &a->profile) != 0)
        fail_quietly();
    a->world = a->launch.world;
    a->launch.threads = a->threads;
    a->launch.host_memory = host_memory;

    fsdp_optim_config_init(&a->optim, kind);
    if (lr)
        a->optim.lr = (float)cli_parse_double("--lr", lr, 0.0, 1e6);
    if (betas) {
        char b1[64], b2[64];
        const char *comma = strchr(betas, ',');
        if (comma == NULL || (size_t)(comma - betas) >= sizeof(b1) || strlen(comma + 1) >= sizeof(b2))
            cli_die("--betas: '%s' is not two numbers B1,B2", betas);
        memcpy(b1, betas, (size_t)(comma - betas));
        b1[comma - betas] = '\0';
        strcpy(b2, comma + 1);
        a->optim.beta1 = (float)cli_parse_double("--betas", b1, 0.0, 0.999999999);
        a->optim.beta2 = (float)cli_parse_double("--betas", b2, 0.0, 0.999999999);
    }
    if (eps)
        a->optim.eps = (float)cli_parse_double("--eps", eps, 0.0, 1.0);
    if (wd)
        a->optim.weight_decay = (float)cli_parse_double("--weight-decay", wd, 0.0, 1e6);
    if (momentum)
        a->optim.momentum = (float)cli_parse_double("--momentum", momentum, 0.0, 1e6);
    if (dampening)
        a->optim.dampening = (float)cli_parse_double("--dampening", dampening, 0.0, 1.0);
    a->optim.nesterov = nesterov;
    a->optim.no_decay_1d = no_decay_1d;
    if ((betas || eps) && kind != FSDP_OPTIM_ADAMW)
        cli_die("--betas and --eps apply to --optim adamw only");
    if ((momentum || dampening || nesterov) && kind != FSDP_OPTIM_SGD)
        cli_die("--momentum, --dampening and --nesterov apply to --optim sgd only");
    if (fsdp_optim_config_check(&a->optim) != FSDP_OK)
        fail_quietly();
    if (a->gpt && !batch_given)
        a->batch = 8;
    if (local_batch > 0) {
        if (batch_given && a->batch != local_batch * a->world)
            cli_die("--batch %d and --local-batch %d disagree on %d ranks: give one", a->batch,
                    local_batch, a->world);
        if ((long)local_batch * a->world > 1 << 24)
            cli_die("--local-batch %d on %d ranks is a global batch over %d", local_batch, a->world,
                    1 << 24);
        a->batch = local_batch * a->world;
    } else if (!batch_given && a->batch % a->world != 0 && (a->gpt || a->data_path == NULL)) {
        int rounded = (a->batch + a->world - 1) / a->world * a->world;
        cli_note("global batch %d %s: the default %d rounded up to a multiple of --world %d "
                 "(--batch or --local-batch sets it)",
                 rounded, a->gpt ? "sequences" : "rows", a->batch, a->world);
        a->batch = rounded;
    }
    cli_apply_attention(attention, a->gpt && !a->llama ? &a->gpt_cfg : NULL, a->llama);
    if (a->gpt) {
        int positions = a->llama ? a->llama_cfg.max_seq : a->gpt_cfg.n_positions;
        if (a->seq == 0)
            a->seq = positions;
        if (a->seq > positions)
            cli_die("--seq %d is longer than the model's %d positions (seq= in the model spec sets "
                    "them)",
                    a->seq, positions);
        if (a->tokens_path != NULL && a->data_path != NULL)
            cli_die("--data (text) and --tokens (llm.c) are two sources of data: give one");
        if (a->checkpoint_activations == CLI_AC_SELECTIVE_OP && !a->llama)
            cli_die("--activation-checkpointing selective-op needs a llama model (gpt has full and "
                    "selective-layer)");
    } else if (a->tokens_path != NULL || a->seq != 0 || a->checkpoint_activations) {
        cli_die("--tokens, --seq and activation checkpointing apply to gpt and llama models only");
    }
    if (a->batch % a->world != 0)
        cli_die("--batch %d is not divisible by --world %d: every rank needs the same number of %s "
                "(--local-batch B gives each rank B)",
                a->batch, a->world, a->gpt ? "sequences" : "rows");
    if (a->batch / a->world % a->grad_accum != 0)
        cli_die(
            "--grad-accum %d does not divide the %d rows of each rank (--batch %d / --world %d)",
            a->grad_accum, a->batch / a->world, a->batch, a->world);
    if ((a->fsdp.strategy == FSDP_HYBRID_SHARD || a->fsdp.strategy == FSDP_HYBRID_SHARD_ZERO2 ||
         a->fsdp.ranks_per_node > 0) &&
        a->world % (a->fsdp.ranks_per_node > 0 ? a->fsdp.ranks_per_node : a->world) != 0)
        cli_die("--ranks-per-node %d does not divide --world %d", a->fsdp.ranks_per_node, a->world);
    a->launch.ranks_per_node = a->fsdp.ranks_per_node; /* the simulated node */
    if ((a->ckpt_every > 0 || state_dict_given) && a->ckpt_dir == NULL)
        cli_die("--checkpoint-every and --state-dict need --save-checkpoint DIR");
    if (a->ckpt_every > a->steps)
        cli_die("--checkpoint-every %d is more than --steps %d: it would never save (the last step "
                "saves a checkpoint anyway; give N <= %d)",
                a->ckpt_every, a->steps, a->steps);
}

/* ---- data and weights ---- */

static const fsdp_st_tensor_t *need_tensor(fsdp_st_file_t *f, const char *path, const char *name,
                                           int64_t d0, int64_t d1, int ndim)
{
    const fsdp_st_tensor_t *t = fsdp_st_find(f, name);
    if (t == NULL)
        cli_die("%s: no tensor '%s'", path, name);
    if (strcmp(t->dtype, "F32") != 0)
        cli_die("%s: tensor '%s' is %s; F32 is required", path, name, t->dtype);
    if (t->ndim != ndim || t->shape[0] != d0 || (ndim == 2 && t->shape[1] != d1)) {
        if (ndim == 2)
            cli_die("%s: tensor '%s' must have shape [%lld, %lld] for this model", path, name,
                    (long long)d0, (long long)d1);
        cli_die("%s: tensor '%s' must have shape [%lld] for this model", path, name, (long long)d0);
    }
    if (fsdp_st_check_finite(t, path) != FSDP_OK)
        fail_quietly(); /* the library named the tensor and the element */
    return t;
}

static float *copy_tensor(const fsdp_st_tensor_t *t)
{
    float *p = malloc(t->nbytes ? t->nbytes : 1);
    if (p == NULL)
        cli_die("out of host memory");
    memcpy(p, t->data, t->nbytes);
    return p;
}

static void load_init(const train_args_t *a, train_shared_t *sh)
{
    fsdp_st_file_t *f;
    int expected = 2 * a->nlayers;

    if (fsdp_st_open(a->init_path, &f) != FSDP_OK)
        fail_quietly();
    sh->init_weights = calloc((size_t)a->nlayers, sizeof(float *));
    sh->init_biases = calloc((size_t)a->nlayers, sizeof(float *));
    if (sh->init_weights == NULL || sh->init_biases == NULL)
        cli_die("out of host memory");
    for (int i = 0; i < a->nlayers; i++) {
        char name[64];
        snprintf(name, sizeof(name), "layers.%d.weight", i);
        sh->init_weights[i] = copy_tensor(
            need_tensor(f, a->init_path, name, a->dims[i + 1], a->dims[i], 2));
        snprintf(name, sizeof(name), "layers.%d.bias", i);
        sh->init_biases[i] = copy_tensor(need_tensor(f, a->init_path, name, a->dims[i + 1], 0, 1));
    }
    if (fsdp_st_num_tensors(f) != expected) {
        for (int i = 0; i < fsdp_st_num_tensors(f); i++) {
            const char *name = fsdp_st_tensor_at(f, i)->name;
            int layer, n = -1;
            char kind[16];
            if (sscanf(name, "layers.%d.%15[a-z]%n", &layer, kind, &n) != 2 ||
                (size_t)n != strlen(name) || layer < 0 || layer >= a->nlayers ||
                (strcmp(kind, "weight") && strcmp(kind, "bias")))
                cli_die("%s: unexpected tensor '%s' for a %d-layer mlp", a->init_path, name,
                        a->nlayers);
        }
    }
    fsdp_st_close(f);
}

static void load_data(const train_args_t *a, train_shared_t *sh)
{
    fsdp_st_file_t *f;
    const fsdp_st_tensor_t *x, *y;

    if (fsdp_st_open(a->data_path, &f) != FSDP_OK)
        fail_quietly();
    x = fsdp_st_find(f, "x");
    if (x == NULL || x->ndim != 2)
        cli_die("%s: needs a 2-d tensor 'x' [B, %d]", a->data_path, a->dims[0]);
    need_tensor(f, a->data_path, "x", x->shape[0], a->dims[0], 2);
    y = need_tensor(f, a->data_path, "y", x->shape[0], a->dims[a->nlayers], 2);
    if (x->shape[0] % a->world != 0)
        cli_die("%s: the batch of %lld rows is not divisible by --world %d", a->data_path,
                (long long)x->shape[0], a->world);
    ((train_args_t *)a)->batch = (int)x->shape[0];
    sh->x = copy_tensor(x);
    sh->y = copy_tensor(y);
    fsdp_st_close(f);
}

/* Synthetic regression: x ~ N(0, 1), y = tanh(x @ A) with a seeded random A. */
static void make_data(const train_args_t *a, train_shared_t *sh)
{
    size_t b = (size_t)a->batch, din = (size_t)a->dims[0], dout = (size_t)a->dims[a->nlayers];
    float *proj = malloc(din * dout * sizeof(float));
    fsdp_rng_t rng;

    sh->x = malloc(b * din * sizeof(float));
    sh->y = malloc(b * dout * sizeof(float));
    if (proj == NULL || sh->x == NULL || sh->y == NULL)
        cli_die("out of host memory");
    fsdp_rng_seed(&rng, a->seed ^ 0x5eedda7aull);
    for (size_t i = 0; i < din * dout; i++)
        proj[i] = fsdp_rng_normal(&rng) / sqrtf((float)din);
    for (size_t i = 0; i < b * din; i++)
        sh->x[i] = fsdp_rng_normal(&rng);
    for (size_t r = 0; r < b; r++) {
        for (size_t o = 0; o < dout; o++) {
            double s = 0.0;
            for (size_t i = 0; i < din; i++)
                s += (double)sh->x[r * din + i] * proj[i * dout + o];
            sh->y[r * dout + o] = (float)tanh(s);
        }
    }
    free(proj);
}

/* ---- the rank's work ---- */

static fsdp_status_t save_weights(const train_args_t *a, fsdp_mlp_t *mlp, int rank)
{
    float **full = calloc((size_t)a->nlayers, sizeof(float *));
    fsdp_st_entry_t *entries = calloc((size_t)a->nlayers * 2, sizeof(*entries));
    int64_t (*shapes)[2] = calloc((size_t)a->nlayers * 2, sizeof(*shapes));
    char (*names)[64] = calloc((size_t)a->nlayers * 2, sizeof(*names));
    fsdp_status_t status = FSDP_OK;

    if (full == NULL || entries == NULL || shapes == NULL || names == NULL) {
        status = FSDP_ERR_NO_MEMORY;
        goto out;
    }
    for (int i = 0; i < a->nlayers && status == FSDP_OK; i++) {
        fsdp_unit_t *u = fsdp_mlp_layer(mlp, i);
        full[i] = malloc(fsdp_unit_flat_numel(u) * sizeof(float));
        if (full[i] == NULL) {
            status = FSDP_ERR_NO_MEMORY;
            break;
        }
        /* a collective: every rank gathers, rank 0 writes */
        status = fsdp_unit_gather_full(u, full[i]);
        for (int j = 0; j < 2 && status == FSDP_OK; j++) {
            fsdp_param_info_t pi;
            fsdp_st_entry_t *e = &entries[2 * i + j];
            fsdp_unit_param_info(u, j, &pi);
            snprintf(names[2 * i + j], sizeof(names[0]), "%s", pi.name);
            shapes[2 * i + j][0] = pi.shape[0];
            shapes[2 * i + j][1] = pi.ndim > 1 ? pi.shape[1] : 0;
            e->name = names[2 * i + j];
            e->dtype = "F32";
            e->ndim = pi.ndim;
            e->shape = shapes[2 * i + j];
            e->data = full[i] + pi.offset;
        }
    }
    if (status == FSDP_OK && rank == 0) {
        static const char *const meta[] = {"format", "pt"};
        status = fsdp_st_write(a->save_path, entries, a->nlayers * 2, meta, 1);
    }
out:
    for (int i = 0; full && i < a->nlayers; i++)
        free(full[i]);
    free(full);
    free(entries);
    free(shapes);
    free(names);
    return status;
}

static fsdp_status_t train_rank(fsdp_dev_t *dev, void *arg)
{
    train_shared_t *sh = arg;
    const train_args_t *a = sh->args;
    size_t rows = (size_t)a->batch / (size_t)a->world;
    size_t din = (size_t)a->dims[0], dout = (size_t)a->dims[a->nlayers];
    const float *x = sh->x + (size_t)dev->rank * rows * din;
    const float *y = sh->y + (size_t)dev->rank * rows * dout;
    fsdp_group_t *world = dev->ops->group_world(dev);
    fsdp_t *fs = NULL;
    fsdp_mlp_t *mlp = NULL;
    fsdp_optim_t *opt = NULL;
    float *dloss = NULL;
    fsdp_mem_stats_t st;
    fsdp_status_t status;

    status = sh->trace != NULL ? fsdp_trace_attach(sh->trace, dev) : FSDP_OK;
    if (status == FSDP_OK)
        status = fsdp_create(dev, &a->fsdp, &fs);
    if (status != FSDP_OK) {
        fsdp_trace_detach(dev);
        return status;
    }
    status = fsdp_mlp_create(fs, a->dims, a->nlayers, &mlp);
    if (status != FSDP_OK)
        goto out;
    if (sh->init_weights) {
        for (int i = 0; i < a->nlayers && status == FSDP_OK; i++) {
            status = fsdp_unit_set_param(fsdp_mlp_layer(mlp, i), 0, sh->init_weights[i]);
            if (status == FSDP_OK)
                status = fsdp_unit_set_param(fsdp_mlp_layer(mlp, i), 1, sh->init_biases[i]);
        }
    } else {
        status = fsdp_mlp_init_params(mlp, a->seed);
    }
    if (status == FSDP_OK)
        status = fsdp_optim_create(fs, &a->optim, &opt);
    if (status == FSDP_OK)
        status = fsdp_mem_alloc(fsdp_memory(fs), sizeof(float), FSDP_MEM_TEMPORARY,
                                fsdp_compute_stream(fs), (void **)&dloss);
    int64_t first_step = 0;
    if (status == FSDP_OK && a->resume_dir != NULL) {
        status = fsdp_checkpoint_load(fs, opt, a->resume_dir, &first_step);
        if (status == FSDP_OK && dev->rank == 0) {
            sh->resumed_step = first_step;
            train_resumed(dev, a->resume_dir, first_step, a->quiet);
        }
    }
    size_t micro_rows = rows / (size_t)a->grad_accum;
    fsdp_mlp_set_loss_scale(mlp, 1.0f / (float)a->grad_accum);
    for (int step = (int)first_step; step < a->steps && status == FSDP_OK; step++) {
        float loss = 0.0f;
        train_step_clock_t clock;
        double wall0 = train_wall_now(), step_time = 0;
        train_step_begin(dev, &clock);
        /* gradient accumulation: the first micro-batches under no_sync, the last syncs */
        for (int k = 0; k < a->grad_accum && status == FSDP_OK; k++) {
            float micro_loss = 0.0f;
            status = fsdp_set_sync_gradients(fs, k == a->grad_accum - 1);
            if (status == FSDP_OK)
                status = fsdp_mlp_forward_backward(mlp, x + (size_t)k * micro_rows * din,
                                                   y + (size_t)k * micro_rows * dout, micro_rows,
                                                   &micro_loss);
            loss += micro_loss / (float)a->grad_accum;
        }
        if (status == FSDP_OK && a->clip_grad_norm > 0.0)
            status = fsdp_clip_grad_norm(fs, a->clip_grad_norm, 2.0, NULL);
        if (status == FSDP_OK)
            status = fsdp_optim_step(opt);
        fsdp_zero_grad(fs);
        if (status == FSDP_OK && a->ckpt_dir != NULL &&
            ((a->ckpt_every > 0 && (step + 1) % a->ckpt_every == 0) || step + 1 == a->steps))
            status = fsdp_checkpoint_save(fs, opt, a->ckpt_dir, a->state_dict, step + 1);
        /* the global mean: every rank holds the same number of rows */
        if (status == FSDP_OK)
            status = dev->ops->memcpy_async(dev, dloss, &loss, sizeof(float),
                                            fsdp_compute_stream(fs));
        if (status == FSDP_OK)
            status = dev->ops->all_reduce(dev, world, dloss, dloss, 1, FSDP_DTYPE_F32,
                                          FSDP_REDUCE_AVG, fsdp_compute_stream(fs));
        if (status == FSDP_OK)
            status = dev->ops->memcpy_async(dev, &loss, dloss, sizeof(float),
                                            fsdp_compute_stream(fs));
        if (status == FSDP_OK)
            status = dev->ops->stream_synchronize(dev, fsdp_compute_stream(fs));
        if (status == FSDP_OK)
            step_time = train_step_end(dev, fs, &clock, step + 1, loss);
        if (status == FSDP_OK && dev->rank == 0) {
            double wall = train_wall_now() - wall0;
            sh->losses[step] = loss;
            sh->steps_run++;
            sh->step_time_sum += step_time;
            if (!a->quiet) {
                char note[32];
                fsdp_mem_get_stats(fsdp_memory(fs), &st);
                train_step_line(sh->trace, &a->launch, step + 1, (double)loss, "rows/s",
                                wall > 0 ? (double)a->batch / wall : 0.0, step_time,
                                st.peak_allocated);
                snprintf(note, sizeof(note), "loss %.4f", (double)loss);
                progress_update(step + 1, note);
            }
        }
    }
    if (status == FSDP_OK && a->save_path)
        status = save_weights(a, mlp, dev->rank);
    fsdp_mem_get_stats(fsdp_memory(fs), &st);
    sh->peak[dev->rank] = st.peak_allocated;
out:
    fsdp_mem_free(fsdp_memory(fs), dloss);
    fsdp_optim_destroy(opt);
    fsdp_mlp_destroy(mlp);
    fsdp_destroy(fs);
    fsdp_trace_detach(dev);
    return status;
}

/* --consolidate DIR --save FILE: a file conversion, no ranks and no model. */
static int consolidate(const train_args_t *a)
{
    int64_t step;

    if (a->save_path == NULL)
        cli_die("--consolidate %s: name the file to write with --save FILE", a->consolidate_dir);
    if (a->resume_dir != NULL || a->ckpt_dir != NULL || a->init_path != NULL)
        cli_die("--consolidate trains nothing: it takes --save FILE, not --resume, "
                "--save-checkpoint or --init");
    if (fsdp_checkpoint_consolidate(a->consolidate_dir, a->save_path, &step) != FSDP_OK)
        fail_quietly(); /* the library said why */
    printf("consolidated %s (step %lld) into %s\n", a->consolidate_dir, (long long)step,
           a->save_path);
    return 0;
}

/* The GPT-2 path: the options train_gpt2.c takes. */
static int train_gpt2(const train_args_t *a, int argc, char **argv)
{
    const char *argv0 = argv[0];
    gpt2_train_opts_t o;

    memset(&o, 0, sizeof(o));
    o.model_name = a->model_name;
    o.model = a->gpt_cfg;
    o.llama = a->llama;
    o.llama_model = a->llama_cfg;
    o.world = a->world;
    o.fsdp = a->fsdp;
    o.optim = a->optim;
    o.steps = a->steps;
    o.batch = a->batch;
    o.seq = a->seq;
    o.grad_accum = a->grad_accum;
    o.seed = a->seed;
    o.timeout_s = a->timeout_s;
    o.clip_grad_norm = a->clip_grad_norm;
    o.checkpoint_activations = a->checkpoint_activations;
    o.init_path = a->init_path;
    o.save_path = a->save_path;
    o.data_path = a->data_path;
    o.tokens_path = a->tokens_path;
    o.ckpt_dir = a->ckpt_dir;
    o.ckpt_every = a->ckpt_every;
    o.state_dict = a->state_dict;
    o.resume_dir = a->resume_dir;
    o.quiet = a->quiet;
    o.argv0 = argv0;
    o.trace_path = a->trace_path;
    o.profile = &a->profile;
    o.launch = &a->launch;
    o.argc = argc;
    o.argv = argv;
    return gpt2_train_main(&o);
}

int main(int argc, char **argv)
{
    train_args_t args;
    train_shared_t sh;
    fsdp_status_t status;
    char trace_buf[4096];
    const char *trace_path;
    double t0;

    cli_init("fsdp-train");
    parse_args(argc, argv, &args);
    if (args.consolidate_dir != NULL)
        return consolidate(&args);
    if (args.gpt)
        return train_gpt2(&args, argc, argv);
    memset(&sh, 0, sizeof(sh));
    sh.args = &args;
    {
        uint64_t params = 0;
        for (int i = 0; i < args.nlayers; i++)
            params += ((uint64_t)args.dims[i] + 1) * (uint64_t)args.dims[i + 1];
        if (train_launch_check_host(&args.launch,
                                    args.model_name != NULL ? args.model_name : "mlp:16,32,4",
                                    params, &args.optim) != 0)
            return 1;
    }
    if (args.init_path)
        load_init(&args, &sh);
    if (args.data_path)
        load_data(&args, &sh);
    else
        make_data(&args, &sh);
    sh.peak = calloc((size_t)args.world, sizeof(size_t));
    sh.losses = calloc((size_t)args.steps + 1, sizeof(float));
    if (sh.peak == NULL || sh.losses == NULL)
        cli_die("out of host memory");

    trace_path = train_launch_trace_path(&args.launch, args.trace_path, trace_buf,
                                         sizeof(trace_buf));
    if (train_trace_open(trace_path, &args.launch, &args.fsdp, "mlp", argc, argv, &sh.trace) !=
        FSDP_OK)
        fail_quietly();
    if (!args.quiet && train_launch_reports(&args.launch))
        progress_start(args.steps, "step", "setting up");
    t0 = train_wall_now();
    status = train_launch_run(&args.launch, train_rank, &sh);
    progress_end();
    t0 = train_wall_now() - t0;
    if (fsdp_trace_close(sh.trace) != FSDP_OK && status == FSDP_OK)
        status = FSDP_ERR_IO;
    train_print_rest();
    if (status == FSDP_OK && train_launch_reports(&args.launch) &&
        train_resume_past_end(args.resume_dir, sh.resumed_step, args.steps))
        status = FSDP_ERR_INVALID_PARAM;
    /* on failure the failing rank logged why; peers only saw it fail. On the gpu backend each
     * process knows its own rank's peak. */
    if (status == FSDP_OK && train_launch_reports(&args.launch) && sh.steps_run > 0) {
        int64_t first = sh.resumed_step;
        train_totals_t t = {.unit = "rows",
                            .items = (double)sh.steps_run * (double)args.batch,
                            .wall_s = t0,
                            .steps_run = sh.steps_run,
                            .first_loss = sh.losses[first],
                            .last_loss = sh.losses[first + sh.steps_run - 1],
                            .step_time_sum = sh.step_time_sum,
                            .profile_name = args.profile.name};
        train_report_totals(&args.launch, &t);
    }
    for (int r = 0; status == FSDP_OK && r < args.world; r++) {
        if (args.launch.backend == TRAIN_BACKEND_SIM || r == args.launch.rank)
            printf("rank %d peak allocated %zu bytes\n", r, sh.peak[r]);
    }
    if (status == FSDP_OK && args.save_path && train_launch_reports(&args.launch))
        printf("saved %s\n", args.save_path);
    if (status == FSDP_OK)
        train_report_outputs(train_launch_reports(&args.launch) ? args.ckpt_dir : NULL, trace_path);

    for (int i = 0; sh.init_weights && i < args.nlayers; i++) {
        free(sh.init_weights[i]);
        free(sh.init_biases[i]);
    }
    free(sh.init_weights);
    free(sh.init_biases);
    free(sh.x);
    free(sh.y);
    free(sh.peak);
    free(sh.losses);
    return status == FSDP_OK ? 0 : 1;
}
