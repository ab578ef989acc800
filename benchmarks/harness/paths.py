"""Where the benchmarks find the repository, the model zoo and its bundled data; importing the package puts the
repository (its ``ms_accum``) and ``model_zoo_lenet`` (its ``src``) first on ``sys.path``."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ZOO = os.path.join(ROOT, "model_zoo_lenet")
SAMPLE = os.path.join(ZOO, "data", "fashion_mnist_sample")
sys.path.insert(0, ZOO)
sys.path.insert(0, ROOT)
