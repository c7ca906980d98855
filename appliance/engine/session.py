"""One ONNX Runtime session per device, and the KV cache a request fills.

The KV cache is one buffer per layer sized for the whole request, bound as both the past input
and the present output (the GroupQueryAttention share-buffer mode), so a decode step writes one
new position in place instead of copying the growing cache every step.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from firmware import Bundle

log = logging.getLogger(__name__)

_ORT_TO_NUMPY = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(bfloat16)": np.float32,  # not bindable from numpy; refused below
}


def available_devices() -> list[str]:
    """'cpu' always; 'cuda:0' when this onnxruntime build has the CUDA provider."""
    providers = ort.get_available_providers()
    return ["cpu", *(["cuda:0"] if "CUDAExecutionProvider" in providers else [])]


def _providers(device: str, cuda_options: dict[str, str] | None) -> list[str | tuple[str, dict[str, str]]]:
    if device == "cpu" or device.startswith("cpu:"):  # "cpu:N": another CPU session (tests, spare)
        return ["CPUExecutionProvider"]
    if device.startswith("cuda"):
        index = device.partition(":")[2] or "0"
        opts = {"device_id": index, **(cuda_options or {})}
        providers: list[str | tuple[str, dict[str, str]]] = [("CUDAExecutionProvider", opts), "CPUExecutionProvider"]
        if "TensorrtExecutionProvider" in ort.get_available_providers():
            # TensorRT where present; nodes it cannot take fall back to CUDA, then the CPU.
            providers.insert(0, ("TensorrtExecutionProvider", {"device_id": index, "trt_engine_cache_enable": "True"}))
        return providers
    raise ValueError(f"unknown device {device!r}: use 'cpu' or 'cuda:N'")


def last_position_logits_model(onnx_path: Path) -> bytes | None:
    """The model with the LM head applied to the last position only.

    Prefill of N tokens otherwise multiplies N hidden states by the vocabulary matrix and throws
    all but one row away; for a small model that is a fifth of the prefill work. Returns None if
    the graph does not have the expected shape (then the model is used as it is).
    """
    import onnx
    from onnx import helper

    model = onnx.load(str(onnx_path), load_external_data=False)
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    node = producer.get("logits")
    while node is not None and node.op_type == "Cast":
        node = producer.get(node.input[0])
    if node is None or node.op_type not in ("MatMul", "MatMulNBits", "Gemm"):
        return None
    hidden = node.input[0]
    sliced = hidden + "/zerolayer_last_position"
    names = [sliced + s for s in ("/starts", "/ends", "/axes")]
    for name, value in zip(names, ([-1], [np.iinfo(np.int64).max], [1]), strict=True):
        graph.initializer.append(onnx.numpy_helper.from_array(np.array(value, dtype=np.int64), name))
    graph.node.insert(
        list(graph.node).index(node), helper.make_node("Slice", [hidden, *names], [sliced], name=sliced)
    )
    node.input[0] = sliced
    for out in graph.output:
        if out.name == "logits":
            out.type.tensor_type.shape.dim[1].dim_param = "logits_positions"
    return bytes(model.SerializeToString())


@dataclass
class KVCache:
    """Per-layer key and value buffers [1, kv_heads, capacity, head_size] and how much is filled."""

    keys: list[ort.OrtValue]
    values: list[ort.OrtValue]
    host: list[tuple[np.ndarray, np.ndarray]] | None  # the numpy memory behind CPU buffers
    capacity: int
    length: int = 0


class ModelSession:
    def __init__(
        self,
        bundle: Bundle,
        device: str = "cpu",
        *,
        intra_op_threads: int = 0,
        last_position_logits: bool = True,
        cuda_options: dict[str, str] | None = None,
    ) -> None:
        self.bundle = bundle
        self.device = device
        self.facts = bundle.model
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Decode is a chain of small kernels: parallelism inside ops, none between them.
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.intra_op_num_threads = intra_op_threads or (os.cpu_count() or 1)
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        model: str | bytes = str(bundle.onnx_path)
        self.last_position_logits = False
        if last_position_logits:
            edited = last_position_logits_model(bundle.onnx_path)
            if edited is not None:
                # External weights are found relative to the bundle, as if the file were loaded.
                opts.add_session_config_entry(
                    "session.model_external_initializers_file_folder_path", str(bundle.root)
                )
                model, self.last_position_logits = edited, True
        self.session = ort.InferenceSession(model, opts, providers=_providers(device, cuda_options))
        inputs = {i.name: i for i in self.session.get_inputs()}
        past0 = inputs[self.facts.past_key_name % 0]
        if past0.type not in _ORT_TO_NUMPY or past0.type == "tensor(bfloat16)":
            raise ValueError(f"{bundle.onnx_path.name}: KV type {past0.type} is not supported")
        self.kv_dtype = _ORT_TO_NUMPY[past0.type]
        self._names = [
            (f.past_key_name % i, f.past_value_name % i, f.present_key_name % i, f.present_value_name % i)
            for f in (self.facts,)
            for i in range(self.facts.num_layers)
        ]
        self._ort_device = "cuda" if device.startswith("cuda") else "cpu"
        self._device_id = int(device.partition(":")[2] or 0) if device.startswith("cuda") else 0
        self._mask = np.ones((1, self.facts.context_length), dtype=np.int64)
        log.info("engine session on %s: %s", device, ", ".join(self.session.get_providers()))

    def new_cache(self, capacity: int) -> KVCache:
        f = self.facts
        shape = [1, f.num_kv_heads, capacity, f.head_size]
        if self._ort_device == "cpu":
            host = [(np.zeros(shape, self.kv_dtype), np.zeros(shape, self.kv_dtype)) for _ in range(f.num_layers)]
            keys = [ort.OrtValue.ortvalue_from_numpy(k) for k, _ in host]
            values = [ort.OrtValue.ortvalue_from_numpy(v) for _, v in host]
            return KVCache(keys, values, host, capacity)
        alloc = ort.OrtValue.ortvalue_from_shape_and_type
        keys = [alloc(shape, self.kv_dtype, self._ort_device, self._device_id) for _ in range(f.num_layers)]
        values = [alloc(shape, self.kv_dtype, self._ort_device, self._device_id) for _ in range(f.num_layers)]
        return KVCache(keys, values, None, capacity)

    def forward(self, cache: KVCache, ids: np.ndarray) -> np.ndarray:
        """Run ids (1-D int64) after cache.length cached tokens; return float32 logits of the last position."""
        return self._run(cache, ids)[-1]

    def all_logits(self, ids: np.ndarray) -> np.ndarray:
        """Logits at every position of a fresh prompt (for correctness checks; needs the unedited graph)."""
        if self.last_position_logits:
            raise RuntimeError("this session computes last-position logits only")
        return self._run(self.new_cache(int(ids.shape[0])), ids)

    def _run(self, cache: KVCache, ids: np.ndarray) -> np.ndarray:
        n = int(ids.shape[0])
        total = cache.length + n
        if total > cache.capacity:
            raise ValueError(f"KV cache overflow: {total} > {cache.capacity}")
        binding = self.session.io_binding()
        binding.bind_output("logits", "cpu")  # first, so it is get_outputs()[0]
        binding.bind_cpu_input("input_ids", ids.reshape(1, n))
        binding.bind_cpu_input("attention_mask", self._mask[:, :total])
        for (pk, pv, ok, ov), k, v in zip(self._names, cache.keys, cache.values, strict=True):
            binding.bind_ortvalue_input(pk, k)
            binding.bind_ortvalue_input(pv, v)
            binding.bind_ortvalue_output(ok, k)
            binding.bind_ortvalue_output(ov, v)
        self.session.run_with_iobinding(binding)
        logits = binding.get_outputs()[0].numpy()
        cache.length = total
        return np.asarray(logits[0], dtype=np.float32)

    def export_prefix(self, cache: KVCache, tokens: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """KV of the first `tokens` positions, as host arrays [kv_heads, tokens, head_size] (views on CPU)."""
        if cache.host is not None:
            return [(k[0, :, :tokens], v[0, :, :tokens]) for k, v in cache.host]
        pairs = zip(cache.keys, cache.values, strict=True)
        return [(k.numpy()[0, :, :tokens], v.numpy()[0, :, :tokens]) for k, v in pairs]

    def import_prefix(self, cache: KVCache, kv: list[tuple[np.ndarray, np.ndarray]], tokens: int) -> None:
        if cache.host is not None:
            for (dk, dv), (sk, sv) in zip(cache.host, kv, strict=True):
                dk[0, :, :tokens] = sk
                dv[0, :, :tokens] = sv
        else:
            for dk, dv, (sk, sv) in zip(cache.keys, cache.values, kv, strict=True):
                hk, hv = dk.numpy(), dv.numpy()
                hk[0, :, :tokens] = sk
                hv[0, :, :tokens] = sv
                dk.update_inplace(hk)
                dv.update_inplace(hv)
        cache.length = tokens
