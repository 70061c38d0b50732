"""rlfleet: RL fine-tuning of robot policies in simulation, at fleet scale."""

import os as _os

# rlfleet never uses gRPC in a forked child (worker processes are spawned), but it does fork to
# exec other programs (ffmpeg for eval videos, torchrun). gRPC's fork handlers only add a risk
# of the child hanging before exec there, so they are off unless the user asks for them.
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
