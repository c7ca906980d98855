"""How llama.cpp splits text before its byte-level BPE, for the pre-tokenizers (a file's
tokenizer.ggml.pre) transformers' GGUF reader does not know.

transformers splits such a file's text as GPT-2 does, so pieces a vocabulary was learned on never
form: GLM-4's ".get" and its numbers cut every three digits, DeepSeek Coder's digits and punctuation
apart from letters, BLOOM's words with their punctuation, Falcon's runs of punctuation. The token
ids then differ from the model's own tokenizer's (and llama.cpp's) wherever the text holds them.
Each name here is given llama.cpp's own expressions (src/llama-vocab.cpp), applied one after
another, as llama.cpp applies them, to each piece the previous one left (a match and the text
between two matches each a piece). Names whose split is GPT-2's (gpt-2, olmo, mpt, exaone4, ...) or
that transformers already knows (llama-bpe, qwen2, tekken, ...) are not listed; every other name of
llama.cpp's table is, but kimi-k2, which llama.cpp splits by code of its own (a family the build
does not read). afmoe's digits, which llama.cpp also cuts by code of its own, are that code's
regular expression (AFMOE_DIGITS).
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
_CJK_KANA = "[一-龥\u3040-ゟ゠-ヿ]+"  # Chinese, then Japanese kana
_CJK_HANGUL = "[一-龥ࠀ-一가-\ud7ff]+"  # (as DeepSeek's tokenizers write it: all from U+0800 to U+4E00, too)
# DeepSeek-V3's (Hunyuan's and others'): a word may begin with one ASCII punctuation mark.
_DEEPSEEK3_WORDS = (r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
                    r"| ?[\p{P}\p{S}]+")
# DeepSeek LLM's letters: Latin, Greek, Cyrillic, Armenian, Georgian, Cherokee and more, listed.
_DEEPSEEK_LETTERS = ("A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫ"
                     "ᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭ"
                     "ℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟"
                     "𞤀-𞥃")
# GPT-4o's words (a capitalised word or an upper-case run, each with its contraction); then numbers
# as each name's entry says, and GPT-4o's rest.
_GPT4O_WORDS = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + _CONTRACTIONS + "?"
                r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTRACTIONS + "?")
_GPT4O_REST = r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"

# Trinity's (afmoe's) digits, which llama.cpp cuts by C++ of its own (unicode.cpp, named
# \p{AFMoE_digits} in its table): each run of digits into threes from its end, its leading one or
# two digits alone.
AFMOE_DIGITS = r"\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))"
_AFMOE_SCRIPTS = ("[一-鿿㐀-䶿豈-\ufaff\u3040-ゟ゠-ヿ･-ﾟ⼀-\u2fdfเ-\u0e7f\u0e80-\u0effក-\u17ffက-႟ꩠ-ꩿꧠ-\ua9ff"
                  "가-\ud7afᄀ-ᇿ]+")

# llama.cpp's name of a pre-tokenizer -> its expressions, in the order it applies them.
SPLITS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("chatglm-bpe", "glm4", "glm5"), (_LLAMA3,)),  # GLM-4 9B, GLM-4-0414, GLM-Edge
    "jais-2": (_LLAMA3_WORDS + "".join(rf"|\s{{{n}}}(?!\S)" for n in (512, 256, 128, 64, 32, 16, 8, 4))
               + r"|\s{1,2}(?!\S)|\s{1}",),
    "minicpm5": (r"\p{N}{1,3}", _LLAMA3_WORDS.replace(r"\p{N}{1,3}", r"\p{N}+") + r"|\s+(?!\S)|\s+"),
    **dict.fromkeys(("stablelm2", "hunyuan", "solar-open", "grok-2"), (_QWEN2,)),
    "ufakzeka": (_QWEN2.removeprefix(_CONTRACTIONS + "|"),),
    "laguna": (r"[^\n]+|[\n]+", _QWEN2),  # each line, then Qwen2's split
    **dict.fromkeys(("bailingmoe", "bailingmoe2", "llada-moe"), (
        r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]|\s+(?!\S)|\s+",)),
    "exaone-moe": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",),
    "seed-coder": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
                   r"|\s+(?!\S)|\s+",),
    **dict.fromkeys(("deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm"), (
        r"\p{N}{1,3}", _CJK_KANA, _DEEPSEEK3_WORDS + r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")),
    "spark2_5": (r"\p{N}{1,3}", _CJK_KANA, _DEEPSEEK3_WORDS + r"|[\r\n]|\s+(?!\S)|\s+", r"\p{N}"),
    "deepseek-llm": ("[\r\n]", rf"\s?[{_DEEPSEEK_LETTERS}]+", "\\s?[!-/:-~！-／：-～‘-‟\u3000-。]+", r"\s+$",
                     _CJK_HANGUL, r"\p{N}+"),
    "deepseek-coder": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK_HANGUL, r"\p{N}"),
    # Numbers cut every three digits from their end, then GPT-4o's split (Tiny Aya's).
    **dict.fromkeys(("tiny_aya", "cohere2moe"), (r"\d{1,3}(?=(?:\d{3})*\b)",
                                                 _GPT4O_WORDS + r"|\p{N}{1,3}" + _GPT4O_REST)),
    "youtu": ("[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|" + _CJK_KANA, _GPT4O_WORDS + r"|\p{N}" + _GPT4O_REST),
    "superbpe": (r"\p{N}+", r"(?=(\d{3})+(?!\d))"),  # (an empty match: a number cut before each three digits)
    # Trinity's: its digits, Chinese, Japanese, Korean and South-East Asian scripts in runs, then
    # DeepSeek-V3's words.
    "afmoe": (AFMOE_DIGITS, _AFMOE_SCRIPTS, _DEEPSEEK3_WORDS + r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
    # Every digit alone, then GPT-2's split: StarCoder 2's, Refact's, Command R's, SmolLM's, EXAONE 3's.
    **dict.fromkeys(("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"),
                    (r"\p{N}", _GPT2)),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"),
    **dict.fromkeys(("bloom", "poro-chat", "gpt3-finnish"), (_BLOOM,)),
    "viking": (_BLOOM, r"\p{N}"),  # BLOOM's, then every digit alone
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
