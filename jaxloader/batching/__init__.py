"""From a step to a batch: transforms (``Map``, ``RandomMap``, ``BatchMap``, ``Filter``),
records as validated columns, collation into a given buffer, and the batch makers of sources
(``batch_maker``, with a mixture's ``mixture_sampler``) and of streams
(``stream_batch_maker``).
"""
