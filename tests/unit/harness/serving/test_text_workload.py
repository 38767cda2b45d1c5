"""workload=text: consecutive windows of a local text, tokenized with the checkpoint's own tokenizer."""

from __future__ import annotations

import pytest

from kvbench.harness.errors import ConfigError
from kvbench.harness.serving.text_workload import text_windows
from tests.helpers.models import write_hf_checkpoint, write_text


@pytest.fixture
def checkpoint(tmp_path):
    return write_hf_checkpoint(tmp_path / "ckpt")


def test_windows_are_consecutive_prompts_and_their_continuations(checkpoint, tmp_path):
    from tokenizers import Tokenizer

    text = write_text(tmp_path / "a.txt", 100)
    w = text_windows(str(text), str(checkpoint), None, prompt_len=20, output_len=10, vocab_size=160)
    ids = Tokenizer.from_file(str(checkpoint / "tokenizer.json")).encode(text.read_text()).ids
    assert w.text_tokens == len(ids) == 100 and len(w.requests) == 3  # 100 // 30 whole windows
    for r in w.requests:
        start = 30 * r.request_id
        assert list(r.prompt_ids) == ids[start:start + 20] and r.output_len == 10
        assert list(w.continuations[r.request_id]) == ids[start + 20:start + 30]
    assert all(0 < t < 160 for r in w.requests for t in r.prompt_ids)  # real words, no [UNK]
    fewer = text_windows(str(text), str(checkpoint), 2, 20, 10, 160)
    assert len(fewer.requests) == 2 and fewer.sha256 == w.sha256 and not fewer.notes
    more = text_windows(str(text), str(checkpoint), 5, 20, 10, 160)
    assert len(more.requests) == 3 and "3 requests, not 5" in more.notes[0]


@pytest.mark.parametrize("case, message", [
    ("no-model-path", "set model.path=DIR"),
    ("no-tokenizer", "tokenizer.json not found"),
    ("no-file", "no such file"),
    ("too-short", "fewer than one window"),
    ("vocab", "outside the model's vocab_size=50"),
    ("binary", "not UTF-8"),
])
def test_bad_input_is_one_line_naming_the_problem(checkpoint, tmp_path, case, message):
    text = write_text(tmp_path / "a.txt", 100)
    args = dict(text_path=str(text), model_path=str(checkpoint), num_requests=None, prompt_len=20, output_len=10,
                vocab_size=160)
    if case == "no-model-path":
        args["model_path"] = None
    elif case == "no-tokenizer":
        (checkpoint / "tokenizer.json").unlink()
    elif case == "no-file":
        args["text_path"] = str(tmp_path / "missing.txt")
    elif case == "too-short":
        args["prompt_len"] = 200
    elif case == "vocab":
        args["vocab_size"] = 50
    elif case == "binary":
        (tmp_path / "b.bin").write_bytes(b"\xff\xfe\x00garbage")
        args["text_path"] = str(tmp_path / "b.bin")
    with pytest.raises(ConfigError, match=message):
        text_windows(**args)
