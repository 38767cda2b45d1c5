"""``hydra/sweeper=kvbench``: the sweeper in harness/front/sweeper.py, where Hydra looks for plugins."""

from kvbench.harness.front.sweeper import GuardedSweeper


class KvbenchSweeper(GuardedSweeper):
    """Hydra instantiates only plugin classes defined under ``hydra_plugins``."""
