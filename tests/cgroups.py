"""Memory cgroups for tests that must see the kernel enforce a limit on a real process."""

import functools
import os
import uuid

import pytest


def memory_cgroup(limit_bytes):
    """A fresh memory cgroup (v2, else v1) limited to `limit_bytes`, as (procs file, cleanup,
    "cgroup2" or "cgroup1"), or a pytest.skip saying why there is none."""
    for root, limit_file, extra in (("/sys/fs/cgroup", "memory.max", {"memory.swap.max": "0"}),
                                    ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", {"memory.swappiness": "0"})):
        if not os.path.exists(os.path.join(root, limit_file if root.endswith("memory") else "cgroup.controllers")):
            continue
        if root == "/sys/fs/cgroup":
            controllers = open(os.path.join(root, "cgroup.subtree_control")).read().split()
            if "memory" not in controllers:
                continue
        folder = os.path.join(root, f"qrnn-test-{uuid.uuid4().hex[:12]}")
        try:
            os.mkdir(folder)
        except OSError as error:
            pytest.skip(f"cannot create a memory cgroup under {root}: {error}")
        try:
            with open(os.path.join(folder, limit_file), "w") as f:
                f.write(str(limit_bytes))
            for name, value in extra.items():
                try:
                    with open(os.path.join(folder, name), "w") as f:
                        f.write(value)
                except OSError:
                    pass
        except OSError as error:
            os.rmdir(folder)
            pytest.skip(f"cannot limit a memory cgroup under {root}: {error}")
        return (os.path.join(folder, "cgroup.procs"), functools.partial(os.rmdir, folder),
                "cgroup1" if root.endswith("memory") else "cgroup2")
    pytest.skip("no writable memory cgroup hierarchy here (/sys/fs/cgroup)")
