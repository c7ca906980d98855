"""The GPU build of ONNX Runtime on a machine without a GPU or CUDA libraries, as a GPU box with a
broken CUDA install would run it: the real `onnxruntime-gpu` wheel, in a virtualenv of its own
(the two packages write the same module, so never beside the CPU build). It lists the CUDA
provider; the daemon must not believe the list, and a session asked for on cuda:0 must refuse
loudly, never run on the CPU without saying so."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECK = r"""
import json, logging, sys
import onnxruntime as ort
import firmware
from appliance.engine import ModelSession, available_devices
from appliance.engine.errors import ProviderError
from firmware.toolchain.devkit import dev_trusted_keys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
bundle = firmware.load(sys.argv[1], dev_trusted_keys())
out = {"ort": ort.__version__, "module": ort.__file__, "listed": ort.get_available_providers(),
       "devices": available_devices()}
try:
    session = ModelSession(bundle, "cuda:0")
    out["cuda_session"] = session.session.get_providers()
except ProviderError as exc:
    out["refused"] = str(exc)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def gpu_python() -> Path:
    """A virtualenv with onnxruntime-gpu, seeing the project's other packages after its own."""
    from firmware.toolchain.paths import cache_dir

    venv = cache_dir() / "ort-gpu-venv"
    python = venv / "bin" / "python"
    if not (venv / ".ready").is_file():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=300)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "onnxruntime-gpu"], check=True,
                       timeout=900)  # fmt: skip
        (venv / ".ready").touch()
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    # After the venv's own site-packages: onnxruntime is the GPU build, the rest this run's project
    # venv's (written every run: the cached venv outlives the checkout whose venv made it).
    (Path(site) / "zz-project.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def test_the_gpu_wheel_without_cuda_offers_no_gpu_and_a_cuda_session_is_refused(
        gpu_python: Path, tiny_bundle_path: Path) -> None:  # fmt: skip
    done = subprocess.run([str(gpu_python), "-c", CHECK, str(tiny_bundle_path)], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert "ort-gpu-venv" in seen["module"] and "CUDAExecutionProvider" in seen["listed"]  # the GPU build
    assert seen["devices"] == ["cpu"]  # listed is not usable: no GPU is offered
    assert "the CUDA provider is listed but unusable" in done.stderr  # and the log says why
    assert "cuda_session" not in seen, seen  # never a "cuda:0" session running on the CPU
    assert "cuda:0: asked ONNX Runtime for CUDAExecutionProvider" in seen["refused"]
