"""One GPU, PyTorch: the step time of a Llama-shaped model trained as FSDP's bf16 mixed precision
trains it (bf16 parameters and activations for compute, f32 master weights, gradients and AdamW
state), with SDPA attention, next to the GEMMs and the attention of one layer timed alone.

    python3 tools/reference/llama_step.py [--layers L] [--seq T] [--batch B] [--json FILE]
                                          [--kernels FILE] [--ops FILE]
                                          [--sdpa default|flash|cudnn|efficient]
                                          [--checkpointing]

--kernels FILE also profiles two steps (torch.profiler, CUDA activity) and writes what the GPU
ran in them: the kernel time per step by kind (GEMM, attention, optimizer, element-wise,
reduction, copy, other), the time the GPU sat idle inside a step (the host's launch and
dispatch cost that no kernel covers), and the 60 kernels of most total time, with their counts.
--ops FILE profiles two more steps with the input shapes recorded and writes the GPU time per
step of each aten operator (self time: the kernels it launched itself) by input shapes, the 80
of most time. --sdpa picks SDPA's backend for the whole run (default: PyTorch's choice;
flash is FlashAttention-2, cudnn cuDNN's fused attention).

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


def mixed_precision_step(model, ids):
    """FSDP MixedPrecision(param_dtype=bf16)'s arithmetic without FSDP: the model computes in
    bf16, its gradients go to f32 master weights, fused AdamW steps those and the bf16 copy is
    refreshed from them. Returns the step and its forward + backward alone."""
    master = [p.detach().float().clone() for p in model.parameters()]
    model.to(torch.bfloat16)
    for p, m in zip(model.parameters(), master):
        m.grad = torch.zeros_like(m)
    opt = torch.optim.AdamW(master, lr=1e-4, fused=True)

    def fwd_bwd():
        model(input_ids=ids, labels=ids).loss.backward()

    def step():
        fwd_bwd()
        for p, m in zip(model.parameters(), master):
            m.grad.copy_(p.grad)
            p.grad = None
        opt.step()
        with torch.no_grad():
            for p, m in zip(model.parameters(), master):
                p.copy_(m)

    return step, fwd_bwd


def profile_and_save(out, step, args):
    """--kernels, --ops and --json of the step's scripts."""
    if args.kernels:
        out["kernels"] = profile_kernels(step, args.kernels)
    if args.ops:
        profile_ops(step, args.ops)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


KINDS = [("gemm", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "gemv")),
         ("attention", ("flash", "fmha", "attention", "attn")),
         ("optimizer", ("adam", "multi_tensor", "foreach")),
         ("reduction", ("reduce", "norm", "softmax", "logsumexp", "nll")),
         ("copy", ("copy", "memcpy", "memset", "cat", "fill")),
         ("elementwise", ("elementwise", "vectorized", "unrolled", "pointwise"))]


def kernel_kind(name):
    low = name.lower()
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return kind
    return "other"


def profile_kernels(step, path, steps=2):
    """What the GPU ran in `steps` profiled steps, per step (see the module's docstring)."""
    import os
    import tempfile
    from torch.profiler import ProfilerActivity, profile
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    fd, raw = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    prof.export_chrome_trace(raw)
    with open(raw) as f:
        events = json.load(f)["traceEvents"]
    os.remove(raw)
    gpu = [e for e in events if e.get("ph") == "X" and
           e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    gpu.sort(key=lambda e: e["ts"])
    by_name, by_kind = {}, {}
    for e in gpu:
        n = by_name.setdefault(e["name"], [0.0, 0])
        n[0] += e["dur"]
        n[1] += 1
        k = kernel_kind(e["name"]) if e["cat"] == "kernel" else "copy"
        by_kind[k] = by_kind.get(k, 0.0) + e["dur"]
    busy, end = 0.0, None
    for e in gpu:  # the union of the kernels' intervals
        a, b = e["ts"], e["ts"] + e["dur"]
        if end is None or a > end:
            busy += b - a
            end = b
        elif b > end:
            busy += b - end
            end = b
    span = gpu[-1]["ts"] + gpu[-1]["dur"] - gpu[0]["ts"] if gpu else 0.0
    res = {"steps": steps, "kernels_per_step": len(gpu) / steps,
           "span_ms_per_step": span / steps / 1e3, "busy_ms_per_step": busy / steps / 1e3,
           "idle_ms_per_step": (span - busy) / steps / 1e3,
           "by_kind_ms_per_step": {k: v / steps / 1e3 for k, v in
                                   sorted(by_kind.items(), key=lambda kv: -kv[1])},
           "top": [{"name": n[:160], "kind": kernel_kind(n), "ms_per_step": v[0] / steps / 1e3,
                    "count_per_step": v[1] / steps}
                   for n, v in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:60]]}
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({k: v for k, v in res.items() if k != "top"}, indent=1), flush=True)
    return res


def profile_ops(step, path, steps=2):
    """Each operator's own GPU time per step, by input shapes (see the module's docstring)."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 record_shapes=True) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages(group_by_input_shape=True):
        t = getattr(e, "self_device_time_total", None)
        if t is None:
            t = getattr(e, "self_cuda_time_total", 0.0)
        if t > 0 and e.key.startswith("aten::"):  # operators, not their kernels' own rows
            rows.append({"op": e.key, "shapes": str(e.input_shapes)[:200],
                         "ms_per_step": t / steps / 1e3, "count_per_step": e.count / steps})
    rows.sort(key=lambda r: -r["ms_per_step"])
    rows = rows[:80]
    total = sum(r["ms_per_step"] for r in rows)
    with open(path, "w") as f:
        json.dump({"steps": steps, "self_ms_per_step_listed": total, "ops": rows}, f, indent=1)
    print("ops: %.2f ms per step of operators' own GPU time" % total, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--kernels")
    ap.add_argument("--ops")
    ap.add_argument("--checkpointing", action="store_true",
                    help="HF's gradient checkpointing of every decoder layer (full)")
    ap.add_argument("--sdpa", default="default", choices=["default", "flash", "cudnn", "efficient"])
    args = ap.parse_args()
    from transformers import LlamaConfig, LlamaForCausalLM

    if args.sdpa != "default":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                   "efficient": SDPBackend.EFFICIENT_ATTENTION}[args.sdpa]
        sdpa_ctx = sdpa_kernel(backend)  # entered for the whole run, held until main returns
        sdpa_ctx.__enter__()
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    d, h, ffn, vocab, B, T = 4096, 32, 11008, 32000, args.batch, args.seq
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "layers": args.layers, "seq": T, "batch": B, "sdpa": args.sdpa,
           "checkpointing": args.checkpointing}

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
    if args.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(0, vocab, (B, T), device=dev)
    step, fwd_bwd = mixed_precision_step(model, ids)
    n_params = sum(p.numel() for p in model.parameters())

    torch.cuda.reset_peak_memory_stats()
    t_step = timed(step, warmup=3, reps=8)
    t_fb = timed(lambda: (fwd_bwd(), [setattr(p, "grad", None) for p in model.parameters()]),
                 warmup=1, reps=5)
    out["model"] = {"params": n_params, "step_s": t_step, "fwd_bwd_s": t_fb,
                    "tokens_per_s": B * T / t_step,
                    "mfu_6n": 6 * n_params * B * T / t_step / 989.4e12,
                    "peak_allocated": torch.cuda.max_memory_allocated()}
    print(json.dumps(out, indent=1))
    profile_and_save(out, step, args)


if __name__ == "__main__":
    sys.exit(main())
