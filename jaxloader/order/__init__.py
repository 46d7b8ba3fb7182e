"""The order of records, a pure function of ``(seed, epoch, step)``: the keyed index shuffle
(``index_shuffle``), the sampler (step -> positions -> indices, ``sampling``) and read-local
block orders (``local_shuffle``).
"""
