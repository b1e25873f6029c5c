"""The registry client's first try is made before its retry loop is built; a failed first try is the loop's
first attempt. Held to the loop alone (the form before) on random scripts of failures: the same result, the
same tries and retries counted, a back-off before every retry, and the same budget."""
from __future__ import annotations

import random
import time

import pytest
from tenacity import Retrying, retry_if_exception_type, stop_after_delay

from idregistry import RegistryUnavailable
from idregistry._client import RegistryClient, _Retry, retry_wait


def _loop_alone(client: RegistryClient, attempt):
    """``_with_retries`` as it was: every try inside one tenacity loop."""
    try:
        for tried in Retrying(stop=stop_after_delay(client._retry_timeout_s), reraise=True, wait=retry_wait,
                              retry=retry_if_exception_type(_Retry),
                              before_sleep=lambda _: client._count("retries")):
            with tried:
                return attempt()
    except _Retry as e:
        raise RegistryUnavailable(f"registry unavailable after {client._retry_timeout_s} s: {e}") from None


def _scripted(failures: list[bool], value):
    """An attempt that fails once per entry of ``failures`` (True: overloaded), then returns ``value``;
    records when each try began."""
    left, began = list(failures), []

    def attempt():
        began.append(time.monotonic())
        if left:
            raise _Retry("no leader", overloaded=left.pop(0))
        return value
    return attempt, began


def _run(form, failures, value, timeout_s=30.0):
    client = RegistryClient(["127.0.0.1:1"], retry_timeout_s=timeout_s)
    attempt, began = _scripted(failures, value)
    try:
        try:
            got = form(client, attempt)
        except RegistryUnavailable as e:
            got = ("unavailable", str(e))
        return got, len(began), client.client_statistics().retries, [b - a for a, b in zip(began, began[1:])]
    finally:
        client.close()


@pytest.mark.parametrize("seed", range(12))
def test_a_first_try_outside_the_loop_retries_as_the_loop_alone(seed):
    rng = random.Random(seed)
    failures = [rng.random() < 0.3 for _ in range(rng.choice([0, 0, 1, 2, 3]))]
    value = object()
    fast = _run(RegistryClient._with_retries, failures, value)
    before = _run(_loop_alone, failures, value)
    assert fast[0] is value and before[0] is value
    assert fast[1:3] == before[1:3] == (len(failures) + 1, len(failures))
    assert all(gap >= 0.015 for gap in fast[3] + before[3])      # a back-off before every retry (20 ms + jitter)


def test_a_registry_that_never_answers_is_given_up_after_the_same_budget():
    for form in (RegistryClient._with_retries, _loop_alone):
        t = time.monotonic()
        got, tries, retries, _ = _run(form, [False] * 1000, None, timeout_s=0.4)
        spent = time.monotonic() - t
        assert got[0] == "unavailable" and "registry unavailable after 0.4 s: no leader" in got[1]
        assert tries == retries + 1 >= 3 and 0.4 <= spent < 0.4 + 0.5
