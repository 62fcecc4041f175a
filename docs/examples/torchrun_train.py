"""A plain DDP loop under torchrun. The loader takes rank and world size from torch.distributed and the
GPU from LOCAL_RANK; it needs no set_epoch (calling it before each epoch gives the same batches).

torchrun --nproc-per-node 8 torchrun_train.py imagenet.lmdb [--resume run/last.pt]
"""
import argparse
import os

import torch
import torch.distributed as dist

import datapipe
from datapipe.train.models import build_model

parser = argparse.ArgumentParser()
parser.add_argument("data")
parser.add_argument("--epochs", type=int, default=90)
parser.add_argument("--batch-size", type=int, default=256)
parser.add_argument("--image-size", type=int, default=224)
parser.add_argument("--resume", help="a checkpoint this script saved")
parser.add_argument("--out", default="torchrun_out")
args = parser.parse_args()

cuda = torch.cuda.is_available()
if cuda:
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl" if cuda else "gloo")
loader = datapipe.make_loader(args.data, split="train", batch_size=args.batch_size, train=True,
                              image_size=args.image_size)
device = loader.options.torch_device
model = torch.nn.parallel.DistributedDataParallel(build_model("resnet18", len(loader.dataset.classes)).to(device))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
if args.resume:
    state = torch.load(args.resume, map_location=device)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    loader.load_state_dict(state["loader"])  # the same for every rank: the epoch's global position

for epoch in range(loader.epoch, args.epochs):
    for images, labels, indices in loader:
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if dist.get_rank() == 0:  # after the epoch's last batch the state names the next epoch's start
        os.makedirs(args.out, exist_ok=True)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "loader": loader.state_dict()}, f"{args.out}/last.pt")
        print(f"epoch {epoch}: loss {loss.item():.3f}")
dist.destroy_process_group()
