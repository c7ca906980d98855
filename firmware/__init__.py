"""Zerolayer firmware bundles: an ONNX Runtime GenAI model folder, a manifest of every file
with its digest and the baked `layer` constants, and an Ed25519 signature over the manifest."""

from firmware.bundle import Bundle, ModelFacts, load, verify
from firmware.errors import BundleError
from firmware.manifest import LayerConstants, Manifest

__all__ = ["Bundle", "BundleError", "LayerConstants", "Manifest", "ModelFacts", "load", "verify"]
