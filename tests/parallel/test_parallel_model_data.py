"""The tiny GPT and the grammar corpus the strategies are tested on (single process)."""

import pytest
import torch

from bench.harness.parallel import CFG
from trainers.data.text import VOCAB_SIZE, batch_at, decode, encode, generate_text, grammar_dataset
from trainers.models.gpt import GPTConfig, build_gpt, lm_loss, split_gpt_for_stage


def test_same_seed_same_weights_without_touching_global_rng():
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a = build_gpt(CFG, seed=7)
    assert torch.equal(torch.rand(1), expected_next)
    b = build_gpt(CFG, seed=7)
    c = build_gpt(CFG, seed=8)
    for (name, pa), pb, pc in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.tok_emb.weight, c.tok_emb.weight)


def test_gpt_is_causal():
    model = build_gpt(CFG, seed=0)
    x = torch.randint(0, CFG.vocab_size, (2, CFG.seq_len))
    y = x.clone()
    y[:, 8:] = (y[:, 8:] + 1) % CFG.vocab_size
    with torch.no_grad():
        out_x, out_y = model(x), model(y)
    assert out_x.shape == (2, CFG.seq_len, CFG.vocab_size)
    torch.testing.assert_close(out_x[:, :8], out_y[:, :8])
    assert not torch.allclose(out_x[:, 8:], out_y[:, 8:])


def test_config_rejects_heads_that_do_not_divide_width():
    with pytest.raises(ValueError) as e:
        GPTConfig(vocab_size=10, d_model=32, n_head=3)
    assert "divisible by n_head" in str(e.value)


def test_pipeline_stages_partition_the_model_under_its_own_names():
    cfg = GPTConfig(vocab_size=VOCAB_SIZE, n_layer=5, n_head=2, d_model=16, seq_len=8)
    full = build_gpt(cfg, seed=0)
    stages = [split_gpt_for_stage(build_gpt(cfg, seed=0), s, 3) for s in range(3)]
    assert [list(s.blocks.keys()) for s in stages] == [["0", "1"], ["2", "3"], ["4"]]
    merged = {}
    for stage in stages:
        assert merged.keys().isdisjoint(stage.state_dict().keys())
        merged.update(stage.state_dict())
    assert merged.keys() == full.state_dict().keys()
    # chaining the stages is the full model
    x = torch.randint(0, VOCAB_SIZE, (2, 8))
    with torch.no_grad():
        h = x
        for stage in stages:
            h = stage(h)
        torch.testing.assert_close(h, full(x))


def test_text_round_trips_and_is_deterministic():
    text = generate_text(2000, seed=3)
    assert len(text) == 2000
    assert text == generate_text(2000, seed=3)
    assert text != generate_text(2000, seed=4)
    assert decode(encode(text)) == text
    with pytest.raises(ValueError):
        encode("Hello!")


def test_blocks_are_shifted_windows():
    ds = grammar_dataset(seq_len=16, n_chars=4096, seed=0)
    x, y = ds[3]
    assert x.shape == y.shape == (16,)
    assert torch.equal(x[1:], y[:-1])
    assert int(x.max()) < VOCAB_SIZE
    val = grammar_dataset(seq_len=16, n_chars=4096, seed=0, split="val")
    assert len(ds) > 8 * len(val) > 0


def test_rank_shards_make_up_the_global_batch():
    ds = grammar_dataset(seq_len=16, n_chars=8192, seed=0)
    for step in (0, 5, 100):  # 100 is past the first epoch
        gx, gy = batch_at(ds, step, 8, seed=1)
        parts = [batch_at(ds, step, 2, rank=r, world_size=4, seed=1) for r in range(4)]
        assert torch.equal(torch.cat([p[0] for p in parts]), gx)
        assert torch.equal(torch.cat([p[1] for p in parts]), gy)
    assert not torch.equal(batch_at(ds, 0, 8, seed=1)[0], batch_at(ds, 0, 8, seed=2)[0])


@pytest.fixture()
def one_thread():
    # a model this small gains nothing from a second thread and loses a lot when the
    # machine is busy
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_a_small_gpt_learns_the_grammar(one_thread):
    ds = grammar_dataset(seq_len=CFG.seq_len, n_chars=16 * 1024, seed=0)
    model = build_gpt(CFG, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for step in range(60):
        x, y = batch_at(ds, step, 16)
        loss = lm_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[0] > 3.2  # about ln(30): guessing
    assert sum(losses[-5:]) / 5 < 2.3
