"""How llama.cpp splits text before its byte-level BPE, for the pre-tokenizers (a file's
tokenizer.ggml.pre) transformers' GGUF reader does not know.

transformers splits such a file's text as GPT-2 does, so pieces a vocabulary was learned on never
form: GLM-4's ".get" and its numbers cut every three digits, BLOOM's words with their punctuation,
Falcon's runs of punctuation. The token ids then differ from the model's own tokenizer's (and
llama.cpp's) wherever the text holds them. Each name here is given llama.cpp's own expressions
(src/llama-vocab.cpp), applied one after another, as llama.cpp applies them, to each piece the
previous one left (a match and the text between two matches each a piece). Names whose split is
GPT-2's (gpt-2, olmo, mpt, exaone4, ...) or that transformers already knows (llama-bpe, qwen2,
tekken, ...) are not listed.
"""

from __future__ import annotations

from typing import Any

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
# Llama 3's (as llama.cpp writes it), numbers cut every three digits; Qwen2's, every digit alone.
_LLAMA3_WORDS = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
_LLAMA3 = _LLAMA3_WORDS + r"|\s+(?!\S)|\s+"
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_BLOOM = r" ?[^(\s|.,!?…。，、।۔،)]+"

# llama.cpp's name of a pre-tokenizer -> its expressions, in the order it applies them.
SPLITS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("chatglm-bpe", "glm4", "glm5"), (_LLAMA3,)),  # GLM-4 9B, GLM-4-0414, GLM-Edge
    "jais-2": (_LLAMA3_WORDS + "".join(rf"|\s{{{n}}}(?!\S)" for n in (512, 256, 128, 64, 32, 16, 8, 4))
               + r"|\s{1,2}(?!\S)|\s{1}",),
    **dict.fromkeys(("stablelm2", "hunyuan"), (_QWEN2,)),
    "seed-coder": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
                   r"|\s+(?!\S)|\s+",),
    "hunyuan-dense": (r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+",
                      r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
                      r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
    # Every digit alone, then GPT-2's split: StarCoder 2's, Refact's, Command R's, SmolLM's, EXAONE 3's.
    **dict.fromkeys(("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"),
                    (r"\p{N}", _GPT2)),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"),
    **dict.fromkeys(("bloom", "poro-chat", "gpt3-finnish"), (_BLOOM,)),
}  # fmt: skip


def pre_tokenizer(expressions: tuple[str, ...]) -> Any:
    """The tokenizers pre-tokenizer that splits by `expressions` as llama.cpp does, then maps each
    piece's bytes to the byte-level alphabet, as GPT-2's does."""
    from tokenizers import Regex, pre_tokenizers

    splits = [pre_tokenizers.Split(Regex(e), behavior="isolated") for e in expressions]
    return pre_tokenizers.Sequence([*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def split_as_llama_cpp(tokenizer: Any, meta: dict[str, Any]) -> Any:
    """`tokenizer` (transformers' reading of a GGUF file whose metadata is `meta`) splitting text
    as llama.cpp does, where the file's byte-level BPE names a pre-tokenizer of SPLITS; otherwise
    as it is."""
    expressions = SPLITS.get(str(meta.get("tokenizer.ggml.pre")))
    if meta.get("tokenizer.ggml.model") == "gpt2" and expressions is not None:
        tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizer(expressions)
    return tokenizer
