"""Where one host thread's time goes, function by function in C++ and the interpreter (the device machines have no
perf): gpuos_ext's wall-clock sampler (csrc/python/host_sampler.cpp) takes this thread's stack hz times a second;
the frames are named here from each module's symbol table (`nm`), so hidden symbols of the extension are named too.

    from tools.host_profile import sample
    prof = sample(lambda: run_the_steps(), hz=4000)
    print(prof.report(top=30, per=steps))          # self and inclusive time per function, us per `per`

Used by tools/sched_model_probe.py (PROBE_SAMPLE=1). Wall-clock: a wait (the GIL, a lock, a spin on the device)
shows as the function that waits. Frames without a symbol show as module+offset.
"""
import bisect
import collections
import functools
import os
import shutil
import struct
import subprocess
import time


@functools.lru_cache(maxsize=None)
def _symbols(path: str) -> tuple:
    """(sorted start addresses, names) of the module's text symbols, demangled; empty when nm is missing."""
    nm = shutil.which("nm")
    if not nm or not os.path.exists(path):
        return (), ()
    rows = []
    for args in (["--defined-only", "-n", "-C"], ["--defined-only", "-n", "-C", "-D"]):  # symtab, else dynsym
        try:
            out = subprocess.run([nm, *args, path], capture_output=True, text=True, timeout=120).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        for line in out.splitlines():
            parts = line.split(" ", 2)
            if len(parts) == 3 and parts[1] in "tTwWi" and parts[0]:
                try:
                    rows.append((int(parts[0], 16), parts[2]))
                except ValueError:
                    pass
        if rows:
            break
    rows.sort()
    return tuple(r[0] for r in rows), tuple(r[1] for r in rows)


@functools.lru_cache(maxsize=None)
def _first_load_vaddr(path: str) -> int:
    """The lowest PT_LOAD address of an ELF64 file: a symbol's address is that plus dladdr's offset."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2:
                return 0
            phoff, = struct.unpack_from("<Q", head, 32)
            phentsize, phnum = struct.unpack_from("<HH", head, 54)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
        loads = [struct.unpack_from("<Q", table, i * phentsize + 16)[0] for i in range(phnum)
                 if struct.unpack_from("<I", table, i * phentsize)[0] == 1]
        return min(loads) & ~0xFFF if loads else 0
    except OSError:
        return 0


def _short(name: str) -> str:
    """A demangled name without its argument list (and template arguments past 60 characters)."""
    depth, cut = 0, len(name)
    for i, c in enumerate(name):  # the '(' of the argument list: the first at template depth 0 after a name
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0 and i > 0 and not name.startswith("(anonymous", i):
            cut = i
            break
    s = name[:cut]
    return s if len(s) <= 120 else s[:117] + "..."


def name_frame(modules, frame, innermost: bool) -> str:
    mod, off = frame
    if mod < 0:
        return f"?0x{off:x}"
    path = modules[mod]
    starts, names = _symbols(path)
    key = off + _first_load_vaddr(path) - (0 if innermost else 1)  # a return address points past its call
    i = bisect.bisect_right(starts, key) - 1
    if i < 0:
        return f"{os.path.basename(path)}+0x{off:x}"
    return _short(names[i])


class Profile:
    def __init__(self, raw: dict, seconds: float) -> None:
        self.samples, self.dropped, self.seconds = raw["samples"], raw["dropped"], seconds
        self.self_counts, self.incl_counts = collections.Counter(), collections.Counter()
        for count, frames in raw["stacks"]:
            names = [name_frame(raw["modules"], f, i == 0) for i, f in enumerate(frames)]
            if names:
                self.self_counts[names[0]] += count
            for n in set(names):
                self.incl_counts[n] += count

    def report(self, top: int = 30, per: int = 1, unit: str = "step") -> str:
        """The top functions by self and by inclusive time (the interpreter's and libc's call plumbing, on nearly
        every stack, left out of the inclusive list), in wall us per `per` runs of `unit`."""
        us = self.seconds * 1e6 / max(self.samples, 1) / per  # wall us per sample and per `per`
        lines = [f"host samples: {self.samples} over {self.seconds:.2f} s ({self.dropped} dropped); us per {unit}"]
        incl = collections.Counter({n: c for n, c in self.incl_counts.items() if not n.startswith(_PLUMBING)})
        for title, counts in (("self", self.self_counts), ("inclusive", incl)):
            lines.append(f"  --- top {top} by {title} time ---")
            lines += [f"  {c * us:9.1f} us/{unit} {100.0 * c / max(self.samples, 1):5.1f}%  {n}"
                      for n, c in counts.most_common(top)]
        return "\n".join(lines)


_PLUMBING = ("_Py", "Py", "method_vectorcall", "slot_tp_call", "cfunction_", "_start", "__libc", "run_mod",
             "vectorcall", "builtin_", "object_vacall")


def sample(fn, hz: float = 4000.0, max_samples: int = 200_000) -> Profile:
    """Run fn() with this thread sampled hz times a second; the samples named (Profile)."""
    import gpuos_ext
    gpuos_ext._host_sampler_start(hz, max_samples)
    t0 = time.perf_counter()
    try:
        fn()
    finally:
        seconds = time.perf_counter() - t0
        raw = gpuos_ext._host_sampler_stop()
    return Profile(raw, seconds)
