"""A character-level text corpus generated locally from a small English grammar.

Training jobs and tests need text without downloads. The corpus is produced by a
seeded random grammar (subject-verb agreement, adjectives, prepositional phrases,
paragraphs), so it is deterministic, any length, and has structure a small GPT can
learn: loss falls well below the ~3.4 nats of guessing among the 30 characters.

    ds = grammar_dataset(seq_len=16, seed=0)                    # (input_ids, target_ids)
    for x, y in iterate_batches(ds, batch_size=8, rank=r, world_size=w, seed=0): ...

``iterate_batches`` shards each global batch by rank: at every step the per-rank
batches of ``world_size`` ranks are exactly the global batch a single process with
``batch_size * world_size`` would see, which is what lets a data-parallel run be
compared with a single-process one.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator
from typing import Literal

import torch
from torch.utils.data import Dataset

from trainers.data.cache import DataCache
from trainers.data.sources import arrays_bytes, arrays_key, arrays_of, cached

VOCAB = "\n ,.abcdefghijklmnopqrstuvwxyz"
VOCAB_SIZE = len(VOCAB)
_CHAR_TO_ID = {c: i for i, c in enumerate(VOCAB)}

# (singular, plural)
_NOUNS = [
    ("fox", "foxes"),
    ("miller", "millers"),
    ("river", "rivers"),
    ("child", "children"),
    ("bird", "birds"),
    ("king", "kings"),
    ("garden", "gardens"),
    ("ship", "ships"),
    ("horse", "horses"),
    ("lamp", "lamps"),
    ("baker", "bakers"),
    ("wolf", "wolves"),
    ("stone", "stones"),
    ("sailor", "sailors"),
    ("queen", "queens"),
    ("tree", "trees"),
    ("mouse", "mice"),
    ("village", "villages"),
    ("letter", "letters"),
    ("cat", "cats"),
]
# (third person singular, base)
_VERBS = [
    ("sees", "see"),
    ("follows", "follow"),
    ("finds", "find"),
    ("carries", "carry"),
    ("watches", "watch"),
    ("loves", "love"),
    ("hides", "hide"),
    ("paints", "paint"),
    ("remembers", "remember"),
    ("pushes", "push"),
    ("calls", "call"),
    ("keeps", "keep"),
]
_ADJECTIVES = [
    "old",
    "small",
    "quiet",
    "bright",
    "green",
    "cold",
    "brave",
    "gentle",
    "tall",
    "slow",
    "golden",
    "lonely",
]
_PREPOSITIONS = ["near", "under", "behind", "beside", "across", "over"]
_ADVERBS = ["slowly", "often", "never", "always", "quietly", "gladly"]


def encode(text: str) -> torch.Tensor:
    try:
        return torch.tensor([_CHAR_TO_ID[c] for c in text], dtype=torch.long)
    except KeyError as e:
        raise ValueError(f"character {e.args[0]!r} is not in the corpus vocabulary {VOCAB!r}") from None


def decode(ids: torch.Tensor | list[int]) -> str:
    return "".join(VOCAB[int(i)] for i in ids)


def _noun_phrase(rng: random.Random) -> tuple[str, bool]:
    singular, plural = rng.choice(_NOUNS)
    is_plural = rng.random() < 0.4
    det = rng.choice(["the", "some"] if is_plural else ["the", "a", "one"])
    words = [det]
    if rng.random() < 0.5:
        words.append(rng.choice(_ADJECTIVES))
    words.append(plural if is_plural else singular)
    phrase = " ".join(words)
    if det == "a" and words[1][0] in "aeiou":
        phrase = "an" + phrase[1:]
    return phrase, is_plural


def _clause(rng: random.Random) -> str:
    subject, plural = _noun_phrase(rng)
    third_sg, base = rng.choice(_VERBS)
    words = [subject]
    if rng.random() < 0.3:
        words.append(rng.choice(_ADVERBS))
    words.append(base if plural else third_sg)
    words.append(_noun_phrase(rng)[0])
    if rng.random() < 0.4:
        words += [rng.choice(_PREPOSITIONS), _noun_phrase(rng)[0]]
    return " ".join(words)


def generate_text(n_chars: int, *, seed: int) -> str:
    """Exactly ``n_chars`` characters of grammatical nonsense (sentences, paragraphs)."""
    rng = random.Random(seed)
    parts: list[str] = []
    length = 0
    while length < n_chars:
        sentence = _clause(rng)
        if rng.random() < 0.25:
            sentence += ", and " + _clause(rng)
        sentence += "." + ("\n" if rng.random() < 0.15 else " ")
        parts.append(sentence)
        length += len(sentence)
    return "".join(parts)[:n_chars]


class CharBlocks(Dataset):
    """Non-overlapping ``(input_ids, target_ids)`` windows of a token stream.

    ``target_ids`` is ``input_ids`` shifted one character to the left.
    """

    def __init__(self, tokens: torch.Tensor, seq_len: int):
        if len(tokens) < seq_len + 1:
            raise ValueError(f"{len(tokens)} tokens cannot fill one block of seq_len {seq_len}")
        self.tokens = tokens
        self.seq_len = seq_len

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = i * self.seq_len
        chunk = self.tokens[start : start + self.seq_len + 1]
        return chunk[:-1], chunk[1:]


def grammar_dataset(
    *,
    seq_len: int,
    n_chars: int = 64 * 1024,
    seed: int = 0,
    split: Literal["train", "val"] = "train",
    tokens: torch.Tensor | None = None,
) -> CharBlocks:
    """The grammar corpus for ``seed``; the last 10% of its characters are ``val``.
    ``tokens``: the corpus already encoded (``corpus_tokens``)."""
    if tokens is None:
        tokens = encode(generate_text(n_chars, seed=seed))
    cut = int(len(tokens) * 0.9)
    return CharBlocks(tokens[:cut] if split == "train" else tokens[cut:], seq_len)


def corpus_tokens(n_chars: int, seed: int, cache: DataCache | None = None) -> torch.Tensor:
    """The encoded corpus, through the node's data cache (``trainers.data.sources``)."""

    def read() -> tuple[torch.Tensor, int]:
        return encode(generate_text(n_chars, seed=seed)), n_chars

    return cached(
        cache,
        arrays_key("text", n_chars=n_chars, seed=seed),
        read,
        lambda t: arrays_bytes({"tokens": t.numpy()}),
        lambda b: torch.from_numpy(arrays_of(b, ("tokens",))["tokens"]),
    )


def batch_at(
    ds: Dataset, step: int, batch_size: int, *, rank: int = 0, world_size: int = 1, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's ``batch_size`` rows of global batch ``step``.

    Each epoch visits every block once in an order drawn from ``seed + epoch``; the
    global batch of ``batch_size * world_size`` blocks is cut into per-rank slices.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world_size {world_size}")
    global_batch = batch_size * world_size
    steps_per_epoch = len(ds) // global_batch
    if steps_per_epoch == 0:
        raise ValueError(
            f"a global batch of {global_batch} blocks is larger than the dataset "
            f"({len(ds)} blocks); use a smaller batch or a longer corpus"
        )
    epoch, i = divmod(step, steps_per_epoch)
    order = epoch_order(len(ds), seed + epoch)
    start = i * global_batch + rank * batch_size
    picked = order[start : start + batch_size]
    if isinstance(ds, CharBlocks):  # the blocks of one batch in one gather, not one slice each
        windows = ds.tokens.unfold(0, ds.seq_len + 1, ds.seq_len).index_select(0, picked)
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
    rows = [ds[int(j)] for j in picked]
    return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])


@functools.lru_cache(maxsize=4)
def epoch_order(n: int, seed: int) -> torch.Tensor:
    """The order an epoch visits ``n`` blocks in: drawn once per epoch, not once per step
    (a step of a large corpus otherwise spends its time drawing the permutation again)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


def iterate_batches(
    ds: Dataset,
    batch_size: int,
    *,
    rank: int = 0,
    world_size: int = 1,
    seed: int = 0,
    start_step: int = 0,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless per-rank batches from ``start_step`` on (pass the step to resume)."""
    step = start_step
    while True:
        yield batch_at(ds, step, batch_size, rank=rank, world_size=world_size, seed=seed)
        step += 1
