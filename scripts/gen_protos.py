"""Generates the gRPC stubs of every room's .proto (``<room>/<name>_pb2.py``, ``<room>/<name>_pb2_grpc.py``)."""
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
ROOMS = ["idregistry", "eventstore", "joiner", "millwheel"]


def main() -> int:
    protos = [str(p.relative_to(ROOT)) for room in ROOMS for p in sorted((ROOT / room).glob("*.proto"))]
    if not protos:
        return 0
    include = str(Path(protoc.__file__).parent / "_proto")
    rc = protoc.main(["protoc", f"-I{ROOT}", f"-I{include}", f"--python_out={ROOT}",
                      f"--grpc_python_out={ROOT}", *protos])
    if rc != 0:
        print(f"protoc failed on {protos}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
