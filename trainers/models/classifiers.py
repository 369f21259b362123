"""Built-in models. Each is built from its spec and the shape of the data, so the
server, the workers and a user reloading a checkpoint build the identical network."""

from __future__ import annotations

import math

import torch
from torch import nn

from api.schemas import CNNModel, MLPModel


def build_model(spec: MLPModel | CNNModel, n_features: int, n_classes: int) -> nn.Module:
    if isinstance(spec, MLPModel):
        return MLP(n_features, spec.hidden_sizes, n_classes, spec.dropout)
    if isinstance(spec, CNNModel):
        side = math.isqrt(n_features)
        if side * side != n_features:
            raise ValueError(
                f"model.type=cnn needs square single-channel images; {n_features} features is not a square. "
                "Use model.type=mlp for tabular data."
            )
        return CNN(side, spec.channels, n_classes, spec.dropout)
    raise ValueError(f"unknown model spec {spec!r}")


class MLP(nn.Module):
    def __init__(self, n_in: int, hidden: list[int], n_out: int, dropout: float = 0.0):
        super().__init__()
        layers: list[nn.Module] = []
        for width in hidden:
            layers += [nn.Linear(n_in, width), nn.ReLU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            n_in = width
        layers.append(nn.Linear(n_in, n_out))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))


class CNN(nn.Module):
    def __init__(self, side: int, channels: list[int], n_out: int, dropout: float = 0.0):
        super().__init__()
        self.side = side
        blocks: list[nn.Module] = []
        c_in = 1
        for c in channels:
            blocks += [nn.Conv2d(c_in, c, 3, padding=1), nn.ReLU()]
            c_in = c
        self.features = nn.Sequential(*blocks)
        # Global pooling keeps the head independent of the image size.
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout), nn.Linear(c_in, n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.view(-1, 1, self.side, self.side)))
