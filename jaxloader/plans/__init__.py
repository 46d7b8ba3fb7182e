"""Pure NumPy plans computed from counts and lengths: which component each position of a
mixture reads (``mixture``), and where each record of a packing goes (``packing``).
"""
