"""HFPolicy on a tiny randomly initialised model built from a config, saved and loaded
back from a local directory: batched, left-padded sampling whose log-probs equal a
recomputation by one forward pass."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch
from transformers import GPT2Config, LlamaConfig

from trialbox.errors import UsageError
from trialbox.rollout.hf_policy import HFPolicy, sequence_logprobs
from trialbox.rollout.policy import ByteTokenizer, make_policy

TOK = ByteTokenizer()


def gpt2() -> GPT2Config:
    return GPT2Config(vocab_size=258, n_positions=256, n_embd=32, n_layer=2, n_head=2,
                      bos_token_id=256, eos_token_id=256)


def llama() -> LlamaConfig:
    return LlamaConfig(vocab_size=258, hidden_size=32, intermediate_size=64,
                       num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                       max_position_embeddings=256, bos_token_id=256, eos_token_id=256,
                       pad_token_id=257)


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def saved(request, tmp_path_factory):
    torch.manual_seed(0)
    policy = HFPolicy.from_config(gpt2() if request.param == "gpt2" else llama(), TOK, seed=0)
    path = tmp_path_factory.mktemp(request.param)
    policy.model.save_pretrained(path)
    return path


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_logprobs_equal_a_forward_pass(saved, temperature):
    policy = HFPolicy.from_pretrained(str(saved), tokenizer=TOK, seed=1)
    # Different lengths exercise the left padding and the position ids.
    prompts = [TOK.encode("def f(x):\n"), TOK.encode("# a longer prompt than that one\n"),
               TOK.encode("x")]
    gens = asyncio.run(policy.generate(prompts, max_new_tokens=24, temperature=temperature,
                                       stop=None))
    assert len(gens) == 3
    for p, g in zip(prompts, gens, strict=True):
        assert 1 <= len(g.token_ids) <= 24 and len(g.logprobs) == len(g.token_ids)
        assert g.text == TOK.decode(g.token_ids)
        ref = sequence_logprobs(policy.model, p, g.token_ids, temperature)
        assert g.logprobs == pytest.approx(ref, abs=2e-4)
        assert all(lp <= 0 and math.isfinite(lp) for lp in g.logprobs)
    if temperature == 0.0:  # greedy is deterministic: batched == alone
        alone = asyncio.run(policy.generate([prompts[1]], max_new_tokens=24,
                                            temperature=0.0, stop=None))
        assert alone[0].token_ids == gens[1].token_ids


def test_stop_strings_and_eos_end_a_row(saved):
    policy = HFPolicy.from_pretrained(str(saved), tokenizer=TOK, seed=3)
    prompts = [TOK.encode("abc")] * 4
    # Every byte is a stop string: each row must stop after its first printable byte.
    stops = [chr(c) for c in range(32, 127)]
    gens = asyncio.run(policy.generate(prompts, max_new_tokens=200, temperature=1.0,
                                       stop=stops))
    assert any(g.finish_reason == "stop" for g in gens)
    for g in gens:
        assert g.finish_reason in ("stop", "eos", "length")
        if g.finish_reason == "stop":
            assert any(s in g.text for s in stops)
            assert not any(s in TOK.decode(g.token_ids[:-1]) for s in stops)
        if g.finish_reason == "eos":
            assert g.token_ids[-1] == 256


def test_sampling_is_seeded_and_runs_off_the_event_loop(saved):
    async def both():
        policy = HFPolicy.from_pretrained(str(saved), tokenizer=TOK, seed=7)
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        t = asyncio.ensure_future(tick())
        g = await policy.generate([TOK.encode("hello")], max_new_tokens=64,
                                  temperature=1.0, stop=None)
        t.cancel()
        return g, ticks

    (g1, ticks), (g2, _) = asyncio.run(both()), asyncio.run(both())
    assert g1[0].token_ids == g2[0].token_ids, "same seed, same sample"
    assert ticks > 1, "the event loop kept running while the model generated"


def test_loading_in_another_dtype(saved):
    policy = HFPolicy.from_pretrained(str(saved), tokenizer=TOK, dtype=torch.float64)
    assert next(policy.model.parameters()).dtype == torch.float64
    [g] = asyncio.run(policy.generate([TOK.encode("ab")], max_new_tokens=4,
                                      temperature=1.0, stop=None))
    assert len(g.token_ids) >= 1


def test_bad_input(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(UsageError, match="no-such-model"):
        HFPolicy.from_pretrained(str(missing), tokenizer=TOK)
    with pytest.raises(UsageError, match="config.json"):
        HFPolicy.from_pretrained(str(tmp_path), tokenizer=TOK)
    with pytest.raises(UsageError, match="unknown policy kind 'gpt5'"):
        make_policy("gpt5")
    with pytest.raises(UsageError, match="no-such-model"):
        make_policy("hf", path=str(missing), tokenizer=TOK)
    with pytest.raises(UsageError, match="device"):
        HFPolicy.from_config(gpt2(), TOK, device="tpu")
    policy = HFPolicy.from_config(gpt2(), TOK)
    with pytest.raises(UsageError, match="positions"):
        asyncio.run(policy.generate([[1] * 256], max_new_tokens=10, temperature=1.0,
                                    stop=None))
    # Near the end of the model's positions a row stops there, the others go on (no
    # EOS id here, so only the lengths can end them).
    no_eos = ByteTokenizer()
    no_eos.eos_id = None
    policy = HFPolicy(policy.model, no_eos)
    short, full = asyncio.run(policy.generate([[1] * 250, [1] * 5], max_new_tokens=10,
                                              temperature=1.0, stop=None))
    assert (len(short.token_ids), short.finish_reason) == (6, "length")
    assert (len(full.token_ids), full.finish_reason) == (10, "length")
    with pytest.raises(UsageError, match="temperature"):
        asyncio.run(policy.generate([[1]], max_new_tokens=10, temperature=-1, stop=None))


@pytest.mark.parametrize("drop_rows", [True, False])
def test_rows_that_stop_early_leave_the_batch_exactly(saved, monkeypatch, drop_rows):
    """Rows end at different steps (stop strings); whether finished rows are dropped
    from the KV cache or keep stepping (a cache without row selection), every row's
    log-probs still equal a forward pass."""
    if not drop_rows:
        from transformers.cache_utils import Cache
        monkeypatch.delattr(Cache, "batch_select_indices")
    policy = HFPolicy.from_pretrained(str(saved), tokenizer=TOK, seed=11)
    prompts = [TOK.encode(f"prompt {i}: " + "x" * i) for i in range(6)]
    stops = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    gens = asyncio.run(policy.generate(prompts, max_new_tokens=40, temperature=1.0,
                                       stop=stops))
    assert len({len(g.token_ids) for g in gens}) > 1, "rows ended at different steps"
    for p, g in zip(prompts, gens, strict=True):
        ref = sequence_logprobs(policy.model, p, g.token_ids, 1.0)
        assert g.logprobs == pytest.approx(ref, abs=2e-4)
        if g.finish_reason == "stop":
            assert not any(s in TOK.decode(g.token_ids[:-1]) for s in stops)


def test_a_directory_with_its_own_bpe_tokenizer(tmp_path):
    """The Qwen-class path: model and a `transformers` tokenizer saved in one local
    directory, both loaded from it (no tokenizer passed); the tokenizer is wrapped into
    the protocol and sampling is exact as before."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(["def f(x):\n    return x * 2\n", "print(f(21))\n"] * 20,
                           trainers.BpeTrainer(
                               vocab_size=300, special_tokens=["<eos>", "<pad>"],
                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", pad_token="<pad>")
    fast.save_pretrained(tmp_path)
    cfg = GPT2Config(vocab_size=len(fast), n_positions=128, n_embd=32, n_layer=2, n_head=2,
                     eos_token_id=fast.eos_token_id, bos_token_id=fast.eos_token_id)
    torch.manual_seed(0)
    HFPolicy.from_config(cfg, fast).model.save_pretrained(tmp_path)

    policy = HFPolicy.from_pretrained(str(tmp_path), seed=0)
    tok = policy.tokenizer
    assert (tok.eos_id, tok.pad_id) == (fast.eos_token_id, fast.pad_token_id)
    ids = tok.encode("def f(x):\n    return x * 2\n")
    assert len(ids) < 20 and tok.decode(ids) == "def f(x):\n    return x * 2\n"
    [g] = asyncio.run(policy.generate([ids], max_new_tokens=12, temperature=1.0,
                                      stop=None))
    assert g.text == tok.decode(g.token_ids)
    assert g.logprobs == pytest.approx(sequence_logprobs(policy.model, ids, g.token_ids),
                                       abs=2e-4)
