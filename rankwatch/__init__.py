"""Application layer of rankwatch: the command line that wires pipeline, consumers and exporters."""

__version__ = "0.1.0"
