"""kv/: how big the KV cache is, and how a config becomes a cache.

sizes.py: the sizing formulas (KV bytes per token, weight bytes, an activation estimate);
budget.py: the budget's one home (vLLM's sizing, measured on a GPU, and its bounds);
factory.py: a config and a budget into a cache kind's allocator or cache (impls/kinds.py).
It imports model/, measure/ and the schema; nothing from serving/, scenarios/, job/ or front/.
"""
