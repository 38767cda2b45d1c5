"""A job's identity: what it measures, as a short hash that resume and the run folder's guard compare.

Two runs are the same job when their resolved configs agree on everything that
changes a result, on the same kind of device. Output paths are not in the config
(Hydra holds them), and the switches below change how a job runs, not what it
measures, so a resumed job keeps the identity of the attempt it continues.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from harness.config import Config

# Keys of the resolved config that leave the results unchanged.
NOT_IDENTITY = ("resume", "progress")


def identity_fields(cfg: Config, device_slug: str) -> dict:
    fields = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in NOT_IDENTITY}
    return {"config": fields, "device_slug": device_slug}


def job_id(cfg: Config, device_slug: str) -> str:
    """16 hex digits of the SHA-256 of the resolved config (less NOT_IDENTITY) and the device slug."""
    text = json.dumps(identity_fields(cfg, device_slug), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
