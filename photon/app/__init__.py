"""Photon's launcher layer: everything that stands above the service rooms and imports them.

* :class:`Launcher` / :class:`RunOptions`: ``photon run`` (plans every room's processes, supervises them,
  knows when the run caught up); :class:`Supervisor` starts, restarts and stops processes;
* :func:`build_summary` / :func:`format_summary`: the run summary;
* :func:`spark_session`, :func:`spark_error`, :func:`progress`: the Spark set-up every batch job shares;
* :func:`run_verify` / :func:`run_recover`: the verification and recovery jobs (``photon verify``,
  ``photon recover``; see docs/verify.md);
* :func:`generate` / :class:`GenOptions`: the workload generator (``photon gen``, the demo, the benchmarks);
* :mod:`photon.app.cli`: the ``photon`` command line (``python -m photon.app.cli``).

The base (:mod:`photon`) and every room import nothing from here.
"""
from photon.app._gen import GenOptions, GenSummary, generate
from photon.app._launcher import AlreadyRunning, Launcher, RunOptions, launcher_state_file, plan_region
from photon.app._recover import RecoverReport, run_recover
from photon.app._verify import VerifyInputError, VerifyReport, format_report, parse_time, read_recoverable, run_verify
from photon.app._spark import Progress, progress, spark_error, spark_session
from photon.app._summary import build_summary, format_summary
from photon.app._supervisor import Supervisor

__all__ = ["RecoverReport", "VerifyInputError", "VerifyReport", "format_report", "parse_time", "read_recoverable",
           "run_recover", "run_verify", "AlreadyRunning", "GenOptions", "GenSummary", "Launcher", "Progress", "RunOptions", "Supervisor", "build_summary",
           "format_summary", "generate", "launcher_state_file", "plan_region", "progress", "spark_error",
           "spark_session"]
