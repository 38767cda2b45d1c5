"""job/: one resolved job's life on disk.

Its folder (one writer, one job, no stale files), its identity (what resume matches),
each impl's run and its failure row, process isolation, Ctrl-C and SIGTERM, the GPU a
launcher's worker gets, and the summary printed after it. It imports scenarios/ and
what lies below; never front/.
"""
