"""``hydra/sweeper=kvbench``: the sweeper in harness/sweeper.py, where Hydra looks for plugins."""

from harness.sweeper import GuardedSweeper


class KvbenchSweeper(GuardedSweeper):
    """Hydra instantiates only plugin classes defined under ``hydra_plugins``."""
