"""The `--from X.gguf` build for every architecture the firmware build supports: each tiny fixture
(tiny.py) written as llama.cpp writes that family's GGUF (tiny_gguf.py: F32 tensors, llama.cpp's
per-family transforms and metadata, the tokenizer and chat template), built to fp32 firmware, and
checked against the bundle built from the Hugging Face folder (itself checked against transformers
in test_architectures.py): the same chat-prompt token ids, prefill logits within 1e-4 and the same
16 greedy tokens. The conversation runs past Mistral's and Gemma 3's 16-position windows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import firmware
from appliance.engine import Message, ModelSession
from appliance.engine.chat import ChatTemplate
from appliance.engine.tokenizer import TextTokenizer
from firmware.toolchain import gguf_families
from firmware.toolchain.build import read_chat_template
from firmware.toolchain.tiny import (
    ARCHITECTURES,
    FOLDER_ONLY,
    reference_class,
    reference_dir,
    tiny_bundle,
    tiny_hf_dir,
)
from firmware.toolchain.tiny_gguf import (
    CONVERTED,
    GGUF_ARCHITECTURES,
    llama_cpp_convert,
    llama_cpp_convert_many,
    llama_cpp_source,
    tiny_gguf,
    tiny_gguf_bundle,
)

CONVERSATION = (
    Message("user", "Explain the for statement and how the else clause of a loop works."),
    Message("assistant", "The for statement iterates over the items of any sequence, in order."),
    Message("user", "And what does break do inside a while loop with an else clause?\n\n  Twice  spaced."),
)
SYSTEM = "You answer in one short sentence."


@pytest.fixture(scope="module", params=sorted(GGUF_ARCHITECTURES))
def arch(request: pytest.FixtureRequest, trusted_keys: Path) -> tuple[str, firmware.Bundle, firmware.Bundle]:
    name = str(request.param)
    return (name, firmware.load(tiny_gguf_bundle(name), trusted_keys),
            firmware.load(tiny_bundle(name), trusted_keys))  # fmt: skip


def test_every_fixture_architecture_but_the_folder_only_ones_has_a_gguf_form() -> None:
    from firmware.toolchain.build import GGUF_CHECKED

    assert set(GGUF_ARCHITECTURES) == set(ARCHITECTURES) - set(FOLDER_ONLY)
    assert set(GGUF_CHECKED) == set(GGUF_ARCHITECTURES.values())  # what a failed build names as read


def _ids(bundle: firmware.Bundle, system: str | None = None) -> list[int]:
    tok = TextTokenizer(bundle.tokenizer_path, bundle.tokenizer_config_path)
    return ChatTemplate(bundle.chat_template, tok).prompt(CONVERSATION, system=system).ids


def _hf_chat_ids(tokenizer: Any, system: str | None) -> list[int]:
    docs = ([{"role": "system", "content": system}] if system else []) + [
        {"role": m.role, "content": m.content} for m in CONVERSATION
    ]
    out = tokenizer.apply_chat_template(docs, tokenize=True, add_generation_prompt=True)
    if not isinstance(out, list):  # transformers 5 returns the encoding
        out = out["input_ids"]
    return [int(i) for i in out]


@pytest.mark.parametrize("system", [None, SYSTEM])
def test_the_gguf_tokenizer_and_template_give_the_folder_s_token_ids(
    arch: tuple[str, firmware.Bundle, firmware.Bundle], system: str | None
) -> None:
    """The bundle built from the GGUF renders and tokenizes a chat as the one built from the folder
    does, and transformers reads from the GGUF the tokenizer of the folder's tokenizer.json.

    Except for Qwen's, both bundles also give the folder's own ids: the model builder re-saves a
    tokenizer by model type, and Qwen2Tokenizer splits text by Qwen's rule, which these fixtures'
    BPE (trained with GPT-2's) was not made with; the doubled spaces here split differently. Qwen2's
    (both fixtures) and Qwen3.5 MoE's do so from either source; the dense Qwen3.5's only from the
    folder (transformers reads its file's tokenizer with the file's own rule, here GPT-2's); Qwen2-VL's
    and Qwen2.5-VL's from neither: the file's bundle is a Qwen2's, re-saved so, the folder's not. A
    real Qwen vocabulary is made with Qwen's rule, and a real file names it."""
    from firmware.toolchain.build import gguf_tokenizer

    name, from_gguf, from_folder = arch
    ids, folder_ids = _ids(from_gguf, system), _ids(from_folder, system)
    assert from_gguf.chat_template == from_folder.chat_template, name
    folder = tiny_hf_dir(name)
    tok = TextTokenizer(folder / "tokenizer.json", folder / "tokenizer_config.json")
    own = ChatTemplate(read_chat_template(folder), tok).prompt(CONVERSATION, system=system).ids
    path = tiny_gguf(name)
    assert _hf_chat_ids(gguf_tokenizer(path), system) == own, name
    qwen_rule = {"qwen2": (False, True), "qwen2_yarn": (False, True), "qwen3_5": (True, False),
                 "qwen3_5_moe": (False, True), "qwen2_vl": (False, False), "qwen2_5_vl": (False, False)}  # fmt: skip
    assert (ids == own, ids == folder_ids) == qwen_rule.get(name, (True, True)), name


def test_prefill_logits_and_16_greedy_steps_match_the_folder_s_bundle(
    arch: tuple[str, firmware.Bundle, firmware.Bundle],
) -> None:
    name, from_gguf, from_folder = arch
    ids = np.array(_ids(from_folder), dtype=np.int64)
    assert len(ids) > 4 * 16  # past the sliding windows
    ours, ref = ModelSession(from_gguf), ModelSession(from_folder)
    cache, ref_cache = ours.new_cache(len(ids) + 16), ref.new_cache(len(ids) + 16)
    logits, ref_logits = ours.forward(cache, ids), ref.forward(ref_cache, ids)
    assert np.abs(logits - ref_logits).max() <= 1e-4, name
    tokens, ref_tokens = [], []
    for _ in range(16):
        tokens.append(int(logits.argmax()))
        ref_tokens.append(int(ref_logits.argmax()))
        logits = ours.forward(cache, np.array(tokens[-1:], dtype=np.int64))
        ref_logits = ref.forward(ref_cache, np.array(ref_tokens[-1:], dtype=np.int64))
    assert tokens == ref_tokens, name


# What transformers' GGUF loader leaves out of the config and gguf_to_hf puts back, per fixture.
RESTORED = {
    "qwen3": {"head_dim": 32},
    "qwen3_moe": {"head_dim": 32, "moe_intermediate_size": 32, "norm_topk_prob": True},
    "phi3": {"rope_parameters.partial_rotary_factor": 0.5},
    "phi3_longrope": {"rope_parameters.rope_type": "longrope",
                      "rope_parameters.original_max_position_embeddings": 1024},
    "mistral": {"model_type": "mistral", "sliding_window": 16},
    "mixtral": {"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2},
    "gemma2": {"query_pre_attn_scalar": 16},
    "gemma3": {"layer_types": ["sliding_attention", "full_attention"], "query_pre_attn_scalar": 16},
    "gemma3_linear": {"rope_parameters.full_attention.rope_type": "linear",
                      "rope_parameters.full_attention.factor": 8.0},
    "llama_rope_linear": {"rope_parameters.rope_type": "linear", "rope_parameters.factor": 4.0},
    "qwen2_yarn": {"rope_parameters.rope_type": "yarn", "rope_parameters.factor": 4.0,
                   "rope_parameters.original_max_position_embeddings": 2048},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(RESTORED))
def test_the_dequantized_folder_keeps_what_the_gguf_states(name: str, tmp_path: Path) -> None:
    """Each of these the loader drops (and the model's output changes): checked on the folder
    gguf_to_hf writes, against the fixture's own config."""
    import json

    from firmware.toolchain.build import gguf_to_hf

    gguf_to_hf(tiny_gguf(name), tmp_path / "hf")
    ours = json.loads((tmp_path / "hf" / "config.json").read_text())
    theirs = json.loads((tiny_hf_dir(name) / "config.json").read_text())
    for key, value in RESTORED[name].items():
        got, want = ours, theirs
        for part in key.split("."):
            got, want = got[part], want[part]
        assert got == want == value, (name, key)
    if name == "phi3_longrope":
        for key in ("short_factor", "long_factor"):
            assert np.allclose(ours["rope_parameters"][key], theirs["rope_parameters"][key]), key


# Keys ours writes that llama.cpp's converter does not: the two tiny_gguf.py names (a window on a
# "llama" file, Gemma 3's layer pattern), and general.* (names and labels llama.cpp makes up).
OUR_KEYS = {"mistral": {"llama.attention.sliding_window"}, "gemma3": {"gemma3.attention.sliding_window_pattern"}}


WRITTEN_HERE = sorted(set(GGUF_ARCHITECTURES) - set(CONVERTED))


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each fixture tiny_gguf.py writes itself, written again by llama.cpp's converter (in one
    process: its start is most of each conversion's time)."""
    out = tmp_path_factory.mktemp("llama-cpp")
    files = {name: out / f"{name}.gguf" for name in WRITTEN_HERE}
    llama_cpp_convert_many([(tiny_hf_dir(name), path, ()) for name, path in files.items()])
    return files


@pytest.mark.parametrize("name", WRITTEN_HERE)
def test_the_gguf_is_what_llama_cpp_s_converter_writes(name: str, converted: dict[str, Path]) -> None:
    """Tensors bit for bit (after llama.cpp's permutations and norm shifts) and every metadata key
    and value, against convert_hf_to_gguf.py from the llama.cpp source bench/llama_server.sh caches
    (the CONVERTED fixtures' files are its own)."""
    from gguf import GGUFReader

    theirs, ours = GGUFReader(str(converted[name])), GGUFReader(str(tiny_gguf(name)))

    def metadata(reader: GGUFReader) -> dict[str, Any]:
        return {k: f.contents() for k, f in reader.fields.items() if not k.startswith(("GGUF.", "general."))}

    mine, extra = metadata(ours), OUR_KEYS.get(name, OUR_KEYS.get(name.partition("_")[0], set()))
    assert {k for k in mine if k not in metadata(theirs)} == extra, name
    assert {k: v for k, v in mine.items() if k not in extra} == metadata(theirs), name
    tensors = {t.name: t for t in theirs.tensors}
    assert sorted(tensors) == sorted(t.name for t in ours.tensors), name
    for t in ours.tensors:
        assert t.tensor_type == tensors[t.name].tensor_type, (name, t.name)
        assert np.array_equal(np.asarray(t.data), np.asarray(tensors[t.name].data)), (name, t.name)


def test_gemma3_files_of_other_shapes_get_their_layer_pattern_scale_and_rope_scaling() -> None:
    """What no tiny fixture's file has: a pattern given as a period, none given (llama.cpp's five
    sliding layers to one global), and the 27B's query scale (1/sqrt(width / heads), as llama.cpp);
    with Gemma 3 4B-27B's linear RoPE scaling of the global layers (rope.scaling.type and factor),
    which the gemma3_linear fixture's file also has."""
    from transformers import AutoConfig

    from firmware.toolchain.build import _restore_gguf_config

    config = AutoConfig.from_pretrained(tiny_hf_dir("gemma3"))
    scaled = _restore_gguf_config(config, {"general.architecture": "gemma3", "gemma3.rope.scaling.type": "linear",
                                           "gemma3.rope.scaling.factor": 8.0,
                                           "gemma3.attention.sliding_window_pattern": 2})  # fmt: skip
    assert scaled.layer_types == ["sliding_attention", "full_attention"]
    assert scaled.rope_parameters["full_attention"] == {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
    assert scaled.rope_parameters["sliding_attention"]["rope_type"] == "default"
    assert scaled.query_pre_attn_scalar == 16  # the head width
    config.num_hidden_layers = 62
    big = _restore_gguf_config(config, {"general.architecture": "gemma3"})
    assert big.layer_types[:6] == ["sliding_attention"] * 5 + ["full_attention"] and len(big.layer_types) == 62
    assert big.query_pre_attn_scalar == 72 // 4  # width / heads


def test_a_rope_frequency_table_no_llama3_scaling_makes_is_refused(tmp_path: Path) -> None:
    """llama.cpp keeps Llama 3.1's RoPE scaling only as each frequency's divisor (rope_freqs),
    which transformers' loader drops; gguf_to_hf finds the scaling that makes the table (the
    matrix above builds the llama_rope_llama3 fixture's file and checks it against transformers).
    A table no such scaling makes is refused."""
    from firmware.errors import BundleError
    from firmware.toolchain.build import gguf_to_hf

    # The same file with a table no Llama 3 scaling makes.
    bad = _rewritten(tiny_gguf("llama_rope_llama3"), tmp_path / "bad.gguf",
                     lambda name, data: data[::-1].copy() if name == "rope_freqs.weight" else data)  # fmt: skip
    with pytest.raises(BundleError, match="not one Llama 3's scaling makes"):
        gguf_to_hf(bad, tmp_path / "hf")


def test_a_file_without_a_tensor_the_model_needs_is_refused(tmp_path: Path) -> None:
    """transformers' loader fills a weight the file has no tensor for with random values and only
    says so in its loading info: a file of a layout it does not read (a Mixtral's experts, before
    gguf_to_hf read them) built a model of random MLPs. Such a file is refused, naming the weight."""
    from firmware.errors import BundleError
    from firmware.toolchain.build import gguf_to_hf

    bad = _rewritten(tiny_gguf("llama"), tmp_path / "bad.gguf",
                     lambda name, data: None if name == "blk.1.ffn_up.weight" else data)  # fmt: skip
    with pytest.raises(BundleError, match=r"no tensors for model\.layers\.1\.mlp\.up_proj\.weight"):
        gguf_to_hf(bad, tmp_path / "hf")


def test_a_falcon_file_of_key_value_groups_is_refused(tmp_path: Path) -> None:
    """llama.cpp writes Falcon 40B's and 180B's fused projections reordered (all queries, then all
    keys, then all values), which transformers' loader reads as Falcon 7B's layout: such a file is
    refused, pointing to the Hugging Face folder, rather than built wrong. (Falcon 7B's one group
    is the same in both layouts: the matrix checks its file.)"""
    from firmware.errors import BundleError
    from firmware.toolchain.build import gguf_to_hf

    grouped = _rewritten(tiny_gguf("falcon"), tmp_path / "grouped.gguf", lambda name, data: data,
                         fields={"falcon.attention.head_count_kv": 2})  # fmt: skip
    with pytest.raises(BundleError, match=r"Falcon GGUF file of key-value groups .* Hugging Face folder"):
        gguf_to_hf(grouped, tmp_path / "hf")


@pytest.mark.parametrize(("fields", "refused"), [
    ({"mpt.attention.clamp_kqv": 6}, "its queries, keys and values clipped"),
    ({"mpt.attention.max_alibi_bias": 16.0}, r"ALiBi's maximum bias 16 \(read: 8\)"),
    ({"mpt.attention.max_alibi_bias": 0.0}, r"ALiBi's maximum bias 0 "),  # (learned positions)
    ({"mpt.attention.head_count_kv": 2}, "grouped key-value heads")])
def test_an_mpt_file_of_options_transformers_runs_otherwise_is_refused(fields: dict[str, Any], refused: str,
                                                                        tmp_path: Path) -> None:  # fmt: skip
    """What of an MPT file's keys transformers' class would run otherwise than the model (or could
    not run) is refused, naming it, before a folder is written."""
    from firmware.errors import BundleError
    from firmware.toolchain.build import gguf_to_hf

    edited = _rewritten(tiny_gguf("mpt"), tmp_path / "edited.gguf", lambda name, data: data, fields=fields)
    with pytest.raises(BundleError, match=f"an MPT file with {refused}"):
        gguf_to_hf(edited, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize(("name", "fields", "refused"), [
    ("afmoe", {"afmoe.expert_weights_norm": False}, r"not scaled to sum to 1 \(expert_weights_norm"),
    ("afmoe", {"afmoe.expert_gating_func": 1}, r"not chosen by sigmoid \(gating 1\): Trinity's are"),
    ("afmoe", {"afmoe.attention.sliding_window": None}, r"without a sliding window"),
    ("ling2", {"bailingmoe2.expert_gating_func": 1}, r"not chosen by sigmoid \(gating 1\): Ling 2\.0's are")])
def test_a_trinity_or_ling_file_llama_cpp_runs_otherwise_than_transformers_is_refused(
        name: str, fields: dict[str, Any], refused: str, tmp_path: Path) -> None:  # fmt: skip
    """Trinity's (afmoe) and Ling 2.0's (bailingmoe2) files whose keys make llama.cpp run what
    transformers' classes do not: experts mixed unscaled or chosen by softmax, no sliding window."""
    from firmware.errors import BundleError
    from firmware.toolchain.build import gguf_to_hf

    kept = {key: value for key, value in fields.items() if value is not None}
    dropped = {key for key, value in fields.items() if value is None}
    edited = _rewritten(tiny_gguf(name), tmp_path / "edited.gguf", lambda _, data: data, fields=kept,
                        dropped=dropped)  # fmt: skip
    with pytest.raises(BundleError, match=refused):
        gguf_to_hf(edited, tmp_path / "hf")


def test_gemma3n_s_per_layer_table_is_cut_to_the_rows_it_has() -> None:
    """llama.cpp pads the per-layer table with zero rows to the whole vocabulary (the published
    models' image and audio tokens have none); transformers gives tokens past the table row 0."""
    from firmware.toolchain import gguf_families
    from firmware.toolchain.build import _gguf_metadata

    meta = _gguf_metadata(tiny_gguf("gemma3n_text"))
    config = gguf_families.config(meta)
    assert config.vocab_size_per_layer_input == 512  # the file's rows
    state = gguf_families.state(tiny_gguf("gemma3n_text"), config, meta)
    assert config.vocab_size_per_layer_input == 480 == len(state["model.embed_tokens_per_layer.weight"])
    assert config.vocab_size_per_layer_input == _config_of("gemma3n_text")["vocab_size_per_layer_input"]


# Fixtures whose file's weights are not the folder's by design (see the test's docstring).
NOT_WEIGHT_FOR_WEIGHT = ("mistral3_vl", "granite4", "falcon_h1")


@pytest.mark.parametrize("name", sorted(n for n, a in GGUF_ARCHITECTURES.items()
                                        if a in gguf_families.ARCHITECTURES and n not in NOT_WEIGHT_FOR_WEIGHT))
def test_a_file_read_here_gives_every_weight_of_the_folder_it_was_converted_from(name: str) -> None:
    """The families transformers' loader does not read, weight by weight: a tiny fixture's output
    can hide a wrong layout (Granite's attention multiplier leaves its scores near zero, so rows
    permuted within a head barely show), its F32 file's weights cannot. (Mistral Small's
    image-and-text folder has the ministral3 fixture's language model; a dense Granite 4.0's file is
    a Granite 3's, whose weights have other names; Falcon-H1's has its multipliers multiplied in.)
    An image-and-text folder's file (Qwen3-VL's) holds its language model's weights alone."""
    import torch
    import transformers

    from firmware.toolchain.build import _gguf_metadata

    meta = _gguf_metadata(tiny_gguf(name))
    config = gguf_families.config(meta)
    ours = gguf_families.state(tiny_gguf(name), config, meta)
    image_and_text = "text_config" in ARCHITECTURES[name][2]
    loader = getattr(transformers, reference_class(name)) if image_and_text else transformers.AutoModelForCausalLM
    folder = loader.from_pretrained(str(reference_dir(name)), dtype=torch.float32)
    theirs = {key.replace("model.language_model.", "model.", 1): value for key, value in folder.state_dict().items()
              if not key.startswith("model.visual.")}  # fmt: skip
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    assert set(ours) | tied == set(theirs) | tied
    for key, value in ours.items():
        if name == "gemma3n_text" and key == "model.embed_tokens_per_layer.weight":
            value = value[: len(theirs[key])]  # (test_gemma3n_s_per_layer_table_is_cut_to_the_rows_it_has)
        assert value.equal(theirs[key]), key


def _config_of(name: str) -> dict[str, Any]:
    import json

    return dict(json.loads((tiny_hf_dir(name) / "config.json").read_text()))


def test_a_gpt_oss_file_s_mxfp4_experts_are_the_published_folder_s(tmp_path: Path) -> None:
    """ggml-org's gpt-oss files keep the experts in MXFP4, as OpenAI publishes them: llama.cpp's
    converter repacks the folder's blocks (nibbles reordered, gate and up split apart), and the
    build's reading of the file gives every weight the folder's own dequantization gives."""
    from gguf import GGMLQuantizationType, GGUFReader
    from safetensors.torch import load_file

    from firmware.toolchain import gguf_families, prequantized, tiny_quantized
    from firmware.toolchain.build import _gguf_metadata

    folder = tiny_quantized.write(tiny_hf_dir("gpt_oss"), tmp_path / "mxfp4", "mxfp4")
    llama_cpp_convert(folder, tmp_path / "gpt-oss.gguf")
    meta = _gguf_metadata(tmp_path / "gpt-oss.gguf")
    assert meta["shapes"]["blk.0.ffn_gate_exps.weight"] == [4, 128, 64]
    kinds = {t.name: t.tensor_type for t in GGUFReader(str(tmp_path / "gpt-oss.gguf")).tensors}
    assert kinds["blk.0.ffn_up_exps.weight"] == GGMLQuantizationType.MXFP4
    ours = gguf_families.state(tmp_path / "gpt-oss.gguf", gguf_families.config(meta), meta)
    prequantized.dequantize_folder(folder, tmp_path / "float")
    theirs = load_file(str(tmp_path / "float" / "model.safetensors"))
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        assert ours[key].equal(value), key


def test_a_file_whose_end_of_generation_is_not_its_template_s_end_of_turn_stops_at_both(tmp_path: Path) -> None:
    """Gemma's files name <eos>; their template ends each turn with <end_of_turn>, which the
    Hugging Face folder's generation_config.json lists and the file does not: the model wrote the
    next turns itself. The build adds the template's end of turn."""
    import json

    from tokenizers import Tokenizer

    from firmware.toolchain.build import gguf_to_hf

    vocab = Tokenizer.from_file(str(tiny_hf_dir("gemma3") / "tokenizer.json"))
    eos, turn = vocab.token_to_id("<eos>"), vocab.token_to_id("<end_of_turn>")
    file = _rewritten(tiny_gguf("gemma3"), tmp_path / "eos.gguf", lambda name, data: data,
                      fields={"tokenizer.ggml.eos_token_id": eos})  # fmt: skip
    gguf_to_hf(file, tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["eos_token_id"] == [eos, turn]
    gguf_to_hf(tiny_gguf("gemma3"), tmp_path / "as-is")  # (the fixture's file names <end_of_turn> itself)
    assert json.loads((tmp_path / "as-is" / "config.json").read_text())["eos_token_id"] == turn


def test_a_file_s_end_of_turn_and_of_message_also_end_generation(tmp_path: Path) -> None:
    """GLM-4's files name <|endoftext|> as the end of generation, <|user|> as the end of turn (eot)
    and <|observation|> as the end of message (eom), which is where its turns end (its template ends
    none): llama.cpp stops at each, and so does the build."""
    import json

    from firmware.toolchain.build import gguf_to_hf

    eos = int(json.loads((tiny_hf_dir("glm4") / "config.json").read_text())["eos_token_id"])
    stated = {"tokenizer.ggml.eot_token_id": 7, "tokenizer.ggml.eom_token_id": 9}
    gguf_to_hf(_rewritten(tiny_gguf("glm4"), tmp_path / "eot.gguf", lambda name, data: data, fields=stated),
               tmp_path / "hf")  # fmt: skip
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["eos_token_id"] == [eos, 7, 9]


def test_a_nemotron_3_file_s_multi_token_prediction_blocks_are_no_layers_of_the_model() -> None:
    """llama.cpp's converter writes Nemotron 3 Super's multi-token prediction head as a block after
    the model's (nextn_predict_layers: one more entry in each per-layer list, attention and experts
    both); read as a layer, it would run in every step."""
    from firmware.toolchain.build import _gguf_metadata

    meta = _gguf_metadata(tiny_gguf("nemotron_h_moe"))
    arch, n = "nemotron_h_moe", int(meta["nemotron_h_moe.block_count"])
    with_head = dict(meta) | {f"{arch}.block_count": n + 1, f"{arch}.nextn_predict_layers": 1,
                              f"{arch}.attention.head_count_kv": [*meta[f"{arch}.attention.head_count_kv"], 2],
                              f"{arch}.feed_forward_length": [*meta[f"{arch}.feed_forward_length"], 32]}  # fmt: skip
    with_head["shapes"] = meta["shapes"] | {f"blk.{n}.ffn_up_exps.weight": [8, 32, 64]}
    plain, headed = gguf_families.config(meta), gguf_families.config(with_head)
    assert headed.layers_block_type == plain.layers_block_type and len(plain.layers_block_type) == n


def test_a_glm_4_5_file_s_prediction_block_is_no_layer_and_experts_a_softmax_chooses_are_refused() -> None:
    """llama.cpp's converter counts GLM-4.5's multi-token prediction block among the file's blocks
    (the tiny folder has no weights for it, as transformers saves none), after the model's; a file
    whose experts a softmax chooses is not routed as GLM-4.5's and is refused."""
    from firmware.errors import BundleError
    from firmware.toolchain.build import _gguf_metadata

    meta = _gguf_metadata(tiny_gguf("glm4_moe"))
    assert (int(meta["glm4moe.block_count"]), int(meta["glm4moe.nextn_predict_layers"])) == (4, 1)
    assert gguf_families.config(meta).num_hidden_layers == 3
    with pytest.raises(BundleError, match="not chosen by sigmoid"):
        gguf_families.config(dict(meta) | {"glm4moe.expert_gating_func": 1})


def test_a_deepseek2_file_s_experts_are_chosen_as_llama_cpp_reads_its_gating() -> None:
    """A deepseek2 file says how its experts are chosen (expert_gating_func: the deepseek_v3 fixture's,
    by sigmoid); without the key, llama.cpp takes softmax (DeepSeek V2's older files) but for
    GLM-4.7-Flash's, which it knows by 47 or 48 blocks and a vocabulary of 154880, and so does the build."""
    from firmware.toolchain.build import _gguf_metadata

    meta = _gguf_metadata(tiny_gguf("deepseek_v3"))
    assert gguf_families.config(meta).model_type == "deepseek_v3"
    unkeyed = {k: v for k, v in meta.items() if k != "deepseek2.expert_gating_func"}
    assert gguf_families.config(unkeyed).model_type == "deepseek_v2"
    flash = unkeyed | {"deepseek2.block_count": 48, "deepseek2.nextn_predict_layers": 1,
                       "shapes": meta["shapes"] | {"token_embd.weight": [154880, 64]}}  # fmt: skip
    config = gguf_families.config(flash)
    assert (config.model_type, config.num_hidden_layers) == ("deepseek_v3", 47)


def test_a_nemotron_3_super_file_s_latent_experts_are_its_folder_s(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Nemotron 3 Super's experts work on a latent projection of the stream (moe_latent_size, two
    more projections a block), which llama.cpp's converter writes as a key and two tensors: read
    weight for weight as the folder it was converted from."""
    import torch
    import transformers

    from firmware.toolchain import tiny
    from firmware.toolchain.build import _gguf_metadata

    config_class, model_class, extra = tiny.ARCHITECTURES["nemotron_h_moe"]
    monkeypatch.setitem(tiny.ARCHITECTURES, "latent", (config_class, model_class, {**extra, "moe_latent_size": 32}))
    monkeypatch.setitem(tiny.RANDOMIZED, "latent", tiny.RANDOMIZED["nemotron_h_moe"])
    tiny.make_tiny_hf(tmp_path / "hf", arch="latent")
    llama_cpp_convert(tmp_path / "hf", tmp_path / "super.gguf")
    meta = _gguf_metadata(tmp_path / "super.gguf")
    config = gguf_families.config(meta)
    assert config.moe_latent_size == 32
    ours = gguf_families.state(tmp_path / "super.gguf", config, meta)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32).state_dict()
    assert set(ours) == set(theirs) and any("latent_proj" in k for k in ours)
    for key, value in ours.items():
        assert value.equal(theirs[key]), key


def test_a_chatglm_file_of_glm_4_9b_chat_s_own_layout_gives_the_weights_of_the_hf_one_s(tmp_path: Path) -> None:
    """glm-4-9b-chat's checkpoint (ChatGLM's remote code) keeps each layer's queries, keys and values
    as one projection, which llama.cpp writes as attn_qkv (all queries, then keys, then values); the
    -hf checkpoint's file has three. Both read as the same weights."""
    from gguf import GGUFReader

    from firmware.toolchain.build import _gguf_metadata

    def fused(name: str, data: Any) -> Any:
        block, _, rest = name.partition(".attn_")
        proj, _, suffix = rest.partition(".")
        if not name.startswith("blk.") or proj not in ("q", "k", "v"):
            return data
        parts = [tensors[f"{block}.attn_{p}.{suffix}"] for p in ("q", "k", "v")]
        return {f"{block}.attn_qkv.{suffix}": np.concatenate(parts)} if proj == "q" else None

    tensors = {t.name: np.array(t.data) for t in GGUFReader(str(tiny_gguf("glm"))).tensors}
    file = _rewritten(tiny_gguf("glm"), tmp_path / "fused.gguf", fused)
    meta = _gguf_metadata(file)
    assert "blk.0.attn_qkv.weight" in meta["shapes"] and "blk.0.attn_q.weight" not in meta["shapes"]
    config, unfused = gguf_families.config(meta), _gguf_metadata(tiny_gguf("glm"))
    assert config.to_dict() == gguf_families.config(unfused).to_dict()
    ours, theirs = gguf_families.state(file, config, meta), gguf_families.state(tiny_gguf("glm"), config, unfused)
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        assert ours[key].equal(value), key


def test_an_apertus_file_without_its_activation_s_parameters_is_refused_naming_them() -> None:
    """Apertus's xIELU parameters are keys of the file (one number a layer), read from the metadata
    the build already holds; a file without one is refused, not built with xIELU's defaults."""
    from firmware.errors import BundleError
    from firmware.toolchain.build import _gguf_metadata

    meta = _gguf_metadata(tiny_gguf("apertus"))
    config = gguf_families.config(meta)
    ours = gguf_families.state(tiny_gguf("apertus"), config, meta)
    assert float(ours["model.layers.1.mlp.act_fn.beta"]) == float(meta["xielu.beta"][1])
    del meta["xielu.beta"]
    with pytest.raises(BundleError, match=r"without xielu\.beta"):
        gguf_families.state(tiny_gguf("apertus"), config, meta)


def test_a_file_of_an_architecture_the_build_does_not_read_is_refused_naming_it(tmp_path: Path) -> None:
    """transformers' loader fails on a gpt-oss file as llama.cpp writes it (its YaRN settings) with
    a TypeError about arrays; the build says which architecture it was, which ones it reads, and
    that the model's Hugging Face folder builds (here a file whose architecture no loader knows)."""
    from firmware.errors import BundleError
    from firmware.toolchain.build import BuildOptions, build

    odd = _rewritten(tiny_gguf("llama"), tmp_path / "odd.gguf", lambda _, data: data, arch="tiny-odd")
    with pytest.raises(BundleError, match=r"'tiny-odd', is not one the build reads from GGUF \(llama, .*\); "
                                          r"build the model from its Hugging Face folder"):  # fmt: skip
        build(odd, tmp_path / "out", BuildOptions(precision="fp32"))


def test_a_file_s_tool_use_template_is_signed_into_the_manifest(tmp_path: Path) -> None:
    """llama.cpp's converter writes a folder's named templates as tokenizer.chat_template.NAME:
    Hermes 3's files carry its tool_use one, which renders the conversations with tools."""
    from firmware.manifest import parse_manifest
    from firmware.toolchain.build import BuildOptions, build
    from firmware.toolchain.tiny import HERMES2_PRO_TOOL_USE_TEMPLATE

    named = _rewritten(tiny_gguf("llama"), tmp_path / "named.gguf", lambda _, data: data,
                       fields={"tokenizer.chat_template.tool_use": HERMES2_PRO_TOOL_USE_TEMPLATE})  # fmt: skip
    build(named, tmp_path / "out", BuildOptions(precision="fp32"))
    manifest = parse_manifest((tmp_path / "out" / "manifest.json").read_bytes())
    assert manifest.tool_use_template == HERMES2_PRO_TOOL_USE_TEMPLATE != manifest.chat_template


def _rewritten(path: Path, out: Path, edit: Any, arch: str | None = None, fields: dict[str, Any] | None = None,
               dropped: set[str] | None = None) -> Path:  # fmt: skip
    """The GGUF file at `path` written again to `out`, each tensor as `edit(name, data)` gives it
    (None: left out; a dict: the tensors, by name, that replace it), under architecture `arch`
    (default: its own), with `fields`' values (a key the file lacks: an unsigned integer, or a
    string) and without the keys `dropped`."""
    from gguf import GGUFReader, GGUFWriter

    reader = GGUFReader(str(path))
    writer = GGUFWriter(str(out), arch or str(reader.fields["general.architecture"].contents()))
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in (dropped or set()):
            continue
        writer.add_key_value(key, (fields or {}).get(key, field.contents()), field.types[0],
                             sub_type=field.types[-1] if len(field.types) > 1 else None)  # fmt: skip
    for key, value in (fields or {}).items():
        if key not in reader.fields:
            (writer.add_string if isinstance(value, str) else writer.add_uint32)(key, value)
    for t in reader.tensors:
        data = edit(t.name, np.array(t.data))
        for name, tensor in (data if isinstance(data, dict) else {t.name: data}).items():
            if tensor is not None:
                writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _llama_cpp_pre_tokenizers() -> dict[str, tuple[str, ...]]:
    """llama.cpp's own table, from its source (src/llama-vocab.cpp, as the converter's run fetches
    it): each pre-tokenizer name -> the expressions its BPE tokenizer splits text by."""
    import re

    text = (llama_cpp_source() / "src" / "llama-vocab.cpp").read_text()
    names: list[str] = []
    kinds: dict[str, str] = {}
    for m in re.finditer(r'tokenizer_pre == "([^"]+)"|pre_type = LLAMA_VOCAB_PRE_TYPE_(\w+);', text):
        if m.group(1):
            names.append(m.group(1))
        else:
            kinds.update(dict.fromkeys(names, m.group(2)))
            names = []
    body = text[text.index("struct llm_tokenizer_bpe") :]
    body = body[: body.index("default:")]
    exprs: dict[str, tuple[str, ...]] = {}
    for block in re.finditer(r"((?:\s*case LLAMA_VOCAB_PRE_TYPE_\w+:)+)\s*regex_exprs = \{(.*?)\};", body, re.S):
        lines = [line.strip() for line in block.group(2).splitlines() if not line.strip().startswith("//")]
        literals = [lit for line in lines for lit in re.findall(r'"((?:[^"\\]|\\.)*)"', line)]
        unescaped = tuple(re.sub(r"\\(.)", lambda e: {"n": "\n", "r": "\r", "t": "\t"}.get(e[1], e[1]), lit)
                          for lit in literals)  # fmt: skip
        exprs |= dict.fromkeys(re.findall(r"LLAMA_VOCAB_PRE_TYPE_(\w+)", block.group(1)), unescaped)
    return {name: exprs[kind] for name, kind in kinds.items() if kind in exprs}


def test_the_pre_tokenizers_transformers_does_not_know_are_llama_cpp_s_own() -> None:
    """Each split the build gives a file's tokenizer is llama.cpp's, expression for expression (a
    carriage return or a newline written as the character or as its escape alike; a split llama.cpp
    names and computes by code of its own, the expression the build writes for it, which the next
    test checks against a copy of that code)."""
    from firmware.toolchain.gguf_pretokenizers import AFMOE_DIGITS, SPLITS

    theirs = {name: tuple({LLAMA_CPP_AFMOE_DIGITS: AFMOE_DIGITS}.get(e, e) for e in expressions)
              for name, expressions in _llama_cpp_pre_tokenizers().items()}  # fmt: skip

    def plain(expressions: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(e.replace("\r", "\\r").replace("\n", "\\n") for e in expressions)

    assert len(theirs) > 40  # (the table was read)
    for name, ours in SPLITS.items():
        assert name in theirs, name
        assert plain(ours) == plain(theirs[name]), name


PROBE = ("Hello world! It's 2024-12-07, obj.get(x) costs $1234.50 or 1,000,000 or 1234567.\n\n\tindent   spaces\r\n"
         "你好世界 日本語のテキスト 한국어 émigré’s “quotes” … done. HELLO'S Ünïcode\u0301 ΑΘΗΝΑ Привет ＡＢＣ！ "
         "٣٤٥٦ ১২৩ ㄅㄆ ﬁ 𐐀𐐨 tab\tend   ")  # fmt: skip


# llama.cpp's name, in its table, of Trinity's digit split, which its C++ computes (unicode.cpp).
LLAMA_CPP_AFMOE_DIGITS = r"\p{AFMoE_digits}"


def _afmoe_digit_runs(piece: str) -> list[tuple[int, int]]:
    """Where llama.cpp's \\p{AFMoE_digits} cuts `piece`, as its C++ does (a copy of that loop, not a
    regular expression): each run of digits (Unicode's N) its leading len % 3 digits, then threes."""
    import unicodedata

    cuts, at = [], 0
    while at < len(piece):
        if not unicodedata.category(piece[at]).startswith("N"):
            at += 1
            continue
        end = at
        while end < len(piece) and unicodedata.category(piece[end]).startswith("N"):
            end += 1
        lead = (end - at) % 3
        if lead:
            cuts.append((at, at + lead))
        cuts += [(start, start + 3) for start in range(at + lead, end, 3)]
        at = end
    return cuts


def _split_as_llama_cpp(text: str, expressions: tuple[str, ...]) -> list[str]:
    """`text` split by each expression in turn, as llama.cpp does (a match and the text between two
    matches each a piece), with Python's regex module (llama.cpp's digit split of its own for
    Trinity's, by a copy of its code): the reference tokenizers' splits are checked against; each
    piece in the byte-level alphabet."""
    import regex
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    pieces = [text]
    for expression in expressions:
        split: list[str] = []
        for piece in pieces:
            at = 0
            matches = (_afmoe_digit_runs(piece) if expression == LLAMA_CPP_AFMOE_DIGITS else
                       [m.span() for m in regex.finditer(expression, piece)])  # fmt: skip
            for start, end in matches:
                split += [piece[at:start]] if start > at else []
                split += [piece[start:end]] if end > start else []
                at = end
            split += [piece[at:]] if at < len(piece) else []
        pieces = split
    alphabet = bytes_to_unicode()
    return ["".join(alphabet[b] for b in piece.encode()) for piece in pieces]


# llama.cpp splits this by C++ of its own (unicode.cpp), not by the expression its table lists; its
# family (Kimi K2) is not one the build reads. (Trinity's digits, also its own C++, are copied here:
# _afmoe_digit_runs.)
SPLIT_BY_LLAMA_CPP_CODE = {"kimi-k2"}
# llama.cpp writes GPT-4o's letter-case classes as "a letter, not a-z" ("..., not A-Z"): std::regex
# has no \p{Lu}. The models' own tokenizers (and transformers' table) use the classes, which take
# in combining marks; those are the reference.
LETTER_CASES = {r"((?=[\p{L}])([^a-z]))": r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]",
                r"((?=[\p{L}])([^A-Z]))": r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"}  # fmt: skip


def test_every_pre_tokenizer_llama_cpp_names_splits_as_llama_cpp_s_expressions() -> None:
    """Every pre-tokenizer name of llama.cpp's table, through transformers' reading of a byte-level
    BPE file (its builder and its own table of splits) and the build's mend (SPLITS), splits text
    as llama.cpp's expressions do (Python's regex module splitting by them): no name whose file
    the build would tokenize otherwise than llama.cpp. A name llama.cpp adds that transformers
    does not know fails here until SPLITS gives it its expressions."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import byte_level_tokenizer, set_split_regex

    from firmware.toolchain.gguf_pretokenizers import split_as_llama_cpp

    theirs = _llama_cpp_pre_tokenizers()
    assert len(theirs) > 80 and set(theirs) >= SPLIT_BY_LLAMA_CPP_CODE | {"afmoe"}  # (the table was read)
    wrong = []
    for name, expressions in sorted(theirs.items()):
        tokenizer = set_split_regex(byte_level_tokenizer({"tokens": ["a"], "merges": []}), {"pre_tokenizer_type": name})
        tokenizer = split_as_llama_cpp(tokenizer, {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": name})
        got = [piece for piece, _ in tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(PROBE)]
        for approximation, letters in LETTER_CASES.items():
            expressions = tuple(e.replace(approximation, letters) for e in expressions)
        if name not in SPLIT_BY_LLAMA_CPP_CODE and got != _split_as_llama_cpp(PROBE, expressions):
            wrong.append(name)
    assert wrong == []


@pytest.mark.parametrize("pre", ["glm4", "deepseek-coder"])
def test_a_file_naming_a_pre_tokenizer_transformers_does_not_know_splits_text_as_llama_cpp(pre: str,
                                                                                           tmp_path: Path) -> None:
    """GLM-4's files name "glm4" (GLM-4 9B's "chatglm-bpe"), DeepSeek Coder's "deepseek-coder", which
    transformers' GGUF reader does not know: it split their text as GPT-2's, so pieces their
    vocabularies were learned on never formed (GLM-4's ".get" and numbers cut every three digits,
    DeepSeek Coder's every digit alone and punctuation runs apart from letters). The build splits as
    llama.cpp does, and the folder it writes keeps that split."""
    import json

    from tokenizers import Tokenizer

    from firmware.toolchain.build import gguf_to_hf, gguf_tokenizer
    from firmware.toolchain.gguf_pretokenizers import SPLITS

    file = _rewritten(tiny_gguf("glm4"), tmp_path / "glm4.gguf", lambda name, data: data,
                      fields={"tokenizer.ggml.pre": pre})  # fmt: skip
    want = _split_as_llama_cpp(PROBE, SPLITS[pre])
    assert want != _split_as_llama_cpp(PROBE, (SPLITS["smollm"][1],))  # (not GPT-2's split)
    tokenizer = gguf_tokenizer(file)
    assert [p for p, _ in tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(PROBE)] == want
    gguf_to_hf(file, tmp_path / "hf")
    saved = Tokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json"))
    assert [p for p, _ in saved.pre_tokenizer.pre_tokenize_str(PROBE)] == want
    assert json.loads((tmp_path / "hf" / "tokenizer.json").read_text())["pre_tokenizer"]["type"] == "Sequence"
