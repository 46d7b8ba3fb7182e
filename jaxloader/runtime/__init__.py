"""What a process is and what it shares: shared memory (memory files, POSIX fallback:
``shm``) and the worker a process is (``worker_info``).
"""
