"""serving/: the serving core, the same on either clock.

Requests (request.py, workload.py, trace.py, arrivals.py), sequences, the scheduler, the decode
engine (wall clock), the event-driven simulator and its cost model (simulated clock),
the timeline both fill and the service metrics computed from it. It imports kv/,
measure/, model/ and the schema; nothing from scenarios/, job/ or front/.
"""
