"""An example user training loop: linear regression under DDP, reporting each step
and checkpointing so that retries (failure.max_retries) resume where it stopped."""

import os
import tempfile

import ray.train
import ray.train.torch
import torch


def train(config):
    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=config.get("lr", 0.1))
    start = 0
    if (ckpt := ray.train.get_checkpoint()) is not None:
        with ckpt.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
        model.module.load_state_dict(state["model"]) if hasattr(model, "module") else model.load_state_dict(
            state["model"]
        )
        start = state["step"]
    w_true = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    for step in range(start, config.get("steps", 20)):
        x = torch.randn(64, 4)
        loss = torch.nn.functional.mse_loss(model(x), x @ w_true)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if ray.train.get_context().get_world_rank() == 0 and (step + 1) % 10 == 0:
                inner = model.module if hasattr(model, "module") else model
                torch.save({"model": inner.state_dict(), "step": step + 1}, os.path.join(d, "state.pt"))
                checkpoint = ray.train.Checkpoint.from_directory(d)
            ray.train.report({"step": step + 1, "loss": loss.item()}, checkpoint=checkpoint)
