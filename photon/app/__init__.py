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
from photon._lazy import lazy_exports

_WHERE = {
    "BuildMapResult": "_buildmap", "build_map": "_buildmap",
    "GenOptions": "_gen", "GenSummary": "_gen", "generate": "_gen",
    "AlreadyRunning": "_launcher", "Launcher": "_launcher", "RunOptions": "_launcher",
    "launcher_state_file": "_launcher", "plan_region": "_launcher",
    "make_certs": "_certs",
    "RegionControlError": "_regions", "region_down": "_regions", "region_up": "_regions",
    "RecoverReport": "_recover", "run_recover": "_recover",
    "VerifyInputError": "_verify", "VerifyReport": "_verify", "format_report": "_verify", "parse_time": "_verify",
    "read_recoverable": "_verify", "run_verify": "_verify", "input_bytes": "_verify",
    "Progress": "_spark", "progress": "_spark", "spark_error": "_spark", "spark_session": "_spark",
    "class_archive_plan": "_spark", "scanner_jar": "_spark",
    "build_summary": "_summary", "format_summary": "_summary",
    "joined_dataframe": "_tables", "register_tables": "_tables", "unjoinable_dataframe": "_tables",
    "CompactionStatistics": "_compact", "compact": "_compact",
    "run_query": "_sql", "sql_command": "_sql",
    "Supervisor": "_supervisor",
    "JobRegistryError": "_jobregistry", "registry_for_job": "_jobregistry", "replicas_answering": "_jobregistry",
}
"""Where each exported name lives. Names are imported on first use (PEP 562), so ``photon run`` does not pay
at start for the verification, recovery, certificate and SQL modules it never calls."""


__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())


__all__ = ["AlreadyRunning", "JobRegistryError", "registry_for_job", "replicas_answering", "BuildMapResult", "CompactionStatistics", "GenOptions", "GenSummary", "Launcher",
           "Progress", "RecoverReport", "RegionControlError", "RunOptions", "Supervisor", "VerifyInputError",
           "VerifyReport", "build_map", "build_summary", "compact", "format_report", "format_summary", "generate",
           "joined_dataframe", "launcher_state_file", "make_certs", "parse_time", "plan_region", "progress",
           "read_recoverable", "region_down", "region_up", "register_tables", "run_query", "run_recover",
           "run_verify", "spark_error", "sql_command", "unjoinable_dataframe",
           "spark_session", "class_archive_plan", "scanner_jar", "input_bytes"]
