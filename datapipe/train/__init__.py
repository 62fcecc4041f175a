"""The reference AMP/DDP training loop (`datapipe train`, or `torchrun ... -m datapipe train`).
May import backends and every room below it; not bench, doctor or cli."""
from .config import TrainConfig
from .ddp import DistEnv
from .loop import Trainer, train
from .models import build_model

__all__ = ["train", "Trainer", "TrainConfig", "DistEnv", "build_model"]
