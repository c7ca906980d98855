"""One ONNX Runtime session per device, and the KV slots its requests fill.

The KV cache is one buffer per layer with a row per slot, bound as both the past input and the
present output (the GroupQueryAttention share-buffer mode), so a step writes its new positions in
place instead of copying the growing cache. A prompt is prefilled through its own row (a pointer
into the buffer); every decoding row then advances together in one run whose attention mask gives
each row its own length, and the operator writes each row's new key at that row's position.

A hybrid model's recurrent layers (Qwen3.5's linear attention) hold a fixed-size state per row
instead of keys and values: bound in place the same way, zeroed when a row is taken for a new
request, and advanced by every run over the row, so a decode run keeps the states of the rows it
only pads along (`keep`).
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort

from appliance.engine.kv_copy import CudaCopy, read_row, write_row
from appliance.engine.prefix_cache import KVArrays
from appliance.engine.providers import providers_for, usable_cuda_devices, verify
from firmware import Bundle
from firmware.bundle import NUMPY_TYPES

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

# Released KV pages: reclaimed when the kernel wants memory, reused without a fault until then
# (Linux 4.5+; elsewhere returned at once).
_RELEASE = getattr(mmap, "MADV_FREE", mmap.MADV_DONTNEED)

# A decode's attention mask is bound this many positions wider at a time (see _Bound), where the
# graph allows it (mask_width_is_free).
MASK_WIDTH_STEP = 64

# The input of an edited graph (last_position_logits_model) that says from which position the LM
# head runs: -1 (the last) in every run but a prompt's scoring, 0 there.
LOGITS_FROM = "zerolayer_logits_from"


def available_devices() -> list[str]:
    """'cpu' always; 'cuda:0' when a CUDA session can really be made here."""
    return ["cpu", *usable_cuda_devices()]


def last_position_logits_model(model: onnx.ModelProto, scoring: bool = True) -> bytes | None:
    """The model (its graph without the external weights; edited in place) with the LM head
    applied to the last position only.

    Prefill of N tokens otherwise multiplies N hidden states by the vocabulary matrix and throws
    all but one row away; for a small model that is a fifth of the prefill work. Returns None if
    the graph does not have the expected shape (then the model is used as it is).

    `scoring`: where the head's positions begin is an input (LOGITS_FROM, -1 for the last
    position), so a prompt's scoring runs the same graph from position 0: every position's
    logits without a second copy of the weights. Left constant for TensorRT, which would take it
    as a shape input to build engines for.
    """
    import onnx
    from onnx import helper

    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    node = producer.get("logits")
    while node is not None and node.op_type == "Cast":
        node = producer.get(node.input[0])
    if node is None or node.op_type not in ("MatMul", "MatMulNBits", "Gemm"):
        return None
    hidden = node.input[0]
    sliced = hidden + "/zerolayer_last_position"
    names = [LOGITS_FROM if scoring else sliced + "/starts", sliced + "/ends", sliced + "/axes"]
    for name, value in zip(names, ([-1], [np.iinfo(np.int64).max], [1]), strict=True):
        if name == LOGITS_FROM:
            graph.input.append(helper.make_tensor_value_info(name, onnx.TensorProto.INT64, [1]))
        else:
            graph.initializer.append(onnx.numpy_helper.from_array(np.array(value, dtype=np.int64), name))
    graph.node.insert(
        list(graph.node).index(node), helper.make_node("Slice", [hidden, *names], [sliced], name=sliced)
    )
    node.input[0] = sliced
    for out in graph.output:
        if out.name == "logits":
            out.type.tensor_type.shape.dim[1].dim_param = "logits_positions"
    return bytes(model.SerializeToString())


def shared_presents(graph: onnx.GraphProto, caches: Sequence[tuple[str, str, str, str]]) -> list[tuple[str, str, int]]:
    """The present outputs of layers that attend over another layer's keys and values (Gemma 4
    E2B's last layers), each with the index in `caches` of the layer whose past its attention
    operator reads: the operator writes that layer's keys again, at the same positions, so its
    present shares that layer's buffer as the layer's own present does. Such a layer has no past
    input of its own, and no memory of its own."""
    layer_of = {past_key: index for index, (past_key, *_) in enumerate(caches)}
    own = {present for *_, present_key, present_value in caches for present in (present_key, present_value)}
    outputs = {o.name for o in graph.output}
    shared = []
    for node in graph.node:
        if node.op_type != "GroupQueryAttention" or len(node.output) < 3 or len(node.input) < 5:
            continue
        present_key, present_value = node.output[1:3]
        if present_key in outputs and present_key not in own and node.input[3] in layer_of:
            shared.append((present_key, present_value, layer_of[node.input[3]]))
    return shared


def mask_width_is_free(graph: onnx.GraphProto) -> bool:
    """Whether the attention mask may be wider than the longest row with nothing changed: its
    values reach the graph only through their sum (each row's length) and its width only as the
    attention operators' total_sequence_length, the longest a row may be. Not in a LongRoPE
    graph, where the width picks the short or the long rotary factors."""
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, index))
    width: list[str] = []  # values computed from the mask's shape alone
    for node, _ in consumers.get("attention_mask", []):
        if node.op_type == "Shape":
            width.extend(node.output)
        elif node.op_type != "ReduceSum":
            return False
    while width:
        for node, index in consumers.get(width.pop(), []):
            if node.op_type in ("Gather", "Cast", "Squeeze", "Unsqueeze", "Reshape", "Identity"):
                width.extend(node.output)
            elif not (node.op_type == "GroupQueryAttention" and index == 6):  # total_sequence_length
                return False
    return True


@dataclass(frozen=True)
class StateSpec:
    """One recurrent state of a hybrid model's layer: its past input and present output, and its
    shape past the batch dimension."""

    past: str
    present: str
    shape: tuple[int, ...]
    dtype: type[np.generic]

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize


class KVSlots:
    """The KV cache of one device: per layer a key and a value buffer [rows, kv_heads, capacity,
    head_size], bound as both past input and present output (GroupQueryAttention's share-buffer
    mode), so a step writes its new positions in place. A row is a slot: one request's KV. Layers
    may differ in heads and head width (Gemma 4's global layers): each has its own shape.

    On the CPU the buffers are anonymous mappings: pages are committed only where positions are
    written, and a released row's pages are the kernel's to take back (MADV_FREE), so memory
    follows the requests admitted, not the rows times the capacity. Until the kernel needs them,
    the next request in that row writes into them without faulting fresh zeroed pages in (2000
    positions of the demo model: 6.7 ms instead of 37, a prefix import's whole cost).
    """

    def __init__(self, session: ModelSession, rows: int, capacity: int) -> None:
        self.rows, self.capacity = rows, capacity
        self.dtype = session.kv_dtype
        self.shapes = [[rows, heads, capacity, width] for heads, width in session.kv_shapes]
        itemsize = np.dtype(self.dtype).itemsize
        # A row's keys in each layer (its values take as much again).
        self.layer_row_bytes = [heads * capacity * width * itemsize for heads, width in session.kv_shapes]
        self.row_bytes = 2 * sum(self.layer_row_bytes)  # a row's keys and values in all layers
        self.device, self.device_id = session.ort_device, session.device_id
        self._maps: list[mmap.mmap] = []
        self.host: list[tuple[np.ndarray, np.ndarray]] | None = None  # the arrays behind CPU buffers
        self._values: list[tuple[ort.OrtValue, ort.OrtValue]] = []  # device buffers (not CPU)
        self.state_specs = session.states
        self._state_host: list[np.ndarray] = []  # CPU: the state buffers [rows, *shape]
        self._state_values: list[ort.OrtValue] = []  # device state buffers (not CPU)
        if self.device == "cpu":
            self.host = [(self._mapped(shape), self._mapped(shape)) for shape in self.shapes]
            self.pointers = [(k.ctypes.data, v.ctypes.data) for k, v in self.host]
            self._state_host = [np.zeros((rows, *spec.shape), dtype=spec.dtype) for spec in self.state_specs]
            self.state_pointers = [a.ctypes.data for a in self._state_host]
        else:
            alloc = ort.OrtValue.ortvalue_from_shape_and_type
            self._values = [(alloc(shape, self.dtype, self.device, self.device_id),
                             alloc(shape, self.dtype, self.device, self.device_id))
                            for shape in self.shapes]  # fmt: skip
            self.pointers = [(k.data_ptr(), v.data_ptr()) for k, v in self._values]
            self._state_values = [alloc([rows, *spec.shape], spec.dtype, self.device, self.device_id)
                                  for spec in self.state_specs]  # fmt: skip
            self.state_pointers = [v.data_ptr() for v in self._state_values]
            for index in range(rows):
                self.reset_states(index)
        # (session, first row, rows) -> KV bound once; two sessions may run on one device's slots (lane.py)
        self.bindings: dict[tuple[ModelSession, int, int], _Bound] = {}
        self._cuda: CudaCopy | None = None  # partial copies to and from device rows, made on first use

    def _mapped(self, shape: list[int]) -> np.ndarray:
        count = int(np.prod(shape))
        mapping = mmap.mmap(-1, max(1, count * np.dtype(self.dtype).itemsize),
                            flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # fmt: skip
        self._maps.append(mapping)
        return np.frombuffer(mapping, dtype=self.dtype, count=count).reshape(shape)

    def row(self, index: int) -> KVCache:
        """Row `index` as an empty cache (what a slot's new request fills): its recurrent states
        zeroed, as a sequence's first run finds them."""
        if not 0 <= index < self.rows:
            raise IndexError(f"KV row {index} of {self.rows}")
        self.reset_states(index)
        return KVCache(self, index)

    def reset_states(self, row: int) -> None:
        """Zero a row's recurrent states (none for a model without)."""
        if self.state_specs:
            self.write_states(row, [np.zeros(spec.shape, dtype=spec.dtype) for spec in self.state_specs])

    def read_states(self, row: int) -> list[np.ndarray]:
        """Copies of a row's recurrent states (none for a model without)."""
        if self._state_host:
            return [a[row].copy() for a in self._state_host]
        return [read_row(ptr, self._state_shape(spec), np.dtype(spec.dtype), row, 1, self._copy()).reshape(spec.shape)
                for spec, ptr in zip(self.state_specs, self.state_pointers, strict=True)]  # fmt: skip

    def write_states(self, row: int, values: Sequence[np.ndarray]) -> None:
        if self._state_host:
            for array, value in zip(self._state_host, values, strict=True):
                array[row] = value
            return
        for spec, ptr, value in zip(self.state_specs, self.state_pointers, values, strict=True):
            # (A state from the pool may come from another device's graph, which keeps it in another type.)
            write_row(ptr, self._state_shape(spec), row, value.astype(spec.dtype, copy=False).reshape(1, 1, -1),
                      self._copy())  # fmt: skip

    def _state_shape(self, spec: StateSpec) -> list[int]:
        """A state buffer as kv_copy sees a layer's: one "position" of the whole row's state."""
        return [self.rows, 1, 1, int(np.prod(spec.shape))]

    def release(self, index: int) -> None:
        """Give a freed row's committed pages back (CPU), lazily where the kernel can (MADV_FREE);
        its contents are undefined afterwards."""
        if not self._maps:
            return
        # Each layer's key and value buffers, in the order _mapped made them.
        for mapping, row_bytes in zip(self._maps, (b for b in self.layer_row_bytes for _ in range(2)), strict=True):
            start = -(-index * row_bytes // mmap.PAGESIZE) * mmap.PAGESIZE
            end = (index + 1) * row_bytes // mmap.PAGESIZE * mmap.PAGESIZE
            if end > start:
                mapping.madvise(_RELEASE, start, end - start)

    def read(self, layer: int, row: int, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Positions [start, end) of a row in one layer, [kv_heads, end - start, head_size]: views on
        the CPU; on a GPU, host copies of just those positions."""
        if self.host is not None:
            hk, hv = self.host[layer]
            return hk[row, :, start:end], hv[row, :, start:end]
        k, v = self.pointers[layer]
        dtype, shape = np.dtype(self.dtype), self.shapes[layer]
        return (read_row(k, shape, dtype, row, end - start, self._copy(), start),
                read_row(v, shape, dtype, row, end - start, self._copy(), start))  # fmt: skip

    def write(self, layer: int, row: int, start: int, keys: np.ndarray, values: np.ndarray) -> None:
        """Put [kv_heads, tokens, head_size] arrays into a row from position `start` (only those positions)."""
        end = start + keys.shape[1]
        if self.host is not None:
            hk, hv = self.host[layer]
            hk[row, :, start:end] = keys
            hv[row, :, start:end] = values
            return
        k, v = self.pointers[layer]
        write_row(k, self.shapes[layer], row, keys.astype(self.dtype, copy=False), self._copy(), start)
        write_row(v, self.shapes[layer], row, values.astype(self.dtype, copy=False), self._copy(), start)

    def _copy(self) -> CudaCopy:
        if self._cuda is None:
            self._cuda = CudaCopy()
        return self._cuda


@dataclass
class _Bound:
    """An IOBinding with a row range's KV bound, and the host buffer its one-position logits go to
    (a run then allocates nothing for its output and the caller reads it without a copy).

    A decode's token ids and attention mask live in buffers of their own, bound once and written
    in place from step to step: the mask is bound a whole number of MASK_WIDTH_STEP positions
    wide where the graph allows, so its binding changes once every so many steps, not at each.
    Between a decode run and the next the weights have streamed through the caches, and each bind
    is then a dozen microseconds of cold lookups (rebinding all three at every step: 1.5% of a
    one-row decode)."""

    binding: ort.IOBinding
    logits: np.ndarray  # [rows, 1, vocab]
    ids: np.ndarray  # [rows, 1]: a decode's tokens
    positions: np.ndarray  # [rows, 1] ([3, rows, 1]: multimodal RoPE's): each decoding row's position
    mask_buffer: np.ndarray  # rows * capacity, flat: a decode's mask is [rows, width] at its start
    mask: np.ndarray  # that [rows, width] view, as bound
    width: int = 0  # the decode mask's bound width; 0 while other inputs are bound
    logits_bound: bool = False  # the logits output is `logits` (not an array ORT allocates)


@dataclass
class KVCache:
    """One request's row of a KVSlots and how many positions of it are filled."""

    slots: KVSlots
    row: int
    length: int = 0

    @property
    def capacity(self) -> int:
        return self.slots.capacity


class ModelSession:
    def __init__(
        self,
        bundle: Bundle,
        device: str = "cpu",
        *,
        intra_op_threads: int = 0,
        last_position_logits: bool = True,
        cuda_options: dict[str, str] | None = None,
        tensorrt: bool = False,
        profile_prefix: str | None = None,
        target: str | None = None,
    ) -> None:
        """`profile_prefix`: record ONNX Runtime's per-node profile (which provider ran each node)
        into a file with that prefix; `self.session.end_profiling()` names it. `target`: which of
        the bundle's graphs to run (default: the CUDA graph on a GPU where the bundle has one, else
        its root graph); the CUDA graph runs on the CPU provider too, for checks without a GPU."""
        self.bundle = bundle
        self.device = device
        self.target = target or ("cuda" if device.startswith("cuda") else "cpu")
        graph_dir, self.facts = bundle.graph(self.target)
        onnx_path = graph_dir / self.facts.onnx_file
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Decode is a chain of small kernels: parallelism inside ops, none between them.
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.intra_op_num_threads = intra_op_threads or (os.cpu_count() or 1)
        opts.inter_op_num_threads = 1
        # The pool's threads spin between a run's kernels (a wake-up per kernel would cost more)
        # but not between runs: there the worker's Python, the event loop and the clients need the
        # cores. One stream through the daemon on 2 cores: 3% faster (16 of 24 alternating pairs).
        opts.add_session_config_entry("session.force_spinning_stop", "1")
        # On a GPU, ONNX Runtime's warning that some nodes were placed on the CPU provider (and
        # each Memcpy it adds around them) reaches the journal: a graph that runs half on the CPU
        # must not pass unseen. Elsewhere only errors.
        opts.log_severity_level = 2 if device.startswith("cuda") else 3
        if profile_prefix is not None:
            opts.enable_profiling = True
            opts.profile_file_prefix = profile_prefix
        import onnx

        graph_only = onnx.load(str(onnx_path), load_external_data=False)
        # Read before the edit below changes the graph (it leaves the mask's path as it is).
        self.mask_width_step = MASK_WIDTH_STEP if mask_width_is_free(graph_only.graph) else 1
        model: str | bytes = str(onnx_path)
        self.last_position_logits = False
        if last_position_logits:
            edited = last_position_logits_model(graph_only, scoring=not tensorrt)
            if edited is not None:
                # External weights are found relative to the graph's folder, as if the file were loaded.
                opts.add_session_config_entry(
                    "session.model_external_initializers_file_folder_path", str(graph_dir)
                )
                model, self.last_position_logits = edited, True
        providers = providers_for(device, cuda_options, tensorrt)
        self.session = ort.InferenceSession(model, opts, providers=providers)
        verify(self.session, device, providers)  # ORT drops a provider it cannot load, and its options
        inputs = {i.name: i for i in self.session.get_inputs()}
        # Every position's logits: the unedited graph gives them to any run of several tokens; an
        # edited one where its head's first position is an input.
        self.logits_from = inputs.pop(LOGITS_FROM, None) is not None
        self.scores_prompts = self.logits_from or not self.last_position_logits
        self._from_last, self._from_first = np.array([-1], dtype=np.int64), np.array([0], dtype=np.int64)
        refusal = self.facts.graph_refusal({name: i.shape for name, i in inputs.items()})
        if refusal:
            raise ValueError(f"{onnx_path.name}: {refusal}")
        # Most exports rotate inside the attention operator from the mask; some (HunYuan's) rotate
        # beside it and take each token's position as an input.
        self.takes_positions = "position_ids" in inputs
        # Qwen2.5-VL's and Qwen3-VL's exports rotate by three position planes (multimodal RoPE: time,
        # height, width); text has its one position on all three, which rotates as plain RoPE does.
        self.position_planes = 3 if self.takes_positions and len(inputs["position_ids"].shape) == 3 else 0
        f = self.facts
        # A hybrid model's recurrent layers have no keys and values, but states (StateSpec).
        self._names, states = f.caches(inputs)
        self.kv_layers = len(self._names)
        self.shared_kv = shared_presents(graph_only.graph, self._names)
        self.kv_shapes = f.kv_shapes({name: i.shape for name, i in inputs.items()})  # per layer (heads, width)
        self.states = [StateSpec(past, present, tuple(int(d) for d in inputs[past].shape[1:]),
                                 np.dtype(NUMPY_TYPES.get(inputs[past].type, "float32")).type)
                       for past, present in states]  # fmt: skip
        past0 = inputs[self._names[0][0]]
        kv_type = NUMPY_TYPES.get(past0.type)
        if kv_type not in ("float32", "float16"):
            raise ValueError(f"{onnx_path.name}: KV type {past0.type} is not supported")
        self.kv_dtype = np.dtype(kv_type).type
        logits_type = next(o.type for o in self.session.get_outputs() if o.name == "logits")
        self.logits_dtype = np.float16 if logits_type == "tensor(float16)" else np.float32
        self.kv_bytes_per_token = 2 * sum(h * w for h, w in self.kv_shapes) * np.dtype(self.kv_dtype).itemsize
        self.ort_device = "cuda" if device.startswith("cuda") else "cpu"
        self.device_id = int(device.partition(":")[2] or 0) if device.startswith("cuda") else 0
        self._positions = np.arange(self.facts.context_length, dtype=np.int64)
        self._ones = np.ones((1, self.facts.context_length), dtype=np.int64)  # a prompt's mask is a slice of it
        log.info("engine session on %s: %s", device, ", ".join(self.session.get_providers()))

    def new_slots(self, rows: int, capacity: int) -> KVSlots:
        return KVSlots(self, rows, capacity)

    def new_cache(self, capacity: int) -> KVCache:
        """A KV cache of its own for one request (a one-row KVSlots)."""
        return KVSlots(self, 1, capacity).row(0)

    def forward(self, cache: KVCache, ids: np.ndarray) -> np.ndarray:
        """Run ids (1-D int64) after cache.length cached tokens; return float32 logits of the last position."""
        n = int(ids.shape[0])
        total = cache.length + n
        if total > cache.capacity:
            raise ValueError(f"KV cache overflow: {total} > {cache.capacity}")
        mask = self._ones[:, :total]
        logits = self._run(cache.slots, cache.row, 1, ids.reshape(1, n), mask)
        cache.length = total
        return np.array(logits[0, -1], dtype=np.float32)  # a copy: the buffer is the next run's

    def forward_every(self, cache: KVCache, ids: np.ndarray) -> np.ndarray:
        """Run ids (1-D int64) after cache.length cached tokens; return float32 logits of every
        one of their positions [len(ids), vocab] (a prompt's scoring: scores_prompts)."""
        if not self.scores_prompts:
            raise RuntimeError("this session computes last-position logits only")
        n = int(ids.shape[0])
        total = cache.length + n
        if total > cache.capacity:
            raise ValueError(f"KV cache overflow: {total} > {cache.capacity}")
        logits = self._run(cache.slots, cache.row, 1, ids.reshape(1, n), self._ones[:, :total], every=True)
        cache.length = total
        return np.asarray(logits[0], dtype=np.float32)

    def decode(self, slots: KVSlots, tokens: np.ndarray, lengths: np.ndarray, keep: Sequence[int] = ()) -> np.ndarray:
        """One token for each of rows 0..len(tokens)-1 in one run, row i after lengths[i] cached
        positions (its new key lands at position lengths[i]); returns float32 logits [rows, vocab].
        The caller advances the lengths of the rows it decodes; rows it only pads along (a slot
        still prefilling, a free one) get a write at their next position, which their own next
        run overwrites, and their recurrent states advance: those of the rows in `keep` are put
        back after the run. The logits are a view, valid until the next decode of the same rows."""
        rows = int(tokens.shape[0])
        width = int(lengths.max()) + 1
        if width > slots.capacity:
            raise ValueError(f"KV cache overflow: {width} > {slots.capacity}")
        bound = self._bound(slots, 0, rows)
        # The operator reads each row's length from the mask's sum; its width only has to cover
        # the longest, so positions past a row's length are zeros, as between ragged rows.
        step = self.mask_width_step
        width = min(-(-width // step) * step, slots.capacity)
        if bound.width != width:
            bound.mask = bound.mask_buffer[: rows * width].reshape(rows, width)
            bound.binding.bind_input("input_ids", "cpu", 0, np.int64, [rows, 1], bound.ids.ctypes.data)
            bound.binding.bind_input("attention_mask", "cpu", 0, np.int64, [rows, width], bound.mask.ctypes.data)
            if self.takes_positions:
                bound.binding.bind_input("position_ids", "cpu", 0, np.int64, list(bound.positions.shape),
                                         bound.positions.ctypes.data)  # fmt: skip
            bound.width = width
        np.less_equal(self._positions[:width], lengths[:, None], out=bound.mask, casting="unsafe")
        bound.ids[:, 0] = tokens
        if self.takes_positions:
            bound.positions[..., 0] = lengths
        kept = [(row, slots.read_states(row)) for row in keep] if slots.state_specs else []
        self._launch(bound)
        for row, states in kept:
            slots.write_states(row, states)
        last = bound.logits[:, -1]
        return last if last.dtype == np.float32 else last.astype(np.float32)

    def all_logits(self, ids: np.ndarray) -> np.ndarray:
        """Logits at every position of a fresh prompt, float32 [len(ids), vocab]."""
        return self.forward_every(self.new_cache(int(ids.shape[0])), ids)

    def _run(self, slots: KVSlots, first: int, rows: int, ids: np.ndarray, mask: np.ndarray,
             every: bool = False) -> np.ndarray:  # fmt: skip
        """One run over rows first..first+rows-1 of the slots; the KV is bound once per row range.
        Where each row gets one position's logits, they land in that range's own buffer: valid
        until the next run over the same rows. `every`: every position's logits."""
        bound = self._bound(slots, first, rows)
        binding = bound.binding
        ids, mask = np.ascontiguousarray(ids, dtype=np.int64), np.ascontiguousarray(mask, dtype=np.int64)
        binding.bind_input("input_ids", "cpu", 0, np.int64, list(ids.shape), ids.ctypes.data)
        binding.bind_input("attention_mask", "cpu", 0, np.int64, list(mask.shape), mask.ctypes.data)
        if self.takes_positions:  # a prompt's tokens follow the positions its mask says are filled
            start = mask.shape[1] - ids.shape[1]
            positions = self._positions[start : start + ids.shape[1]].reshape(1, -1)
            if self.position_planes:
                positions = np.ascontiguousarray(np.broadcast_to(positions, (self.position_planes, *positions.shape)))
            binding.bind_input("position_ids", "cpu", 0, np.int64, list(positions.shape), positions.ctypes.data)
        bound.width = 0  # the next decode binds its own again
        if ids.shape[1] == 1 or (self.last_position_logits and not every):
            self._launch(bound)
            return bound.logits
        binding.bind_output("logits", "cpu")  # every position's logits: ORT allocates them
        bound.logits_bound = False
        if not self.logits_from:
            self.session.run_with_iobinding(binding)
            return binding.get_outputs()[0].numpy()
        self._head_from(binding, self._from_first)
        try:
            self.session.run_with_iobinding(binding)
            return binding.get_outputs()[0].numpy()
        finally:
            self._head_from(binding, self._from_last)

    @staticmethod
    def _head_from(binding: ort.IOBinding, position: np.ndarray) -> None:
        binding.bind_input(LOGITS_FROM, "cpu", 0, np.int64, [1], position.ctypes.data)

    def _bound(self, slots: KVSlots, first: int, rows: int) -> _Bound:
        bound = slots.bindings.get((self, first, rows))
        if bound is None:
            bound = slots.bindings[(self, first, rows)] = self._bind(slots, first, rows)
        return bound

    def _launch(self, bound: _Bound) -> None:
        """Run with one position's logits for each row into the range's own buffer."""
        if not bound.logits_bound:
            logits = bound.logits
            bound.binding.bind_output("logits", "cpu", 0, self.logits_dtype, list(logits.shape), logits.ctypes.data)
            bound.logits_bound = True
        self.session.run_with_iobinding(bound.binding)

    def _bind(self, slots: KVSlots, first: int, rows: int) -> _Bound:
        binding = self.session.io_binding()
        binding.bind_output("logits", "cpu")  # first, so it is get_outputs()[0] when ORT allocates it
        layers = zip(self._names, slots.pointers, slots.shapes, slots.layer_row_bytes, strict=True)
        for (pk, pv, ok, ov), (k, v), layer_shape, row_bytes in layers:
            shape, offset = [rows, *layer_shape[1:]], first * row_bytes
            for name, ptr in ((pk, k), (pv, v)):
                binding.bind_input(name, slots.device, slots.device_id, slots.dtype, shape, ptr + offset)
            for name, ptr in ((ok, k), (ov, v)):
                binding.bind_output(name, slots.device, slots.device_id, slots.dtype, shape, ptr + offset)
        for ok, ov, layer in self.shared_kv:
            shape, offset = [rows, *slots.shapes[layer][1:]], first * slots.layer_row_bytes[layer]
            k, v = slots.pointers[layer]
            for name, ptr in ((ok, k), (ov, v)):
                binding.bind_output(name, slots.device, slots.device_id, slots.dtype, shape, ptr + offset)
        for spec, ptr in zip(self.states, slots.state_pointers, strict=True):
            shape, at = [rows, *spec.shape], ptr + first * spec.row_bytes
            binding.bind_input(spec.past, slots.device, slots.device_id, spec.dtype, shape, at)
            binding.bind_output(spec.present, slots.device, slots.device_id, spec.dtype, shape, at)
        if self.logits_from:
            self._head_from(binding, self._from_last)
        logits = np.empty((rows, 1, self.facts.vocab_size), dtype=self.logits_dtype)
        ids, mask = np.zeros((rows, 1), dtype=np.int64), np.zeros(rows * slots.capacity, dtype=np.int64)
        positions = np.zeros((self.position_planes, rows, 1) if self.position_planes else (rows, 1), dtype=np.int64)
        return _Bound(binding, logits, ids, positions, mask, mask[:0].reshape(rows, 0))

    def export_span(self, cache: KVCache, start: int, end: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """KV of positions [start, end), per layer as host arrays [kv_heads, end - start, head_size]
        (views on the CPU)."""
        return [cache.slots.read(layer, cache.row, start, end) for layer in range(self.kv_layers)]

    def import_prefix(self, cache: KVCache, segments: Sequence[tuple[int, KVArrays]], tokens: int,
                      states: Sequence[np.ndarray] | None = None) -> None:  # fmt: skip
        """Fill a row's first `tokens` positions from segments of per-layer arrays, each with the
        position it starts at, and (a hybrid model's) its recurrent states after them."""
        for start, kv in segments:
            _write(cache, start, kv)
        if states is not None:
            cache.slots.write_states(cache.row, states)
        cache.length = tokens

    def copy_span(self, source: KVCache, target: KVCache, start: int, end: int) -> None:
        """Positions [start, end) of one row into another; the target's length is the caller's."""
        if end > start:
            _write(target, start, self.export_span(source, start, end))


def _write(cache: KVCache, start: int, kv: KVArrays) -> None:
    """Per-layer arrays into a row from position `start`."""
    for layer, (k, v) in enumerate(kv):
        cache.slots.write(layer, cache.row, start, k, v)
