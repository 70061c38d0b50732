"""`python -m rlfleet.learner` = `rlfleet learner`, the form torchrun starts:

torchrun --nproc-per-node 4 -m rlfleet.learner RECIPE [key=value ...] [--resume] [--address-file F]

It goes through the CLI's parser, so both forms take the same arguments; .importlinter lists
this entry point's one upward import.
"""

import sys

from rlfleet.cli import main

if __name__ == "__main__":
    sys.exit(main(["learner", *sys.argv[1:]]))
