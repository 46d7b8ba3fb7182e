"""Sources built by running a loader once over another source: ``FilteredSource`` (the records
a predicate keeps, found once) and ``PackedSource`` (sequences packed into rows).
"""
