"""Runs onnxruntime-genai's model builder with one compatibility fix.

transformers 5 keeps RoPE settings only in `config.rope_parameters`; the builder reads
`config.rope_theta` and, finding none, silently uses 10000. For SmolLM2 (theta 100000) that gives
a model that loads and answers nonsense. The property below answers `rope_theta` from
`rope_parameters` when the config has no value of its own.
"""

from __future__ import annotations

import runpy
from typing import Any

from transformers import PretrainedConfig


def _get(self: Any) -> Any:
    if "rope_theta" in self.__dict__:
        return self.__dict__["rope_theta"]
    params = self.__dict__.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        return params["rope_theta"]
    raise AttributeError("rope_theta")


def _set(self: Any, value: Any) -> None:
    self.__dict__["rope_theta"] = value


if __name__ == "__main__":
    if "rope_theta" not in vars(PretrainedConfig):
        PretrainedConfig.rope_theta = property(_get, _set)  # type: ignore[attr-defined]
    runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__", alter_sys=True)
