"""A CLIP-style contrastive loop over image-text pairs: the loader yields (images, texts, indices),
the captions tokenized where the images are decoded (worker processes, decode threads, DALI's
source workers), and a symmetric InfoNCE loss pairs each image with its own caption in the batch.

python tools/make_img2dataset_sample.py --out i2d --shards 4 --per-shard 64   # or img2dataset's output
python clip_train.py "i2d/{00000..00003}.tar" --steps 20                       # or i2d/, or a converted .wds

The two encoders are deliberately tiny (a conv net and a bag of byte embeddings): swap in
open_clip's model and tokenizer (`tokenizer=open_clip.get_tokenizer(name)`) for a real run.
"""
import argparse

import torch
import torch.nn.functional as F

import datapipe

CONTEXT = 32  # tokens per caption: UTF-8 bytes + 1, cut or zero-padded to this length


def byte_tokens(caption: str) -> torch.Tensor:
    """A caption as CONTEXT token ids (its UTF-8 bytes shifted by one; 0 pads): the same length for
    every caption, so a batch's texts arrive as one N x CONTEXT LongTensor."""
    ids = [b + 1 for b in caption.encode("utf-8")[:CONTEXT]]
    return torch.tensor(ids + [0] * (CONTEXT - len(ids)), dtype=torch.int64)


class TinyClip(torch.nn.Module):
    """An image tower and a text tower projected to one embedding space, and CLIP's learned temperature."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.image = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(32, 64, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, dim))
        self.text = torch.nn.EmbeddingBag(257, dim, mode="mean", padding_idx=0)
        self.logit_scale = torch.nn.Parameter(torch.tensor(2.659))  # log(1 / 0.07), CLIP's initial value

    def forward(self, images: torch.Tensor, texts: torch.Tensor) -> torch.Tensor:
        """The batch's image-to-text similarity logits (N x N)."""
        i = F.normalize(self.image(images), dim=-1)
        t = F.normalize(self.text(texts), dim=-1)
        return self.logit_scale.exp().clamp(max=100) * i @ t.T


def contrastive_loss(logits: torch.Tensor) -> torch.Tensor:
    """Symmetric cross entropy: image k's caption is text k, and text k's image is image k."""
    target = torch.arange(len(logits), device=logits.device)
    return (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2


def train(data: str, *, steps: int, batch_size: int, image_size: int, backend: str = "auto") -> list[float]:
    """`steps` optimizer steps over the image-text source; the losses."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)  # the towers' initial weights: two runs over the same data agree
    loader = datapipe.make_loader(data, batch_size=batch_size, train=True, image_size=image_size, device=device,
                                  backend=backend, drop_last=True, fields=("image", "text"), tokenizer=byte_tokens)
    model = TinyClip().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses: list[float] = []
    epoch = 0
    while len(losses) < steps:
        loader.set_epoch(epoch)
        for images, texts, _ in loader:  # texts: N x CONTEXT token ids, already on the host; images on device
            loss = contrastive_loss(model(images, texts.to(device)))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if len(losses) == steps:
                break
        epoch += 1
    return losses


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("data", help="img2dataset shards (a folder or a brace pattern), or a converted dataset")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--backend", default="auto")
    args = parser.parse_args()
    losses = train(args.data, steps=args.steps, batch_size=args.batch_size, image_size=args.image_size,
                   backend=args.backend)
    print(f"{len(losses)} steps: contrastive loss {losses[0]:.3f} -> {losses[-1]:.3f}")
