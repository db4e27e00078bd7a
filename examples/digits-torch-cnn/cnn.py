"""The digits as 8x8 images through a small convolutional network: PyTorch's full mode.

trainstack starts the process group (gloo on CPU, NCCL on a GPU) before `train(ctx)` runs;
the job wraps its model in DistributedDataParallel, resumes from its own checkpoint in
`ctx.checkpoint_dir` (a retried stage starts the job again), reports each epoch with
`ctx.report` and saves with `ctx.save_model`.
"""

from __future__ import annotations

import os
from typing import Any


def build(ctx: Any) -> Any:
    nn = ctx.torch.nn
    channels = int(ctx.params["channels"])
    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, channels, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(channels, 2 * channels, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(2 * channels * 4 * 4, ctx.n_classes),
    )


def evaluate(ctx: Any, model: Any, x: Any, y: Any) -> tuple[float, float]:
    torch = ctx.torch
    model.eval()
    with torch.no_grad():
        out = model(x)
        loss = float(torch.nn.functional.cross_entropy(out, y))
        accuracy = float((out.argmax(dim=1) == y).float().mean())
    return loss, accuracy


def train(ctx: Any) -> dict[str, float]:
    torch = ctx.torch
    torch.manual_seed(ctx.seed)
    model = build(ctx).to(ctx.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=float(ctx.params["learning_rate"]))
    path = os.path.join(ctx.checkpoint_dir, "cnn.pt")
    start = 0
    if os.path.exists(path):  # a retried stage: go on from the last finished epoch
        state = torch.load(path, map_location=ctx.device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["epoch"])
    ddp = torch.nn.parallel.DistributedDataParallel(model) if ctx.world_size > 1 else model
    x = torch.as_tensor(ctx.x).float().to(ctx.device)
    y = torch.as_tensor(ctx.y).long().to(ctx.device)
    x_val = torch.as_tensor(ctx.x_val).float().to(ctx.device)
    y_val = torch.as_tensor(ctx.y_val).long().to(ctx.device)
    batch = ctx.batch_size
    val_loss = val_accuracy = 0.0
    for epoch in range(start, ctx.epochs):
        ddp.train()
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        for step in range(ctx.steps_per_epoch):
            idx = order[step * batch : (step + 1) * batch]
            loss = torch.nn.functional.cross_entropy(ddp(x[idx]), y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        val_loss, val_accuracy = evaluate(ctx, model, x_val, y_val)
        ctx.report(epoch=epoch + 1, val_loss=val_loss, val_accuracy=val_accuracy)
        if ctx.is_chief:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save({**state, "epoch": epoch + 1}, path)
    ctx.save_model(model)
    return {"val_loss": val_loss, "val_accuracy": val_accuracy}
