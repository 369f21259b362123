"""A Ray Tune function trainable written as Ray Tune's documentation writes one, searched by
raydock as it is (``trainable: function``, ``examples/tune-function-pbt.yaml``): it fits a
linear regression with SGD at the searched ``lr``, reports with ``tune.report`` every 10
steps with a checkpoint, and restores from ``tune.get_checkpoint()`` (a PBT clone starts
from its donor's weights, with its own perturbed ``lr``). It loops until the search stops it."""

import os
import tempfile

import torch
from ray import tune

W_TRUE = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])


def train(config):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
    step = 0
    if (checkpoint := tune.get_checkpoint()) is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
        model.load_state_dict(state["model"])
        step = state["step"]
    while True:
        for _ in range(10):
            x = torch.randn(64, 4)
            loss = torch.nn.functional.mse_loss(model(x), x @ W_TRUE)
            opt.zero_grad()
            loss.backward()
            opt.step()
        step += 10
        with tempfile.TemporaryDirectory() as d:
            torch.save({"model": model.state_dict(), "step": step}, os.path.join(d, "state.pt"))
            tune.report({"loss": loss.item(), "step": step}, checkpoint=tune.Checkpoint.from_directory(d))
