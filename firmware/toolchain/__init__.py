"""The firmware build toolchain, for a build host: GGUF or Hugging Face model -> ONNX (through
onnxruntime-genai's builder, with our shims), signed bundle; the demo firmware and the tiny test
fixture, built once and cached; the development signing key. Nothing here runs on the box, which
needs only the trust core above it (verify, load, install)."""
