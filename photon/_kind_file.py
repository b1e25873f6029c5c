"""The local kind: a bare path or ``file:///path``. Input files are appended to in place; output is written
and published in place (:class:`photon.RollingWriter` renames a closed file to its visible name), and read
through the commit records (:class:`photon._output.FolderOutput`)."""
from __future__ import annotations

from pathlib import Path

from photon._output import FolderOutput
from photon._source import LocalSource, parse_location
from photon._storage import StorageKind


class FileKind(StorageKind):
    scheme = "file"
    in_place = True

    def _path(self, url: str) -> Path:
        return Path(parse_location(url).path)

    def join(self, root: str, *parts: str) -> str:
        rel = [p.strip("/") for p in parts if p.strip("/")]
        return str(self._path(root).joinpath(*rel)) if rel else str(self._path(root))

    def output_folder(self, output_root: str, kind: str, state_dir: str) -> Path:
        return self._path(output_root) / kind

    def local_folder(self, url: str) -> Path:
        return self._path(url)

    def source(self, url: str, s3=None, *, input_config=None, client=None):
        if input_config is not None:
            return LocalSource(str(self._path(url)), input_config.retire_after_s, input_config.full_scan_s)
        return LocalSource(str(self._path(url)))

    def output_reader(self, url: str, s3=None, *, outbox=None):
        return FolderOutput(self._path(url))

    def check(self, url: str, s3=None) -> None:
        self.source(url).check()

    def exists(self, url: str, s3=None) -> bool:
        return self._path(url).is_dir()


KIND = FileKind()
