"""The benchmark suite behind ``shellseam bench``: shellseam side by side with its peers.

Private: the table it prints is the interface (see ``benches/README.md``). ``harness`` holds
the sizes, rows and timing helpers, ``suites`` the benchmarks, ``child`` the measurements
made in a fresh interpreter, ``table`` the text table, ``cli`` the one command line and
``ray`` the Ray rows of ``--ray`` (which need Ray, imported only when they run).
Only the standard library and shellseam, so an installed wheel can run it.
"""

from .cli import main
from .harness import BENCHES, FULL, QUICK, TINY, Config, Row
from .suites import run
from .table import format_table

__all__ = ["BENCHES", "FULL", "QUICK", "TINY", "Config", "Row", "format_table", "main", "run"]
