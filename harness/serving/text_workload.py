"""workload=text: windows of a real text, for a perplexity and a teacher-forced comparison on real tokens.

Seeded-random prompts are enough to measure speed and memory, but a model's accuracy is a
property of text. Here the user's own local file is tokenized with the checkpoint's own tokenizer
(``tokenizer.json`` in ``model.path``, read with the ``tokenizers`` package; no download) and cut
into consecutive, non-overlapping windows of ``prompt_len + output_len`` tokens. Each window is a
request: its first ``prompt_len`` tokens are the prompt, and the next ``output_len`` are the
continuation the run is fed (teacher-forced), so every position's next token is the text's own.

The file is data: it is read as text, never run. Its hash goes into the row, as a trace's does.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from kvbench.harness.errors import ConfigError
from kvbench.harness.serving.request import Request

TOKENIZER_FILE = "tokenizer.json"


@dataclass(frozen=True)
class TextWindows:
    requests: list[Request]
    continuations: dict[int, tuple[int, ...]]  # request_id -> the text's next output_len tokens
    sha256: str
    text_tokens: int  # the whole file's tokens
    notes: tuple[str, ...] = ()


def load_tokenizer(model_path: str | None):
    if not model_path:
        raise ConfigError("workload=text tokenizes the file with the checkpoint's own tokenizer: set model.path=DIR "
                          f"(a Hugging Face checkpoint folder with {TOKENIZER_FILE}) and model.weights=path")
    file = Path(model_path) / TOKENIZER_FILE
    if not file.is_file():
        raise ConfigError(f"workload=text: {file} not found (the checkpoint's fast tokenizer file is needed)")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ConfigError("workload=text needs the `tokenizers` package (pip install tokenizers; transformers "
                          "brings it)") from None
    try:
        return Tokenizer.from_file(str(file))
    except Exception as e:  # noqa: BLE001 - any unreadable tokenizer file is one line
        raise ConfigError(f"workload=text: cannot read {file} ({type(e).__name__}: {e})") from None


def text_windows(text_path: str | None, model_path: str | None, num_requests: int | None, prompt_len: int,
                 output_len: int, vocab_size: int) -> TextWindows:
    """The file's first ``num_requests`` windows (None: every whole window it holds)."""
    if not text_path:
        raise ConfigError("workload=text reads a local text file: set workload.path=FILE")
    file = Path(text_path)
    if not file.is_file():
        raise ConfigError(f"workload.path={text_path}: no such file (workload=text reads a local text file)")
    if prompt_len < 1 or output_len < 1:
        raise ConfigError(f"workload=text: workload.prompt_len={prompt_len} and workload.output_len={output_len} "
                          "must each be >= 1 token")
    raw = file.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"workload.path={text_path}: not UTF-8 text ({e})") from None
    ids = load_tokenizer(model_path).encode(text).ids
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ConfigError(f"workload=text: the tokenizer gave id {bad[0]}, outside the model's vocab_size={vocab_size} "
                          "(tokenizer and checkpoint do not match)")
    window = prompt_len + output_len
    available = len(ids) // window
    if available == 0:
        raise ConfigError(f"workload.path={text_path} holds {len(ids)} tokens: fewer than one window of "
                          f"prompt_len + output_len = {window}")
    count = available if num_requests is None else num_requests
    notes: tuple[str, ...] = ()
    if count > available:
        notes = (f"the text holds {available} windows of {window} tokens: {available} requests, not {count}",)
        count = available
    requests, continuations = [], {}
    for rid in range(count):
        start = rid * window
        requests.append(Request(rid, tuple(ids[start:start + prompt_len]), output_len))
        continuations[rid] = tuple(ids[start + prompt_len:start + window])
    return TextWindows(requests, continuations, hashlib.sha256(raw).hexdigest(), len(ids), notes)
