"""Run as a script by test_job_signals.py, as the leader of its own process group: a loader that has
handed out one batch receives, with its workers, the stop signal a cluster sends to the whole group;
the training process handles it (as datapipe.train.preempt does), and the loader must serve the rest
of the epoch. Prints the batches and samples served, one line of JSON."""
import json
import os
import signal
import sys

from datapipe import make_loader


def main(path: str, backend: str, start_method: str, signum: int) -> None:
    received = []
    for number in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):  # the trainer's handlers: count, go on
        signal.signal(number, lambda s, frame: received.append(s))
    loader = make_loader(path, backend=backend, batch_size=4, image_size=32, device="cpu", num_workers=1,
                         start_method=start_method, train=False)
    batches = iter(loader)
    served = [next(batches)]
    os.killpg(0, signum)  # to this process and every worker, as torchrun, a terminal or Slurm do
    served.extend(batches)
    print(json.dumps({"batches": len(served), "samples": sum(len(b.labels) for b in served), "received": received}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
