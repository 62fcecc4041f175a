"""Helpers of the training tests: a small config, a free port, strict JSON lines."""
import json
import socket

from datapipe.train import TrainConfig


def config(data, out, **kw) -> TrainConfig:
    """resnet18 at 32 px, batch 12: 6 steps per epoch over the `learnable` fixture."""
    base = dict(data=data, out=str(out), model="resnet18", epochs=3, batch_size=12, lr=0.05, image_size=32,
                warmup_epochs=0.5, workers=1, log_every=5, backend="dataloader")
    return TrainConfig(**{**base, **kw})


def free_port() -> int:
    """A free TCP port on 127.0.0.1, so parallel test runs do not collide."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def strict_json_lines(path):
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]
