"""data_wait_pct's clock: the device's idle time waiting for data, on an injected time source."""
import pytest
import torch

from datapipe.train.clock import CudaWaitClock, HostWaitClock, make_clock


def ticks(*values):
    it = iter(values)
    return lambda: next(it)


def test_the_host_clock_counts_the_time_blocked_on_the_loader():
    clock = HostWaitClock(now=ticks(0.0, 1.0, 3.0, 10.0, 10.5, 12.0, 12.0, 13.0, 20.0))
    clock.start()  # 0
    clock.waiting(), clock.arrived()  # 1 -> 3
    clock.queued()
    clock.waiting(), clock.arrived()  # 10 -> 10.5
    assert clock.read() == (2.5, 12.0)  # read at 12: blocked 2.5 of 12 s
    clock.waiting(), clock.arrived()  # 12 -> 13
    assert clock.read() == (1.0, 8.0)  # from the last read on
    assert isinstance(make_clock(torch.device("cpu")), HostWaitClock)


class FakeGpu:
    """One stream: work queued runs after the work before it; an event is reached when the stream
    gets to it (at once where it is idle). Times in seconds; the host advances only by sleeping."""

    def __init__(self):
        self.host, self.busy_until = 0.0, 0.0

    def sleep(self, seconds):
        self.host += seconds

    def queue(self, seconds):
        self.busy_until = max(self.busy_until, self.host) + seconds

    def event(self):
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, gpu):
        self.gpu, self.at = gpu, None

    def record(self):
        self.at = max(self.gpu.host, self.gpu.busy_until)

    def synchronize(self):
        self.gpu.host = max(self.gpu.host, self.at)

    def elapsed_time(self, end):  # milliseconds, as torch.cuda.Event has it
        return (end.at - self.at) * 1000


def test_the_cuda_clock_counts_the_gpus_idle_time_not_the_hosts_wait():
    gpu = FakeGpu()
    clock = CudaWaitClock(now=lambda: gpu.host, event=gpu.event)
    clock.start()
    clock.waiting(), gpu.sleep(2), clock.arrived()  # the first batch after 2 s: the GPU idled 2 s
    gpu.queue(5), clock.queued()  # step 1 runs 2 -> 7
    clock.waiting(), gpu.sleep(1), clock.arrived()  # next batch at 3 while the GPU is busy: no idle time
    gpu.queue(5), clock.queued()  # step 2 runs 7 -> 12
    clock.collect()  # a log line: reading the events waits for the GPU to reach them (host at 7)
    clock.waiting(), gpu.sleep(11), clock.arrived()  # next batch at 18: the GPU idled 12 -> 18
    gpu.queue(5), clock.queued()  # step 3 runs 18 -> 23
    assert clock.read() == (8.0, 23.0)  # the host waited 14 s, the GPU idled 2 + 6; read after the work ended
    gpu.sleep(1), clock.waiting(), clock.arrived()  # 24: the GPU idled since step 3 ended (23)
    gpu.queue(1), clock.queued()
    assert clock.read() == (1.0, 2.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none is present")
def test_the_cuda_clock_reads_real_events():
    clock = make_clock(torch.device("cuda", torch.cuda.current_device()))
    assert isinstance(clock, CudaWaitClock)
    x = torch.randn(512, 512, device="cuda")
    clock.start()
    for _ in range(3):
        clock.waiting(), clock.arrived()
        (x @ x).sum()
        clock.queued()
    clock.collect()
    wait, seconds = clock.read()
    assert 0 <= wait <= seconds
