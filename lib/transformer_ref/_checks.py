"""Argument checks shared by both backends: the one place where bad input is named.

Every public function validates its input and raises ``ValueError`` whose
message starts with the offending argument's name, e.g.
``ValueError("head_dim must be even for RoPE, got 7")``; the same bad input gives
the same message in both backends (``tests/library/test_api_surface.py`` calls every
shared function of both with the same bad inputs). These helpers only look at
Python numbers, ``.shape`` tuples and dtype names, so they work for NumPy arrays
and torch tensors alike: the NumPy and torch backends both import them from here
and nothing private from each other.
"""

import math
import numbers
from collections import namedtuple

__all__ = [
    "ACTIVATIONS",
    "NORM_TYPES",
    "check_int",
    "check_positive_float",
    "check_flag",
    "check_choice",
    "check_ndim",
    "check_even",
    "check_divisible",
    "check_same_dim",
    "check_broadcasts_to",
    "dtype_name",
    "check_axis",
    "check_scale",
    "QKVSizes",
    "check_qkv",
    "check_mask",
    "check_boolean",
    "check_lengths",
    "check_window",
    "check_tile",
    "check_vector",
    "check_rescale_factors",
    "check_norm_eps",
    "check_memory",
    "cache_offset",
    "check_cache_type",
    "check_quant_bits",
    "check_partials",
    "MLASizes",
    "check_mla_sizes",
    "cross_attention_params",
]

#: the FFN non-linearities of ``feed_forward`` (and of a block's ``activation``)
ACTIVATIONS = ("gelu", "gelu_tanh", "relu")
#: a norm's ``eps`` when none is given: PyTorch's LayerNorm default, Llama's RMSNorm one
_DEFAULT_EPS = {"layernorm": 1e-5, "rmsnorm": 1e-6}
#: the norms of a block
NORM_TYPES = tuple(_DEFAULT_EPS)


def check_int(name, value, *, minimum=0):
    """Return ``value`` as an ``int`` if it is an integer ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_positive_float(name, value, *, minimum=None, allow_equal=True):
    """Return ``value`` as a finite ``float``; ``> 0`` unless ``minimum`` is given."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if minimum is None:
        if value <= 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    elif value < minimum or (not allow_equal and value == minimum):
        op = ">=" if allow_equal else ">"
        raise ValueError(f"{name} must be {op} {minimum}, got {value}")
    return value


def check_flag(name, value):
    """Require a real boolean: ``bias="no"`` would otherwise count as True."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def check_choice(name, value, choices):
    """Return ``value`` if it is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)!r}, got {value!r}")
    return value


def check_ndim(name, x, minimum):
    """Require ``x.ndim >= minimum``; return the shape as a tuple."""
    shape = tuple(x.shape)
    if len(shape) < minimum:
        raise ValueError(f"{name} must have at least {minimum} dimensions, got shape {shape}")
    return shape


def check_even(name, value, what=""):
    """Require an even positive integer (e.g. a RoPE head dimension)."""
    value = check_int(name, value, minimum=1)
    if value % 2:
        raise ValueError(f"{name} must be even{what}, got {value}")
    return value


def check_divisible(name, value, by_name, by):
    """Require ``value % by == 0`` (e.g. query heads by KV heads); return ``value // by``."""
    if by <= 0 or value % by:
        raise ValueError(f"{name} ({value}) must be divisible by {by_name} ({by})")
    return value // by


def check_same_dim(name_a, dim_a, name_b, dim_b, what):
    """Require two sizes to agree; the message names both arguments."""
    if dim_a != dim_b:
        raise ValueError(f"{name_a} and {name_b} must have the same {what}, got {dim_a} and {dim_b}")


def _broadcast(a, b):
    """NumPy's broadcast of the shapes ``a`` and ``b``, or None when they do not broadcast."""
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and 1 not in (x, y):
            return None
        out.append(y if x == 1 else x)
    return tuple(reversed(out))


def check_broadcasts_to(name, shape, target, what):
    """Require ``shape`` to broadcast to ``target`` without growing it (``what`` names the target)."""
    shape, target = tuple(shape), tuple(target)
    if _broadcast(shape, target) != target:
        raise ValueError(f"{name} of shape {shape} must broadcast to {what} {target}")


def dtype_name(dtype):
    """The dtype as both backends spell it: ``"float32"`` for ``np.float32`` and ``torch.float32``."""
    return str(dtype).removeprefix("torch.")


def _dtype_kind(dtype):
    """``"boolean"``, ``"integer"``, ``"floating-point"`` or ``"complex"`` (bfloat16 is floating)."""
    name = dtype_name(dtype)
    if name == "bool":
        return "boolean"
    if name.startswith(("int", "uint")):
        return "integer"
    if name.startswith(("float", "bfloat")):
        return "floating-point"
    return "complex"


def check_axis(axis, shape):
    """Return ``axis`` as an ``int`` if it indexes a dimension of an ``x`` of ``shape``."""
    ndim = len(shape)
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral) or not -ndim <= axis < ndim:
        raise ValueError(f"axis must be an integer in [-{ndim}, {ndim}) for x of shape {tuple(shape)}, got {axis!r}")
    return int(axis)


def check_scale(scale, head_dim):
    """The softmax scale: ``1 / sqrt(head_dim)`` when ``scale`` is None, else ``scale`` as a finite float."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    return check_positive_float("scale", scale, minimum=-math.inf)


#: the sizes of grouped attention inputs, as returned by ``check_qkv(..., grouped=True)``
QKVSizes = namedtuple("QKVSizes", "batch H H_kv group T S D Dv")


def check_qkv(q, k, v, *, grouped=False):
    """Validate ``q (..., H, T, D)``, ``k (..., H_kv, S, D)``, ``v (..., H_kv, S, Dv)``.

    Always: k and v agree on every dimension but the last, q and k on the head size D.
    ``grouped=False`` (:func:`scaled_dot_product_attention`): at least 2 dimensions, and the
    leading dimensions ``(..., H)`` of q and k broadcast; returns None.
    ``grouped=True`` (GQA, flash and sliding-window attention): at least 3 dimensions, the
    same batch dimensions ``...`` and ``H`` a multiple of ``H_kv``; returns the
    :data:`QKVSizes` ``(batch, H, H_kv, group, T, S, D, Dv)`` with ``group = H // H_kv``.
    """
    minimum = 3 if grouped else 2
    q_shape, k_shape, v_shape = (check_ndim(name, x, minimum) for name, x in (("q", q), ("k", k), ("v", v)))
    check_same_dim("q", q_shape[-1], "k", k_shape[-1], "head size D (last dimension)")
    check_same_dim("k", k_shape[-2], "v", v_shape[-2], "number of keys S (dimension -2)")
    check_same_dim("k", k_shape[:-2], "v", v_shape[:-2], "leading dimensions (..., H_kv)")
    if not grouped:
        if _broadcast(q_shape[:-2], k_shape[:-2]) is None:
            raise ValueError(f"q and k leading dimensions (..., H) do not broadcast: {q_shape} vs {k_shape}")
        return None
    *batch, H, T, D = q_shape
    *k_batch, H_kv, S, _ = k_shape
    check_same_dim("q", tuple(batch), "k", tuple(k_batch), "batch dimensions")
    group = check_divisible("q heads H", H, "k heads H_kv", H_kv)
    return QKVSizes(tuple(batch), H, H_kv, group, T, S, D, v_shape[-1])


def check_mask(mask, score_shape):
    """Require a boolean (True = may attend) or floating (additive) ``mask`` that broadcasts to the scores.

    An integer 0/1 mask is rejected: added to the scores it would silently mean
    "additive", not "keep where 1"."""
    check_broadcasts_to("mask", mask.shape, score_shape, "the scores")
    if _dtype_kind(mask.dtype) not in ("boolean", "floating-point"):
        raise ValueError("mask must be boolean (True = may attend) or floating (additive), "
                         f"got dtype {dtype_name(mask.dtype)}")


def check_boolean(name, x):
    """Require a boolean array or tensor."""
    if _dtype_kind(x.dtype) != "boolean":
        raise ValueError(f"{name} must be boolean, got dtype {dtype_name(x.dtype)}")


def check_lengths(lengths, S):
    """Require ``lengths (B,)``: integers in ``[0, S]`` (the real keys of each padded sequence)."""
    if len(lengths.shape) != 1:
        raise ValueError(f"lengths must be 1-D (B,), got shape {tuple(lengths.shape)}")
    kind = _dtype_kind(lengths.dtype)
    if kind != "integer":
        raise ValueError(f"lengths must be integers, got {kind} values")
    values = lengths.tolist()
    if any(not 0 <= n <= S for n in values):
        raise ValueError(f"lengths must lie in [0, S={S}], got {values}")


def check_window(window, T, S):
    """Sliding-window arguments: ``window >= 1`` and at least as many keys as queries."""
    window = check_int("window", window, minimum=1)
    if S < T:
        raise ValueError(f"k must hold at least as many keys as q has queries (S >= T), got S={S}, T={T}")
    return window


def check_tile(name, value, default, length):
    """A tile size: ``default`` when ``value`` is None, else an integer ``>= 1``; never larger than ``length``."""
    size = default if value is None else check_int(name, value, minimum=1)
    return max(1, min(size, length))


def check_vector(name, shape, size):
    """Require a norm gain or bias of shape ``(size,)`` (a bigger array would silently broadcast)."""
    if tuple(shape) != (size,):
        raise ValueError(f"{name} must have shape ({size},), the last dimension of x, got {tuple(shape)}")


def check_rescale_factors(name, factors, size):
    """Require ``size`` positive finite rescale factors, one per RoPE pair; return them as a tuple of floats.

    ``factors`` is a sequence of real numbers or a 1-D array (the torch backend passes tensors
    in as NumPy arrays, so the message is the same)."""
    try:
        values = list(factors)
    except TypeError:
        values = None
    if (values is None or len(getattr(factors, "shape", (size,))) != 1 or len(values) != size
            or any(isinstance(v, bool) or not isinstance(v, numbers.Real) for v in values)):
        got = f"shape {tuple(factors.shape)}" if hasattr(factors, "shape") else repr(factors)
        raise ValueError(f"{name} must hold {size} numbers, one rescale factor per RoPE pair (head_dim/2), got {got}")
    values = tuple(float(v) for v in values)
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"{name} must hold positive finite rescale factors, got {list(values)}")
    return values


def check_norm_eps(norm, eps):
    """Validate the ``norm`` name; return ``eps``, by default 1e-5 for LayerNorm and 1e-6 for RMSNorm."""
    check_choice("norm", norm, NORM_TYPES)
    return _DEFAULT_EPS[norm] if eps is None else check_positive_float("eps", eps)


def check_memory(memory, d_model):
    """Require the encoder output ``memory (..., S, C)`` of a cross-attention to have width ``d_model``."""
    shape = check_ndim("memory", memory, 2)
    if shape[-1] != d_model:
        raise ValueError(f"memory must have the model width {d_model} as last dimension, got shape {shape}")


def cache_offset(cache, layer_idx):
    """The number of positions a KV ``cache`` holds for layer ``layer_idx`` (0 without a cache)."""
    if cache is None:
        return 0
    layer_idx = check_int("layer_idx", layer_idx, minimum=0)
    if layer_idx >= cache.n_layers:
        raise ValueError(f"layer_idx must be < cache.n_layers={cache.n_layers}, got {layer_idx}")
    return cache.length(layer_idx)


def check_cache_type(cache, cls):
    """Require ``cache`` to be None or an instance of ``cls`` (the cache type this attention stores into)."""
    if cache is not None and not isinstance(cache, cls):
        raise ValueError(f"cache must be a {cls.__name__} (or None), got {type(cache).__name__}")


def check_quant_bits(bits):
    """The bit width of a symmetric integer code: ``2 <= bits <= 16``; return ``(bits, qmax, code dtype name)``.

    Codes lie in ``[-qmax, qmax]``, ``qmax = 2 ** (bits - 1) - 1``, stored as int8 up to 8 bits, else int16."""
    bits = check_int("bits", bits, minimum=2)
    if bits > 16:
        raise ValueError(f"bits must be <= 16 (codes are stored as int8 or int16), got {bits}")
    return bits, 2 ** (bits - 1) - 1, "int8" if bits <= 8 else "int16"


def check_partials(outs, lses):
    """Validate partial attention results: ``outs`` ``(..., Dv)`` all of one shape, ``lses`` the same
    number, each of shape ``outs[0].shape[:-1]``; return them as two lists."""
    outs, lses = list(outs), list(lses)
    if not outs:
        raise ValueError("outs must hold at least one partial output, got none")
    if len(lses) != len(outs):
        raise ValueError(f"outs and lses must have the same length, got {len(outs)} and {len(lses)}")
    first = check_ndim("outs[0]", outs[0], 1)
    for i, out in enumerate(outs):
        if tuple(out.shape) != first:
            raise ValueError(f"outs[{i}] must have the shape of outs[0] {first}, got {tuple(out.shape)}")
    for i, lse in enumerate(lses):
        if tuple(lse.shape) != first[:-1]:
            raise ValueError(f"lses[{i}] must have the shape of outs[0] without its last dimension, "
                             f"{first[:-1]}, got {tuple(lse.shape)}")
    return outs, lses


#: the sizes of multi-head latent attention, as returned by :func:`check_mla_sizes`
MLASizes = namedtuple("MLASizes", "H r_kv d_nope d_rope d_v")


def check_mla_sizes(n_heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim):
    """Validate the sizes of multi-head latent attention; return :data:`MLASizes`.

    Every size is a positive integer; the RoPE part of a head is even (it is rotated in pairs)."""
    return MLASizes(check_int("n_heads", n_heads, minimum=1),
                    check_int("kv_lora_rank", kv_lora_rank, minimum=1),
                    check_int("qk_nope_head_dim", qk_nope_head_dim, minimum=1),
                    check_even("qk_rope_head_dim", qk_rope_head_dim, " (RoPE rotates pairs)"),
                    check_int("v_head_dim", v_head_dim, minimum=1))


def cross_attention_params(params, memory):
    """The unprefixed cross-attention parameters ``cross_wq -> wq``, ... of a block; None without ``memory``."""
    if memory is None:
        return None
    if "cross_wq" not in params:
        raise ValueError("memory was given but params has no cross-attention keys (cross_wq, ...): "
                         "use init_block_params(..., cross_attention=True)")
    return {key[len("cross_"):]: value for key, value in params.items() if key.startswith("cross_")}
