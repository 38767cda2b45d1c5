"""kvbench's Hydra sweeper plugin (Hydra finds plugins only under the ``hydra_plugins`` namespace)."""
