"""Datasets a built-in model trains on: bundled digits, generated rows, user tables, a
generated character corpus. Nothing is downloaded."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field

from api.schemas.common import Strict


class DigitsData(Strict):
    source: Literal["digits"] = Field(
        description="scikit-learn's bundled handwritten digits (1797 8x8 images, 10 classes); no download."
    )
    val_fraction: float = Field(default=0.2, gt=0.0, lt=1.0, description="Share held out for validation.")
    cache: bool = Field(
        default=True,
        description="Keep what is read in the node's data cache for later jobs and trials (when the server's "
        "RAYDOCK_DATA_CACHE_BYTES is set); false: read the source every time.",
    )


class SyntheticData(Strict):
    source: Literal["synthetic"] = Field(description="A generated classification problem (deterministic by seed).")
    n_samples: int = Field(default=2048, ge=16, le=10_000_000, description="Number of rows.")
    n_features: int = Field(default=32, ge=2, le=100_000, description="Number of features.")
    n_classes: int = Field(default=4, ge=2, le=1000, description="Number of classes.")
    val_fraction: float = Field(default=0.2, gt=0.0, lt=1.0, description="Share held out for validation.")
    cache: bool = Field(
        default=True,
        description="Keep what is read in the node's data cache for later jobs and trials (when the server's "
        "RAYDOCK_DATA_CACHE_BYTES is set); false: read the source every time.",
    )


class TabularData(Strict):
    source: Literal["csv", "parquet"] = Field(description="A user table read with Ray Data and sharded across workers.")
    path: str = Field(min_length=1, description="File, directory or URI (s3://, gs://, ...) of the table.")
    label_column: str = Field(min_length=1, description="Column holding the integer class label.")
    feature_columns: list[str] | None = Field(
        default=None, description="Columns used as features; all other numeric columns when omitted."
    )
    num_classes: int | None = Field(
        default=None, ge=2, description="Number of classes; inferred from the labels when omitted."
    )
    val_fraction: float = Field(default=0.2, gt=0.0, lt=1.0, description="Share held out for validation.")
    cache: bool = Field(
        default=True,
        description="Keep what is read in the node's data cache for later jobs and trials (when the server's "
        "RAYDOCK_DATA_CACHE_BYTES is set); false: read the source every time.",
    )


class TextData(Strict):
    source: Literal["text"] = Field(
        description=(
            "A character corpus generated locally from a small English grammar "
            "(deterministic by seed; no download). The last 10% is held out for validation."
        )
    )
    n_chars: int = Field(
        default=64 * 1024, ge=1024, le=100_000_000, description="Length of the generated corpus in characters."
    )
    val_batches: int = Field(default=4, ge=1, le=10_000, description="Validation batches evaluated at each report.")
    cache: bool = Field(
        default=True,
        description="Keep what is read in the node's data cache for later jobs and trials (when the server's "
        "RAYDOCK_DATA_CACHE_BYTES is set); false: read the source every time.",
    )

    def block_counts(self, seq_len: int) -> tuple[int, int]:
        """(train, val) windows of ``seq_len`` characters, as ``trainers.data.text`` cuts them."""
        cut = int(self.n_chars * 0.9)
        return (cut - 1) // seq_len, (self.n_chars - cut - 1) // seq_len


DataSpec = Annotated[Union[DigitsData, SyntheticData, TabularData, TextData], Field(discriminator="source")]
