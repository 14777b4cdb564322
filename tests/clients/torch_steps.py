#!/usr/bin/env python3
"""A PyTorch training step and a CUDA-graph inference step, whose driver calls
scripts/bench/step-profile.py records on the fake GPU (FAKECUDA_TRACE) to write
tests/fixtures/steps/*.json. An ordinary PyTorch program otherwise: it knows nothing of
gpucap or of the fake.

Usage: torch_steps.py train|graph WARMUP N [BATCH IMAGE]

  train  the step scripts/gpu/probe.py's `train` times on a real GPU (bench-torch-train,
         scripts/gpu/probes/training.py):
         its ResNet-18-like net, SGD with momentum, zero_grad / forward / cross-entropy /
         backward / step, batch BATCH (default 64) of 3 x IMAGE x IMAGE (default 128)
         images, no synchronisation within the step.
  graph  the same net in eval mode captured once with torch.cuda.graph (after warm-up
         runs on a side stream, as PyTorch's documentation does it); a step copies a new
         batch into the captured input (device to device), replays the graph and copies
         the logits to the host (.cpu(), which waits for the stream).

After WARMUP steps it writes `step-profile: begin` to stderr, runs N steps, writes
`step-profile: mid`, runs N more and writes `step-profile: end`, each in one write(2)
to fd 2, so that the markers fall in order among the fake driver's trace lines: what
lies between begin and mid is N steps, between begin and end 2N. Prints
`torch <version> cuda=<version>` and `done` on stdout.
"""

import contextlib
import contextvars
import os
import sys
import time
import weakref

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "gpu"))
# the real-GPU benchmark's net and step, not a copy
from probes.training import resnet18_like, training_step  # noqa: E402


class _Mark:
    """A value only the contexts copied by backward() hold (see autograd_threads_done)."""


_MARK = contextvars.ContextVar("torch_steps_mark")


@contextlib.contextmanager
def autograd_threads_done(bound_s=60.0):
    """Waits, at the end of the block, until PyTorch's autograd device threads have let
    go of every backward pass's graph task. Each backward() stashes a copy of the
    caller's contextvars.Context in the graph task, and a device thread drops that task
    after backward() returned, taking the GIL to release the copy: an interpreter that
    finalizes meanwhile makes the thread exit inside a destructor, and the process aborts
    with "terminate called without an active exception" (pytorch/pytorch#38228; 1 run in
    5 to 10 of the train step on a loaded 2-core machine). A mark set in this context
    is in every copy: once it is gone, so are they (bounded by bound_s)."""
    mark_obj = _Mark()
    gone = weakref.ref(mark_obj)
    token = _MARK.set(mark_obj)
    del mark_obj
    try:
        yield
    finally:
        _MARK.reset(token)
        deadline = time.monotonic() + bound_s
        while gone() is not None and time.monotonic() < deadline:
            time.sleep(0.001)


def mark(what):
    os.write(2, ("step-profile: %s\n" % what).encode())


def train_step(batch, image):
    return training_step(torch, batch, image)


def graph_step(batch, image):
    model = resnet18_like(torch).cuda().eval()
    static_in = torch.randn(batch, 3, image, image, device="cuda")
    batches = [torch.randn(batch, 3, image, image, device="cuda") for _ in range(2)]
    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                model(static_in)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_out = model(static_in)
    turn = [0]

    def step():
        static_in.copy_(batches[turn[0] % 2])
        turn[0] += 1
        g.replay()
        static_out.cpu()

    return step


def main():
    if len(sys.argv) not in (4, 6) or sys.argv[1] not in ("train", "graph"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    what, warmup, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    batch, image = (int(sys.argv[4]), int(sys.argv[5])) if len(sys.argv) == 6 else (64, 128)
    print("torch %s cuda=%s" % (torch.__version__, torch.version.cuda), flush=True)
    with autograd_threads_done():
        step = (train_step if what == "train" else graph_step)(batch, image)
        for _ in range(warmup):
            step()
        torch.cuda.synchronize()
        mark("begin")
        for _ in range(n):
            step()
        mark("mid")
        for _ in range(n):
            step()
        mark("end")
        torch.cuda.synchronize()
        del step
    print("done", flush=True)


if __name__ == "__main__":
    main()
