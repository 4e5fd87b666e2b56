"""``python -m sarathi.worker``: one worker process of the ``mp`` executor, its pickled ``WorkerSpec`` read
from stdin.

Workers start as a fresh interpreter on this module rather than through multiprocessing's spawn, which
re-imports the parent's main script: a plain script that builds an ``LLM`` with parallelism and has no
``if __name__ == "__main__":`` guard would otherwise run again in every worker.
"""

import pickle
import sys

from sarathi.worker.process import run_worker

run_worker(pickle.load(sys.stdin.buffer))
