"""The process entry's command line and the front door."""
from __future__ import annotations

import dispatcher
from dispatcher import read_status
from dispatcher.main import main
from dispatcher_helpers import write_config


def test_front_door_exports():
    assert sorted(dispatcher.__all__) == ["Checkpoint", "ChunkRead", "Dispatcher", "DispatcherConfig", "DispatcherLocked",
                                          "DispatcherState", "DispatcherStatistics", "JoinAnswered", "LinesRead", "Lookup",
                                          "LookupAnswered", "RegionShare", "SendBatch", "TimePassed", "encode_delta",
                                          "plan_processes", "read_status", "serve"]
    from dispatcher import _messages        # the core's facts and commands, for tools that drive DispatcherState
    assert dispatcher.LinesRead is _messages.LinesRead and dispatcher.SendBatch is _messages.SendBatch
    import photon
    assert dispatcher.DispatcherConfig is photon.DispatcherConfig


def test_bad_config_or_region_exits_2_naming_the_problem(tmp_path, capsys):
    assert main(["--config", str(tmp_path / "missing.toml"), "--region", "r1", "--joiners", "h:1"]) == 2
    assert "missing.toml" in capsys.readouterr().err
    path = write_config(tmp_path)
    assert main(["--config", str(path), "--region", "nowhere", "--joiners", "h:1"]) == 2
    assert "nowhere" in capsys.readouterr().err
    path.write_text(path.read_text().replace("batch_size = 50", "batch_size = -1"))
    assert main(["--config", str(path), "--region", "r1", "--joiners", "h:1"]) == 2
    assert "[dispatcher].batch_size" in capsys.readouterr().err


def test_read_status_is_none_before_a_dispatcher_ran(tmp_path):
    assert read_status(tmp_path) is None
