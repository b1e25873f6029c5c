"""Example topologies runnable with ``millwheel run examples.<name> --input DIR --out DIR``."""
