"""Photon's launcher layer: everything that stands above the service rooms and imports them.

* :class:`Launcher` / :class:`RunOptions`: ``photon run`` (plans every room's processes, supervises them,
  knows when the run caught up); :class:`Supervisor` starts, restarts and stops processes;
* :func:`build_summary` / :func:`format_summary`: the run summary;
* :func:`spark_session`, :func:`spark_error`, :func:`progress`: the Spark set-up every batch job shares;
* :func:`build_map`: ``photon eventstore build-map`` (the log-file map, built by Spark);
* :func:`joined_dataframe` (the joined output of a set of regions as a Spark DataFrame, following the output
  contract), :func:`register_tables` (every table of ``photon sql``), :func:`compact` (``photon compact``);
* :func:`run_verify` / :func:`run_recover`: the verification and recovery jobs (``photon verify``,
  ``photon recover``; see docs/verify.md); :func:`registry_for_job`: the registry they (and
  ``photon registry export``) use, brought up from its data for the job when no replica answers;
* :func:`generate` / :class:`GenOptions`: the workload generator (``photon gen``, the demo, the benchmarks);
* :func:`region_down` / :func:`region_up`: take a region down (SIGKILL with ``hard``) and bring it back
  during a run (``photon region down|up``);
* :mod:`photon.app.cli`: the ``photon`` command line (``python -m photon.app.cli``).

The base (:mod:`photon`) and every room import nothing from here.
"""
from photon.app._buildmap import BuildMapResult, build_map
from photon.app._gen import GenOptions, GenSummary, generate
from photon.app._launcher import AlreadyRunning, Launcher, RunOptions, launcher_state_file, plan_region
from photon.app._certs import make_certs
from photon.app._regions import RegionControlError, region_down, region_up
from photon.app._recover import RecoverReport, run_recover
from photon.app._verify import VerifyInputError, VerifyReport, format_report, parse_time, read_recoverable, run_verify
from photon.app._spark import Progress, progress, spark_error, spark_session
from photon.app._summary import build_summary, format_summary
from photon.app._tables import joined_dataframe, register_tables, unjoinable_dataframe
from photon.app._compact import CompactionStatistics, compact
from photon.app._sql import run_query, sql_command
from photon.app._supervisor import Supervisor
from photon.app._jobregistry import JobRegistryError, registry_for_job, replicas_answering

__all__ = ["AlreadyRunning", "JobRegistryError", "registry_for_job", "replicas_answering", "BuildMapResult", "CompactionStatistics", "GenOptions", "GenSummary", "Launcher",
           "Progress", "RecoverReport", "RegionControlError", "RunOptions", "Supervisor", "VerifyInputError",
           "VerifyReport", "build_map", "build_summary", "compact", "format_report", "format_summary", "generate",
           "joined_dataframe", "launcher_state_file", "make_certs", "parse_time", "plan_region", "progress",
           "read_recoverable", "region_down", "region_up", "register_tables", "run_query", "run_recover",
           "run_verify", "spark_error", "sql_command", "unjoinable_dataframe",
           "spark_session"]
