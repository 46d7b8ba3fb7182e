"""What ``iter()`` says of the pass it begins (``num_epochs`` epochs an ``iter()``), once a
loader: a pass begun after a restore at a pass's end, and a later pass of several epochs, which
a loop over epochs around the loader reads again and again.

Example:
    >>> import warnings
    >>> from jaxloader.loaders.iterator import Progress
    >>> progress = Progress("DataLoader")
    >>> with warnings.catch_warnings(record=True) as said:
    ...     warnings.simplefilter("always")
    ...     say_later_pass(progress, epochs=2, epoch=2, at_start=True)
    ...     say_later_pass(progress, epochs=2, epoch=4, at_start=True)  # (once)
    >>> len(said), "reads E x 2 of them" in str(said[0].message)
    (1, True)
"""

from __future__ import annotations

import logging
import warnings

from jaxloader.base.errors import JaxloaderWarning, user_stacklevel
from jaxloader.loaders.iterator import Progress

log = logging.getLogger("jaxloader")


def say_new_pass(progress: Progress, epochs: int | None) -> None:
    """At ``iter()``: says, once, that a loader restored at the end of a pass begins the next
    one (``progress.at_pass_end``), which a run that had ended there would train on. A pass of
    several ``epochs`` warns (the loop over them is that one iter(): a run restarted after its
    end would train them again); a pass of one is logged at INFO (a loop over epochs restored
    at an epoch's end goes on as it should: the common resume)."""
    said, progress.at_pass_end = progress.at_pass_end, ""
    if not said:
        return
    progress.passes_said = True  # (this says the pass begun: say_later_pass need not)
    text = (f"{progress.owner} was restored at the end of a pass: this iter() begins the next "
            f"one, {said}, as a PyTorch DataLoader's next epoch does; a run that had ended "
            "with that state trains on unless it stops before iterating (a DataLoader's "
            "loader.epoch says where it is; or keep the epochs done in the checkpoint)")
    if epochs is not None and epochs > 1:
        warnings.warn(text, JaxloaderWarning, stacklevel=user_stacklevel())
    else:
        log.info("%s; a loop over epochs (for epoch in range(E): for batch in loader) "
                 "goes on as it should", text)


def say_later_pass(progress: Progress, epochs: int, epoch: int, at_start: bool) -> None:
    """At ``iter()``: says, once, that a pass of several ``epochs`` after the first begins
    (``epoch``, at its start): a loop over epochs around it reads each one's epochs."""
    if progress.passes_said or not at_start or epoch < epochs or epochs < 2:
        return
    progress.passes_said = True
    warnings.warn(
        f"{progress.owner}(num_epochs={epochs}): this iter() begins epochs {epoch} to "
        f"{epoch + epochs - 1}, a pass after the first: each iter() is a pass of num_epochs "
        "epochs, so a loop over epochs (for epoch in range(E): for batch in loader) reads "
        f"E x {epochs} of them; pass num_epochs=1 for an epoch a loop (Grain's and tf.data's "
        f"repeat({epochs}) is one loop over them)", JaxloaderWarning, stacklevel=user_stacklevel())
