"""A small decoder-only transformer (GPT) that the parallelism strategies can split.

Token and position embeddings, ``n_layer`` blocks of causal self-attention + MLP, a
final layer norm and a language-model head. Plain PyTorch: no parallelism lives here.
``trainers.parallel`` applies it from outside, and the model is shaped so it can:

- attention has separate ``q``/``k``/``v``/``proj`` linears and the MLP ``fc``/``proj``
  linears, so tensor parallelism shards ``q``/``k``/``v``/``fc`` by columns and the two
  ``proj`` by rows; attention reshapes by ``head_dim`` (not ``n_head``) so it works on
  a rank that holds only some of the heads;
- blocks live in an ``nn.ModuleDict`` keyed ``"0"``, ``"1"``, ... (same parameter names
  as an ``nn.ModuleList``) so a pipeline stage can drop the blocks it does not own and
  keep the names of the ones it does, which keeps checkpoints comparable across
  strategies;
- ``forward`` skips the embeddings or the head when a pipeline stage has set them to
  ``None``; the input embedding and the head are not tied for the same reason.

Build one with ``build_gpt(GPTConfig(vocab_size=..., ...), seed=0)``; the same config
and seed give the same weights on every worker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    n_layer: int = 2
    n_head: int = 2
    d_model: int = 32
    seq_len: int = 16
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.d_model % self.n_head:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head}) "
                "so every head gets the same width"
            )


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.head_dim = cfg.d_model // cfg.n_head
        self.q = nn.Linear(cfg.d_model, cfg.d_model)
        self.k = nn.Linear(cfg.d_model, cfg.d_model)
        self.v = nn.Linear(cfg.d_model, cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = cfg.dropout
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # -1 heads, not n_head: under tensor parallelism this rank holds only its share
        q = self.q(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        k = self.k(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        v = self.v(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).reshape(B, T, -1)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token ids ``(B, T)`` in, next-token logits ``(B, T, vocab_size)`` out."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        self.tok_emb: nn.Embedding | None = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb: nn.Embedding | None = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.n_layer)})
        self.ln_f: nn.LayerNorm | None = nn.LayerNorm(cfg.d_model)
        self.lm_head: nn.Linear | None = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A pipeline stage without the embeddings receives hidden states, not token ids.
        if self.tok_emb is not None:
            T = x.shape[1]
            if T > self.config.seq_len:
                raise ValueError(f"sequence of {T} tokens is longer than the model's seq_len ({self.config.seq_len})")
            pos = torch.arange(T, device=x.device)
            x = self.drop(self.tok_emb(x) + self.pos_emb(pos))
        for block in self.blocks.values():
            x = block(x)
        # A pipeline stage without the head passes hidden states on.
        if self.lm_head is not None:
            x = self.lm_head(self.ln_f(x))
        return x

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over every position of the batch."""
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())


def build_gpt(cfg: GPTConfig, *, seed: int) -> GPT:
    """A GPT whose initial weights depend only on ``cfg`` and ``seed``.

    Uses its own generator, so it neither depends on nor disturbs the global RNG.
    """
    # Layer constructors draw default weights from the global RNG; all of them are
    # overwritten below, so give them a throwaway copy of it.
    with torch.random.fork_rng(devices=[]):
        model = GPT(cfg)
    gen = torch.Generator().manual_seed(seed)
    # Residual projections start smaller so the residual stream's variance does not
    # grow with depth (GPT-2's scheme).
    resid_std = 0.02 / math.sqrt(2 * cfg.n_layer)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear):
                std = resid_std if name.endswith(".proj") else 0.02
                nn.init.normal_(module.weight, mean=0.0, std=std, generator=gen)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02, generator=gen)
    return model
