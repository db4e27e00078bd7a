"""A torch rank's model state (runs in each rank, a barrier task's Python process, beside
frameworks/torch.py): FSDP's sharding of the model, the checkpoint a retried stage resumes from
(`backup/torch-checkpoint.pt` in the run directory, written by the chief), and the saved model
(`model.pt`, and torch.export's program `model.pt2` where the model traces). With FSDP every
rank takes part in gathering the whole state; only the chief writes it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trainstack_training.context import JobContext
from trainstack_training.rundir import EXPORTED_FILE, TORCH_CHECKPOINT


def checkpoint_path(ctx: JobContext) -> Path:
    """The checkpoint in the run's backup directory (ctx.checkpoint_dir)."""
    return Path(ctx.checkpoint_dir) / TORCH_CHECKPOINT


def shard(torch: Any, model: Any) -> None:
    """FSDP (torch.distributed.fsdp.fully_shard): each submodule with parameters of its own,
    then the model, sharded across the ranks."""
    from torch.distributed.fsdp import fully_shard

    for module in list(model.modules())[1:]:
        if any(True for _ in module.parameters(recurse=False)):
            fully_shard(module)
    fully_shard(model)


def shard_sizes(model: Any) -> tuple[int, int]:
    """The model's parameters (elements) that this rank holds, and the whole model's: a
    sharded parameter (a DTensor) counts its local shard."""
    local = total = 0
    for param in model.parameters():
        total += param.numel()
        local += param.to_local().numel() if hasattr(param, "to_local") else param.numel()
    return local, total


def sharded(model: Any) -> bool:
    """Whether `model` is sharded by FSDP."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_state(model: Any, optimizer: Any = None) -> tuple[Any, Any]:
    """The model's (and optimizer's) whole state. For a sharded model this gathers the
    shards: every rank must call it; the chief gets the state (the others an empty one)."""
    if not sharded(model):
        return model.state_dict(), (optimizer.state_dict() if optimizer is not None else None)
    from torch.distributed.checkpoint import state_dict as dcp

    options = dcp.StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = dcp.get_model_state_dict(model, options=options)
    if optimizer is None:
        return state, None
    return state, dcp.get_optimizer_state_dict(model, optimizer, options=options)


def checkpoint(ctx: JobContext, model: Any, optimizer: Any, epochs_done: int) -> None:
    """The chief writes model, optimizer and epoch to shared storage (replaced atomically);
    with FSDP every rank takes part in gathering them."""
    state, optimizer_state = full_state(model, optimizer)
    if not ctx.is_chief:
        return
    path = checkpoint_path(ctx)
    tmp = path.with_name(f".{path.name}.partial")
    ctx.torch.save({"model": state, "optimizer": optimizer_state, "epoch": epochs_done}, tmp)
    os.replace(tmp, path)


def resume(ctx: JobContext, model: Any, optimizer: Any) -> int:
    """Load the last checkpoint, if any (a retried stage, or a rerun of an interrupted job);
    the number of epochs it had finished. Every rank reads the whole state."""
    path = checkpoint_path(ctx)
    if not path.is_file():
        return 0
    state = ctx.torch.load(path, map_location="cpu", weights_only=True)
    if sharded(model):
        from torch.distributed.checkpoint import state_dict as dcp

        options = dcp.StateDictOptions(full_state_dict=True)
        dcp.set_model_state_dict(model, state["model"], options=options)
        dcp.set_optimizer_state_dict(model, optimizer, state["optimizer"], options=options)
    else:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    epochs_done = int(state["epoch"])
    print(f"resuming from {path}: {epochs_done} epoch(s) done", flush=True)
    return epochs_done


def save_model(ctx: JobContext, model: Any) -> None:
    """The chief saves the model's state_dict (model.pt) and, where torch.export traces it on
    two validation rows, the exported program beside it (model.pt2, loadable without the
    job's code: torch.export.load). Every rank calls it (an FSDP model's shards are gathered
    first); the others save nothing."""
    torch = ctx.torch
    inner = getattr(model, "module", model)  # a DistributedDataParallel's model
    state, _ = full_state(inner)
    if not ctx.is_chief:
        return
    torch.save(state, ctx.model_path)
    saved = Path(ctx.model_path)
    exported = saved.with_name(EXPORTED_FILE)
    exported.unlink(missing_ok=True)
    if sharded(inner):
        print(f"no exported copy of an FSDP model: load {saved.name} into your model", flush=True)
        return
    if ctx.own_data:
        print(
            "no exported copy of the model: the job reads its own data, so trainstack has no "
            f"rows to trace it with; load {saved.name} into your model",
            flush=True,
        )
        return
    try:
        first, _ = next(iter(ctx.data.val_batches(2)))  # two rows, in memory or streamed
        example = torch.tensor(first).float().to(ctx.device)
        torch.export.save(torch.export.export(inner.eval(), (example,)), str(exported))
    except Exception as exc:  # not every model exports: the state_dict is the model then
        exported.unlink(missing_ok=True)
        print(f"no exported copy of the model ({type(exc).__name__}: {exc})"[:300], flush=True)
