"""The KV cache's storage formats by name (``kv_dtype``) and their scale granularities (``kv_scale``).

Plain numbers only: config validation and the sizing formulas read this module without torch.
A quantized cache stores each element in one byte plus fp32 scales; ``x ~= stored * scale``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVFormat:
    name: str
    torch_name: str  # the torch dtype the cache's values are stored in
    qmax: float  # the largest magnitude the format holds: scales map a row's amax onto it
    integer: bool  # values are rounded to integers (int8), not cast to a float format


KV_FORMATS: dict[str, KVFormat] = {f.name: f for f in (
    KVFormat("fp8_e4m3", "float8_e4m3fn", 448.0, False),  # OCP e4m3 "fn": no inf, 448 is the top finite
    KVFormat("fp8_e5m2", "float8_e5m2", 57344.0, False),
    KVFormat("int8", "int8", 127.0, True),  # symmetric: -128 is never used
)}
# auto: the model's dtype (``dtype``), unquantized: what every run did before kv_dtype existed.
KV_DTYPES = ("auto", *KV_FORMATS)
# tensor: one static fp32 scale per layer for K and one for V, set from the amax of the first write
#   into that layer (the first prefill): vLLM's per-tensor default, calibrated instead of 1.0, so int8
#   is usable; later values beyond that amax saturate.
# token_head: a dynamic fp32 scale per token and kv head (amax of its head_dim values / qmax), written
#   beside the values; it costs SCALE_BYTES per token, head, K and V.
KV_SCALES = ("tensor", "token_head")
VALUE_BYTES = 1
SCALE_BYTES = 4


def is_quantized(kv_dtype: str) -> bool:
    return kv_dtype != "auto"


def scale_bytes_per_head(kv_dtype: str, kv_scale: str) -> int:
    """Bytes of scale one token's K (or V) of one kv head carries: per-tensor scales are per layer, not per token."""
    return SCALE_BYTES if is_quantized(kv_dtype) and kv_scale == "token_head" else 0
