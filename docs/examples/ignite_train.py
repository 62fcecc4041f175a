"""PyTorch Ignite: the loader is the trainer's data, asked for (images, labels) batches so that the
default prepare_batch unpacks them, and kept in Checkpoint's to_save so that a resume continues at
the next batch.

python ignite_train.py imagenet.lmdb --nproc 8 [--resume ignite_out/checkpoint_5000.pt] [--deterministic]
"""
import argparse

import ignite.distributed as idist
import torch
from ignite.engine import Events, create_supervised_trainer
from ignite.handlers import Checkpoint, DiskSaver

import datapipe
from datapipe.train.models import build_model


def make_model(name: str, classes: int, image_size: int) -> torch.nn.Module:
    if name == "linear":  # a quick check: one Linear layer on the flattened pixels
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * image_size**2, classes))
    return build_model(name, classes)


def setup(config: dict):
    """The loader and the trainer, resumed from config["resume"] if given."""
    loader = datapipe.make_loader(config["data"], split="train", batch_size=config["batch_size"], train=True,
                                  image_size=config["image_size"], device=idist.device(), batch_format="pair")
    model = idist.auto_model(make_model(config["model"], len(loader.dataset.classes), config["image_size"]))
    optimizer = idist.auto_optim(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    trainer = create_supervised_trainer(model, optimizer, torch.nn.functional.cross_entropy, device=idist.device(),
                                        deterministic=config["deterministic"])
    to_save = {"trainer": trainer, "model": model, "optimizer": optimizer}
    if not config["deterministic"]:
        to_save["loader"] = loader  # the loader resumes at its own position: the batch after the saved one
    checkpoint = Checkpoint(to_save, DiskSaver(config["out"], require_empty=False), n_saved=None)
    trainer.add_event_handler(Events.EPOCH_COMPLETED, checkpoint)  # checkpoint_{iteration}.pt, on rank 0
    if config["resume"]:
        # DeterministicEngine saves numpy's random state, which torch.load(weights_only=True) refuses:
        # load that checkpoint (one this script wrote) in full
        saved = torch.load(config["resume"], map_location="cpu", weights_only=not config["deterministic"])
        Checkpoint.load_objects(to_load=to_save, checkpoint=saved)
        if config["deterministic"]:  # DeterministicEngine reads the epoch's done batches again and drops them
            loader.set_epoch(trainer.state.epoch)  # so the loader starts that epoch from its beginning
    return trainer, loader, checkpoint


def training(local_rank: int, config: dict) -> None:
    trainer, loader, _ = setup(config)
    trainer.run(loader, max_epochs=config["epochs"])
    if idist.get_rank() == 0:
        print(f"trained to epoch {trainer.state.epoch}: loss {trainer.state.output:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("--nproc", type=int, default=1, help="processes (ranks) on this machine")
    parser.add_argument("--epochs", type=int, default=90)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--deterministic", action="store_true", help="Ignite's DeterministicEngine")
    parser.add_argument("--resume", help="a checkpoint_{iteration}.pt this script saved")
    parser.add_argument("--out", default="ignite_out")
    config = vars(parser.parse_args())
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    with idist.Parallel(backend=backend, nproc_per_node=config["nproc"]) as parallel:
        parallel.run(training, config)
