"""The node-local dataset cache (trainers/data/cache.py, trainers/data/sources.py), without
Ray: keys, the cap and LRU eviction, atomic writes, entries a job planted or poisoned
(modified bytes, a symlink, a hard link, a FIFO, a link in place of the directory), and
``cache: false``. Every case asserts what a reader gets and what is left on disk."""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np
import pandas as pd
import pytest
import torch

from api.cluster_contract import DATA_CACHE_BYTES_ENV, DATA_CACHE_DIR_ENV
from api.schemas import TrainSpec
from trainers.data.cache import MAGIC, DataCache, cache_key
from trainers.data.sources import cached, node_cache
from trainers.data.tables import cached_arrow
from trainers.data.tabular import load_arrays
from trainers.data.text import corpus_tokens, encode, generate_text


def entry(payload: bytes) -> bytes:
    """An entry as the cache writes one: whole by its digest."""
    return MAGIC + hashlib.sha256(payload).digest() + len(payload).to_bytes(8, "big") + payload


class Source:
    """A source that counts its reads."""

    def __init__(self, value: bytes):
        self.value, self.reads = value, 0

    def read(self) -> tuple[bytes, int]:
        self.reads += 1
        return self.value, len(self.value)


def through(cache: DataCache, key: str, source: Source) -> bytes:
    return cached(cache, key, source.read, lambda v: v, lambda b: b)


@pytest.fixture()
def cache(tmp_path) -> DataCache:
    return DataCache(str(tmp_path / "cache"), max_bytes=10_000)


def test_the_key_follows_the_source_and_the_preprocessing():
    assert cache_key(kind="text", n_chars=1024, seed=0) == cache_key(seed=0, n_chars=1024, kind="text")
    assert cache_key(kind="text", n_chars=1024, seed=0) != cache_key(kind="text", n_chars=1024, seed=1)
    assert cache_key(kind="text", n_chars=1024, seed=0) != cache_key(kind="text", n_chars=2048, seed=0)


def test_a_second_read_is_served_from_the_cache_and_counted(cache):
    source = Source(b"rows" * 100)
    assert through(cache, "a" * 64, source) == source.value
    assert through(cache, "a" * 64, source) == source.value
    assert source.reads == 1
    assert cache.counters() == {"hits": 1, "misses": 1, "source_bytes": 400}
    stats = cache.stats()
    assert (stats.entries, stats.cap_bytes) == (1, 10_000)
    assert stats.bytes > 400
    assert not [n for n in os.listdir(cache.root) if n.startswith(".tmp-")]  # written under a fresh name, renamed


def test_the_cap_evicts_the_least_recently_used_entry(cache):
    a, b, c = "a" * 64, "b" * 64, "c" * 64
    for key in (a, b):
        assert cache.put(key, b"x" * 4_000)
    os.utime(os.path.join(cache.root, a + ".bin"), (time.time() - 60, time.time() - 60))
    os.utime(os.path.join(cache.root, b + ".bin"), (time.time() - 30, time.time() - 30))
    assert cache.get(a) == b"x" * 4_000  # a is used again: b is now the oldest
    assert cache.put(c, b"y" * 4_000)
    assert cache.get(b) is None
    assert cache.get(a) == b"x" * 4_000 and cache.get(c) == b"y" * 4_000
    assert cache.stats().bytes <= cache.max_bytes
    assert not cache.put("d" * 64, b"z" * 20_000)  # larger than the cap: not kept
    assert cache.get("d" * 64) is None


def test_a_modified_entry_is_discarded_and_read_again_from_the_source(cache):
    key, source = "e" * 64, Source(b"the real rows")
    through(cache, key, source)
    path = os.path.join(cache.root, key + ".bin")
    with open(path, "r+b") as f:  # a job flips the payload, leaving the digest as it was
        f.seek(-4, os.SEEK_END)
        f.write(b"EVIL")
    assert through(cache, key, source) == b"the real rows"
    assert source.reads == 2
    assert cache.get(key) == b"the real rows"  # and the entry is whole again


def test_a_truncated_or_foreign_entry_is_not_trusted(cache):
    key, source = "f" * 64, Source(b"rows")
    for planted in (b"", MAGIC + b"short", b"not an entry at all" * 10):
        with open(os.path.join(cache.root if os.path.isdir(cache.root) else _mk(cache), key + ".bin"), "wb") as f:
            f.write(planted)
        assert through(cache, key, source) == b"rows"
    assert source.reads == 3


def _mk(cache: DataCache) -> str:
    os.makedirs(cache.root, mode=0o700)
    return cache.root


def test_a_symlink_planted_as_an_entry_is_never_followed(cache, tmp_path):
    key, source = "1" * 64, Source(b"rows from the source")
    outside = tmp_path / "outside.bin"
    outside.write_bytes(entry(b"rows a job chose"))  # whole by its digest, but outside the cache
    os.symlink(outside, os.path.join(_mk(cache), key + ".bin"))
    assert through(cache, key, source) == b"rows from the source"
    assert source.reads == 1
    assert outside.read_bytes() == entry(b"rows a job chose")  # never written through
    assert not os.path.islink(os.path.join(cache.root, key + ".bin"))  # the link was replaced
    assert cache.get(key) == b"rows from the source"


def test_a_hard_link_to_a_file_elsewhere_is_neither_read_nor_written(cache, tmp_path):
    key, source = "2" * 64, Source(b"rows from the source")
    outside = tmp_path / "secret.bin"
    outside.write_bytes(entry(b"someone else's file"))
    os.link(outside, os.path.join(_mk(cache), key + ".bin"))
    assert through(cache, key, source) == b"rows from the source"
    assert outside.read_bytes() == entry(b"someone else's file")
    assert os.stat(outside).st_nlink == 1  # the cache's name was removed, the file left alone


def test_links_planted_as_the_counters_are_never_written_through(cache, tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text("keep")
    os.symlink(outside, os.path.join(_mk(cache), "counters.json"))
    through(cache, "6" * 64, Source(b"rows"))
    os.link(outside, os.path.join(cache.root, "counters.json"))
    through(cache, "6" * 64, Source(b"rows"))
    assert outside.read_text() == "keep" and os.stat(outside).st_nlink == 1
    assert cache.get("6" * 64) == b"rows"


def test_a_fifo_in_place_of_an_entry_does_not_hang_the_reader(cache):
    key, source = "3" * 64, Source(b"rows")
    os.mkfifo(os.path.join(_mk(cache), key + ".bin"))
    assert through(cache, key, source) == b"rows"
    assert cache.get(key) == b"rows"


def test_a_link_in_place_of_the_cache_directory_turns_the_cache_off(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, tmp_path / "cache")
    cache, source = DataCache(str(tmp_path / "cache"), 10_000), Source(b"rows")
    assert through(cache, "4" * 64, source) == b"rows"
    assert through(cache, "4" * 64, source) == b"rows"
    assert source.reads == 2
    assert os.listdir(elsewhere) == []  # nothing written where the link points


def test_a_directory_others_can_write_is_not_used(tmp_path):
    root = tmp_path / "cache"
    root.mkdir(mode=0o777)
    os.chmod(root, 0o777)
    cache, source = DataCache(str(root), 10_000), Source(b"rows")
    through(cache, "5" * 64, source)
    assert os.listdir(root) == []


def test_cache_false_and_a_server_without_a_cap_read_the_source(monkeypatch, tmp_path):
    monkeypatch.setenv(DATA_CACHE_DIR_ENV, str(tmp_path / "c"))
    monkeypatch.delenv(DATA_CACHE_BYTES_ENV, raising=False)
    assert node_cache() is None
    monkeypatch.setenv(DATA_CACHE_BYTES_ENV, "1000000")
    assert node_cache(False) is None
    assert node_cache().root == str(tmp_path / "c")
    spec = TrainSpec.model_validate(
        {"name": "n", "model": {"type": "mlp"}, "data": {"source": "digits", "cache": False}}
    )
    load_arrays(spec.data, 0)
    assert not (tmp_path / "c").exists()


def test_built_in_datasets_come_back_from_the_cache_unchanged(monkeypatch, tmp_path):
    monkeypatch.setenv(DATA_CACHE_DIR_ENV, str(tmp_path / "c"))
    monkeypatch.setenv(DATA_CACHE_BYTES_ENV, str(50_000_000))
    spec = TrainSpec.model_validate(
        {"name": "n", "model": {"type": "mlp"}, "data": {"source": "synthetic", "n_samples": 64, "n_features": 8}}
    )
    first, second = load_arrays(spec.data, 3), load_arrays(spec.data, 3)
    assert torch.equal(first.x_train, second.x_train) and torch.equal(first.y_val, second.y_val)
    assert not torch.equal(load_arrays(spec.data, 4).x_train, first.x_train)  # another seed, another entry
    digits = TrainSpec.model_validate({"name": "n", "model": {"type": "mlp"}, "data": {"source": "digits"}}).data
    assert torch.equal(load_arrays(digits, 0).x_train, load_arrays(digits, 0).x_train)
    assert torch.equal(corpus_tokens(2048, 1, node_cache()), corpus_tokens(2048, 1, node_cache()))
    assert torch.equal(corpus_tokens(2048, 1, node_cache()), encode(generate_text(2048, seed=1)))
    counters = node_cache().counters()
    assert (counters["misses"], counters["hits"]) == (4, 4)  # synthetic twice and once, digits, text thrice


def test_a_table_is_read_once_until_its_files_change(tmp_path):
    cache = DataCache(str(tmp_path / "c"), 10_000_000)
    rng = np.random.default_rng(0)
    path = tmp_path / "t.csv"
    pd.DataFrame({"x": rng.uniform(size=50), "y": rng.integers(0, 2, 50)}).to_csv(path, index=False)
    first = cached_arrow("csv", str(path), cache)
    assert cached_arrow("csv", str(path), cache).equals(first)
    assert cache.counters() == {"hits": 1, "misses": 1, "source_bytes": path.stat().st_size}
    assert cached_arrow("csv", str(path), DataCache(str(tmp_path / "small"), 100)) is None  # over the cap: Ray Data
    pd.DataFrame({"x": [1.0], "y": [1]}).to_csv(path, index=False)  # new content: a new key
    assert cached_arrow("csv", str(path), cache).num_rows == 1
    assert cache.counters()["misses"] == 2


def test_a_text_batch_is_the_blocks_its_epoch_order_picks():
    from trainers.data.text import batch_at, grammar_dataset

    for seq_len in (16, 7):
        ds = grammar_dataset(seq_len=seq_len, n_chars=8192, seed=0)
        per_epoch = len(ds) // 16
        for step in (0, 5, per_epoch + 3):
            for rank in (0, 1):
                x, y = batch_at(ds, step, 8, rank=rank, world_size=2, seed=3)
                order = torch.randperm(len(ds), generator=torch.Generator().manual_seed(3 + step // per_epoch))
                start = (step % per_epoch) * 16 + rank * 8
                rows = [ds[int(j)] for j in order[start : start + 8]]
                assert torch.equal(x, torch.stack([r[0] for r in rows]))
                assert torch.equal(y, torch.stack([r[1] for r in rows]))
