/* fsdp-train's command line (train_args.h): the options, their checks and --help. */
#include "train_args.h"

#include <fsdp/fsdp.h>

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
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
        "  --local-batch B            per-rank micro-batch: the global batch is B x the\n"
        "                             world x --grad-accum\n"
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
        "  --threads N                sim: the threads that compute, all ranks together\n"
        "                             (default: the online CPUs); more ranks than N run as\n"
        "                             fibers on N worker threads, fewer ranks than N each\n"
        "                             split their GEMMs and other large kernels across N /\n"
        "                             world threads: the same results bit for bit\n"
        "  --host-memory BYTES        sim: the most host memory the simulated ranks' memory\n"
        "                             may take, all together, with K/M/G/T; 0 is unlimited\n"
        "                             (default 90% of the memory available); a model that\n"
        "                             needs more is refused at once\n"
        "  --no-pack-cache            sim: pack the LM head's weight at every micro-batch\n"
        "                             instead of keeping it packed while it is unchanged\n"
        "                             (saves its size per rank; the same results)\n"
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
    OPT_HOST_MEMORY,
    OPT_NO_PACK_CACHE
};

void train_parse_args(int argc, char **argv, train_args_t *a)
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
        {"no-pack-cache", no_argument, NULL, OPT_NO_PACK_CACHE},
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
    int no_pack_cache = 0;

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
                    cli_fail_quietly();
                a->gpt = 1;
                break;
            }
            if (a->gpt) {
                if (fsdp_gpt2_config_parse(optarg, &a->gpt_cfg) != FSDP_OK)
                    cli_fail_quietly();
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
        case OPT_NO_PACK_CACHE: no_pack_cache = 1; break;
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
    cli_no_arguments(argc, argv, &a->fsdp);
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
            cli_fail_quietly(); /* the library said what is wrong and what is allowed */
        if (a->ops >= 0)
            a->profile.ops = (fsdp_sim_ops_t)a->ops;
    }
    if (train_launch_prepare(&a->launch, backend, a->world, a->timeout_s, &a->profile) != 0)
        cli_fail_quietly();
    a->world = a->launch.world;
    a->dp = a->world;
    if (a->fsdp.tp_size > 1) {
        if (a->world % a->fsdp.tp_size != 0)
            cli_die("--tp %d does not divide --world %d", a->fsdp.tp_size, a->world);
        if (!a->gpt)
            cli_die("--tp %d: tensor parallelism is planned for gpt and llama models only (an "
                    "mlp has no tensor-parallel layout here)",
                    a->fsdp.tp_size);
        a->dp = a->world / a->fsdp.tp_size;
    }
    a->launch.threads = a->threads;
    a->launch.host_memory = host_memory;
    a->launch.no_pack_cache = no_pack_cache;

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
        cli_fail_quietly();
    if (a->gpt && !batch_given)
        a->batch = 8;
    if (local_batch > 0) {
        /* each rank's micro-batch, as fsdp-plan's and torchtitan's local_batch_size: a step is
         * --grad-accum of them on every rank */
        double global = (double)local_batch * a->dp * a->grad_accum;
        if (global > (double)(1 << 24))
            cli_die("--local-batch %d on %d ranks x --grad-accum %d is a global batch over %d",
                    local_batch, a->dp, a->grad_accum, 1 << 24);
        if (batch_given && (double)a->batch != global)
            cli_die("--batch %d and --local-batch %d disagree on %d ranks x --grad-accum %d: "
                    "give one",
                    a->batch, local_batch, a->dp, a->grad_accum);
        a->batch = (int)global;
    } else if (!batch_given && a->batch % a->dp != 0 && (a->gpt || a->data_path == NULL)) {
        int rounded = (a->batch + a->dp - 1) / a->dp * a->dp;
        cli_note("global batch %d %s: the default %d rounded up to a multiple of --world %d "
                 "(--batch or --local-batch sets it)",
                 rounded, a->gpt ? "sequences" : "rows", a->batch, a->dp);
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
    char ranks[64]; /* what the batch is split over */
    if (a->dp < a->world)
        snprintf(ranks, sizeof(ranks), "the %d dp ranks (--world %d / --tp %d)", a->dp, a->world,
                 a->fsdp.tp_size);
    else
        snprintf(ranks, sizeof(ranks), "--world %d", a->world);
    if (a->batch % a->dp != 0)
        cli_die("--batch %d is not divisible by %s: every rank needs the same number of %s "
                "(--local-batch B gives each rank B)",
                a->batch, ranks, a->gpt ? "sequences" : "rows");
    if (a->batch / a->dp % a->grad_accum != 0)
        cli_die("--grad-accum %d does not divide the %d rows of each rank (--batch %d / %s)",
                a->grad_accum, a->batch / a->dp, a->batch, ranks);
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
