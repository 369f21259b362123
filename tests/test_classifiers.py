"""The built-in classifiers learn the digits in a few epochs, in this process (no Ray)."""

from __future__ import annotations

import pytest
import torch

from api.schemas import DigitsData
from trainers.data.tabular import batches, load_arrays
from trainers.models import CNN, MLP


def val_acc_after(model: torch.nn.Module, epochs: int) -> float:
    """Train as examples/digits-cnn.yaml does (AdamW, lr 0.005, a global batch of 128)."""
    data = load_arrays(DigitsData(source="digits"), seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=0.005, weight_decay=0.01)
    for epoch in range(epochs):
        for x, y in batches(data.x_train, data.y_train, 128, torch.Generator().manual_seed(epoch)):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    with torch.no_grad():
        return (model(data.x_val).argmax(1) == data.y_val).float().mean().item()


@pytest.mark.parametrize("build", [lambda: CNN(8, [16, 32], 10), lambda: MLP(64, [128], 10)], ids=["cnn", "mlp"])
def test_a_classifier_learns_the_digits_in_four_epochs(build):
    # A CNN whose head averaged each channel over the whole image (no idea *where* a
    # stroke is) stayed near 0.4 here and ended examples/digits-cnn.yaml at 0.68.
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small tensors: one thread is fastest and leaves the other cores alone
    try:
        acc = val_acc_after(build(), epochs=4)
    finally:
        torch.set_num_threads(threads)
    assert acc >= 0.9
