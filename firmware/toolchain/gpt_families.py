"""GPT-2, GPT-BigCode (SantaCoder, StarCoder 1), OPT, GPT-NeoX, GPT-J, CodeGen, Falcon, BLOOM and MPT
as the Llama the builder's class builds.

The model builder has no class for these older families, and their layers are a Llama's in all but
names and three details, which the builder's Llama class is given (builder_shim.post_norm_layers):
LayerNorms with biases (as StableLM's), an MLP without a gate (up, GELU or ReLU, down), and but for
GPT-NeoX, GPT-J, CodeGen and Falcon no RoPE: each position has a learned row added to its token's
embedding (`zerolayer_positions`, which the class gathers by the graph's `position_ids` input), or in
BLOOM and MPT a bias on each score (ALiBi: `zerolayer_alibi_slopes`); GPT-NeoX's, GPT-J's, CodeGen's and
Falcon's attention and MLP run side by side (their parallel residual). Here a loaded transformers
model is rebuilt, weights shared, as modules under the names the builder reads
(`model.embed_tokens`, `model.layers[i].input_layernorm`, `.self_attn.q_proj`, ..., `model.norm`,
`lm_head`); what the export does differently is folded into the weights where it can be (a GPT-2
that scales its scores by the layer's index, OPT's projections between a narrower embedding and the
layers) and refused where it cannot (OPT's norms after each sublayer, opt-350m's).
"""

from __future__ import annotations

import math
from typing import Any

from firmware.errors import BundleError

# model_type -> the transformers class a checkpoint of it names.
GPT_FAMILIES = {"gpt2": "GPT2LMHeadModel", "gpt_bigcode": "GPTBigCodeForCausalLM", "opt": "OPTForCausalLM",
                "gpt_neox": "GPTNeoXForCausalLM", "gptj": "GPTJForCausalLM", "codegen": "CodeGenForCausalLM",
                "falcon": "FalconForCausalLM", "bloom": "BloomForCausalLM", "mpt": "MptForCausalLM"}
# Those of them whose positions are a learned table (GPT-NeoX, GPT-J, CodeGen and Falcon rotate their
# heads instead).
LEARNED_POSITIONS = ("gpt2", "gpt_bigcode", "opt")
# And those whose positions are a bias on each score, by the key's position times a slope per head (ALiBi).
ALIBI = ("bloom", "mpt")
BLOOM_CONTEXT = 2048  # the sequence length BLOOM was trained on
# OPT's position table starts two rows in (a padding offset fairseq left in it).
OPT_POSITION_OFFSET = 2
# GPT-J's layer, which CodeGen's repeats but for its fused projection: the first `rotary_dim` of each
# head rotated by neighbouring pairs (RoPE base 10000), attention and MLP side by side after one norm.
ROTATE_EVERY_TWO = ("gptj", "codegen")
ROTARY_BASE = 10000.0
# CodeGen's fused projection is laid out for the 4 devices it was trained on: each device's part its
# queries, then its values, then its keys.
CODEGEN_DEVICES = 4


def config_as_llama(config: Any) -> None:
    """The config fields the builder's Llama class reads, from what these families call them."""
    kind = getattr(config, "model_type", None)
    if kind not in GPT_FAMILIES:
        return
    heads = config.num_attention_heads
    config.architectures = ["LlamaForCausalLM"]
    if not isinstance(getattr(type(config), "head_dim", None), property):  # (Falcon's config computes it)
        config.head_dim = config.hidden_size // heads
    config.num_key_value_heads = 1 if getattr(config, "multi_query", False) else heads
    if kind == "falcon":
        config.num_key_value_heads = config.num_kv_heads if config.new_decoder_architecture else (
            1 if config.multi_query else heads)  # fmt: skip
        config.intermediate_size = config.ffn_hidden_size or 4 * config.hidden_size
        config.hidden_act = config.activation
        return
    if kind == "gpt_neox":  # its rotated part of each head, which the builder reads from the config itself
        config.partial_rotary_factor = float(config.rope_parameters.get("partial_rotary_factor", 1.0))
        return
    config.rope_parameters = {"rope_type": "default", "rope_theta": ROTARY_BASE}  # (read, unused where none rotates)
    if kind in ROTATE_EVERY_TWO:
        config.partial_rotary_factor = config.rotary_dim / config.head_dim
    if kind == "bloom":  # (its GELU is the tanh one)
        config.hidden_act, config.intermediate_size = "gelu_pytorch_tanh", 4 * config.hidden_size
        config.rms_norm_eps = config.layer_norm_epsilon
        # ALiBi sets no limit and BLOOM's configs name none: the 2048 positions it was trained on.
        config.max_position_embeddings = getattr(config, "max_position_embeddings", None) or BLOOM_CONTEXT
        return
    if kind == "mpt":  # (its MLP is 4 times as wide as the layer, as transformers builds it, whatever
        # expansion_ratio says: every published one's is 4)
        config.hidden_act, config.intermediate_size = "gelu", 4 * config.hidden_size
        config.rms_norm_eps, config.max_position_embeddings = config.layer_norm_epsilon, config.max_seq_len
        return
    config.hidden_act = config.activation_function
    if kind == "opt":
        config.intermediate_size = config.ffn_dim
        config.rms_norm_eps = 1e-5  # torch's LayerNorm default, which OPT's layers keep
    else:
        config.intermediate_size = config.n_inner or 4 * config.hidden_size
        config.rms_norm_eps = config.layer_norm_epsilon


def parallel_residual(config: Any) -> bool:
    """Whether the layers run attention and the MLP side by side on the same input (GPT-NeoX's
    and Falcon's, mostly), each after its own norm of it or both after one."""
    if config.model_type == "gpt_neox":
        return bool(config.use_parallel_residual)
    if config.model_type in ROTATE_EVERY_TWO:
        return True
    return config.model_type == "falcon" and bool(config.parallel_attn or config.new_decoder_architecture)


def refusal(config: dict[str, Any]) -> str | None:
    """Why a config.json of these families cannot be exported as they run it (None: it can);
    build.UNEXPORTED_OPTIONS names the options whose presence alone refuses one."""
    if config.get("model_type") == "mpt":
        return _mpt_refusal(config)
    if config.get("model_type") == "opt" and config.get("do_layer_norm_before") is False:
        return ("OPT with its norms after each sublayer (do_layer_norm_before: false, as opt-350m) is not "
                "supported: the export normalizes each sublayer's input")  # fmt: skip
    return None


def as_llama(model: Any) -> Any:
    """The loaded transformers `model` as modules under the builder's Llama names (weights shared
    where they are used as they are, new ones where they are split, transposed or folded)."""
    import torch

    kind = model.config.model_type
    with torch.no_grad():
        if kind == "opt":
            return _opt(model)
        if kind == "gpt_neox":
            return _gpt_neox(model)
        if kind in ROTATE_EVERY_TWO:
            return _gptj(model)
        if kind == "falcon":
            return _falcon(model)
        if kind == "bloom":
            return _bloom(model)
        if kind == "mpt":
            return _mpt(model)
        return _gpt2(model)


def _gpt2(model: Any) -> Any:
    """GPT-2 (its projections are Conv1D: weights stored input-major) and GPT-BigCode (Linear; its
    keys and values one head wide where it is multi-query)."""
    import torch

    config, body = model.config, model.transformer
    hidden, heads = config.hidden_size, config.num_attention_heads
    width = hidden // heads
    conv = config.model_type == "gpt2"
    layers = []
    for index, block in enumerate(body.h):
        qkv_weight = block.attn.c_attn.weight.T if conv else block.attn.c_attn.weight
        qkv_bias = block.attn.c_attn.bias
        if conv:  # GPT-2: all queries, then all keys, then all values
            q, k, v = ((qkv_weight[a:a + hidden], qkv_bias[a:a + hidden]) for a in (0, hidden, 2 * hidden))
        else:  # GPT-BigCode: multi-query is one key-value group, else [query, key, value] per head
            groups = 1 if getattr(config, "multi_query", False) else heads
            q, k, v = _grouped_qkv(qkv_weight, qkv_bias, groups, heads // groups, width)
        # The export scales scores by 1/sqrt(width); GPT-2's config may ask for none, or for a
        # further 1/(layer + 1): both are a factor on the queries.
        scale = (1.0 if getattr(config, "scale_attn_weights", True) else math.sqrt(width)) / (
            index + 1 if getattr(config, "scale_attn_by_inverse_layer_idx", False) else 1)  # fmt: skip
        q = (q[0] * scale, q[1] * scale)
        out, up, down = (_weight_and_bias(p, conv) for p in (block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj))
        layers.append(_layer(block.ln_1, (q, k, v, out), block.ln_2, up, block.mlp.act, down))
    head = torch.nn.Linear(hidden, config.vocab_size, bias=False)
    head.weight = model.lm_head.weight
    return _as_llama_model(model.config, body.wte, layers, body.ln_f, head, body.wpe.weight)


def _opt(model: Any) -> Any:
    """OPT: Llama's names but for its norms, its ungated MLP (fc1, fc2) and its output projection;
    where its embedding is narrower than its layers, the projections in and out folded into the
    embedding table and the LM head (two linear maps in a row are one)."""
    import torch

    config, decoder = model.config, model.model.decoder
    layers = []
    for block in decoder.layers:
        attention = block.self_attn
        qkv = tuple(_weight_and_bias(p, False) for p in (attention.q_proj, attention.k_proj, attention.v_proj))
        layers.append(_layer(block.self_attn_layer_norm, (*qkv, _weight_and_bias(attention.out_proj, False)),
                             block.final_layer_norm, _weight_and_bias(block.fc1, False), block.activation_fn,
                             _weight_and_bias(block.fc2, False)))  # fmt: skip
    table, head_weight = decoder.embed_tokens.weight, model.lm_head.weight
    if decoder.project_in is not None:
        table = table @ decoder.project_in.weight.T
    if decoder.project_out is not None:
        head_weight = head_weight @ decoder.project_out.weight
    embedding = torch.nn.Embedding(config.vocab_size, config.hidden_size)
    embedding.weight = torch.nn.Parameter(table, requires_grad=False)
    head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)
    head.weight = torch.nn.Parameter(head_weight, requires_grad=False)
    positions = decoder.embed_positions.weight[OPT_POSITION_OFFSET:]
    return _as_llama_model(config, embedding, layers, decoder.final_layer_norm, head, positions)


def _gpt_neox(model: Any) -> Any:
    """GPT-NeoX (Pythia, Dolly 2, RedPajama-INCITE): Llama's layers with LayerNorms and biases, its
    queries, keys and values one projection laid out per head, an ungated MLP; where
    `use_parallel_residual` (most of them), the attention and the MLP read the same residual
    stream, each through its own norm, and their outputs join it together (the builder's class is
    told: builder_shim's parallel layer)."""
    config, body = model.config, model.gpt_neox
    heads = config.num_attention_heads
    layers = []
    for block in body.layers:
        fused = block.attention.query_key_value
        qkv = _grouped_qkv(fused.weight, fused.bias, heads, 1, config.hidden_size // heads)
        layers.append(_dense_layer(block.input_layernorm, block.attention, qkv, block.post_attention_layernorm,
                                   block.mlp, block.mlp.act))  # fmt: skip
    return _as_llama_model(config, body.embed_in, layers, body.final_layer_norm, model.lm_head, None)


def _gptj(model: Any) -> Any:
    """GPT-J (6B, GPT4All-J) and CodeGen (Salesforce's 350M to 16B, mono and multi, and CodeGen 2's
    1B to 16B): attention and an ungated MLP side by side after one LayerNorm, no biases but the
    MLP's and the LM head's; CodeGen's queries, keys and values one projection (CODEGEN_DEVICES)."""
    config, body = model.config, model.transformer
    hidden = config.hidden_size
    layers = []
    for block in body.h:
        attention = block.attn
        if config.model_type == "codegen":
            rows = attention.qkv_proj.weight.reshape(CODEGEN_DEVICES, 3, hidden // CODEGEN_DEVICES, hidden)
            qkv = tuple((rows[:, part].reshape(hidden, hidden), None) for part in (0, 2, 1))
        else:
            qkv = tuple(_weight_and_bias(p, False) for p in (attention.q_proj, attention.k_proj, attention.v_proj))
        out, up, down = (_weight_and_bias(p, False) for p in (attention.out_proj, block.mlp.fc_in, block.mlp.fc_out))
        # One norm before both: the MLP reads the attention's normed input (None, to the builder's layer).
        layers.append(_layer(block.ln_1, (*qkv, out), None, up, block.mlp.act, down))
    return _as_llama_model(config, body.wte, layers, body.ln_f, model.lm_head, None)


def _falcon(model: Any) -> Any:
    """Falcon (7B, 40B, 180B and their instruct models): LayerNorms, RoPE, an ungated GELU MLP, the
    queries, keys and values one projection laid out by key-value group (each group's queries,
    then its key and its value; multi-query is one group), or per head where neither; attention
    and the MLP side by side after one norm (7B) or each after its own (40B's and 180B's new
    architecture), or one after the other."""
    config, body = model.config, model.transformer
    heads, width = config.num_attention_heads, config.hidden_size // config.num_attention_heads
    # Per head (a group per head) where neither new nor multi-query.
    groups = config.num_kv_heads if config.new_decoder_architecture else 1 if config.multi_query else heads
    layers = []
    for block in body.h:
        fused = block.self_attention.query_key_value
        qkv = _grouped_qkv(fused.weight, fused.bias, groups, heads // groups, width)
        two = getattr(block, "ln_attn", None) is not None
        before_attention = block.ln_attn if two else block.input_layernorm
        # One norm before both: the MLP reads the attention's normed input (None, to the builder's layer).
        before_mlp = block.ln_mlp if two else getattr(block, "post_attention_layernorm", None)
        layers.append(_dense_layer(before_attention, block.self_attention, qkv, before_mlp, block.mlp, block.mlp.act))
    return _as_llama_model(config, body.word_embeddings, layers, body.ln_f, model.lm_head, None)


def _bloom(model: Any) -> Any:
    """BLOOM (and BLOOMZ): GPT-2's layers but for its fused projection, laid out per head, a
    LayerNorm of the embeddings before the first layer, and ALiBi for positions: each head's
    scores gain its slope times the key's position (softmax takes no notice of what every score of
    a row gains, so the query's own position need not be subtracted)."""
    import torch
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    config, body = model.config, model.transformer
    heads = config.num_attention_heads
    layers = []
    for block in body.h:
        fused = block.self_attention.query_key_value
        qkv = _grouped_qkv(fused.weight, fused.bias, heads, 1, config.hidden_size // heads)
        layers.append(_dense_layer(block.input_layernorm, block.self_attention, qkv, block.post_attention_layernorm,
                                   block.mlp, block.mlp.gelu_impl))  # fmt: skip
    root = _as_llama_model(config, body.word_embeddings, layers, body.ln_f, model.lm_head, None)
    root.zerolayer_embedding_norm = body.word_embeddings_layernorm
    # transformers' own slopes: each head's bias at key position 1 (its table's second column).
    root.zerolayer_alibi_slopes = build_alibi_tensor(torch.ones(1, 2), heads, torch.float32)[:, 0, 1]
    return root


MPT_ALIBI_BIAS_MAX = 8  # what transformers' class spreads MPT's ALiBi slopes by, whatever the config says
# MPT's options that transformers' class runs otherwise than the published model (or not at all):
# (key of attn_config or of the config, the value it runs as, what the option does).
MPT_OPTIONS = (("attn_config", "clip_qkv", None, "its queries, keys and values clipped"),
               ("attn_config", "qk_ln", False, "query and key LayerNorms"),
               ("attn_config", "prefix_lm", False, "a prefix attended both ways"),
               ("attn_config", "alibi", True, "learned positions instead of ALiBi"),
               ("attn_config", "attn_type", "multihead_attention", "another attention than multi-head"),
               ("attn_config", "alibi_bias_max", MPT_ALIBI_BIAS_MAX, "ALiBi's slopes spread otherwise"),
               ("", "no_bias", True, "biases"), ("", "logit_scale", None, "a scale on the logits"))


def _mpt_refusal(config: dict[str, Any]) -> str | None:
    """Why an MPT config.json cannot be exported as its model runs (MPT_OPTIONS), or None."""
    attention = config.get("attn_config") or {}
    for where, key, plain, what in MPT_OPTIONS:
        doc = attention if where else config
        if key in doc and doc[key] != plain:
            return f"MPT with {where + '.' if where else ''}{key} {doc[key]!r} ({what}) is not supported"
    return None


def _mpt(model: Any) -> Any:
    """MPT (MosaicML's 7B and 30B, their instruct and chat models): a Llama's layers with LayerNorms
    without biases (given zero ones), an ungated GELU MLP, its queries, keys and values one
    projection, no biases, ALiBi for positions (BLOOM's bias, with MPT's slopes); the embeddings
    tied to the LM head."""
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    config, body = model.config, model.transformer
    hidden, heads = config.hidden_size, config.num_attention_heads
    layers = []
    for block in body.blocks:
        q, k, v = block.attn.Wqkv.weight.split(hidden)
        scale = block.attn.softmax_scale * math.sqrt(hidden // heads)  # (1 unless the config sets another)
        qkv = ((q * scale, None), (k, None), (v, None))
        out, up, down = (_weight_and_bias(p, False) for p in (block.attn.out_proj, block.ffn.up_proj,
                                                               block.ffn.down_proj))  # fmt: skip
        layers.append(_layer(_biased(block.norm_1), (*qkv, out), _biased(block.norm_2), up, block.ffn.act, down))
    root = _as_llama_model(config, body.wte, layers, _biased(body.norm_f), model.lm_head, None)
    # MPT's slopes (BLOOM's, with its alibi_bias_max of 8): each head's bias at key position 0 of
    # two, which is minus its slope.
    root.zerolayer_alibi_slopes = -build_mpt_alibi_tensor(heads, 2, MPT_ALIBI_BIAS_MAX)[:, 0, 0]
    return root


def _biased(norm: Any) -> Any:
    """A LayerNorm without a bias (MPT's) as one with a bias of zeros, which the export reads."""
    import torch

    if norm.bias is not None:
        return norm
    biased = torch.nn.LayerNorm(norm.normalized_shape, eps=norm.eps)
    biased.weight = norm.weight
    biased.bias = torch.nn.Parameter(torch.zeros_like(norm.weight), requires_grad=False)
    return biased


def _grouped_qkv(weight: Any, bias: Any, groups: int, per_group: int, width: int) -> tuple[tuple[Any, Any], ...]:
    """A fused projection laid out per key-value group: the group's `per_group` query heads, its key
    head, its value head (laid out [query, key, value] per head is a group per head; multi-query
    is one group)."""
    rows = weight.reshape(groups, per_group + 2, width, -1)
    sums = bias.reshape(groups, per_group + 2, width) if bias is not None else None
    parts = (slice(0, per_group), slice(per_group, per_group + 1), slice(per_group + 1, per_group + 2))
    return tuple((rows[:, part].reshape(-1, rows.shape[-1]), sums[:, part].reshape(-1) if sums is not None else None)
                 for part in parts)  # fmt: skip


def _weight_and_bias(projection: Any, conv: bool) -> tuple[Any, Any]:
    """A projection's weight as a Linear stores it (output-major) and its bias."""
    return (projection.weight.T if conv else projection.weight), projection.bias


def _linear(weight_and_bias: tuple[Any, Any]) -> Any:
    import torch

    weight, bias = weight_and_bias
    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    linear.weight = torch.nn.Parameter(weight.contiguous(), requires_grad=False)
    if bias is not None:
        linear.bias = torch.nn.Parameter(bias.contiguous(), requires_grad=False)
    return linear


def _dense_layer(before_attention: Any, attention: Any, qkv: tuple[tuple[Any, Any], ...], before_mlp: Any,
                 mlp: Any, act: Any) -> Any:  # fmt: skip
    """A layer of the families that name their projections `dense` (GPT-NeoX, Falcon, BLOOM): the
    attention's output one, the MLP's dense_h_to_4h and dense_4h_to_h; `qkv` split from its fused one."""
    out, up, down = (_weight_and_bias(p, False) for p in (attention.dense, mlp.dense_h_to_4h, mlp.dense_4h_to_h))
    return _layer(before_attention, (*qkv, out), before_mlp, up, act, down)


def _layer(before_attention: Any, attention: tuple[tuple[Any, Any], ...], before_mlp: Any,
           up: tuple[Any, Any], act: Any, down: tuple[Any, Any]) -> Any:  # fmt: skip
    import torch

    self_attn = torch.nn.Module()
    for name, projection in zip(("q_proj", "k_proj", "v_proj", "o_proj"), attention, strict=True):
        setattr(self_attn, name, _linear(projection))
    mlp = torch.nn.Module()
    mlp.up_proj, mlp.down_proj, mlp.act_fn = _linear(up), _linear(down), act
    layer = _decoder_layer()
    layer.input_layernorm, layer.self_attn, layer.post_attention_layernorm, layer.mlp = (
        before_attention, self_attn, before_mlp, mlp)  # fmt: skip
    return layer


def _as_llama_model(config: Any, embedding: Any, layers: list[Any], norm: Any, head: Any,
                    positions: Any | None) -> Any:  # fmt: skip
    import torch

    if positions is not None and positions.shape[0] < config.max_position_embeddings:
        raise BundleError(f"the position table has {positions.shape[0]} rows for a context of "
                          f"{config.max_position_embeddings}")  # fmt: skip
    body = torch.nn.Module()
    body.embed_tokens, body.layers, body.norm = embedding, torch.nn.ModuleList(layers), norm
    root = torch.nn.Module()
    root.model, root.lm_head = body, head  # in this order: the builder takes modules as they come
    root.config = config
    if positions is not None:  # a tensor, not a module: not taken for the embedding
        root.zerolayer_positions = positions.detach()
    return root


_LAYER_CLASS: list[Any] = []


def _decoder_layer() -> Any:
    """A new layer module, of a class whose name ends as the builder's test for a layer wants."""
    import torch

    if not _LAYER_CLASS:
        _LAYER_CLASS.append(type("GptDecoderLayer", (torch.nn.Module,), {}))
    return _LAYER_CLASS[0]()
