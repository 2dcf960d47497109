"""Arguments protocol.md types as integers refuse a float, even a whole one.

GROUP_WAIT's ``timeout_ms`` and MAILBOX_ENSURE's ``retry_backoff_ms`` and
``max_attempts`` are integers on the wire: ``1.5`` (or ``30000.0``) is INVALID_ARGUMENT
naming the field, and changes nothing. (The other waits' ``timeout_ms`` and a retry's
``delay_ms`` are typed "number", fractions allowed.) One validator checks them all
(``int_arg`` in rsd/core/ground/validate.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from support.core import CoreDriver

from rsproto import ErrorCode, Op


@pytest.fixture
def core() -> CoreDriver:
    return CoreDriver()


@pytest.mark.parametrize("value", [1.5, 30000.0, True, "10"])
def test_group_wait_timeout_ms_must_be_an_integer(core: CoreDriver, value: Any) -> None:
    error = core.refused(Op.GROUP_WAIT, {"scope": "s", "group": "g", "need": 1,
                                         "timeout_ms": value})
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert "timeout_ms must be an integer" in error.message
    assert core.drain() == []


def test_group_wait_timeout_ms_integer_is_accepted(core: CoreDriver) -> None:
    reply = core.call(Op.GROUP_WAIT, {"scope": "s", "group": "g", "timeout_ms": 0})
    assert reply["reached"] is True


@pytest.mark.parametrize("field", ["retry_backoff_ms", "max_attempts"])
def test_mailbox_integer_settings_must_be_integers(core: CoreDriver, field: str) -> None:
    error = core.refused(Op.MAILBOX_ENSURE, {"name": "other", field: 2.0})
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert f"{field} must be an integer" in error.message
    core.drain()
    assert core.call(Op.MAILBOX_ENSURE, {"name": "other", field: 2})["name"] == "other"
