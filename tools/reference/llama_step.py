"""One GPU, PyTorch: the step time of a Llama-shaped model trained as FSDP's bf16 mixed precision
trains it (bf16 parameters and activations for compute, f32 master weights, gradients and AdamW
state), with SDPA attention, next to the GEMMs and the attention of one layer timed alone.

    python3 tools/reference/llama_step.py [--layers L] [--seq T] [--batch B] [--json FILE]

The shape is Llama 2 7B's (width 4096, 32 heads, FFN 11008, vocabulary 32000) with L layers
(default 4), so that it fits one GPU with no sharding; fsdp-plan's prediction for the same job
(world 1, docs/fidelity.md) is compared with it. Times are CUDA-event medians after warm-up.
"""
import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F


def timed(fn, warmup=3, reps=10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    from transformers import LlamaConfig, LlamaForCausalLM

    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    d, h, ffn, vocab, B, T = 4096, 32, 11008, 32000, args.batch, args.seq
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "layers": args.layers, "seq": T, "batch": B}

    # ---- one layer's GEMMs (bf16 in, f32 accumulate, bf16 out), forward shapes ----
    M = B * T
    peak = None
    gemms = {"qkvo": (M, d, d), "gate_up": (M, ffn, d), "down": (M, d, ffn), "head": (M, vocab, d)}
    out["gemm"] = {}
    for name, (m, n, k) in gemms.items():
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        t = timed(lambda: a @ w.t())
        out["gemm"][name] = {"m": m, "n": n, "k": k, "s": t, "tflops": 2 * m * n * k / t / 1e12}
    big = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    t = timed(lambda: big @ big)
    out["gemm_8192_tflops"] = 2 * 8192**3 / t / 1e12

    # ---- causal SDPA, forward and forward + backward ----
    q, k, v = (torch.randn(B, h, T, d // h, device=dev, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    def fb():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o.backward(torch.ones_like(o))
    fb_t = timed(fb)
    flops_fwd = 4 * B * h * T * T * (d // h) / 2  # causal: half of QK^T and PV
    out["sdpa"] = {"fwd_s": fwd, "fwd_bwd_s": fb_t, "fwd_tflops": flops_fwd / fwd / 1e12,
                   "fwd_bwd_tflops": 3.5 * flops_fwd / fb_t / 1e12}
    del q, k, v, big
    print(json.dumps(out, indent=1), flush=True)

    # ---- the model: bf16 compute copy, f32 master + AdamW ----
    cfg = LlamaConfig(hidden_size=d, intermediate_size=ffn, num_hidden_layers=args.layers,
                      num_attention_heads=h, num_key_value_heads=h, vocab_size=vocab,
                      max_position_embeddings=T, rms_norm_eps=1e-5, rope_theta=10000.0,
                      tie_word_embeddings=False, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(dev)
    master = [p.detach().float().clone() for p in model.parameters()]
    model.to(torch.bfloat16)
    for p, m in zip(model.parameters(), master):
        m.grad = torch.zeros_like(m)
    opt = torch.optim.AdamW(master, lr=1e-4, fused=True)
    n_params = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, vocab, (B, T), device=dev)

    def fwd_bwd():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()

    def step():
        fwd_bwd()
        for p, m in zip(model.parameters(), master):
            m.grad.copy_(p.grad)
            p.grad = None
        opt.step()
        with torch.no_grad():
            for p, m in zip(model.parameters(), master):
                p.copy_(m)

    torch.cuda.reset_peak_memory_stats()
    t_step = timed(step, warmup=3, reps=8)
    t_fb = timed(lambda: (fwd_bwd(), [setattr(p, "grad", None) for p in model.parameters()]),
                 warmup=1, reps=5)
    out["model"] = {"params": n_params, "step_s": t_step, "fwd_bwd_s": t_fb,
                    "tokens_per_s": B * T / t_step,
                    "mfu_6n": 6 * n_params * B * T / t_step / 989.4e12,
                    "peak_allocated": torch.cuda.max_memory_allocated()}
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
