"""flatcheck against PyHessian, curvlinops and hessian-eigenthings, side by side, in one run.

The command line of the peers/ package (its docstring says what is measured and how):

    python benchmarks/bench_peers.py [--models demo,resnet18,vit] [--device cpu|cuda|auto]
                                     [--full] [--save] [--backends autograd,func] [--peers ...]
                                     [--repeat N]
"""

from __future__ import annotations

import sys

from peers.runner import main  # benchmarks/ is sys.path[0] when this file is run

if __name__ == "__main__":
    sys.exit(main())
