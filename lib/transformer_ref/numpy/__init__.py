"""The numpy backend of transformer_ref (see the package docstring for conventions)."""

from ..counts import *  # noqa: F401,F403  backend-free arithmetic, shared by both backends
from ..counts import __all__ as _counts_all
from .rope import *  # noqa: F401,F403
from .rope import __all__ as _rope_all
from .masks import *  # noqa: F401,F403
from .masks import __all__ as _masks_all
from .attention import *  # noqa: F401,F403
from .attention import __all__ as _attention_all
from .kv_cache import *  # noqa: F401,F403
from .kv_cache import __all__ as _kv_cache_all
from .block import *  # noqa: F401,F403
from .block import __all__ as _block_all
from .families import *  # noqa: F401,F403
from .families import __all__ as _families_all
from .flash import *  # noqa: F401,F403
from .flash import __all__ as _flash_all
from .latent_attention import *  # noqa: F401,F403
from .latent_attention import __all__ as _latent_attention_all
from .alibi import *  # noqa: F401,F403
from .alibi import __all__ as _alibi_all
from .quantization import *  # noqa: F401,F403
from .quantization import __all__ as _quantization_all
from .split_attention import *  # noqa: F401,F403
from .split_attention import __all__ as _split_attention_all

__all__ = [
    *_counts_all,
    *_rope_all,
    *_masks_all,
    *_attention_all,
    *_kv_cache_all,
    *_block_all,
    *_families_all,
    *_flash_all,
    *_latent_attention_all,
    *_alibi_all,
    *_quantization_all,
    *_split_attention_all,
]
