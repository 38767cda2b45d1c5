"""Which decoder class computes each architecture: the Llama family's, or a family's own module.

A family whose layers differ from Llama's in more than a config switch (Gemma 3's sandwich norms and scaled
embeddings, gpt-oss's sinks and clamped SwiGLU experts) subclasses harness/model/llama.py's ``LlamaModel`` in
its own module and is registered here, so build_model (harness/model/weights.py) stays one function.
"""

from __future__ import annotations

import importlib

# architecture -> "module:Class" of its decoder; an architecture not listed is computed by LlamaModel.
FAMILY_CLASSES: dict[str, str] = {}
FAMILY_CLASSES["gpt_oss"] = "kvbench.harness.model.gpt_oss:GptOssModel"
FAMILY_CLASSES["gemma3_text"] = "kvbench.harness.model.gemma3:Gemma3Model"
FAMILY_CLASSES["deepseek_v2"] = "kvbench.harness.model.deepseek:DeepseekModel"
FAMILY_CLASSES["deepseek_v3"] = "kvbench.harness.model.deepseek:DeepseekModel"
FAMILY_CLASSES["qwen3_next"] = "kvbench.harness.model.qwen3_next:Qwen3NextModel"
LLAMA = "kvbench.harness.model.llama:LlamaModel"


def model_class(architecture: str) -> type:
    """The decoder class of ``architecture`` (imported on first use: a family's module loads only when run)."""
    module, name = FAMILY_CLASSES.get(architecture, LLAMA).split(":")
    return getattr(importlib.import_module(module), name)
