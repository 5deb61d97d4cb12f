/* fsdp-train: trains a built-in model with FSDP on simulated ranks, or on GPUs (--backend gpu:
 * one process per rank, as a launcher starts them; train_launch.c).
 *
 *   fsdp-train --model mlp:16,32,4 --world 4 --strategy full_shard --optim adamw --lr 1e-2
 *              --steps 10
 *
 * Prints "step N loss X" per step (X as %.9g, the mean over the global batch; rank 0 only) and
 * each rank's peak allocated bytes (on the gpu backend, each process its own rank's). The command
 * line is train_args.c's, the one training loop train_loop.c's, the models' own parts
 * train_mlp.c's and train_lm.c's. */
#include <fsdp/fsdp.h>

#include <stdio.h>

#include "cli.h"
#include "train_args.h"
#include "train_loop.h"

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
        cli_fail_quietly(); /* the library said why */
    printf("consolidated %s (step %lld) into %s\n", a->consolidate_dir, (long long)step,
           a->save_path);
    return 0;
}

int main(int argc, char **argv)
{
    train_args_t args;

    cli_init("fsdp-train");
    train_parse_args(argc, argv, &args);
    if (args.consolidate_dir != NULL)
        return consolidate(&args);
    return args.gpt ? train_lm_main(&args, argc, argv) : train_mlp_main(&args, argc, argv);
}
