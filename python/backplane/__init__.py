"""backplane for Python: a tensor-backend registry with autodiff, DLPack and data-parallel training.

The C++ library (libbackplane) loads the backend plugins named in backends.json; this package
binds its public API. Start with::

    import backplane as bp
    t = bp.tensor([[1.0, 2.0], [3.0, 4.0]])       # on the default backend's device 0
    (t + bp.tensor([10.0, 20.0])).tolist()        # NumPy broadcasting
    registry = bp.default_registry()              # BACKPLANE_CONFIG, else the installed default
    "collective" in registry.backend("cpu").device(0).capabilities

Errors are backplane.Error subclasses, one per C++ Errc, with a .code.
"""

from . import _backplane
from ._backplane import *  # noqa: F401,F403  (the C++ API; names listed in __init__.pyi)
from ._backplane import (  # noqa: F401  (names `import *` skips or the stubs need explicitly)
    Capability,
    DType,
    Error,
    Errc,
    Registry,
    Tensor,
)
from . import _tensor  # noqa: F401  (adds indexing, numpy(), iteration to Tensor)
from ._tensor import no_grad, op_fallback_off  # noqa: F401
from . import nn  # noqa: F401

__version__ = "0.2.0"

# dtype names, NumPy style: backplane.float32 is backplane.DType.f32.
f32 = float32 = DType.f32
f64 = float64 = DType.f64
i32 = int32 = DType.i32
i64 = int64 = DType.i64
bool_ = DType.bool_
f16 = float16 = DType.f16
bf16 = bfloat16 = DType.bf16
u8 = uint8 = DType.u8
i8 = int8 = DType.i8
