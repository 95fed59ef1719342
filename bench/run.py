"""Run the performance suite: ``python bench/run.py [--quick] [--only ITEMS] --out DIR`` (same as ``dgrpo bench``)."""

import os
import sys
from pathlib import Path

# this checkout's dgrpo, as the other scripts here take it, in the items' subprocesses too (python -m dgrpo...)
SRC = str(Path(__file__).resolve().parents[1] / "src")
sys.path.insert(0, SRC)
os.environ["PYTHONPATH"] = os.pathsep.join([SRC, *filter(None, [os.environ.get("PYTHONPATH")])])

from dgrpo.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
