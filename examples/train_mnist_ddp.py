"""The MNIST example (``train_mnist.py``) trained with DistributedDataParallel: its DDP twin.

Run it under torchrun (one process per GPU, or one per node without GPUs), e.g. on two Slurm nodes::

    gputui run hpc --nodes 2 --gpus-per-node 4 --launcher torchrun -- examples/train_mnist_ddp.py --epochs 3

NCCL on GPUs, gloo on CPU. Each process trains on its share of the data (DistributedSampler) with
``batch_size / world_size`` images a step, so one step sees ``--batch-size`` images in all, as the
single-process example does; the gradients are averaged over every process. Every process prints the
example's progress lines (``Epoch 2/5 train_loss=... test_acc=...``: the train loss averaged over all
processes, the test set evaluated whole); only rank 0 writes ``model.pt`` and ``summary.json``.
Started without torchrun it runs as a world of one.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Subset
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_mnist as base  # noqa: E402  (the example this one twins: model, data, epoch, save)


def init_world() -> tuple[int, int, int]:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT); alone
    (no torchrun) a world of one. Returns (rank, world size, local rank)."""
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(
            RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
        )
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0"))


def mean_over_world(value: float, device: torch.device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item()) / dist.get_world_size()


def main(argv: list[str] | None = None) -> int:
    args = base.parse_args(argv)
    rank, world, local = init_world()
    if torch.cuda.is_available() and args.device == "cuda":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    out = Path(args.out)
    print(f"gputui MNIST DDP example: torch {torch.__version__}, rank {rank}/{world} on "
          f"{socket.gethostname()} ({device}, {dist.get_backend()})", flush=True)

    if rank != 0:
        dist.barrier()  # rank 0 downloads (or builds the stand-in) first; the others then read it
    train_set, test_set, args.dataset = base.load_mnist(args.data_dir, tuple(args.mirror or base.MIRRORS))
    if rank == 0:
        dist.barrier()
    if args.limit_train is not None:
        train_set = Subset(train_set, range(min(args.limit_train, len(train_set))))
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    pin = device.type == "cuda"
    per_rank = max(1, args.batch_size // world)
    train_loader = DataLoader(train_set, batch_size=per_rank, sampler=sampler, num_workers=args.workers,
                              pin_memory=pin)
    test_loader = DataLoader(test_set, batch_size=1000, num_workers=args.workers, pin_memory=pin)
    print(f"Data: {len(train_set)} train / {len(test_set)} test images ({args.dataset}) from {args.data_dir}; "
          f"epochs={args.epochs} batch_size={args.batch_size} ({per_rank} per rank) lr={args.lr:g} out={out}",
          flush=True)

    net = base.Net().to(device)
    model = DistributedDataParallel(net, device_ids=[local] if device.type == "cuda" else None)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp and device.type == "cuda")
    history: list[dict[str, float]] = []
    started = time.time()
    try:
        for epoch in range(1, args.epochs + 1):
            t0 = time.time()
            sampler.set_epoch(epoch)
            loss = base.train_epoch(
                model, train_loader, opt, scaler, device, args.amp, f"Epoch {epoch}/{args.epochs}"
            )
            train_loss = mean_over_world(loss, device)
            test_loss, test_acc = base.evaluate(net, test_loader, device, args.amp)
            lr, secs = opt.param_groups[0]["lr"], time.time() - t0
            history.append({"epoch": epoch, "train_loss": train_loss, "test_loss": test_loss, "test_acc": test_acc,
                            "lr": lr, "seconds": round(secs, 2)})
            print(f"Epoch {epoch}/{args.epochs} train_loss={train_loss:.4f} test_loss={test_loss:.4f} "
                  f"test_acc={test_acc:.4f} lr={lr:g} time={secs:.1f}s", flush=True)
    except KeyboardInterrupt:
        if rank == 0:
            base.save(out, net, opt, args, device, history, started, "interrupted")
        raise
    summary = {"seconds": round(time.time() - started, 2), "test_acc": history[-1]["test_acc"] if history else None,
               "best_acc": max((h["test_acc"] for h in history), default=None)}
    if rank == 0:
        summary = base.save(out, net, opt, args, device, history, started, "completed")
    acc = f"test_acc={summary['test_acc']:.4f} best_acc={summary['best_acc']:.4f} " if history else ""
    print(f"Done: {acc}time={summary['seconds']:.1f}s out={out}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
