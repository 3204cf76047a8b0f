#!/usr/bin/env python3
"""PyTorch twin of examples/fashion_cnn.c: the same model, initialisation
(PyTorch's default, which cten's layers copy), optimizer, cosine schedule,
batch size, epochs and data order scheme (a seeded permutation per epoch).

    python3 examples/reference/fashion_cnn.py [--epochs N] [--device cpu|cuda] ...
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

import fashion_common as fc


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)   # [B, 16, 14, 14]
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)   # [B, 32, 7, 7]
        return self.fc(x.flatten(1))                 # [B, 10]


def main():
    args = fc.parse_args("Trains the CNN on Fashion-MNIST.", epochs=10, batch_size=64,
                         optimizer="adamw", lr=2e-3, momentum=0.9, weight_decay=1e-2)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    (train_x, train_y), (test_x, test_y) = fc.load_data(args)
    torch.manual_seed(args.seed)
    model = CNN().to(device)
    opt = fc.make_optimizer(args, model)
    scaler = fc.grad_scaler(args, device)
    gen = torch.Generator().manual_seed(args.seed)
    n = len(train_x)
    steps = (n + args.batch_size - 1) // args.batch_size
    total = args.epochs * steps
    print(f"pytorch {torch.__version__} cnn: {n} training / {len(test_x)} test images, "
          f"{args.epochs} epochs of {steps} steps, batch {args.batch_size}, {args.optimizer} "
          f"lr {args.lr}, amp {args.amp}, device {device}, {torch.get_num_threads()} threads",
          flush=True)
    step, best, t_start = 0, 0.0, fc.now()
    for epoch in range(args.epochs):
        t0 = fc.now()
        perm = torch.randperm(n, generator=gen)
        loss_sum = torch.zeros((), device=device)
        for b in range(steps):
            idx = perm[b * args.batch_size:(b + 1) * args.batch_size]
            x, y = train_x[idx].to(device), train_y[idx].to(device)
            for g in opt.param_groups:
                g["lr"] = fc.cosine_lr(args.lr, step, total)
            with fc.autocast(args, device):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            loss_sum += loss.detach()
            step += 1
        fc.sync(device)
        train_time = fc.now() - t0
        t1 = fc.now()
        acc, test_loss = fc.evaluate(model, test_x, test_y, device, args=args)
        best = max(best, acc)
        print(f"epoch {epoch + 1}/{args.epochs} done: train loss {loss_sum.item() / steps:.6f}  "
              f"test loss {test_loss:.6f}  test accuracy {100 * acc:.2f}%  "
              f"(train {train_time:.1f} s, {n / train_time:.0f} samples/s; "
              f"test {fc.now() - t1:.1f} s)", flush=True)
    print(f"best test accuracy {100 * best:.2f}%, total time {fc.now() - t_start:.1f}s")


if __name__ == "__main__":
    main()
