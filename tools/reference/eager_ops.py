"""One GPU, PyTorch: the memory bandwidth eager element-wise ops reach, by how PyTorch runs them.

    python3 tools/reference/eager_ops.py [--json FILE]

PyTorch's TensorIterator runs an element-wise op as a vectorized kernel (vector loads and
stores) only when every operand is contiguous and of one dtype; a broadcast operand, a strided
view or a dtype conversion takes the unrolled or the legacy kernel, with an offset computed per
element and operand and no vector access. The ops below are those of HF's LlamaForCausalLM at
Llama 2 7B's shape (batch 2, 4096 tokens, width 4096, 32 heads of 128), each timed alone (CUDA
events, the median of 20 after 3 warm-ups); each row gives the bytes it must move (every
operand read once, the output written once; a broadcast operand counted once), the time, and
bytes / time in TB/s. A device-to-device copy of 1 GiB is the reference rate.
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_step import timed  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    B, T, D, H = 2, 4096, 4096, 32
    hd, F_ = D // H, 11008
    n = B * T * D
    rows = []

    def row(name, path, fn, nbytes):
        t = timed(fn, warmup=3, reps=20)
        rows.append({"op": name, "path": path, "bytes": nbytes, "s": t,
                     "tb_per_s": nbytes / t / 1e12})
        print("%-44s %-10s %8.1f us %6.2f TB/s" % (name, path, t * 1e6, nbytes / t / 1e12),
              flush=True)

    big = torch.empty(1 << 28, device=dev, dtype=torch.float32)
    row("d2d copy 1 GiB", "copy", lambda: big.clone(), 2 * big.numel() * 4)
    del big
    for dt, e in ((torch.bfloat16, 2), (torch.float32, 4)):
        s = "bf16" if e == 2 else "f32"
        x = torch.randn(B, T, D, device=dev, dtype=dt)
        y = torch.randn(B, T, D, device=dev, dtype=dt)
        w = torch.randn(D, device=dev, dtype=dt)
        r = torch.randn(B, T, 1, device=dev, dtype=dt)
        row(s + " x.clone()", "vectorized", lambda: x.clone(), 2 * n * e)
        row(s + " x + y", "vectorized", lambda: x + y, 3 * n * e)
        row(s + " y.add_(x)", "vectorized", lambda: y.add_(x), 3 * n * e)
        row(s + " x * x", "vectorized", lambda: x * x, 2 * n * e)
        row(s + " x.pow(2)", "vectorized", lambda: x.pow(2), 2 * n * e)
        row(s + " -x", "vectorized", lambda: -x, 2 * n * e)
        row(s + " w * x  (w [D])", "broadcast", lambda: w * x, 2 * n * e + D * e)
        row(s + " x * r  (r [B,T,1])", "broadcast", lambda: x * r, 2 * n * e + B * T * e)
        row(s + " x.mean(-1, keepdim)", "reduce", lambda: x.mean(-1, keepdim=True),
            n * e + B * T * e)
        row(s + " x.sum((0, 1))", "reduce", lambda: x.sum((0, 1)), n * e + D * e)
        # q as HF makes it: q_proj(x).view(B, T, H, hd).transpose(1, 2)
        q = x.view(B, T, H, hd).transpose(1, 2)
        cos = torch.randn(1, 1, T, hd, device=dev, dtype=dt)
        row(s + " q * cos  (q a transposed view)", "strided", lambda: q * cos,
            2 * n * e + T * hd * e)
        qc = q.contiguous()
        row(s + " qc * cos  (qc contiguous)", "broadcast", lambda: qc * cos,
            2 * n * e + T * hd * e)
        row(s + " -q[..., hd/2:]  (view)", "strided", lambda: -q[..., hd // 2:], n * e)
        x1, x2 = q[..., : hd // 2], q[..., hd // 2:]
        row(s + " cat((-x2, x1), -1)  (views)", "strided", lambda: torch.cat((x2, x1), -1),
            2 * n * e)
        row(s + " q.transpose(1,2).contiguous()", "strided",
            lambda: qc.transpose(1, 2).contiguous(), 2 * n * e)
        g = torch.randn(B, T, F_, device=dev, dtype=dt)
        u = torch.randn(B, T, F_, device=dev, dtype=dt)
        row(s + " silu(g)  [B,T,F]", "vectorized", lambda: F.silu(g), 2 * B * T * F_ * e)
        row(s + " g * u  [B,T,F]", "vectorized", lambda: g * u, 3 * B * T * F_ * e)
        del x, y, g, u, q, qc
    xb = torch.randn(B, T, D, device=dev, dtype=torch.bfloat16)
    xf = torch.randn(B, T, D, device=dev, dtype=torch.float32)
    row("bf16 -> f32 x.to(f32)", "cast", lambda: xb.to(torch.float32), 6 * n)
    row("f32 -> bf16 x.to(bf16)", "cast", lambda: xf.to(torch.bfloat16), 6 * n)
    logits = torch.randn(B * T, 32000, device=dev, dtype=torch.bfloat16)
    row("bf16 -> f32 logits.float() [BT,V]", "cast", lambda: logits.float(), 6 * B * T * 32000)
    lf = logits.float()
    row("f32 log_softmax [BT,V]", "reduce", lambda: F.log_softmax(lf, -1), 8 * B * T * 32000)
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
