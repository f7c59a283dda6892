"""Machine profiles: which engine counts and sizes a run uses.

Chosen by ``IPB_BENCH_PROFILE`` (default ``local``). The suites are the same
everywhere; only these parameters change, so a 2-core box runs 2-16 engines
and a 96-vCPU VM runs up to 1,024.
"""

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    engines: tuple[int, ...]  # engine counts for the view suites
    depths: tuple[int, ...]  # tree depths for the depth suite
    depth_engines: int  # engine count for the depth suite
    sizes: tuple[int, ...]  # bytes, for push and throughput
    many: tuple[int, ...]  # async calls in a burst
    max_engines: int  # real engines alive at once (clusters beyond are stopped, LRU)
    timeout: float = 180  # seconds before asv gives up on one benchmark
    farm: tuple[int, ...] = (256,)  # simulated engines, for the farm suite
    trees: tuple[str, ...] = ("1x2",)  # DEPTHxFANOUT of our trees in the farm suite
    peers: tuple[int, ...] = (16,)  # engine (worker) counts for the peer suite
    compose: tuple[int, ...] = (2, 4, 8)  # engines sharing the host, for the compose suite
    compose_quick: bool = True  # small work sizes in the compose suite
    multihost: tuple[int, int] = (3, 3)  # NetBed hosts and engines per host (root only)


BIG = (1024, 1 << 20, 8 << 20)
PROFILES = {
    "ci": Profile((2,), (0, 1), 2, (1024,), (10,), 8, farm=(32,), peers=(2,), compose=(2,), multihost=(2, 2)),
    "local": Profile((2, 16), (0, 1, 2), 16, (1024, 1 << 20), (20,), 64, compose=(4,)),
    "vm16": Profile(
        (16, 32, 64),
        (1, 2, 3),
        64,
        BIG,
        (100,),
        160,
        1200,
        (1024, 4096),
        ("2x2", "2x4", "3x4"),
        (16, 64),
        (4, 16, 32),
        False,
        multihost=(8, 8),
    ),
    "vm32": Profile(
        (32, 64, 128),
        (1, 2, 3),
        128,
        BIG,
        (100,),
        320,
        1200,
        (1024, 4096),
        ("2x2", "2x4", "3x4"),
        (32, 128),
        (8, 32, 64),
        False,
        multihost=(8, 8),
    ),
    "vm64": Profile(
        (64, 128, 256),
        (1, 2, 3, 4),
        256,
        BIG,
        (100,),
        640,
        1200,
        (4096, 16384),
        ("2x2", "2x8", "3x8"),
        (64, 256),
        (16, 64, 128),
        False,
        multihost=(8, 8),
    ),
    "vm96": Profile(
        (128, 256, 512, 1024),
        (1, 2, 3, 4),
        512,
        BIG,
        (100,),
        1100,
        1200,
        (4096, 16384),
        ("2x2", "2x8", "3x8"),
        (128, 512),
        (24, 96, 192),
        False,
        multihost=(8, 8),
    ),
}


def current() -> Profile:
    name = os.environ.get("IPB_BENCH_PROFILE", "local")
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"IPB_BENCH_PROFILE={name!r}: choose one of {sorted(PROFILES)}") from None
