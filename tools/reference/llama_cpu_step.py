"""PyTorch's eager CPU training step of a Llama, against fsdp-train's step of the same model on
one rank of the sim, in the same run.

    python3 tools/reference/llama_cpu_step.py --fsdp-train PATH [--model M] [--batch B]
                                              [--seq T] [--steps N] [--threads N]
                                              [--rounds R] [--check-steps N] [--json FILE]

The model is HF's LlamaForCausalLM with its eager attention, written out in plain torch ops
(RMSNorm, rotate_half rotary embeddings, causal softmax attention, SwiGLU, untied head), trained
in f32 with torch.optim.AdamW and the mean cross-entropy, as fsdp-train trains it (AdamW lr
1e-3, betas 0.9, 0.999, eps 1e-8, weight decay 0.01 on every parameter).

First the two are checked to compute the same thing: fsdp-train writes its initial weights
(`--steps 0 --save`, HF's names), both train --check-steps steps from them on the same tokens
(an llm.c shard of this file's bytes, read in order), and their losses must agree within 1e-4
relative at every step. Then the two are timed in turn, R rounds:

- PyTorch: the CPU time of the process (time.process_time(), every thread of torch's pool
  counted) and the wall time of each step after the first, the medians;
- fsdp-train: the CPU and wall times of a run of 1 + N steps less those of a run of 1 step,
  over N (the set-up and the first step cancel), the CPU time from the operating system's
  accounting of the child.

Each round prints both per-step times and their ratios; the last lines are the median ratios
(fsdp-train / PyTorch: below 1, fsdp-train's step is faster). --threads sets torch's intra-op
threads and fsdp-train's --threads alike (interop threads: 1). On one thread the CPU time is
the figure to quote (other work on the machine moves it less); on more, the CPU time counts
every thread's work, so the wall time on a quiet machine is the one that shows a thread's gain.

Models: stories15M (llama2.c's 15M shape: 6 layers of 288, 6 heads, SwiGLU of 768, vocabulary
32000; B=4, T=256 by default) and llama-tiny (fsdp-train's preset; B=32, T=64).
"""
import argparse
import json
import os
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

MODELS = {
    "stories15M": ("llama:layers=6,heads=6,kv_heads=6,dim=288,ffn=768,seq=256,vocab=32000", 4, 256),
    "llama-tiny": ("llama-tiny", 32, 64),
}

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def read_safetensors(path):
    """A safetensors file as {name: tensor} (f32 copies)."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        t = torch.frombuffer(bytearray(blob[base + a : base + b]), dtype=DTYPES[meta["dtype"]])
        out[name] = t.reshape(meta["shape"]).float().clone()
    return out


def write_shard(path, data):
    """An llm.c token shard (magic 20240520, version 1, uint16 ids) of the bytes `data`."""
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, len(data)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % len(data), *data))


class Llama(torch.nn.Module):
    """HF's LlamaForCausalLM, eager attention, from a state dict of HF's names."""

    def __init__(self, sd, cfg):
        super().__init__()
        self.cfg = cfg
        self.p = torch.nn.ParameterDict({k.replace(".", "/"): torch.nn.Parameter(v) for k, v in sd.items()})
        hd = cfg["head_dim"]
        inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
        self.inv_freq = inv

    def w(self, name):
        return self.p[name.replace(".", "/")]

    def rms(self, x, name):
        v = x.pow(2).mean(-1, keepdim=True)
        return self.w(name) * (x * torch.rsqrt(v + self.cfg["rms_norm_eps"]))

    def forward(self, ids, targets):
        cfg = self.cfg
        B, T = ids.shape
        H, K, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        pos = torch.arange(T).float()
        freqs = torch.outer(pos, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        mask = torch.full((T, T), float("-inf")).triu(1)

        def rot(x):
            x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
            return x * cos + torch.cat((-x2, x1), dim=-1) * sin

        h = F.embedding(ids, self.w("model.embed_tokens.weight"))
        for i in range(cfg["num_hidden_layers"]):
            p = "model.layers.%d." % i
            x = self.rms(h, p + "input_layernorm.weight")
            q = F.linear(x, self.w(p + "self_attn.q_proj.weight")).view(B, T, H, hd).transpose(1, 2)
            k = F.linear(x, self.w(p + "self_attn.k_proj.weight")).view(B, T, K, hd).transpose(1, 2)
            v = F.linear(x, self.w(p + "self_attn.v_proj.weight")).view(B, T, K, hd).transpose(1, 2)
            q, k = rot(q), rot(k)
            if K != H:
                k = k.repeat_interleave(H // K, dim=1)
                v = v.repeat_interleave(H // K, dim=1)
            s = torch.matmul(q, k.transpose(2, 3)) / (hd**0.5) + mask
            a = torch.matmul(F.softmax(s, dim=-1, dtype=torch.float32), v)
            a = a.transpose(1, 2).reshape(B, T, H * hd)
            h = h + F.linear(a, self.w(p + "self_attn.o_proj.weight"))
            x = self.rms(h, p + "post_attention_layernorm.weight")
            g = F.linear(x, self.w(p + "mlp.gate_proj.weight"))
            u = F.linear(x, self.w(p + "mlp.up_proj.weight"))
            h = h + F.linear(F.silu(g) * u, self.w(p + "mlp.down_proj.weight"))
        h = self.rms(h, "model.norm.weight")
        head = "model.embed_tokens.weight" if cfg.get("tie_word_embeddings") else "lm_head.weight"
        logits = F.linear(h, self.w(head))
        return F.cross_entropy(logits.view(B * T, -1), targets.reshape(-1))


def batches(tokens, B, T, steps):
    """fsdp-train's order of an llm.c shard: window s of B*T + 1 tokens, row b at b*T."""
    n = tokens.numel()
    windows = (n - 1) // (B * T)
    for s in range(steps):
        start = (s % windows) * B * T
        w = tokens[start : start + B * T + 1]
        yield w[:-1].view(B, T).long(), w[1:].view(B, T).long()


def torch_run(weights, config, tokens, B, T, steps):
    """Losses and per-step CPU seconds of PyTorch's steps."""
    model = Llama(read_safetensors(weights), config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    losses, cpu, wall = [], [], []
    for x, y in batches(tokens, B, T, steps):
        t0, w0 = time.process_time(), time.perf_counter()
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        cpu.append(time.process_time() - t0)
        wall.append(time.perf_counter() - w0)
    return losses, cpu, wall


def child_cpu(cmd):
    """Runs cmd; its stdout, the CPU seconds (user + system) the OS charged it and its wall
    seconds."""
    r0, w0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True).stdout
    r1, w1 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    return out, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), w1 - w0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdp-train", required=True, help="the fsdp-train program")
    ap.add_argument("--model", default="stories15M", choices=sorted(MODELS))
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--steps", type=int, default=4, help="timed steps after the first")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--check-steps", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    spec, B, T = MODELS[a.model]
    B, T = a.batch or B, a.seq or T
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)

    tmp = tempfile.mkdtemp(prefix="llama_cpu_step.")
    with open(os.path.abspath(__file__), "rb") as f:
        text = f.read()
    need = B * T * (max(a.steps + 1, a.check_steps)) + 1
    data = (text * (need // len(text) + 1))[:need]
    shard, weights = os.path.join(tmp, "tokens.bin"), os.path.join(tmp, "init.safetensors")
    write_shard(shard, data)
    tokens = torch.tensor(list(data), dtype=torch.int64)
    common = [a.fsdp_train, "--model", spec, "--world", "1", "--threads", str(a.threads), "--batch",
              str(B), "--seq", str(T), "--tokens", shard]
    child_cpu(common + ["--steps", "0", "--save", weights])
    with open(os.path.join(tmp, "config.json")) as f:
        config = json.load(f)

    # the same computation: losses step by step
    out, _, _ = child_cpu(common + ["--steps", str(a.check_steps), "--init", weights])
    ours = [float(line.split()[3]) for line in out.splitlines() if line.startswith("step ")]
    theirs, _, _ = torch_run(weights, config, tokens, B, T, a.check_steps)
    print("losses (fsdp-train, PyTorch %s):" % torch.__version__)
    worst = 0.0
    for i, (x, y) in enumerate(zip(ours, theirs)):
        worst = max(worst, abs(x - y) / abs(y))
        print("  step %d  %.7f  %.7f" % (i + 1, x, y))
    if len(ours) != a.check_steps or worst > 1e-4:
        sys.exit("llama_cpu_step: the losses differ (worst relative %.3g): not the same computation" % worst)

    rows = []
    print("%s, B=%d, T=%d, %d thread(s): seconds per step, CPU (wall)" % (a.model, B, T, a.threads))
    for r in range(a.rounds):
        _, cpu1, wall1 = child_cpu(common + ["--steps", "1", "--init", weights])
        _, cpun, walln = child_cpu(common + ["--steps", str(1 + a.steps), "--init", weights])
        _, cpu, wall = torch_run(weights, config, tokens, B, T, 1 + a.steps)
        row = {"fsdp_train_cpu_s": (cpun - cpu1) / a.steps, "fsdp_train_wall_s": (walln - wall1) / a.steps,
               "torch_cpu_s": statistics.median(cpu[1:]), "torch_wall_s": statistics.median(wall[1:])}
        row["cpu_ratio"] = row["fsdp_train_cpu_s"] / row["torch_cpu_s"]
        row["wall_ratio"] = row["fsdp_train_wall_s"] / row["torch_wall_s"]
        rows.append(row)
        print("  round %d: fsdp-train %.3f (%.3f), PyTorch %.3f (%.3f), ratio %.3f (%.3f)" % (
            r + 1, row["fsdp_train_cpu_s"], row["fsdp_train_wall_s"], row["torch_cpu_s"], row["torch_wall_s"],
            row["cpu_ratio"], row["wall_ratio"]))
    med = {k: statistics.median(row[k] for row in rows) for k in ("cpu_ratio", "wall_ratio")}
    for k, what in (("cpu_ratio", "CPU"), ("wall_ratio", "wall")):
        print("median ratio fsdp-train / PyTorch, %s time: %.3f (%s the PyTorch step)" % (
            what, med[k], "faster than" if med[k] < 1 else "slower than"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "batch": B, "seq": T, "threads": a.threads, "torch": torch.__version__,
                       "torch_config": torch.__config__.show(), "loss_worst_rel": worst, "rounds": rows,
                       "median": med}, f, indent=1)


if __name__ == "__main__":
    main()
