"""The model builder's fixes for transformers 5 (firmware/toolchain/builder_shim.py), each on the
config transformers makes. Without them the builds in tests/engine/test_architectures.py fail
(Phi-3: KeyError 'multi_cache'; Phi-3 LongRoPE: KeyError 'type'; Gemma 3: KeyError 'rope_type')
or export a model that is wrong past its window (Mistral: every layer given full attention) or
everywhere (Gemma: its embedding scale rounded, 4.3e-4 off in the tiny Gemma 3's logits, 2.4e-3
in Gemma 3 270M's; Phi-2 and Nemotron: the norms' epsilon 1e-6 for their 1e-5, 0.05 and 0.2 off;
OLMo: its LayerNorm exported as an RMS norm, 1.0 off; SmolLM3: KeyError 'position_ids')."""

from __future__ import annotations

import subprocess
import sys

import transformers

from firmware.toolchain import builder_shim
from firmware.toolchain.tiny import tiny_hf_dir

SHAPE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
             pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip


def test_phi3_with_its_default_rope_is_exported_as_plain_phi3() -> None:
    config = transformers.Phi3Config(**SHAPE)  # original_max_position_embeddings defaults to 4096
    assert config.original_max_position_embeddings != config.max_position_embeddings
    builder_shim.phi3_default_rope(config)
    assert config.original_max_position_embeddings == config.max_position_embeddings == 2048


def test_phi3_longrope_is_left_to_the_builder() -> None:
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
            "original_max_position_embeddings": 1024}  # fmt: skip
    config = transformers.Phi3Config(**SHAPE, rope_parameters=rope)
    before = config.original_max_position_embeddings
    builder_shim.phi3_default_rope(config)
    assert config.original_max_position_embeddings == before


def test_longrope_gets_the_type_the_builder_reads() -> None:
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
            "original_max_position_embeddings": 1024}  # fmt: skip
    config = transformers.Phi3Config(**SHAPE, rope_parameters=rope)
    builder_shim.longrope_type(config)
    assert config.rope_parameters["type"] == "longrope"
    plain = transformers.LlamaConfig(**SHAPE)
    builder_shim.longrope_type(plain)
    assert "type" not in plain.rope_parameters


def test_gemma3_rope_per_layer_type_becomes_the_flat_entry_and_the_local_base() -> None:
    config = transformers.Gemma3TextConfig(**SHAPE)
    assert "rope_type" not in config.rope_parameters  # {"full_attention": ..., "sliding_attention": ...}
    builder_shim.gemma3_rope_per_layer_type(config)
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 1000000.0}
    assert config.rope_theta == 1000000.0 and config.rope_local_base_freq == 10000.0


def test_a_sliding_window_without_layer_types_slides_on_every_layer() -> None:
    mistral = transformers.MistralConfig(**SHAPE, sliding_window=16)
    builder_shim.sliding_window_layers(mistral)
    assert mistral.layer_types == ["sliding_attention", "sliding_attention"]
    plain = transformers.MistralConfig(**SHAPE, sliding_window=None)
    builder_shim.sliding_window_layers(plain)
    assert getattr(plain, "layer_types", None) is None
    gemma = transformers.Gemma3TextConfig(**SHAPE, layer_types=["sliding_attention", "full_attention"])
    builder_shim.sliding_window_layers(gemma)
    assert gemma.layer_types == ["sliding_attention", "full_attention"]  # its own pattern kept


def test_a_norm_epsilon_under_another_name_is_the_one_the_builder_reads() -> None:
    phi = transformers.PhiConfig(**SHAPE, layer_norm_eps=3e-5)
    builder_shim.norm_epsilon(phi)
    assert phi.rms_norm_eps == 3e-5
    nemotron = transformers.NemotronConfig(**SHAPE, norm_eps=2e-5)
    builder_shim.norm_epsilon(nemotron)
    assert nemotron.rms_norm_eps == 2e-5
    llama = transformers.LlamaConfig(**SHAPE, rms_norm_eps=1e-6)
    builder_shim.norm_epsilon(llama)
    assert llama.rms_norm_eps == 1e-6  # its own kept


def test_the_families_given_the_llama_class_go_to_it_and_no_other() -> None:
    for config_class, arch in (("Olmo2Config", "Olmo2ForCausalLM"), ("Olmo3Config", "Olmo3ForCausalLM"),
                               ("Exaone4Config", "Exaone4ForCausalLM"), ("Glm4Config", "Glm4ForCausalLM"),
                               ("ArceeConfig", "ArceeForCausalLM"), ("SeedOssConfig", "SeedOssForCausalLM"),
                               ("StableLmConfig", "StableLmForCausalLM"), ("OlmoeConfig", "OlmoeForCausalLM"),
                               ("Qwen2MoeConfig", "Qwen2MoeForCausalLM")):  # fmt: skip
        config = getattr(transformers, config_class)(**SHAPE, architectures=[arch])
        builder_shim.post_norm_as_llama(config)
        assert config.architectures == ["LlamaForCausalLM"], arch
    olmo = transformers.OlmoConfig(**SHAPE, architectures=["OlmoForCausalLM"])  # the builder's own OLMo class
    builder_shim.post_norm_as_llama(olmo)
    assert olmo.architectures == ["OlmoForCausalLM"]


def test_mixtral_goes_to_the_mistral_class() -> None:
    config = transformers.MixtralConfig(**SHAPE, architectures=["MixtralForCausalLM"])
    builder_shim.mixtral_as_mistral(config)
    assert config.architectures == ["MistralForCausalLM"]


def test_qwen3_5_s_language_model_alone_goes_to_its_class_and_its_text_rope_is_plain() -> None:
    rope = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
            "mrope_interleaved": True}  # as the published configs give it  # fmt: skip
    alone = transformers.Qwen3_5TextConfig(**SHAPE, rope_parameters=dict(rope), architectures=["Qwen3_5ForCausalLM"])
    builder_shim.qwen3_5_text_as_conditional(alone)
    builder_shim.qwen35_rope_as_text(alone)
    assert alone.architectures == ["Qwen3_5ForConditionalGeneration"]
    assert alone.rope_parameters == {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}
    whole = transformers.Qwen3_5Config(text_config={**SHAPE, "rope_parameters": dict(rope)},
                                       architectures=["Qwen3_5ForConditionalGeneration"])  # fmt: skip
    builder_shim.qwen35_rope_as_text(whole)
    assert "mrope_section" not in whole.text_config.rope_parameters
    vl = transformers.Qwen3VLConfig(text_config={"rope_parameters": {"rope_type": "default", "rope_theta": 5e6,
                                                                     "mrope_section": [24, 20, 20]}},
                                    architectures=["Qwen3VLForConditionalGeneration"])  # fmt: skip
    builder_shim.qwen35_rope_as_text(vl)
    assert vl.text_config.rope_parameters["mrope_section"] == [24, 20, 20]  # Qwen3-VL's positions are three rows


def test_granite_3_moe_goes_to_the_granite_4_class_with_rope_and_its_shared_mlp_where_it_has_one() -> None:
    for config, shared in ((transformers.GraniteMoeConfig(**SHAPE, architectures=["GraniteMoeForCausalLM"]), 0),
                           (transformers.GraniteMoeSharedConfig(**SHAPE, shared_intermediate_size=48,
                                                                architectures=["GraniteMoeSharedForCausalLM"]), 48)):
        builder_shim.granite_moe_as_granite4(config)
        assert config.architectures == ["GraniteMoeHybridForCausalLM"]
        assert config.layer_types == ["full_attention"] * config.num_hidden_layers
        assert (config.position_embedding_type, config.shared_intermediate_size) == ("rope", shared)
    granite4 = transformers.GraniteMoeHybridConfig(**SHAPE, architectures=["GraniteMoeHybridForCausalLM"],
                                                   position_embedding_type="nope")  # fmt: skip
    builder_shim.granite_moe_as_granite4(granite4)
    assert granite4.position_embedding_type == "nope"  # Granite 4's own config is its own


def test_an_attention_cap_is_kept_only_where_transformers_applies_it() -> None:
    gemma3 = transformers.Gemma3TextConfig(**SHAPE, attn_logit_softcapping=5.0)
    builder_shim.attention_softcap_as_transformers(gemma3)
    assert gemma3.attn_logit_softcapping is None  # Gemma 3's attention never reads it
    gemma2 = transformers.Gemma2Config(**SHAPE, attn_logit_softcapping=50.0)
    builder_shim.attention_softcap_as_transformers(gemma2)
    assert gemma2.attn_logit_softcapping == 50.0


def test_granite_swa_goes_to_the_granite_class() -> None:
    config = transformers.GraniteSWAConfig(**SHAPE, architectures=["GraniteSWAForCausalLM"])
    builder_shim.granite_swa_as_granite(config)
    assert config.architectures == ["GraniteForCausalLM"]
    granite = transformers.GraniteConfig(**SHAPE, architectures=["GraniteForCausalLM"])
    builder_shim.granite_swa_as_granite(granite)
    assert granite.architectures == ["GraniteForCausalLM"]


def test_the_builder_module_loads_its_configs_through_the_fixes() -> None:
    """Importing the builder's modules replaces sys.modules['transformers'] (transformers 5's lazy
    loading); a patch of the module object seen before that is not what the builder imports."""
    folder = tiny_hf_dir("gemma3")
    code = (
        "from firmware.toolchain import builder_shim; builder_shim.install()\n"
        "import builder\n"
        f"c = builder.AutoConfig.from_pretrained({str(folder)!r})\n"
        "print(c.rope_parameters['rope_type'], c.rope_local_base_freq)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["default", "10000.0"]
