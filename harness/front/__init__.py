"""front/: a command line becomes a valid config, or one line and an error row.

Hydra's app and sweeper, the pre-flight composition, Hydra error rewording, the strict
key checks, resolution (``auto`` choices: resolve.py; every key checked: checks.py, validate.py,
validate_workload.py; conf/'s groups and the impls read: groups.py), the sweep dry run,
replay, and the door every job goes through (job.py). The top room: it may import
every room below it (job/, scenarios/, serving/, kv/, measure/, model/).
"""
