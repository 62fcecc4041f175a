"""Ray Train: each worker makes its loader as a torchrun script does (it shards by rank itself), puts
its position in the checkpoint it reports, and takes it back from ray.train.get_checkpoint() when Ray
Train starts the workers again after a failure.

python ray_train.py imagenet.lmdb --workers 8 --gpu --storage /shared/ray-runs [--max-steps N]
"""
import argparse
import json
import os
import tempfile

import ray.train
import ray.train.torch
import torch
from ray.train.torch import TorchTrainer

import datapipe
from datapipe.train.models import build_model


def make_model(name: str, classes: int, image_size: int) -> torch.nn.Module:
    if name == "linear":  # a quick check: one Linear layer on the flattened pixels
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * image_size**2, classes))
    return build_model(name, classes)


def report(step: int, loss: torch.Tensor, state: dict) -> None:
    """Every worker reports (Ray Train waits for all of them); rank 0 alone saves the checkpoint: the
    loader's state is the same on every rank."""
    metrics = {"step": step, "epoch": state["loader"]["epoch"], "loss": loss.item()}
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = None
        if ray.train.get_context().get_world_rank() == 0:
            torch.save(state, os.path.join(folder, "state.pt"))
            checkpoint = ray.train.Checkpoint.from_directory(folder)
        ray.train.report(metrics, checkpoint=checkpoint)


def train_func(config: dict) -> None:
    device = ray.train.torch.get_device()
    loader = datapipe.make_loader(config["data"], split="train", batch_size=config["batch_size"], train=True,
                                  image_size=config["image_size"], device=device)  # not prepare_data_loader
    net = make_model(config["model"], len(loader.dataset.classes), config["image_size"])
    model = ray.train.torch.prepare_model(net)  # DDP around net, on the worker's device
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step, checkpoint = 0, ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder:
            state = torch.load(os.path.join(folder, "state.pt"), map_location=device)
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])  # the next batch is the one after the saved step's
        step = state["step"]
    for epoch in range(loader.epoch, config["epochs"]):
        for images, labels, indices in loader:
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if config.get("audit"):  # a folder: what each rank trained on (the tests read it)
                with open(os.path.join(config["audit"], f"rank{ray.train.get_context().get_world_rank()}.jsonl"),
                          "a") as audit:
                    audit.write(json.dumps({"epoch": epoch, "step": step, "indices": indices.tolist()}) + "\n")
            if loader.epoch_served or step == config["max_steps"]:  # each epoch's end, and where the run stops
                report(step, loss, {"model": net.state_dict(), "optimizer": optimizer.state_dict(),
                                    "loader": loader.state_dict(), "step": step})
            if step == config["max_steps"]:
                return


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("--workers", type=int, default=1, help="training processes (ranks)")
    parser.add_argument("--gpu", action="store_true", help="one GPU per worker")
    parser.add_argument("--epochs", type=int, default=90)
    parser.add_argument("--max-steps", type=int, help="stop after this many steps in all (a checkpoint is saved)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--storage", default="ray_out", help="where Ray keeps the checkpoints (shared by all nodes)")
    parser.add_argument("--name", default="datapipe")
    parser.add_argument("--max-failures", type=int, default=3, help="times Ray Train restarts failed workers")
    args = parser.parse_args()
    config = {**vars(args), "data": args.data if "://" in args.data else os.path.abspath(args.data)}
    trainer = TorchTrainer(train_func, train_loop_config=config,
                           scaling_config=ray.train.ScalingConfig(num_workers=args.workers, use_gpu=args.gpu),
                           run_config=ray.train.RunConfig(
                               name=args.name, storage_path=os.path.abspath(args.storage),
                               failure_config=ray.train.FailureConfig(max_failures=args.max_failures)))
    result = trainer.fit()
    print(f"trained to step {result.metrics['step']}: loss {result.metrics['loss']:.3f}")
