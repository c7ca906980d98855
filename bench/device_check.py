"""The device check: what the GPU path must show on a real GPU, in one run that writes
`OUT/device_check.json` (bench/device_check.sh runs it on a lent device, after installing the
carried onnxruntime-gpu and building the CUDA firmware).

Steps, each timed and recorded whether it passes or not (a failing step does not stop the others):
providers (asked for, and kept with their options), node placement from a one-step ONNX Runtime
profile (attention and matmuls on the device), the device's logits against the CPU's on a
64-token prompt, greedy decode with end-of-sequence ignored against the memory-bandwidth bound,
aggregate tokens/s at 1, 4 and 16 concurrent streams, time to first token at two prompt sizes,
prefix reuse, a memory hog moving placement to the CPU and back, a real out-of-memory
continued on the CPU with the same text as a CPU run, a hybrid model's recurrent states in
device buffers (the tiny Qwen3.5: zeroed, kept for a padded row, two rows as each alone), and
Nemotron 3's ReLU-squared experts on the device's MoE kernel (the tiny one's logits against the CPU's).

`--dry-run` runs the same steps on the CPU provider with the tiny fixture and smaller sizes (the
hog is a probe whose readings the check sets; the out-of-memory step needs a GPU arena and says so),
so what reaches a device has run end to end before: `make test` runs it
(tests/benchmarks/test_device_check.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

import firmware
from appliance.engine import Engine, EngineConfig, GenerationRequest, Message
from appliance.engine.session import KVSlots, ModelSession
from appliance.governor import Governor, GovernorConfig, MemoryReading, cuda_memory_limit
from bench.step_profile import read_profile
from firmware.toolchain.devkit import dev_trusted_keys

H200_BANDWIDTH = 4.8e12  # bytes/s of HBM3e: the decode bound a token's weight reads set
QUESTION = "What is the capital of France?"


@dataclass(frozen=True)
class Sizes:
    decode_steps: int
    ttft_prompts: tuple[int, ...]
    streams: tuple[int, ...]
    stream_tokens: int


DEVICE_SIZES = Sizes(decode_steps=512, ttft_prompts=(2048, 8192), streams=(1, 4, 16), stream_tokens=64)
DRY_SIZES = Sizes(decode_steps=64, ttft_prompts=(256, 1024), streams=(1, 4, 16), stream_tokens=16)


class SetReadings:
    """The dry run's memory probe: readings the check sets, in place of NVML's (this process holds
    `own`; another process's allocation adds to `used` only)."""

    kind = "dry-run"

    def __init__(self, total: int, own: int) -> None:
        self.total, self.own, self.others = total, own, 0

    def read(self) -> list[MemoryReading]:
        return [MemoryReading("cpu-as-gpu", self.own + self.others, self.total, self.own)]


# Another process holding GPU memory until its stdin closes (the device image has PyTorch).
HOG = ("import sys, torch; x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device='cuda'); "
       "print('holding', flush=True); sys.stdin.read()")


def logits_against(ours: np.ndarray, reference: np.ndarray, tolerance: float) -> dict[str, Any]:
    """A step's result: `ours` within `tolerance` of the CPU provider's logits, the same token first
    (at each position, where they are every position's)."""
    diff, same = float(np.abs(ours - reference).max()), bool((ours.argmax(-1) == reference.argmax(-1)).all())
    return {"ok": same and diff <= tolerance, "max_abs_diff": diff, "same_argmax": same, "tolerance": tolerance}


@dataclass
class DeviceCheck:
    bundle: firmware.Bundle
    device: str  # "cuda:0", or "cpu" in the dry run
    sizes: Sizes
    dry_run: bool
    cuda_options: dict[str, str] | None = None
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)

    def step(self, name: str, run: Callable[[], dict[str, Any]]) -> None:
        started = time.perf_counter()
        try:
            result = run()
        except Exception as exc:  # recorded; the other steps still run
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc(limit=4)}
        result["seconds"] = round(time.perf_counter() - started, 2)
        self.steps[name] = result
        print(f"{name}: {'ok' if result['ok'] else 'FAILED'} ({result['seconds']} s) "
              f"{ {k: v for k, v in result.items() if k not in ('ok', 'seconds', 'trace')} }", flush=True)  # fmt: skip

    def session(self, device: str | None = None, **kwargs: Any) -> ModelSession:
        device = device or self.device
        options = self.cuda_options if device.startswith("cuda") else None
        return ModelSession(self.bundle, device, cuda_options=options, **kwargs)

    def prompt_ids(self, n: int, seed: int = 0) -> np.ndarray:
        vocab = self.bundle.model.vocab_size
        return np.random.default_rng(seed).integers(min(100, vocab // 4), vocab, size=n).astype(np.int64)

    # --- the steps ------------------------------------------------------------------------------

    def providers(self) -> dict[str, Any]:
        session = self.session()  # ModelSession refuses a session that lost a provider or its options
        got = session.session.get_providers()
        options = session.session.get_provider_options()
        kept = {k: options.get("CUDAExecutionProvider", {}).get(k) for k in (self.cuda_options or {})}
        wanted = "CUDAExecutionProvider" if self.device.startswith("cuda") else "CPUExecutionProvider"
        return {"ok": got[0] == wanted, "providers": got, "cuda_options_kept": kept}

    def placement(self) -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            session = self.session(profile_prefix=str(Path(tmp) / "profile"))
            session.forward(session.new_cache(16), self.prompt_ids(8))
            _, events = read_profile(Path(session.session.end_profiling()))
        nodes: Counter[tuple[str, str]] = Counter()
        for event in events:
            args = event.get("args", {})
            if "provider" in args:
                nodes[(args.get("op_name", "?"), args["provider"])] += 1
        wanted = "CUDAExecutionProvider" if self.device.startswith("cuda") else "CPUExecutionProvider"
        heavy = {(op, provider): n for (op, provider), n in nodes.items()
                 if op in ("GroupQueryAttention", "MatMulNBits", "MatMul")}  # fmt: skip
        elsewhere = {f"{op} on {p}": n for (op, p), n in heavy.items() if p != wanted}
        return {"ok": bool(heavy) and not elsewhere, "heavy_nodes": {f"{op} on {p}": n for (op, p), n in heavy.items()},
                "heavy_nodes_elsewhere": elsewhere,
                "nodes_by_provider": dict(Counter(p for (_, p) in nodes.elements()))}  # fmt: skip

    def logits(self) -> dict[str, Any]:
        ids = self.prompt_ids(64, seed=1)
        device = self.session()
        # The same graph on the CPU provider: what differs is the provider's kernels, not the graph.
        cpu = device if self.device == "cpu" else self.session("cpu", target=device.target)
        ours = device.forward(device.new_cache(64), ids)
        reference = cpu.forward(cpu.new_cache(64), ids)
        tolerance = 0.5 if self.device.startswith("cuda") else 1e-5  # fp16 kernels of two providers
        last = logits_against(ours, reference, tolerance)
        # A prompt's scoring (the head from position 0, an input bound on the host): every position's.
        every = logits_against(device.all_logits(ids), cpu.all_logits(ids), tolerance)
        return {**last, "ok": last["ok"] and every["ok"], "every_position": every}

    def decode(self) -> dict[str, Any]:
        steps = self.sizes.decode_steps
        session = self.session()
        ids = self.prompt_ids(128, seed=2)
        cache = session.new_cache(len(ids) + steps + 1)
        token = int(session.forward(cache, ids).argmax())
        started = time.perf_counter()
        for _ in range(steps):  # end-of-sequence ignored: every step runs the model
            token = int(session.forward(cache, np.array([token], dtype=np.int64)).argmax())
        rate = steps / (time.perf_counter() - started)
        weights = sum(e.size for e in self.bundle.manifest.files.values())
        kv = session.kv_bytes_per_token * (len(ids) + steps / 2)  # the average step reads half the new KV
        bound = H200_BANDWIDTH / (weights + kv) if self.device.startswith("cuda") else None
        return {"ok": rate > 0, "tokens_per_s": round(rate, 1), "steps": steps,
                "bandwidth_bound_tokens_per_s": round(bound, 1) if bound else None,
                "fraction_of_bound": round(rate / bound, 3) if bound else None}  # fmt: skip

    def hybrid(self) -> dict[str, Any]:
        """A hybrid model (the tiny Qwen3.5: a recurrent layer beside an attention one) on the device:
        its states in device buffers, zeroed when a row is taken, kept for a row a decode pads
        along while its prompt is half in; two rows decoded together answer as each alone, the
        first prompt's logits are the CPU provider's, and a row the CPU computed (a prefix pool hit)
        imported into a device row goes on as the device's own."""
        from firmware.toolchain.tiny import tiny_bundle

        bundle = firmware.load(tiny_bundle("qwen3_5"), dev_trusted_keys())
        options = self.cuda_options if self.device.startswith("cuda") else None
        session = ModelSession(bundle, self.device, cuda_options=options)
        rng = np.random.default_rng(3)
        prompts = [rng.integers(3, 500, size=n).astype(np.int64) for n in (40, 17)]
        steps = 8

        def greedy(slots: KVSlots, row: int, ids: np.ndarray) -> tuple[list[int], np.ndarray]:
            """A prompt's greedy answer alone, and the logits its prompt ends with."""
            cache = slots.row(row)
            last = session.forward(cache, ids)
            tokens = [int(last.argmax())]
            for _ in range(steps - 1):
                tokens.append(int(session.forward(cache, np.array(tokens[-1:], dtype=np.int64)).argmax()))
            return tokens, last

        alone = [greedy(session.new_slots(1, 64), 0, ids) for ids in prompts]
        slots = session.new_slots(2, 64)
        first = session.forward(slots.row(0), prompts[0])
        cpu = ModelSession(bundle, "cpu")
        diff = float(np.abs(first - cpu.forward(cpu.new_cache(64), prompts[0])).max())
        half = slots.row(1)
        session.forward(half, prompts[1][:9])  # row 1's prompt half in: the decode pads along it
        together, length = [int(first.argmax())], len(prompts[0])
        for _ in range(steps - 1):
            lengths = np.array([length, half.length], dtype=np.int64)
            logits = session.decode(slots, np.array([together[-1], 0], dtype=np.int64), lengths, keep=[1])
            together.append(int(logits[0].argmax()))
            length += 1
        last = session.forward(half, prompts[1][9:])
        # The padded row's prompt ends on the logits it ends on alone (a random tiny model keeps its
        # greedy tokens through a stale state; its logits show it).
        kept = float(np.abs(last - alone[1][1]).max())
        second = [int(last.argmax())]
        for _ in range(steps - 1):
            second.append(int(session.forward(half, np.array(second[-1:], dtype=np.int64)).argmax()))
        same = [together, second] == [tokens for tokens, _ in alone]
        # A prefix pool hit from the CPU's row (the pool serves every device): its keys, values and
        # states go into a device row, cast to the device graph's types, and the prompt's last two
        # tokens end on the logits the device's own run ends on.
        head = len(prompts[0]) - 2
        cpu_row = cpu.new_cache(64)
        cpu.forward(cpu_row, prompts[0][:head])
        pooled = slots.row(1)
        session.import_prefix(pooled, [(0, cpu.export_span(cpu_row, 0, head))], head,
                              cpu_row.slots.read_states(cpu_row.row))  # fmt: skip
        imported = float(np.abs(session.forward(pooled, prompts[0][head:]) - alone[0][1]).max())
        tolerance = 0.05 if self.device.startswith("cuda") else 1e-5
        return {"ok": same and kept <= 1e-3 and diff <= tolerance and imported <= tolerance, "answers_as_alone": same,
                "padded_row_logits_vs_alone": kept, "logits_vs_cpu": diff, "imported_from_cpu_vs_own": imported,
                "states": len(session.states), "kv_layers": session.kv_layers}  # fmt: skip

    def engine(self, **config: Any) -> Engine:
        devices = (self.device,) if self.device == "cpu" else (self.device, "cpu")
        return Engine(self.bundle, EngineConfig(**config), devices, self.cuda_options)

    def streams(self) -> dict[str, Any]:
        engine = self.engine(prefix_cache_bytes=0, max_active_per_device=max(self.sizes.streams))
        rates = {}

        async def one(i: int) -> int:
            request = GenerationRequest((Message("user", f"Tell story number {i} about a lighthouse."),),
                                        max_tokens=self.sizes.stream_tokens, temperature=0.0)  # fmt: skip
            stream = engine.submit(request, self.device)
            async for _ in stream:
                pass
            assert stream.finished is not None
            return stream.finished.output_tokens

        async def run(n: int) -> float:
            started = time.perf_counter()
            tokens = sum(await asyncio.gather(*(one(i) for i in range(n))))
            return tokens / (time.perf_counter() - started)

        try:
            engine.warm()
            for n in self.sizes.streams:
                rates[str(n)] = round(asyncio.run(run(n)), 1)
        finally:
            engine.close()
        most = str(max(self.sizes.streams))
        return {"ok": rates[most] > rates["1"], "tokens_per_s_by_streams": rates,
                "scaling": round(rates[most] / rates["1"], 2)}  # fmt: skip

    def long_prompt(self, engine: Engine, tokens: int) -> str:
        text, sentence = "", "The appliance keeps every decision local, in the process that runs the model. "
        while len(engine.tokenizer.encode(text + sentence, add_special_tokens=False)[0]) < tokens - 16:
            text += sentence
        return text

    def ttft(self) -> dict[str, Any]:
        engine = self.engine(prefix_cache_bytes=0)
        out: dict[str, float | str] = {}
        try:
            for n in self.sizes.ttft_prompts:
                if n + 8 > self.bundle.model.context_length:
                    out[str(n)] = f"skipped: the model's context is {self.bundle.model.context_length}"
                    continue
                request = GenerationRequest((Message("user", self.long_prompt(engine, n)),), max_tokens=1,
                                            temperature=0.0)  # fmt: skip
                started = time.perf_counter()
                asyncio.run(engine.complete(request, self.device))
                out[str(n)] = round((time.perf_counter() - started) * 1000, 1)
        finally:
            engine.close()
        return {"ok": any(isinstance(v, float) for v in out.values()), "ttft_ms_by_prompt_tokens": out}

    def prefix_reuse(self) -> dict[str, Any]:
        engine = self.engine(prefix_cache_bytes=256 << 20)
        try:
            text = self.long_prompt(engine, min(1024, self.bundle.model.context_length // 2))
            request = GenerationRequest((Message("user", text),), max_tokens=4, temperature=0.0)
            cold, first = asyncio.run(engine.complete(request, self.device))
            warm, again = asyncio.run(engine.complete(request, self.device))
        finally:
            engine.close()
        reused = again.trace.reused_tokens
        return {"ok": reused > 0 and warm == cold, "reused_tokens": reused, "same_text": warm == cold,
                "prefill_ms_cold": round(first.trace.prefill_ms, 1),
                "prefill_ms_warm": round(again.trace.prefill_ms, 1)}  # fmt: skip

    def governor(self) -> dict[str, Any]:
        threshold = self.bundle.layer.fallback_cpu_threshold
        import subprocess

        from appliance.plan import memory_need

        threshold = self.bundle.layer.fallback_cpu_threshold
        engine = self.engine(prefix_cache_bytes=0)  # ours, holding its weights and KV pool on the GPU
        reserved = memory_need(self.bundle, engine.config, self.device).on(self.device)
        if self.dry_run:
            probe: Any = SetReadings(80 << 30, own=reserved)
            gpu = "cpu-as-gpu"
        else:
            from appliance.governor import NvmlProbe

            probe, gpu = NvmlProbe(), self.device
        governor = Governor(probe, GovernorConfig(threshold=threshold), gpu_device=gpu, cpu_device="cpu")
        governor.reserved = reserved
        hog = None
        try:
            governor.sample()
            before, first = governor.place(), probe.read()[0]
            # What another process must take to put the pressure 2 points over the threshold.
            target = int((threshold + 0.02) * first.total)
            need = target - first.used if first.own is None else target - reserved - (first.used - first.own)
            if self.dry_run:
                probe.others += need
            else:
                hog = subprocess.Popen([sys.executable, "-c", HOG, str(need)], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True)  # fmt: skip
                assert hog.stdout is not None and hog.stdout.readline().strip() == "holding"
            governor.sample()
            full, pressure = governor.place(), probe.read()[0].pressure(reserved)
            if self.dry_run:
                probe.others = 0
            elif hog is not None:
                hog.communicate("", timeout=30)
            time.sleep(0.5)
            governor.sample()
            after = governor.place()
        finally:
            if hog is not None and hog.poll() is None:
                hog.kill()
            engine.close()
        return {"ok": before == gpu and full == "cpu" and after == gpu, "placement": [before, full, after],
                "own_known": first.own is not None, "reserved": reserved, "hog_bytes": need,
                "pressure_when_full": round(pressure, 4), "threshold": threshold}  # fmt: skip

    def out_of_memory(self) -> dict[str, Any]:
        if self.dry_run:
            return {"ok": True, "skipped": "needs a GPU arena to exhaust"}
        weights = sum(e.size for e in self.bundle.manifest.files.values())
        request = GenerationRequest((Message("user", QUESTION),), max_tokens=32, temperature=0.0)
        reference = Engine(self.bundle, EngineConfig(prefix_cache_bytes=0), ("cpu",))
        try:
            want, _ = asyncio.run(reference.complete(request))
        finally:
            reference.close()
        # An arena with room for the weights and little else: the first long run cannot allocate.
        tight = {**(self.cuda_options or {}), "gpu_mem_limit": str(weights + (64 << 20))}
        engine = Engine(self.bundle, EngineConfig(prefix_cache_bytes=0), (self.device, "cpu"), tight)
        try:
            got, done = asyncio.run(engine.complete(request, self.device))
        finally:
            engine.close()
        moved = done.trace.device.endswith("->cpu")  # Generation.migrate marks the move
        return {"ok": moved and got == want, "continued_on_cpu": moved, "same_text_as_cpu": got == want,
                "arena_limit": tight["gpu_mem_limit"], "notes": done.trace.notes, "text": got[:80]}  # fmt: skip

    def experts(self) -> dict[str, Any]:
        """A mixture of experts on the device (the tiny Nemotron 3, float32): its ReLU-squared experts
        are the MoE operator's SwiGLU of the up projection with itself (builder_shim.
        RELU_SQUARED_ALPHA), right only where the device's kernel takes the operator's
        activation_alpha and activation_beta; its prompt's logits against the CPU provider's."""
        from firmware.toolchain.tiny import tiny_bundle

        bundle = firmware.load(tiny_bundle("nemotron_h_moe"), dev_trusted_keys())
        options = self.cuda_options if self.device.startswith("cuda") else None
        device, cpu = ModelSession(bundle, self.device, cuda_options=options), ModelSession(bundle, "cpu")
        ids = np.random.default_rng(4).integers(3, 500, size=40).astype(np.int64)
        return logits_against(device.forward(device.new_cache(48), ids), cpu.forward(cpu.new_cache(48), ids), 1e-3)

    def run(self) -> dict[str, Any]:
        for name in ("providers", "placement", "logits", "decode", "streams", "ttft", "prefix_reuse", "governor",
                     "out_of_memory", "hybrid", "experts"):  # fmt: skip
            self.step(name, getattr(self, name))
        return {"device": self.device, "dry_run": self.dry_run, "onnxruntime": ort.__version__,
                "bundle": {"name": self.bundle.name, "version": self.bundle.version,
                           "target": self.bundle.manifest.source.get("target"),
                           "precision": self.bundle.manifest.source.get("precision")},
                "ok": all(s["ok"] for s in self.steps.values()), "steps": self.steps}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="the same steps on the CPU provider, tiny fixture")
    parser.add_argument("--bundle", type=Path, help="the firmware (default: the tiny fixture in a dry run)")
    parser.add_argument("--out", type=Path, default=Path("."), help="where device_check.json goes")
    args = parser.parse_args(argv)
    if args.bundle is None:
        if not args.dry_run:
            parser.error("--bundle: the CUDA firmware to check")
        from firmware.toolchain.tiny import tiny_bundle

        args.bundle = tiny_bundle()
    bundle = firmware.load(args.bundle, dev_trusted_keys())
    if args.dry_run:
        check = DeviceCheck(bundle, "cpu", DRY_SIZES, True)
    else:
        from appliance.governor import NvmlProbe

        total = NvmlProbe().read()[0].total
        options = {"gpu_mem_limit": str(cuda_memory_limit(total, bundle.layer.fallback_cpu_threshold)),
                   "arena_extend_strategy": "kSameAsRequested"}  # fmt: skip
        check = DeviceCheck(bundle, "cuda:0", DEVICE_SIZES, False, options)
    summary = check.run()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "device_check.json").write_text(json.dumps(summary, indent=2) + "\n")
    failed = [name for name, step in check.steps.items() if not step["ok"]]
    print(f"{'FAILED: ' + ', '.join(failed) if failed else 'all steps passed'}; wrote {args.out / 'device_check.json'}")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
