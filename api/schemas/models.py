"""Built-in models a job can train: a multilayer perceptron, a small CNN and a small GPT."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field, model_validator

from api.schemas.common import Strict


class MLPModel(Strict):
    type: Literal["mlp"] = Field(description="A multilayer perceptron over flat features.")
    hidden_sizes: list[Annotated[int, Field(gt=0, le=65_536)]] = Field(
        max_length=64, default_factory=lambda: [128], description="Width of each hidden layer."
    )
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="Dropout after each hidden layer.")


class CNNModel(Strict):
    type: Literal["cnn"] = Field(
        description=(
            "A small convolutional net for square single-channel images: 3x3 conv blocks at full "
            "resolution, a max-pool to a grid of at most 4x4 cells, a linear head."
        )
    )
    channels: list[Annotated[int, Field(gt=0, le=16_384)]] = Field(
        max_length=64, default_factory=lambda: [16, 32], description="Output channels of each 3x3 conv block."
    )
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="Dropout before the classifier.")


class GPTModel(Strict):
    type: Literal["gpt"] = Field(
        description=(
            "A small decoder-only transformer over characters; the model the tensor, "
            "pipeline and hybrid strategies can split. Trains on `data: {source: text}`."
        )
    )
    n_layer: int = Field(default=2, ge=1, le=256, description="Transformer blocks (what pipeline stages split).")
    n_head: int = Field(
        default=2, ge=1, le=256, description="Attention heads per block (what tensor parallelism splits)."
    )
    d_model: int = Field(default=32, ge=1, le=16_384, description="Width of the residual stream; a multiple of n_head.")
    seq_len: int = Field(default=32, ge=2, le=8192, description="Context length in characters.")
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="Dropout in attention and MLP outputs.")

    @model_validator(mode="after")
    def _heads_divide_width(self) -> "GPTModel":
        if self.d_model % self.n_head:
            raise ValueError(
                f"model.d_model ({self.d_model}) must be a multiple of model.n_head "
                f"({self.n_head}) so every head gets the same width"
            )
        return self


ModelSpec = Annotated[Union[MLPModel, CNNModel, GPTModel], Field(discriminator="type")]
