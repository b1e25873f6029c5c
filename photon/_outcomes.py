"""What happened to one foreign event in a join attempt: the one vocabulary the joiner answers in and the
dispatcher decides on. joiner.proto's ``Outcome`` enum carries the same numbers (a test ties them)."""
from __future__ import annotations

import enum


class Outcome(enum.IntEnum):
    """The joiner's answer for one foreign event.

    * ``JOINED``: committed in the registry under this attempt's token and written to the output;
    * ``ALREADY_REGISTERED``: the registry already holds the id (registered before, elsewhere or by a retry).
      This is all the joiner knows: not that the click is in some output (its first joiner may have died
      between commit and write, or a commit whose outcome stayed unknown may have taken it);
    * ``NOT_FOUND``: its primary event is not (yet) in the event store: retry later;
    * ``THROTTLED``: not decided (a store, the registry or the output is unavailable): retry soon;
    * ``UNJOINABLE``: can never be joined (the adapter refused it, or its id is older than the registry keeps);
    * ``LOST``: registered under this attempt's token, but the output write failed; the id is durably in the
      joiner's lost-ids ledger and awaits the recovery job (a retry would only meet the registry's
      ALREADY_EXISTS, so the event is resolved, counted as lost, not as already registered).
    """
    JOINED = 0
    ALREADY_REGISTERED = 1
    NOT_FOUND = 2
    THROTTLED = 3
    UNJOINABLE = 4
    LOST = 5


OUTCOMES = tuple(Outcome)
"""``OUTCOMES[n]`` is the :class:`Outcome` numbered ``n`` (a tuple index, cheaper than ``Outcome(n)``)."""
