"""One GPU, PyTorch: the step time of HF's GPT-2 124M trained as FSDP's bf16 mixed precision
trains it (bf16 parameters and activations for compute, f32 master weights, gradients and
AdamW state), with HF's eager attention or SDPA, dropout off.

    python3 tools/reference/gpt2_step.py [--batch B] [--seq T] [--attention eager|sdpa]
                                         [--json FILE] [--kernels FILE] [--ops FILE]
                                         [--checkpointing]

fsdp-plan's prediction for the same job is `fsdp-plan --model gpt2 --profile h200 --world 1
--local-batch B --mixed-precision param=bf16,reduce=fp32 [--attention fused]`. --kernels and
--ops profile two more steps as llama_step.py does. Times are CUDA-event medians after warm-up.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_step import mixed_precision_step, profile_and_save, timed  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--attention", default="eager", choices=["eager", "sdpa"])
    ap.add_argument("--json")
    ap.add_argument("--kernels")
    ap.add_argument("--ops")
    ap.add_argument("--checkpointing", action="store_true",
                    help="HF's gradient checkpointing of every decoder layer (full)")
    args = ap.parse_args()
    from transformers import GPT2Config, GPT2LMHeadModel

    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    B, T = args.batch, args.seq
    cfg = GPT2Config(n_positions=max(T, 1024), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     attn_implementation=args.attention)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg).to(dev)
    if args.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(0, cfg.vocab_size, (B, T), device=dev)
    step, _ = mixed_precision_step(model, ids)
    n_params = sum(p.numel() for p in model.parameters())

    torch.cuda.reset_peak_memory_stats()
    t = timed(step, warmup=3, reps=10)
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "model": "gpt2", "params": n_params, "batch": B, "seq": T,
           "attention": args.attention, "checkpointing": args.checkpointing,
           "step_s": t, "tokens_per_s": B * T / t,
           "peak_allocated": torch.cuda.max_memory_allocated()}
    print(json.dumps(out, indent=1), flush=True)
    profile_and_save(out, step, args)


if __name__ == "__main__":
    sys.exit(main())
