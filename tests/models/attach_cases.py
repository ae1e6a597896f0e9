"""Small training scripts with no GradScope in them, for ``gradscope attach`` (see
tests/test_attach_cases.py): each ``--case`` is a loop a user could have written.

- ``save``: keeps an EMA ``copy.deepcopy`` of the model from step 0 on, updated and called
  (with autograd on) every step, then ``torch.save``s and pickles the model and the EMA;
- ``save-by-hand``: the same, with the weights updated by hand after ``clip_grad_value_``
  (no optimizer), as pytorch/examples' word_language_model does by default;
- ``nan-pixel``: a NaN pixel in the batch of step ``--bad-step``;
- ``sqrt0``: a distance ``sqrt(sum(a**2))`` of a zero row at step ``--bad-step``: finite
  forward, NaN backward (with ``--micro N``, in the last of N micro-batches of the step);
- ``fp16-sgd``: float16 autocast and a CPU GradScaler with SGD; from step ``--bad-step``
  on, the input grows past float16's range, so the loss is Inf at every later step;
- ``fp16-fused``: float16 autocast, a CPU GradScaler with a large initial scale (so the
  scaled gradients overflow for the first steps: the scaler halves it) and a fused Adam,
  no ``unscale_``;
- ``clip``: gradients of about 1e4, clipped to 1.0 (``clip_grad_norm_``) before each step;
- ``forward``: the model trained through ``model.forward(x)``, never ``model(x)``.

``--watch`` makes the same loop call ``gradscope.watch`` itself (the reference attach is
compared with) and print each step's loss, total norm, ``skipped`` and origin as a JSON
line.
"""

import argparse
import copy
import io
import json
import pickle

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 1)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Distance(nn.Module):
    def forward(self, a):
        return torch.sqrt((a**2).sum(-1, keepdim=True))


class SqrtNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 8, bias=False)
        self.dist = Distance()
        self.head = nn.Linear(1, 1)

    def forward(self, x):
        return self.head(self.dist(self.proj(x)))


def batch(step, case, bad_step):
    generator = torch.Generator().manual_seed(step)
    x = torch.randn(16, 4, generator=generator)
    y = torch.randn(16, 1, generator=generator)
    if step == bad_step and case == "nan-pixel":
        x[5, 2] = float("nan")
    if step == bad_step and case == "sqrt0":
        x[3] = 0.0
    if step >= bad_step and case == "fp16-sgd":
        x = x * 1e6  # past float16's 65504 in the forward: Inf, then NaN
    if case == "clip":
        y = y * 1e4  # gradients of about 1e4
    return x, y


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--bad-step", type=int, default=-1)
    parser.add_argument("--watch", action="store_true")
    parser.add_argument("--out", default="saved")
    parser.add_argument("--micro", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = (SqrtNet() if args.case == "sqrt0" else Net()).to(device)
    fp16 = args.case.startswith("fp16")
    if args.case == "fp16-fused":
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scale = 2.0**24 if args.case == "fp16-fused" else 2.0**16
    scaler = torch.amp.GradScaler(device.type, init_scale=scale) if fp16 else None
    ema = None
    watch = None
    if args.watch:
        import gradscope

        watch = gradscope.watch(model, scaler=scaler, optimizer=optimizer)
    for step in range(args.steps):
        x, y = (t.to(device) for t in batch(step, args.case, args.bad_step))
        optimizer.zero_grad()
        for micro in range(args.micro - 1):  # the step's earlier micro-batches, all clean
            clean_x, clean_y = (t.to(device) for t in batch(1000 + micro, args.case, args.bad_step))
            (((model(clean_x) - clean_y) ** 2).mean() / args.micro).backward()
        with torch.autocast(device.type, dtype=torch.float16, enabled=fp16):
            output = model.forward(x) if args.case == "forward" else model(x)
            loss = ((output.float() - y) ** 2).mean()
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        if watch is not None:
            stats = watch.collect(loss)
            seen = {"step": stats.step, "loss": stats.loss, "total": stats.total_grad_norm}
            seen["skipped"] = stats.skipped
            if stats.origin is not None:
                fields = ("step", "phase", "module", "tensor", "op", "line")
                seen["origin"] = {name: getattr(stats.origin, name) for name in fields}
            print(json.dumps(seen))
        if args.case == "clip":
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            print(f"step {step} norm {norm.item():.1f}")
        if args.case == "save-by-hand":
            torch.nn.utils.clip_grad_value_(model.parameters(), 0.5)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-0.01)
        elif scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        if args.case.startswith("save") and ema is None:
            ema = copy.deepcopy(model)  # a teacher that follows the model
        elif ema is not None:
            with torch.no_grad():
                for kept, new in zip(ema.parameters(), model.parameters(), strict=True):
                    kept.mul_(0.9).add_(new, alpha=0.1)
            print(f"step {step} ema {ema(x + 1).sum().item():.6f}")  # with autograd on
        print(f"step {step} loss {loss.item():.6f}")
    if watch is not None:
        watch.close()
    if ema is not None:
        torch.save(model, f"{args.out}.model.pt")
        torch.save({"model": model.state_dict(), "ema": ema}, f"{args.out}.ema.pt")
        pickled = pickle.dumps((model, ema))
        again = pickle.loads(pickled)
        with open(f"{args.out}.model.pt", "rb") as saved:
            restored = torch.load(io.BytesIO(saved.read()), weights_only=False)
        copies = (*again, restored, ema)
        print(
            "hooks on the copies:",
            [len(m._forward_pre_hooks) + len(m._forward_hooks) for m in copies],
        )
        print("their own call:", [m._compiled_call_impl for m in copies])
        print("state keys:", sorted(model.state_dict()))


if __name__ == "__main__":
    main()
