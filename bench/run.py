"""Run the performance suite: ``python bench/run.py [--quick] [--only ITEMS] --out DIR`` (same as ``dgrpo bench``)."""

import sys

from dgrpo.bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
