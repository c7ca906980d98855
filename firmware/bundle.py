"""Verify a bundle and load it into typed form. Nothing in a bundle is trusted before this passes."""

from __future__ import annotations

import json
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from firmware.errors import BundleError
from firmware.manifest import (
    MANIFEST_NAME,
    SIGNATURE_NAME,
    LayerConstants,
    Manifest,
    list_payload_files,
    parse_manifest,
    sha256_file,
)
from firmware.signing import load_trusted_keys, verify_signature

GENAI_CONFIG = "genai_config.json"
# A bundle built for the CPU may also carry a CUDA graph of the same weights here (its own
# genai_config.json and model files; the tokenizer is the root's), so each device runs its own.
CUDA_GRAPH_DIR = "cuda"
REQUIRED_MODEL_FILES = (GENAI_CONFIG, "tokenizer.json", "tokenizer_config.json")


# ONNX Runtime's names of the tensor types a model's inputs have -> numpy's (the engine's KV cache
# and the build's load check make arrays of them). bfloat16 has no numpy type: not served.
NUMPY_TYPES = {"tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(float)": "float32",
               "tensor(float16)": "float16"}  # fmt: skip


@dataclass(frozen=True)
class ModelFacts:
    """What the engine needs from genai_config.json."""

    model_type: str
    onnx_file: str
    context_length: int
    vocab_size: int
    num_layers: int
    num_kv_heads: int
    num_attention_heads: int
    head_size: int
    hidden_size: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    pad_token_id: int | None
    past_key_name: str
    past_value_name: str
    present_key_name: str
    present_value_name: str
    share_buffer: bool
    # A hybrid model's recurrent layers (Qwen3.5's linear attention): per kind of state, the
    # patterns of its past input and present output names ("past.%d.conv", "present.%d.conv").
    # Each such layer carries these states instead of keys and values.
    state_names: tuple[tuple[str, str], ...] = ()
    # The model's own sampling defaults (genai_config.json "search"): used when a request sets none.
    default_temperature: float = 0.0
    default_top_p: float = 1.0
    default_top_k: int = 0

    def caches(self, inputs: Container[str]) -> tuple[list[tuple[str, str, str, str]], list[tuple[str, str]]]:
        """The caches of a graph with these inputs, in layer order: each attention layer's (past
        key, past value, present key, present value) names, and each recurrent state's (past,
        present): a hybrid model's recurrent layers carry states instead of keys and values."""
        layers = range(self.num_layers)
        kv = [(self.past_key_name % i, self.past_value_name % i, self.present_key_name % i, self.present_value_name % i)
              for i in layers if self.past_key_name % i in inputs]  # fmt: skip
        states = [(past % i, present % i) for i in layers for past, present in self.state_names if past % i in inputs]
        return kv, states

    def kv_shapes(self, inputs: Mapping[str, Sequence[object]]) -> list[tuple[int, int]]:
        """Each attention layer's (kv_heads, head_size), in the order of caches(): the graph's own
        where its past key's shape fixes them (Gemma 4's global layers have fewer, wider heads than
        its sliding ones), the model's where the graph leaves them symbolic."""
        kv, _ = self.caches(inputs)
        return [self._kv_shape(inputs, past_key) for past_key, *_ in kv]

    def _kv_shape(self, inputs: Mapping[str, Sequence[object]], name: str) -> tuple[int, int]:
        shape = list(inputs.get(name) or ())
        heads, width = (shape[1], shape[3]) if len(shape) == 4 else (None, None)
        return (heads if isinstance(heads, int) and heads > 0 else self.num_kv_heads,
                width if isinstance(width, int) and width > 0 else self.head_size)

    def graph_refusal(self, inputs: Mapping[str, Sequence[object]]) -> str | None:
        """Why the engine cannot run a graph with these inputs (name -> shape), or None. The build's
        load check and a session at start both ask, so a bundle built elsewhere is refused too.

        - An input the engine does not feed: it binds the token ids, the attention mask, the
          positions where a graph takes them, and each layer's past keys and values, nothing else
          (a graph that took more would fail at its first run).
        - A layer whose past key and past value differ in heads or head width: the engine's KV
          slots hold a layer's keys and values in two buffers of one shape (layers may differ
          from each other: kv_shapes).
        - A recurrent state whose shape is not fixed past its batch dimension (the slots hold one
          of a fixed size per row).
        """
        layers = range(self.num_layers)
        kv = [name % layer for layer in layers for name in (self.past_key_name, self.past_value_name)]
        states = [past % layer for layer in layers for past, _ in self.state_names]
        unfed = [name for name in inputs if name not in {"input_ids", "attention_mask", "position_ids", *kv, *states}]
        if unfed:
            return (f"the graph takes {', '.join(unfed)}, which the engine does not feed (it gives a model its "
                    "token ids, attention mask, positions, KV cache and recurrent states)")  # fmt: skip
        loose = [name for name in states if name in inputs and not all(isinstance(d, int) for d in inputs[name][1:])]
        if loose:
            return f"its recurrent state {loose[0]} has no fixed shape ({list(inputs[loose[0]])})"
        layer_shapes = {layer: (self._kv_shape(inputs, self.past_key_name % layer),
                                self._kv_shape(inputs, self.past_value_name % layer))
                        for layer in layers if self.past_key_name % layer in inputs}  # fmt: skip
        odd = [f"layer {layer}: keys {k[0]} heads of {k[1]}, values {v[0]} heads of {v[1]}"
               for layer, (k, v) in layer_shapes.items() if k != v]  # fmt: skip
        if odd:
            return (f"its keys and values differ in shape ({'; '.join(odd[:2])}), and the engine's slots hold a "
                    "layer's keys and values in buffers of one shape")  # fmt: skip
        return None


@dataclass(frozen=True)
class Bundle:
    root: Path
    manifest: Manifest
    signer_key_id: str
    model: ModelFacts  # the graph at the root (its target is the manifest's source "target")
    cuda_model: ModelFacts | None = None  # a CUDA graph of the same weights in cuda/, where built

    @property
    def root_target(self) -> str:
        return self.manifest.source.get("target", "cpu")

    @property
    def targets(self) -> tuple[str, ...]:
        """The devices kinds this bundle has a graph for ("cpu", "cuda")."""
        return tuple(sorted({self.root_target} | ({"cuda"} if self.cuda_model is not None else set())))

    def graph(self, target: str) -> tuple[Path, ModelFacts]:
        """The folder and facts of the graph built for `target` (the root graph where none is)."""
        if target == "cuda" and self.cuda_model is not None and self.root_target != "cuda":
            return self.root / CUDA_GRAPH_DIR, self.cuda_model
        return self.root, self.model

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def version(self) -> str:
        return self.manifest.version

    @property
    def layer(self) -> LayerConstants:
        return self.manifest.layer

    @property
    def chat_template(self) -> str:
        return self.manifest.chat_template

    @property
    def tool_use_template(self) -> str | None:
        """The template for requests with tools, where the model has one of its own (else the chat template)."""
        return self.manifest.tool_use_template

    @property
    def tokenizer_path(self) -> Path:
        return self.root / "tokenizer.json"

    @property
    def tokenizer_config_path(self) -> Path:
        return self.root / "tokenizer_config.json"


TrustedKeys = Path | list[Path] | dict[str, Ed25519PublicKey]


def verify(path: Path | str, trusted_keys: TrustedKeys) -> tuple[Manifest, str]:
    """Check signature, then every file's size and digest; refuse missing and extra files.

    Returns the manifest and the signer's key id. Raises BundleError naming the file at fault.
    """
    root = Path(path)
    if not root.is_dir():
        raise BundleError(f"{root}: not a bundle directory")
    trusted = trusted_keys if isinstance(trusted_keys, dict) else load_trusted_keys(trusted_keys)
    if not trusted:
        raise BundleError("the trusted key set is empty: no bundle can be verified")
    for name in (MANIFEST_NAME, SIGNATURE_NAME):
        if not (root / name).is_file():
            raise BundleError(f"{name}: missing from {root}")
    manifest_bytes = (root / MANIFEST_NAME).read_bytes()
    # Signature first: a manifest is not even parsed for meaning until we know who wrote it.
    signer = verify_signature(manifest_bytes, (root / SIGNATURE_NAME).read_bytes(), trusted)
    manifest = parse_manifest(manifest_bytes)
    present = set(list_payload_files(root))
    for rel in sorted(manifest.files):
        if rel not in present:
            raise BundleError(f"{rel}: listed in the manifest but missing from the bundle")
    for rel in sorted(present - set(manifest.files)):
        raise BundleError(f"{rel}: in the bundle but not listed in the manifest")
    for rel, entry in sorted(manifest.files.items()):
        file = root / rel
        if file.is_symlink():
            raise BundleError(f"{rel}: symbolic links are not allowed in a bundle")
        size = file.stat().st_size
        if size != entry.size:
            raise BundleError(f"{rel}: size {size} does not match the manifest's {entry.size}")
        if sha256_file(file) != entry.sha256:
            raise BundleError(f"{rel}: sha256 does not match the manifest (the file was changed)")
    for rel in REQUIRED_MODEL_FILES:
        if rel not in manifest.files:
            raise BundleError(f"{rel}: required model file is not in the bundle")
    return manifest, signer


# The recurrent states a hybrid model's genai_config.json names (onnxruntime-genai's builder).
STATE_KINDS = ("conv", "recurrent")


def read_model_facts(root: Path) -> ModelFacts:
    try:
        doc = json.loads((root / GENAI_CONFIG).read_text())
        model = doc["model"]
        dec = model["decoder"]
        eos = model["eos_token_id"]
        search = doc.get("search", {})
        return ModelFacts(
            model_type=str(model["type"]),
            onnx_file=str(dec["filename"]),
            context_length=int(model["context_length"]),
            vocab_size=int(model["vocab_size"]),
            num_layers=int(dec["num_hidden_layers"]),
            num_kv_heads=int(dec["num_key_value_heads"]),
            num_attention_heads=int(dec["num_attention_heads"]),
            head_size=int(dec["head_size"]),
            hidden_size=int(dec["hidden_size"]),
            eos_token_ids=tuple(int(e) for e in (eos if isinstance(eos, list) else [eos])),
            bos_token_id=model.get("bos_token_id"),
            pad_token_id=model.get("pad_token_id"),
            past_key_name=str(dec["inputs"]["past_key_names"]),
            past_value_name=str(dec["inputs"]["past_value_names"]),
            present_key_name=str(dec["outputs"]["present_key_names"]),
            present_value_name=str(dec["outputs"]["present_value_names"]),
            share_buffer=bool(search.get("past_present_share_buffer", False)),
            state_names=tuple((str(dec["inputs"][f"past_{kind}_names"]), str(dec["outputs"][f"present_{kind}_names"]))
                              for kind in STATE_KINDS if f"past_{kind}_names" in dec["inputs"]),
            default_temperature=float(search.get("temperature", 1.0)) if search.get("do_sample") else 0.0,
            default_top_p=float(search.get("top_p", 1.0)),
            default_top_k=int(search.get("top_k", 0)) if search.get("do_sample") else 0,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise BundleError(f"{GENAI_CONFIG}: not a usable ONNX Runtime GenAI config ({exc!r})") from None


def load(path: Path | str, trusted_keys: TrustedKeys) -> Bundle:
    """Verify, then load: the only way the daemon gets a Bundle."""
    root = Path(path).resolve()
    manifest, signer = verify(root, trusted_keys)
    facts = read_model_facts(root)
    if facts.onnx_file not in manifest.files:
        raise BundleError(f"{facts.onnx_file}: named by {GENAI_CONFIG} but not in the bundle")
    cuda = None
    if f"{CUDA_GRAPH_DIR}/{GENAI_CONFIG}" in manifest.files:
        cuda = read_model_facts(root / CUDA_GRAPH_DIR)
        if f"{CUDA_GRAPH_DIR}/{cuda.onnx_file}" not in manifest.files:
            raise BundleError(f"{CUDA_GRAPH_DIR}/{cuda.onnx_file}: named by {CUDA_GRAPH_DIR}/{GENAI_CONFIG} but "
                              "not in the bundle")  # fmt: skip
    return Bundle(root=root, manifest=manifest, signer_key_id=signer, model=facts, cuda_model=cuda)
