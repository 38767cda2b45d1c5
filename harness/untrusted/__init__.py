"""Reading and writing a folder kvbench did not make: the one place SECURITY.md's rules are enforced.

A results folder, a run folder given to ``resume`` or ``replay``, an ``external/`` folder of other
systems' JSON, a clock profile and a trace are all data someone else may have written. Whatever
they hold, kvbench:

- reads only regular files inside the folder it was given: a path is resolved (symbolic links
  followed) and refused when it lands outside; a FIFO, a device or a socket is refused before
  it is read (opened non-blocking, then checked), so none can block or feed a read forever;
- reads at most a size limit from any file, and refuses a YAML document whose aliases expand
  beyond a node limit (a 1 KB "billion laughs" file is a billion nodes to whoever walks it);
- writes and deletes only names inside the folder, never through a link that a folder planted
  (a write goes to a temporary file renamed over the name, which replaces a link instead of
  following it; a sub-folder that is a link is refused);
- takes a file name from a folder's own records only when it is a bare name, never a path.

Every refusal is ``UntrustedError``: one line naming the file and what is wrong.
"""

from __future__ import annotations

import io
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

MiB = 1 << 20
# What a file of each kind may weigh. A run folder's tables hold one row per run, point or step:
# the largest published steps table is under 2 MiB; 256 MiB is far beyond any run and still fits
# the smallest machine kvbench runs on. A vLLM result with per-request arrays of 100,000 requests
# is about 30 MiB. Configs, job records and Hydra's overrides are a few KiB.
TABLE_LIMIT = 256 * MiB
JSON_LIMIT = 64 * MiB
YAML_LIMIT = 1 * MiB
RECORD_LIMIT = 1 * MiB  # job.json, env.json
# A saved config has a few hundred nodes; aliases that expand past this are a bomb, not a config.
YAML_NODE_LIMIT = 100_000
# A Parquet file is compressed: its decoded size, from its own metadata, is checked before decoding.
DECODED_LIMIT = 1024 * MiB

_BARE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


class UntrustedError(ValueError):
    """A file or name a folder holds that kvbench will not read or write; the message is one line."""


def _name(path: Path) -> str:
    return path.name or str(path)


def inside(root: Path, path: Path) -> Path:
    """``path`` resolved (links followed), refused unless it is ``root`` or under it (``root`` resolved too)."""
    base = Path(root).resolve()
    resolved = Path(path).resolve()
    if resolved != base and base not in resolved.parents:
        raise UntrustedError(f"{_name(Path(path))} leads outside the folder {base.name or base} (a link, or ..); "
                             "kvbench reads and writes only inside the folder it was given")
    return resolved


def bare_name(name: object, what: str) -> str:
    """A file name a folder's record gives (a table's stem in job.json): letters, digits, ``_ . -``, no path."""
    if not isinstance(name, str) or not _BARE_NAME.fullmatch(name) or ".." in name:
        raise UntrustedError(f"{what} {str(name)[:80]!r} is not a bare file name "
                             "(letters, digits, _ . - only; no folder, no ..)")
    return name


def read_bytes(path: Path, limit: int, root: Path | None = None) -> bytes:
    """The bytes of the regular file at ``path`` (inside ``root`` when given), at most ``limit`` of them.

    Opened with O_NONBLOCK so that a FIFO never blocks the open, then checked with fstat on the open
    descriptor (the file read is the file checked): anything but a regular file is refused.
    """
    path = Path(path)
    target = inside(root, path) if root is not None else path
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise UntrustedError(f"{_name(path)} cannot be opened: {e.strerror or type(e).__name__}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UntrustedError(f"{_name(path)} is not a regular file (a FIFO, device, socket or folder); "
                                 "kvbench reads only files")
        if info.st_size > limit:
            raise UntrustedError(f"{_name(path)} is {info.st_size / MiB:.1f} MiB, over the {limit / MiB:g} MiB "
                                 "kvbench reads from a file of this kind")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)  # a file that grows while read is cut, not read without end
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UntrustedError(f"{_name(path)} grew past the {limit / MiB:g} MiB kvbench reads from a file of this kind")
    return data


def read_text(path: Path, limit: int, root: Path | None = None) -> str:
    try:
        return read_bytes(path, limit, root).decode("utf-8")
    except UnicodeDecodeError as e:
        raise UntrustedError(f"{_name(path)} is not UTF-8 text (byte {e.start})") from None


def read_json(path: Path, limit: int = JSON_LIMIT, root: Path | None = None) -> Any:
    text = read_text(path, limit, root)
    try:
        return json.loads(text)
    except RecursionError:
        raise UntrustedError(f"{_name(path)} is nested too deeply to be a kvbench file") from None
    except ValueError as e:  # JSONDecodeError, or an integer of more digits than Python converts
        raise UntrustedError(f"{_name(path)} is not JSON: {str(e).splitlines()[0][:120]}") from None


def _expanded_size(node, memo: dict[int, int], depth: int = 0) -> int:
    """How many nodes ``node`` stands for once every alias is expanded (a shared subtree counted each time)."""
    key = id(node)
    if key in memo:
        return memo[key]
    if depth > 200:
        raise RecursionError
    memo[key] = 1  # a node that contains itself (a recursive alias) counts once while it is walked
    value = node.value
    if isinstance(value, list):
        total = 1
        for item in value:
            for part in (item if isinstance(item, tuple) else (item,)):  # a mapping's (key, value) pairs
                total += _expanded_size(part, memo, depth + 1)
    else:
        total = 1
    memo[key] = total
    return total


def load_yaml(text: str, name: str, node_limit: int = YAML_NODE_LIMIT) -> Any:
    """YAML as plain data (PyYAML's safe loader: no tags that build objects), refused when its aliases
    expand past ``node_limit`` nodes: the check walks the composed graph once, sharing counted by node."""
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is None:
            return None
        if (size := _expanded_size(node, {})) > node_limit:
            raise UntrustedError(f"{name}: its aliases expand to {size:,} nodes, over the {node_limit:,} "
                                 "of any kvbench file (a YAML alias bomb?)")
        return yaml.SafeLoader(io.StringIO("")).construct_document(node)
    except UntrustedError:
        raise
    except RecursionError:
        raise UntrustedError(f"{name} is nested too deeply to be a kvbench file") from None
    except ValueError as e:  # an integer of more digits than Python converts (4300)
        raise UntrustedError(f"{name} holds a value kvbench cannot read: {str(e).splitlines()[0][:120]}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UntrustedError(f"{name} is not valid YAML{where}: {problem}") from None


def read_yaml(path: Path, limit: int = YAML_LIMIT, root: Path | None = None) -> Any:
    return load_yaml(read_text(path, limit, root), _name(path))


def read_table(path: Path, limit: int = TABLE_LIMIT, root: Path | None = None):
    """A ``.parquet`` or ``.csv`` table as a DataFrame, read from its checked bytes. A Parquet file's
    decoded size (its own metadata) is checked before anything is decoded."""
    import pandas as pd

    data = read_bytes(path, limit, root)
    if Path(path).suffix == ".parquet":
        import pyarrow.parquet as pq

        meta = pq.ParquetFile(io.BytesIO(data)).metadata
        decoded = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        if decoded > DECODED_LIMIT:
            raise UntrustedError(f"{_name(Path(path))} decodes to {decoded / MiB:.0f} MiB, over the "
                                 f"{DECODED_LIMIT / MiB:g} MiB kvbench decodes from one table")
        return pd.read_parquet(io.BytesIO(data))
    # the CSV writer's formula escapes, taken off again; the schema's text columns read as text
    from kvbench.harness.results import TEXT_COLUMNS, csv_frame_back

    return csv_frame_back(pd.read_csv(io.BytesIO(data), dtype=dict.fromkeys(TEXT_COLUMNS, str)))


def own_subfolder(root: Path, name: str) -> Path:
    """``root/name`` as a folder kvbench may write into: made if absent; refused when it is a link or
    anything but a folder, so that no write lands where a planted link points."""
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"own_subfolder takes a name, not a path: {name!r}")
    sub = Path(root) / name
    if sub.is_symlink():
        raise UntrustedError(f"{sub} is a symbolic link (to {os.readlink(sub)}); kvbench writes only inside the "
                             "folder it was given: remove the link")
    if sub.exists() and not sub.is_dir():
        raise UntrustedError(f"{sub} is not a folder; kvbench writes its {name}/ there: move it away")
    sub.mkdir(parents=True, exist_ok=True)
    return sub


def own_file(path: Path) -> Path:
    """``path`` as a name kvbench may open in place (a lock file): a planted link there is removed first
    (the link is inside the folder; what it points to is never opened)."""
    if Path(path).is_symlink():
        Path(path).unlink()
    return Path(path)
