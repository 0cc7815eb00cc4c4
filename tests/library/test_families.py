"""Cross-attention and the three model families (encoder-only, decoder-only, encoder-decoder)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from transformer_ref import numpy as ref
from transformer_ref import torch as tref


def t64(a):
    return torch.as_tensor(np.asarray(a), dtype=torch.float64)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --- cross-attention ---------------------------------------------------------------------------

def test_cross_attention_matches_nn_multiheadattention(rng):
    C, H, T, S = 16, 4, 5, 7
    mha = nn.MultiheadAttention(C, H, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        for p in mha.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()),
                                      dtype=torch.float64))
    W, b = mha.in_proj_weight.detach().numpy(), mha.in_proj_bias.detach().numpy()
    params = {"wq": W[:C].T, "wk": W[C:2 * C].T, "wv": W[2 * C:].T, "bq": b[:C], "bk": b[C:2 * C],
              "bv": b[2 * C:], "wo": mha.out_proj.weight.detach().numpy().T, "bo": mha.out_proj.bias.detach().numpy()}
    x, memory = rng.normal(size=(2, T, C)), rng.normal(size=(2, S, C))
    lengths = np.array([S, 4])
    expected, _ = mha(t64(x), t64(memory), t64(memory), need_weights=False,
                      key_padding_mask=torch.as_tensor(np.arange(S)[None, :] >= lengths[:, None]))
    got = ref.cross_attention(x, memory, params, H, memory_mask=ref.padding_mask(lengths, S))
    np.testing.assert_allclose(got, expected.detach().numpy(), rtol=1e-10, atol=1e-12)
    got_t = tref.cross_attention(t64(x), t64(memory), params, H,
                                 memory_mask=tref.padding_mask(torch.as_tensor(lengths), S))
    np.testing.assert_allclose(got_t.detach().numpy(), expected.detach().numpy(), rtol=1e-10, atol=1e-12)


@given(T=st.integers(1, 5), S=st.integers(1, 6), kv=st.sampled_from([1, 2, 4]))
def test_cross_attention_backends_agree_and_ignore_padded_memory(T, S, kv):
    rng = np.random.default_rng(T * 10 + S)
    C, H = 8, 4
    params = {k: rng.normal(scale=0.5, size=v.shape)
              for k, v in ref.init_block_params(C, H, n_kv_heads=kv).items() if k[0] in "wb" and k[1] in "qkvo"}
    x, memory = rng.normal(size=(2, T, C)), rng.normal(size=(2, S, C))
    lengths = np.array([S, max(S - 2, 1)])
    mask = ref.padding_mask(lengths, S)
    out = ref.cross_attention(x, memory, params, H, mask)
    assert out.shape == x.shape
    out_t = tref.cross_attention(t64(x), t64(memory), params, H, torch.as_tensor(mask))
    np.testing.assert_allclose(out, out_t.numpy(), rtol=1e-10, atol=1e-12)
    changed = memory.copy()
    changed[1, lengths[1]:] = 100.0  # padded memory positions may hold anything
    np.testing.assert_allclose(ref.cross_attention(x, changed, params, H, mask), out, rtol=1e-12, atol=1e-12)


def test_cross_attention_validation():
    p = ref.init_block_params(8, 2)
    with pytest.raises(ValueError, match="^memory"):
        ref.cross_attention(np.zeros((1, 3, 8)), np.zeros((1, 3, 4)), p, 2)
    with pytest.raises(ValueError, match="^memory"):
        tref.cross_attention(torch.zeros(1, 3, 8), torch.zeros(3), p, 2)
    with pytest.raises(ValueError, match="^x"):
        tref.cross_attention(torch.zeros(8), torch.zeros(1, 3, 8), p, 2)
    with pytest.raises(ValueError, match="^params is missing the key 'wk'"):
        ref.cross_attention(np.zeros((1, 3, 8)), np.zeros((1, 3, 8)), {"wq": p["wq"]}, 2)


# --- decoder-only ------------------------------------------------------------------------------

def greedy_without_cache(model, prompt, n):
    tokens = prompt
    for _ in range(n):
        tokens = torch.cat([tokens, model(tokens)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return tokens


@pytest.mark.parametrize("options", [dict(), dict(n_kv_heads=1, ffn="swiglu", norm="rmsnorm", bias=False),
                                     dict(rope=False, n_kv_heads=2), dict(norm_position="post")])
def test_decoder_generate_with_cache_equals_full_forward(options):
    torch.manual_seed(0)
    model = tref.DecoderOnlyModel(13, 32, 2, 4, 24, **options).double().eval()
    prompt = torch.randint(0, 13, (3, 4))
    generated = model.generate(prompt, 9)
    assert generated.shape == (3, 13) and torch.equal(generated[:, :4], prompt)
    assert torch.equal(generated, greedy_without_cache(model, prompt, 9))
    # and the logits themselves: prefill 4, then one token at a time, equal the full forward
    cache = model.new_cache(3, 13)
    steps = [model(generated[:, :4], cache=cache)] + [model(generated[:, t:t + 1], cache=cache) for t in range(4, 13)]
    np.testing.assert_allclose(torch.cat(steps, 1).detach().numpy(), model(generated).detach().numpy(),
                               rtol=1e-9, atol=1e-10)


def test_decoder_sampling_with_cache_equals_sampling_without():
    torch.manual_seed(1)
    model = tref.DecoderOnlyModel(11, 16, 2, 2, 20).double().eval()
    prompt = torch.randint(0, 11, (2, 3))
    sampled = model.generate(prompt, 6, greedy=False, temperature=0.7,
                             generator=torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(5)
    tokens = prompt
    for _ in range(6):
        probs = F.softmax(model(tokens)[:, -1].float() / 0.7, dim=-1)
        tokens = torch.cat([tokens, torch.multinomial(probs, 1, generator=g)], dim=1)
    assert torch.equal(sampled, tokens)


@pytest.mark.parametrize("rope", [True, False])
def test_causal_decoder_never_reads_the_future_but_the_unmasked_one_does(rope):
    torch.manual_seed(0)
    tokens = torch.randint(0, 17, (2, 8))
    changed = tokens.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % 17
    causal = tref.DecoderOnlyModel(17, 16, 2, 4, 8, rope=rope).double()
    np.testing.assert_allclose(causal(tokens)[:, :5].detach().numpy(), causal(changed)[:, :5].detach().numpy(),
                               rtol=1e-12, atol=1e-12)
    cheating = tref.DecoderOnlyModel(17, 16, 2, 4, 8, rope=rope, causal=False).double()
    cheating.load_state_dict(causal.state_dict())
    assert not torch.allclose(cheating(tokens)[:, :5], cheating(changed)[:, :5])


def test_decoder_learns_a_sequence_in_a_few_steps():
    # next-token prediction of the repeating pattern 0 1 2 ... 6 0 1 ...: a causal model must learn it
    torch.manual_seed(0)
    model = tref.DecoderOnlyModel(7, 32, 2, 4, 16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    starts = torch.randint(0, 7, (16, 1))
    data = (starts + torch.arange(13)) % 7
    for _ in range(40):
        logits = model(data[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 7), data[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.1
    model.eval()
    assert torch.equal(model.generate(torch.tensor([[3]]), 8), torch.tensor([[3, 4, 5, 6, 0, 1, 2, 3, 4]]))


def test_decoder_tied_head_and_gqa_cache_size():
    model = tref.DecoderOnlyModel(10, 16, 3, 4, 12, n_kv_heads=2)
    cache = model.new_cache(2, 12)
    assert cache.nbytes == tref.kv_cache_bytes(3, 2, 4, 12, batch_size=2, bytes_per_element=4)
    assert model.decoder.pos_emb is None  # RoPE: no position table
    h = torch.randn(1, 2, 16)
    assert torch.equal(model.decoder.logits(h), h @ model.decoder.tok_emb.weight.t())


# --- encoder-only ------------------------------------------------------------------------------

def test_encoder_is_bidirectional_and_ignores_padding():
    torch.manual_seed(0)
    model = tref.EncoderOnlyModel(20, 16, 2, 4, 10).double()
    tokens = torch.randint(1, 20, (2, 10))
    lengths = torch.tensor([10, 6])
    logits = model(tokens, lengths)
    assert logits.shape == (2, 10, 20)
    later = tokens.clone()
    later[0, 9] = (later[0, 9] + 1) % 20
    assert not torch.allclose(model(later, lengths)[0, 0], logits[0, 0])  # position 0 sees position 9
    padded = tokens.clone()
    padded[1, 6:] = 0  # different pad contents
    np.testing.assert_allclose(model(padded, lengths)[1, :6].detach().numpy(), logits[1, :6].detach().numpy(),
                               rtol=1e-12, atol=1e-12)


def test_encoder_classifier_learns_majority_task():
    # does the sequence hold more 1s than 0s? (the syllabus's toy task), lengths 4..6 with padding
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 2, (128, 7), generator=g)
    lengths = torch.tensor([5, 7] * 64)
    keep = torch.arange(7)[None, :] < lengths[:, None]
    labels = ((tokens * keep).sum(1) * 2 > lengths).long()
    tokens = torch.where(keep, tokens, torch.full_like(tokens, 2))  # pad id 2
    model = tref.EncoderOnlyModel(3, 32, 2, 4, 7, n_classes=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(60):
        loss = F.cross_entropy(model(tokens, lengths), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    accuracy = (model(tokens, lengths).argmax(-1) == labels).float().mean().item()
    assert accuracy > 0.9, accuracy


def test_encoder_classifier_pools_only_real_tokens():
    torch.manual_seed(0)
    model = tref.EncoderOnlyModel(5, 8, 1, 2, 6, n_classes=3).double()
    tokens = torch.randint(0, 5, (1, 6))
    short = model(tokens[:, :4])  # no padding at all
    padded = model(tokens, torch.tensor([4]))
    np.testing.assert_allclose(padded.detach().numpy(), short.detach().numpy(), rtol=1e-12, atol=1e-12)
    assert padded.shape == (1, 3)


# --- encoder-decoder ---------------------------------------------------------------------------

def test_encoder_decoder_generate_and_causality():
    torch.manual_seed(0)
    model = tref.EncoderDecoderModel(9, 11, 16, 2, 4, 12).double().eval()
    src = torch.randint(0, 9, (2, 6))
    lengths = torch.tensor([6, 4])
    out = model.generate(src, bos=1, max_new_tokens=7, src_lengths=lengths)
    assert out.shape == (2, 8) and torch.all(out[:, 0] == 1)
    tokens = out[:, :1]  # greedy decoding without a cache, from the full forward
    for _ in range(7):
        tokens = torch.cat([tokens, model(src, tokens, lengths)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, tokens)
    tgt = torch.randint(0, 11, (2, 5))
    changed = tgt.clone()
    changed[:, 3:] = (changed[:, 3:] + 1) % 11
    np.testing.assert_allclose(model(src, tgt, lengths)[:, :3].detach().numpy(),
                               model(src, changed, lengths)[:, :3].detach().numpy(), rtol=1e-12, atol=1e-12)
    other_src = src.clone()
    other_src[1, 4:] = 0  # padding of the source is invisible
    np.testing.assert_allclose(model(other_src, tgt, lengths)[1].detach().numpy(),
                               model(src, tgt, lengths)[1].detach().numpy(), rtol=1e-12, atol=1e-12)
    other_src[0, 0] = (src[0, 0] + 1) % 9  # but every real source token is
    assert not torch.allclose(model(other_src, tgt, lengths)[0], model(src, tgt, lengths)[0])


def test_encoder_decoder_learns_to_reverse():
    # reversing needs cross-attention to the right source position; judged on unseen sequences
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    src = torch.randint(2, 8, (64, 5), generator=g)
    tgt = torch.cat([torch.ones(64, 1, dtype=torch.long), src.flip(1)], 1)  # BOS = 1, then reversed
    model = tref.EncoderDecoderModel(8, 8, 32, 1, 4, 6)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    for _ in range(80):
        loss = F.cross_entropy(model(src, tgt[:, :-1]).reshape(-1, 8), tgt[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    unseen = torch.randint(2, 8, (128, 5), generator=g)
    accuracy = (model.generate(unseen, 1, 5)[:, 1:] == unseen.flip(1)).float().mean().item()
    assert accuracy > 0.95, (loss.item(), accuracy)


# --- validation --------------------------------------------------------------------------------

def test_model_validation():
    model = tref.DecoderOnlyModel(10, 16, 1, 4, 8)
    with pytest.raises(ValueError, match="^tokens"):
        model(torch.zeros(2, 9, dtype=torch.long))  # longer than max_len
    with pytest.raises(ValueError, match="^tokens"):
        model(torch.zeros(2, 3))  # float ids
    with pytest.raises(ValueError, match="^prompt"):
        model.generate(torch.zeros(1, 5, dtype=torch.long), 4)  # 9 > max_len
    with pytest.raises(ValueError, match="^max_new_tokens"):
        model.generate(torch.zeros(1, 2, dtype=torch.long), -1)
    with pytest.raises(ValueError, match="^temperature"):
        model.generate(torch.zeros(1, 2, dtype=torch.long), 2, greedy=False, temperature=0.0)
    with pytest.raises(ValueError, match="^n_classes"):
        tref.EncoderOnlyModel(10, 16, 1, 4, 8, n_classes=0)
    with pytest.raises(ValueError, match="^vocab_size"):
        tref.DecoderOnlyModel(0, 16, 1, 4, 8)
    with pytest.raises(ValueError, match="^d_model"):
        tref.DecoderOnlyModel(10, 18, 1, 4, 8)
    seq2seq = tref.EncoderDecoderModel(5, 5, 8, 1, 2, 4)
    with pytest.raises(ValueError, match="^src"):
        seq2seq(torch.zeros(1, 5, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="^max_new_tokens"):
        seq2seq.generate(torch.zeros(1, 3, dtype=torch.long), 0, 4)


def test_models_reject_out_of_vocabulary_tokens():
    torch.manual_seed(0)
    model = tref.DecoderOnlyModel(10, 16, 1, 4, 8)
    for bad in (torch.full((1, 3), 10), torch.full((1, 3), -1)):  # IndexError inside nn.Embedding before
        with pytest.raises(ValueError, match="^tokens"):
            model(bad)
    with pytest.raises(ValueError, match="^prompt"):
        model.generate(torch.full((1, 2), 11), 2)
    seq2seq = tref.EncoderDecoderModel(10, 12, 16, 1, 4, 8)
    with pytest.raises(ValueError, match="^src"):
        seq2seq(torch.full((1, 3), 10), torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="^tgt_in"):
        seq2seq(torch.zeros(1, 3, dtype=torch.long), torch.full((1, 2), 12))
    with pytest.raises(ValueError, match="^bos"):
        seq2seq.generate(torch.zeros(1, 3, dtype=torch.long), 12, 2)


def test_decoder_model_names_d_model_when_heads_do_not_divide_it():
    # d_model = 16, n_heads = 3: the error used to read "head_dim must be even for RoPE, got 5"
    with pytest.raises(ValueError, match=r"^d_model \(16\) must be divisible by n_heads \(3\)"):
        tref.DecoderOnlyModel(10, 16, 1, 3, 8)
