"""What py4j logs when a call to the JVM is interrupted (Ctrl-C, or a job's SIGTERM turned into KeyboardInterrupt)
and the JVM has already closed its end: the interrupted call with its stack (root logger), then the failed
shutdown of that call's socket with a second stack (``py4j.clientserver``). The jobs report the interruption
in one line, so :func:`photon.app._spark.quiet_py4j_interrupts` drops both records and nothing else. py4j's
own code runs here on a real socket whose sending side is shut."""
from __future__ import annotations

import collections
import io
import logging
import socket

import pytest
from py4j.clientserver import ClientServerConnection
from py4j.java_gateway import GatewayClient

from photon.app import _spark


class _Interrupted(ClientServerConnection):
    """A py4j client-server connection whose call is interrupted while it waits for the JVM's answer."""

    def send_command(self, command):
        raise KeyboardInterrupt("signal 15")


@pytest.fixture
def logs():
    """Everything the loggers py4j uses emit, formatted as ``logging.basicConfig`` does. The test starts with
    none of the quiet filters (a SparkSession started earlier in this process put them there) and the loggers
    as they were are put back afterwards."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter(logging.BASIC_FORMAT))
    root = logging.getLogger()
    loggers = [root, logging.getLogger("py4j.clientserver"), logging.getLogger("py4j.java_gateway")]
    before = [(lg, lg.level, lg.propagate, list(lg.filters)) for lg in loggers]
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    for lg in loggers:
        lg.filters[:] = [f for f in lg.filters if not isinstance(f, _spark._QuietInterrupt)]
    for lg in loggers[1:]:
        lg.setLevel(logging.WARNING)
        lg.propagate = True
    try:
        yield out
    finally:
        root.removeHandler(handler)
        for lg, level, propagate, filters in before:
            lg.setLevel(level)
            lg.propagate = propagate
            lg.filters[:] = filters


def _interrupt_a_call():
    """py4j's ``GatewayClient.send_command`` on a connection interrupted mid-call whose socket cannot send."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        sock = socket.create_connection(server.getsockname(), timeout=5)
        peer, _ = server.accept()
        try:
            sock.shutdown(socket.SHUT_WR)       # the shutdown request py4j sends cannot go out
            conn = object.__new__(_Interrupted)
            conn.socket, conn.stream, conn.is_connected = sock, sock.makefile("rb"), True
            conn.initiated_from_client, conn.python_server = True, None
            client = object.__new__(GatewayClient)
            client.deque = collections.deque()
            client._get_connection = lambda: conn
            with pytest.raises(KeyboardInterrupt):
                client.send_command("c\nt\nrun\ne\n")
        finally:
            sock.close()
            peer.close()


@pytest.mark.timeout(30)
def test_py4j_logs_an_interrupted_call_and_its_failed_socket_shutdown_with_stacks(logs):
    _interrupt_a_call()
    text = logs.getvalue()
    assert f"ERROR:root:{_spark.PY4J_INTERRUPT}" in text, text
    assert f"ERROR:py4j.clientserver:{_spark.PY4J_INTERRUPT_CLOSE}" in text, text
    assert "KeyboardInterrupt: signal 15" in text and "BrokenPipeError" in text, text


@pytest.mark.timeout(30)
def test_the_quiet_filters_drop_both_records_and_keep_other_py4j_errors(logs):
    _spark.quiet_py4j_interrupts()
    _spark.quiet_py4j_interrupts()              # once per logger, however often a session is asked for
    assert sum(isinstance(f, _spark._QuietInterrupt) for f in logging.getLogger().filters) == 1
    _interrupt_a_call()
    assert logs.getvalue() == ""
    logging.getLogger("py4j.clientserver").error("Could not authenticate connection.")
    logging.getLogger().error("Exception while sending command.")
    assert logs.getvalue().splitlines() == ["ERROR:py4j.clientserver:Could not authenticate connection.",
                                           "ERROR:root:Exception while sending command."]
