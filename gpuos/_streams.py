"""Raw stream handles the extension returns ((device, cudaStream_t) pairs) as torch streams, and the waits on them.
One place: the scheduler's flushes and gpuos.flush both make a target stream wait for the streams work went out
on, per device (never across devices), with an event (no host sync)."""
from __future__ import annotations

import torch


def torch_stream(dev: int, raw: int) -> torch.cuda.Stream:
    """The torch stream of raw handle `raw` on device `dev`. 0 is the legacy default stream
    (``torch.cuda.ExternalStream(0)`` would create a new pool stream instead)."""
    return torch.cuda.default_stream(dev) if raw == 0 else torch.cuda.ExternalStream(raw, device=dev)


def wait_for(streams, target=None) -> None:
    """For each (device, raw stream): `target` (a torch stream of that device; None: the calling thread's current
    stream of that device) waits for the work queued on it so far, unless it is that stream."""
    for dev, s in streams:
        tgt = target if target is not None else torch.cuda.current_stream(dev)
        if s != tgt.cuda_stream:
            tgt.wait_stream(torch_stream(dev, s))
