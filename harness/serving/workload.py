"""Seeded request generator shared by every impl: same seed, same requests, byte for byte."""

from __future__ import annotations

import gc
import hashlib
import json
from contextlib import contextmanager
from itertools import chain
from typing import Callable

import numpy as np

from kvbench.harness.config import WorkloadConfig
from kvbench.harness.errors import ConfigError
from kvbench.harness.serving.request import Request, Workload, clip_note, draw_lengths, shared_ints


_lengths = draw_lengths  # the name tests and older callers import


def _clip(p: int, o: int, max_seq_len: int) -> tuple[int, int]:
    """Clip the tail so prompt + output fits; keep at least one output token."""
    p = min(p, max_seq_len - 1)
    return p, max(1, min(o, max_seq_len - p))


# Token ids drawn per numpy call in ``draw_prompts``: 8 MB of int64 at a time, whatever the workload's size.
DRAW_CHUNK_TOKENS = 2**20


def draw_prompts(rng: np.random.Generator, vocab: int, sizes: list[int], token_ids,
                 prefix: tuple[int, ...] = (), on_chunk: Callable[[int, int, np.ndarray], None] | None = None
                 ) -> list[tuple[int, ...]]:
    """``prefix + token_ids(rng.integers(0, vocab, size=k))`` as a tuple for each ``k`` of ``sizes`` in turn,
    the same ids from the same ``rng``, drawn a chunk of requests per call.

    One call per request spent ~10 us in numpy's argument handling alone (100,000 requests: 1 s). Several
    requests' ids in one call are the same ids: below 2**32 ids, numpy draws each from the generator's own
    32-bit stream (PCG64 keeps the half of a 64-bit output left over between calls, in its state), above it
    each from one 64-bit output, and a rejected draw is redrawn in place; so the stream does not depend on
    how it is cut into calls (tests/unit/harness/serving/test_workload.py checks it against one call each).
    ``on_chunk(start, end, ids)``: each chunk's drawn ids as numpy has them, for the requests
    ``start..end-1`` (without the prefix), before they become ints.
    """
    prompts: list[tuple[int, ...]] = []
    start, count = 0, len(sizes)
    while start < count:
        end, total = start, 0
        while end < count and (end == start or total + sizes[end] <= DRAW_CHUNK_TOKENS):
            total += sizes[end]
            end += 1
        drawn = rng.integers(0, vocab, size=total)
        if on_chunk is not None:
            on_chunk(start, end, drawn)
        ids = token_ids(drawn)  # one list of shared ints for the chunk
        at = 0
        for k in sizes[start:end]:
            prompts.append(prefix + tuple(ids[at:at + k]))  # () + t is t itself: no copy without a prefix
            at += k
        start = end
    return prompts


@contextmanager
def gc_paused():
    """The cyclic collector off for a block that makes millions of objects and no reference cycles (drawing
    100,000 prompts: ~2.5 s of its collections rescanning the prompts already made, for nothing).

    At its end what it made goes straight to the oldest generation (``gc.freeze`` then ``gc.unfreeze``, which
    moves every tracked object there unscanned): else the first young collection after it walks all of it
    once more (100,000 chat prompts' 51 million ids: 0.5 s). Nothing is kept from the collector: a full
    collection still sees it all."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.freeze()
            gc.unfreeze()
            gc.enable()


def draw_workload(cfg: WorkloadConfig, num_requests: int, vocab_size: int, max_seq_len: int, seed: int,
                  model_path: str | None = None) -> Workload:
    """Draw ``num_requests`` requests; lengths come from ``cfg`` or, for ``distribution=trace``, its file
    (``distribution=text``: windows of a local text, tokenized by the checkpoint at ``model_path``).

    Long-tailed lengths are clipped to ``max_seq_len`` and counted in the notes. A fixed
    workload that cannot fit is a config error, not a silent clip.
    """
    with gc_paused():
        return _draw_workload(cfg, num_requests, vocab_size, max_seq_len, seed, model_path)


def _draw_workload(cfg: WorkloadConfig, num_requests: int, vocab_size: int, max_seq_len: int, seed: int,
                   model_path: str | None) -> Workload:
    total = cfg.prompt_len + cfg.output_len
    if cfg.distribution == "fixed" and total > max_seq_len:
        raise ConfigError(f"workload.prompt_len + workload.output_len = {total:g} exceeds max_seq_len={max_seq_len}")
    vocab = min(vocab_size, cfg.vocab_limit or vocab_size)
    if cfg.distribution == "text":
        from kvbench.harness.serving.text_workload import text_windows  # the tokenizer only when asked for

        if total > max_seq_len:
            raise ConfigError(f"workload=text: workload.prompt_len + workload.output_len = {total:g} exceeds "
                              f"max_seq_len={max_seq_len}")
        text = text_windows(cfg.path, model_path, num_requests, int(cfg.prompt_len), int(cfg.output_len), vocab_size)
        return Workload(text.requests, text.notes, text.sha256, continuations=text.continuations)
    if cfg.kind == "multi_turn":  # its own modules, imported when asked for
        from kvbench.harness.serving.conversations import draw_conversations

        return draw_conversations(cfg, vocab, max_seq_len, seed)
    if cfg.kind == "system_prompt":
        from kvbench.harness.serving.system_prompts import draw_system_prompt_workload

        return draw_system_prompt_workload(cfg, num_requests, vocab, max_seq_len, seed)
    rng = np.random.Generator(np.random.PCG64(seed))
    trace = None
    if cfg.distribution == "trace":
        from kvbench.harness.serving.trace import read_trace  # pandas and the file only when asked for

        trace = read_trace(cfg, num_requests, seed)
        prompt_lens, output_lens = trace.prompt_lens, trace.output_lens
    else:
        prompt_lens = draw_lengths(cfg, cfg.prompt_len, num_requests, rng)
        output_lens = draw_lengths(cfg, cfg.output_len, num_requests, rng, output=True)
    prefix = rng.integers(0, vocab, size=cfg.shared_prefix_len).tolist()
    token_ids = shared_ints(vocab)
    if trace is not None and trace.hash_ids is not None:
        from kvbench.harness.serving.hash_blocks import HashBlockTokens

        blocks = HashBlockTokens(cfg.hash_block_size, vocab, seed, token_ids)
    lengths, clipped, prompts_cut = [], 0, 0
    for rid in range(num_requests):
        want = int(max(prompt_lens[rid], cfg.shared_prefix_len + 1)), int(output_lens[rid])
        p, o = _clip(*want, max_seq_len)
        clipped += (p, o) != want
        prompts_cut += p < want[0]
        lengths.append((p, o))
    digest = None
    if trace is not None and trace.hash_ids is not None:  # format=mooncake: tokens from the block ids
        prompts = [tuple(prefix + blocks.prompt(trace.hash_ids[rid], p, rng)) for rid, (p, _) in enumerate(lengths)]
    else:
        sizes = [p - len(prefix) for p, _ in lengths]
        digest = hashlib.sha256()

        def hash_chunk(start: int, end: int, ids: np.ndarray) -> None:  # workload_digest's text, in order
            records = [(rid, lengths[rid][0], lengths[rid][1], cfg.n, 0.0) for rid in range(start, end)]
            digest.update(_ids_records_text(_with_prefix(ids, sizes[start:end], tuple(prefix)), records))

        prompts = draw_prompts(rng, vocab, sizes, token_ids, tuple(prefix), on_chunk=hash_chunk)
    requests = [Request(rid, prompt, o, cfg.n) for rid, (prompt, (_, o)) in enumerate(zip(prompts, lengths))]
    return Workload(
        requests,
        clip_note(clipped, prompts_cut, num_requests, max_seq_len),
        trace.sha256 if trace else None,
        tuple(trace.arrival_s.tolist()) if trace is not None and trace.arrival_s is not None else None,
        digest=digest.hexdigest()[:DIGEST_CHARS] if digest is not None else None,
    )


def generate_requests(
    cfg: WorkloadConfig, num_requests: int, vocab_size: int, max_seq_len: int, seed: int
) -> list[Request]:
    """The requests of ``draw_workload``, without its notes."""
    return draw_workload(cfg, num_requests, vocab_size, max_seq_len, seed).requests


def workload_digest(requests: list[Request]) -> str:
    """A short hash of the exact requests, recorded in every row: the sha256 of each request's JSON record,
    ``json.dumps([request_id, prompt_ids, output_len, n])`` (``+ [arrival_s]`` when it is not 0), one after
    another.

    An arrival at t=0 adds nothing to its request's record, so a burst hashes exactly as
    every run did before arrival times existed. The records' text is made here without ``json.dumps``
    (``_records_text``; 100,000 chat prompts: 7.7 s with it), byte for byte the same
    (tests/unit/harness/serving/test_workload.py checks it against ``json.dumps`` on awkward requests).
    """
    h = hashlib.sha256()
    start, tokens = 0, 0
    for i, r in enumerate(requests):  # chunks of about DRAW_CHUNK_TOKENS prompt tokens
        tokens += len(r.prompt_ids)
        if tokens >= DRAW_CHUNK_TOKENS:
            h.update(_records_text(requests[start:i + 1], tokens))
            start, tokens = i + 1, 0
    h.update(_records_text(requests[start:], tokens))
    return h.hexdigest()[:DIGEST_CHARS]


DIGEST_CHARS = 16  # a digest's length in hex digits


def _json_record(r: Request) -> bytes:
    record = [r.request_id, r.prompt_ids, r.output_len, r.n]
    return json.dumps(record + [r.arrival_s] if r.arrival_s else record).encode()


def _scalar(x) -> str:
    return str(x) if type(x) is int else json.dumps(x)  # an int's JSON is its str; others (bool) as json has them


# Prompt ids below this are written from a table of every id's text up to the largest one in the chunk.
TEXT_TABLE_MAX = 2**20


def _id_texts(values: np.ndarray) -> np.ndarray:
    """Each (non-negative) value's decimal digits then ", ", left-aligned in a row of bytes, zero-padded."""
    digits = np.ones(len(values), dtype=np.int64)
    for k in range(1, 19):
        over = values >= 10**k
        if not over.any():
            break
        digits += over
    width = int(digits.max(initial=1))
    rows = np.zeros((len(values), width + 2), dtype=np.uint8)
    for col in range(width):
        place = 10 ** np.maximum(digits - 1 - col, 0)  # the power of ten of this column's digit
        rows[:, col] = np.where(col < digits, 48 + values // place % 10, 0)
    at = np.arange(len(values))
    rows[at, digits] = ord(",")
    rows[at, digits + 1] = ord(" ")
    return rows


_TEXT_TABLE: list[np.ndarray] = []  # [rows, lengths]: ``_id_texts`` of 0..len-1, grown as larger ids come


def _text_table(top: int) -> tuple[np.ndarray, np.ndarray]:
    """The text rows of every id up to at least ``top`` and their lengths in bytes, made once per process."""
    if not _TEXT_TABLE or len(_TEXT_TABLE[0]) <= top:
        rows = _id_texts(np.arange(max(top + 1, 2**17)))
        _TEXT_TABLE[:] = [rows, np.count_nonzero(rows, axis=1)]
    return _TEXT_TABLE[0], _TEXT_TABLE[1]


def _records_text(chunk: list[Request], tokens: int) -> bytes:
    """The JSON records of ``chunk`` (``tokens`` prompt ids in all), concatenated: ``json.dumps``'s text, made
    with numpy (``_ids_records_text``)."""
    ids = np.fromiter(chain.from_iterable(r.prompt_ids for r in chunk), dtype=np.int64, count=tokens)
    if tokens and ids.min() < 0 or any(type(t) is not int for r in chunk for t in r.prompt_ids[:1]):
        return b"".join(map(_json_record, chunk))  # not the token ids of any workload here: json writes them
    return _ids_records_text(ids, [(r.request_id, len(r.prompt_ids), r.output_len, r.n, r.arrival_s) for r in chunk])


def _ids_records_text(ids: np.ndarray, records: list[tuple[int, int, int, int, float]]) -> bytes:
    """The JSON records of requests given as (request_id, prompt length, output_len, n, arrival_s), whose
    prompts are ``ids`` (non-negative), one after another. Every prompt id's text (its digits and ", ") goes
    into one buffer, from a table of each id's text; a record is its head ``[id, [``, its prompt's slice of
    the buffer (less the last ", ") and its tail ``], output_len, n]`` (``, arrival_s]``)."""
    top = int(ids.max(initial=0))
    if top < TEXT_TABLE_MAX:
        table, lengths = _text_table(top)
        rows, sizes = np.take(table, ids, axis=0), np.take(lengths, ids)
    else:
        rows = _id_texts(ids)
        sizes = np.count_nonzero(rows, axis=1)
    flat = rows.reshape(-1)
    text = memoryview(flat[flat != 0])  # the padding is the only zero byte
    ends = np.cumsum(sizes)  # where each id's text (with its ", ") ends in ``text``
    parts: list = []
    at, offset = 0, 0
    for request_id, k, output_len, n, arrival_s in records:
        parts.append(f"[{_scalar(request_id)}, [".encode())
        if k:
            end = int(ends[at + k - 1])
            parts.append(text[offset:end - 2])
            at, offset = at + k, end
        tail = f"], {_scalar(output_len)}, {_scalar(n)}"
        parts.append((f"{tail}, {json.dumps(arrival_s)}]" if arrival_s else tail + "]").encode())
    return b"".join(parts)


def _with_prefix(ids: np.ndarray, sizes: list[int], prefix: tuple[int, ...]) -> np.ndarray:
    """The prompts ``prefix + ids[at:at + k]`` for each ``k`` of ``sizes`` in turn, one after another."""
    if not prefix:
        return ids
    m, width = len(sizes), len(prefix)
    counts = np.asarray(sizes, dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(counts + width)[:-1]))  # where each prompt begins
    out = np.empty(len(ids) + m * width, dtype=np.int64)
    out[(starts[:, None] + np.arange(width)).ravel()] = np.tile(np.asarray(prefix, dtype=np.int64), m)
    out[np.arange(len(ids)) + np.repeat(starts + width, counts) - np.repeat(np.cumsum(counts) - counts, counts)] = ids
    return out
