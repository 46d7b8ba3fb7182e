"""The loaders users hold: ``DataLoader`` and ``StreamLoader`` on their shared base
(``base``: position, stats, shutdown, Orbax v1), their iterator, options, the state schema
(``state``) and the state files of a checkpoint (``state_files``).
"""
