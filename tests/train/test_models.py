"""The ResNet family: torchvision's sizes, identity-start blocks, activation checkpointing that changes
memory use only (BatchNorm's running statistics update once per step, as without it)."""
import torch

from datapipe.train import build_model


def test_models_match_torchvision_sizes_and_start_blocks_as_identity():
    assert sum(p.numel() for p in build_model("resnet50", 1000).parameters()) == 25_557_032
    assert sum(p.numel() for p in build_model("resnet18", 1000).parameters()) == 11_689_512
    model = build_model("resnet18", 10)
    assert all(float(b.body[-1].weight.detach().abs().sum()) == 0 for b in model.blocks)


def one_step(checkpoint_activations: bool) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = build_model("resnet18", 3, checkpoint_activations=checkpoint_activations)
    with torch.no_grad():  # non-zero last BN weights: every block's BatchNorms take part
        for b in model.blocks:
            b.body[-1].weight.fill_(0.5)
    images, labels = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1, 2, 0])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.nn.functional.cross_entropy(model(images), labels).backward()
    optimizer.step()
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_activation_checkpointing_updates_batchnorm_statistics_once_per_step():
    plain, recomputed = one_step(False), one_step(True)
    stats = [k for k in plain if k.endswith(("running_mean", "running_var", "num_batches_tracked"))]
    assert len(stats) == 3 * 20  # every BatchNorm of resnet18
    for name in stats:
        assert torch.equal(recomputed[name], plain[name]), name
    for name in plain:  # and the step itself is the same
        assert torch.allclose(recomputed[name].float(), plain[name].float(), atol=1e-6), name
