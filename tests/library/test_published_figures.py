"""The counting functions against independently published figures of real models.

Every expected number below comes from a source outside this project (cited beside it);
the architecture hyper-parameters come from each model's paper or Hugging Face ``config.json``.
Nothing here restates the library's formula: if a count is off by one norm, one bias or one
embedding table, the published total disagrees.

Sources used (abbreviations in the comments):
* [keras-gpt2], [keras-bert], [keras-t5], [keras-bart]: the ``"params"`` metadata of the KerasHub
  presets, keras-team/keras-hub ``keras_hub/src/models/{gpt2,bert,bart}/*_presets.py`` and
  ``keras_nlp/models/t5/t5_presets.py`` (counted from the converted checkpoints);
* [hf-api]: the Hugging Face model API field ``safetensors.total`` (exact element count of the
  released checkpoint), e.g. https://huggingface.co/api/models/meta-llama/Llama-3.1-8B;
* [hf-num]: ``AutoModel.from_pretrained(name).num_parameters()`` as printed by users of
  ``transformers`` (bert-large-uncased 335,141,888; facebook/bart-base 139,420,416;
  facebook/bart-large 406,291,456);
* [gguf]: ``general.parameter_count`` in the GGUF metadata that ``ollama show`` prints
  (mistral 7B: 7,241,732,096; llama3 8B: 8,030,261,248);
* [mistral]: Jiang et al. 2023, "Mistral 7B", arXiv:2310.06825, Table 1 (dim 4096, 32 layers,
  head_dim 128, hidden_dim 14336, 32 heads, 8 KV heads, vocab 32000);
* KV-cache pages: systemoverflow.com "What is KV cache and why does it dominate memory"
  (Llama 2 7B: 524,288 bytes per token); torchedup.dev "KV Cache Size" (Llama-2-7B, 2048
  tokens: 1.07 GB); runlocalai.co glossary "KV Cache" (Llama 3.x 70B: about 320 MB per 1K
  tokens; Llama 3.1 8B's GQA "a 4x cache reduction"); wes.today "GQA" (80 layers, 8K tokens:
  ~21 GB with 64 KV heads, ~2.6 GB with 8);
* [dsv2]: DeepSeek-AI 2024, "DeepSeek-V2", arXiv:2405.04434 (the PDF in deepseek-ai/DeepSeek-V2 at
  commit ec98ee3): §3.1.2 (60 layers, n_h = 128, d_h = 128, d_c = 512, d_h^R = 64), Table 1 (MLA
  caches (d_c + d_h^R) l ~ 9/2 d_h l elements a token, "equal to GQA with only 2.25 groups") and
  Table 9 (the large MoE with MLA: 34.6K elements a token);
* [dsv3]: DeepSeek-V3's reference configuration, deepseek-ai/DeepSeek-V3
  ``inference/configs/config_671B.json`` at commit 9b4e978 (61 layers, kv_lora_rank 512,
  qk_rope_head_dim 64, 128 heads), as in arXiv:2412.19437.
"""

import pytest

from transformer_ref import counts

LLAMA = dict(bias=False, ffn="swiglu", norm="rmsnorm", tied_embeddings=False)  # no biases, RMSNorm, SwiGLU, untied head


# --- GPT-2 (learned positions, tied head, biases, LayerNorm, GELU, d_ff = 4 C) ------------------

@pytest.mark.parametrize("name, d_model, n_layers, n_heads, published", [
    ("gpt2", 768, 12, 12, 124_439_808),          # [keras-gpt2] gpt2_base_en
    ("gpt2-medium", 1024, 24, 16, 354_823_168),  # [keras-gpt2] gpt2_medium_en
    ("gpt2-large", 1280, 36, 20, 774_030_080),   # [keras-gpt2] gpt2_large_en
    ("gpt2-xl", 1600, 48, 25, 1_557_611_200),    # [keras-gpt2] gpt2_extra_large_en
])
def test_gpt2_family(name, d_model, n_layers, n_heads, published):
    assert counts.model_param_count(50257, d_model, n_layers, n_heads, max_positions=1024) == published


# --- BERT (post-norm: the "final norm" is the embedding LayerNorm) -----------------------------

@pytest.mark.parametrize("name, vocab, d_model, n_layers, n_heads, published", [
    ("bert-base-uncased", 30522, 768, 12, 12, 109_482_240),    # [keras-bert] bert_base_en_uncased
    ("bert-base-cased", 28996, 768, 12, 12, 108_310_272),      # [keras-bert] bert_base_en
    ("bert-large-uncased", 30522, 1024, 24, 16, 335_141_888),  # [keras-bert] bert_large_en_uncased; [hf-num]
    ("bert-large-cased", 28996, 1024, 24, 16, 333_579_264),    # [keras-bert] bert_large_en
])
def test_bert_family(name, vocab, d_model, n_layers, n_heads, published):
    stack = counts.model_param_count(vocab, d_model, n_layers, n_heads, max_positions=512)
    token_types = 2 * d_model                 # segment A/B embeddings
    pooler = d_model * d_model + d_model      # the [CLS] pooler: one dense layer with bias
    assert stack + token_types + pooler == published


# --- Llama 2, Llama 3, Mistral (RoPE: max_positions=None) --------------------------------------

@pytest.mark.parametrize("name, vocab, d_model, n_layers, n_heads, d_ff, n_kv_heads, published", [
    # [hf-api] meta-llama/Llama-2-{7,13,70}b-hf hold 6,738,417,664 / 13,015,866,880 /
    # 68,976,653,312 elements: those checkpoints also store each layer's rotary ``inv_freq``
    # buffer (64 floats, not a parameter), which the line below adds back.
    ("llama-2-7b", 32000, 4096, 32, 32, 11008, 32, 6_738_415_616),
    ("llama-2-13b", 32000, 5120, 40, 40, 13824, 40, 13_015_864_320),
    ("llama-2-70b", 32000, 8192, 80, 64, 28672, 8, 68_976_648_192),
    ("mistral-7b", 32000, 4096, 32, 32, 14336, 8, 7_241_732_096),          # [gguf]; architecture [mistral]
    ("llama-3-8b", 128256, 4096, 32, 32, 14336, 8, 8_030_261_248),         # [hf-api] Llama-3.1-8B; [gguf]
    ("llama-3-70b", 128256, 8192, 80, 64, 28672, 8, 70_553_706_496),       # [hf-api] Llama-3.1-70B
    ("llama-3.1-405b", 128256, 16384, 126, 128, 53248, 8, 405_853_388_800),  # [hf-api] Llama-3.1-405B
])
def test_llama_and_mistral(name, vocab, d_model, n_layers, n_heads, d_ff, n_kv_heads, published):
    count = counts.model_param_count(vocab, d_model, n_layers, n_heads, d_ff, n_kv_heads=n_kv_heads, **LLAMA)
    assert count == published
    if name.startswith("llama-2"):
        assert count + n_layers * (d_model // n_heads // 2) == {
            "llama-2-7b": 6_738_417_664, "llama-2-13b": 13_015_866_880, "llama-2-70b": 68_976_653_312}[name]


def test_llama2_default_ffn_width_is_metas_rule():
    # Llama-2-7B/13B config.json: intermediate_size 11008 / 13824 = Meta's 256-rounded 8C/3 rule
    assert counts.default_d_ff(4096, "swiglu") == 11008
    assert counts.default_d_ff(5120, "swiglu") == 13824


# --- encoder-decoders assembled from block counts ----------------------------------------------

@pytest.mark.parametrize("name, d_model, n_layers, n_heads, d_ff, published", [
    ("t5-small", 512, 6, 8, 2048, 60_506_624),    # [keras-t5] t5_small
    ("t5-base", 768, 12, 12, 3072, 222_903_552),  # [keras-t5] t5_base
])
def test_t5(name, d_model, n_layers, n_heads, d_ff, published):
    # T5 v1.0: no biases, weight-only LayerNorm, a two-matrix ReLU FFN (counted like the GELU
    # one), one embedding shared by encoder, decoder and LM head, a final norm per stack, and a
    # relative-position bias of 32 buckets per head in the first block of each stack.
    options = dict(bias=False, norm="rmsnorm")
    encoder = n_layers * counts.block_param_count(d_model, n_heads, d_ff, **options) + d_model
    decoder = n_layers * counts.block_param_count(d_model, n_heads, d_ff, cross_attention=True, **options) + d_model
    relative_bias = 2 * 32 * n_heads
    assert 32128 * d_model + encoder + decoder + relative_bias == published


@pytest.mark.parametrize("name, d_model, n_layers, n_heads, positions, published", [
    ("bart-base (HF)", 768, 6, 12, 1026, 139_420_416),      # [hf-num] facebook/bart-base
    ("bart-base (Keras)", 768, 6, 12, 1024, 139_417_344),   # [keras-bart] bart_base_en
    ("bart-large (HF)", 1024, 12, 16, 1026, 406_291_456),   # [hf-num] facebook/bart-large
    ("bart-large (Keras)", 1024, 12, 16, 1024, 406_287_360),  # [keras-bart] bart_large_en
])
def test_bart(name, d_model, n_layers, n_heads, positions, published):
    # Post-norm, biases, GELU, d_ff = 4C, one shared 50265-token embedding, learned positions per
    # stack (Hugging Face keeps 2 extra rows: 1026), and a LayerNorm on each stack's embeddings.
    encoder = n_layers * counts.block_param_count(d_model, n_heads) + positions * d_model + 2 * d_model
    decoder = (n_layers * counts.block_param_count(d_model, n_heads, cross_attention=True)
               + positions * d_model + 2 * d_model)
    assert 50265 * d_model + encoder + decoder == published


# --- KV-cache bytes (fp16, batch 1) --------------------------------------------------------------

def test_kv_cache_llama2_7b():
    per_token = counts.kv_cache_bytes(32, 32, 128, 1)
    assert per_token == 524_288  # systemoverflow: "approximately 524,288 bytes per token"
    assert counts.kv_cache_bytes(32, 32, 128, 2048) / 1e9 == pytest.approx(1.07, abs=0.005)  # torchedup: 1.07 GB


def test_kv_cache_70b_with_and_without_gqa():
    # Llama-2-70B and Llama-3-70B share 80 layers, 8 KV heads of 128 dims
    assert counts.kv_cache_bytes(80, 8, 128, 1024) / 2**20 == 320          # runlocalai: ~320 MB per 1K tokens
    assert counts.kv_cache_bytes(80, 64, 128, 8192) / 1e9 == pytest.approx(21, abs=0.5)   # wes.today: ~21 GB (MHA)
    assert counts.kv_cache_bytes(80, 8, 128, 8192) / 1e9 == pytest.approx(2.6, abs=0.1)   # wes.today: ~2.6 GB (GQA)


def test_kv_cache_mistral_and_llama3_8b():
    # [mistral] Table 1 and Llama-3-8B config.json: 32 layers, 8 KV heads, head_dim 128 -> 128 KiB a
    # token; runlocalai: Llama 3.1 8B's 8 KV heads for 32 query heads are "a 4x cache reduction"
    # over multi-head attention (Llama-2-7B's layout at the same width and depth).
    per_token = counts.kv_cache_bytes(32, 8, 128, 1)
    assert per_token == 128 * 1024
    assert counts.kv_cache_bytes(32, 32, 128, 1) == 4 * per_token
