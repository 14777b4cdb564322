"""probe.py train: one timed PyTorch training run (a ResNet-18-like net, SGD, a fixed random
batch; prints RESULT ms/step). The step is the one both training benchmarks time (here and
scripts/gpu/step_cost.py).
"""

import math
import time

from verdicts import fail, info, mib, ok


def resnet18_like(torch, num_classes=10):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.short = None
            if stride != 1 or cin != cout:
                self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            y = self.b2(self.c2(y))
            return torch.relu(y + (x if self.short is None else self.short(x)))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
              nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)]
    return nn.Sequential(*layers)


def training_step(torch, batch, image):
    """One SGD step of resnet18_like on a fixed random batch (a function returning the
    loss): the step both training benchmarks time (train, scripts/gpu/step_cost.py)."""
    torch.manual_seed(0)
    model = resnet18_like(torch).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(batch, 3, image, image, device="cuda")
    y = torch.randint(0, 10, (batch,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def cmd_train(a):
    import torch
    step = training_step(torch, a.batch, a.image)
    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    after = torch.cuda.memory_stats()
    value = float(loss)
    if not math.isfinite(value):
        fail("the loss is %r" % value)
    # the driver allocations PyTorch made while timed (what gpucap's hooks could cost)
    calls = ", ".join("%s %d" % (k, after.get(k, 0) - before.get(k, 0)) for k in ("num_device_alloc", "num_device_free"))
    info("loss %.4f, peak reserved %s; during the timed steps: %s" % (value, mib(torch.cuda.max_memory_reserved()), calls))
    print("RESULT %.3f steps=%d batch=%d image=%d" % (dt * 1000 / a.steps, a.steps, a.batch, a.image), flush=True)
    ok("%.3f ms per step" % (dt * 1000 / a.steps))
