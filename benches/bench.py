"""Print the side-by-side benchmark table: ``python benches/bench.py [--quick]``.

A thin wrapper over ``shellseam._bench`` (the same suite and command line as
``shellseam bench``); see
``benches/README.md`` for what each row measures and how to read the ratios. Missed targets
are reported in the table, never as a nonzero exit.
"""

from __future__ import annotations

import sys

from shellseam._bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
