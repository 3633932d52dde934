"""How much memory the automatic decoded cache may take.

The budget is a fraction of the memory available when a split is built: the
host's (Linux's `MemAvailable`), or less where this process's memory cgroup
(a container's or a job's limit: Docker, Kubernetes, Slurm, systemd) leaves
less before its limit. A container sees the host's `/proc/meminfo`, so the
host's figure alone would size a cache that the limit then kills.
"""

import os

from keras_datum import images

# The automatic in-memory cache may take this fraction of the memory that is
# available when the split is built: enough for most datasets that fit at all,
# while leaving the model, the shuffle buffer and other processes their room.
DEFAULT_CACHE_FRACTION = 0.25
# A cgroup v1 "no limit" is the largest page-aligned 64-bit count.
_NO_LIMIT = 1 << 62
# Per cgroup version: the limit, the usage and the memory.stat key of the page
# cache the kernel can drop before it kills (as `docker stats` and the kubelet
# count a container's working set).
_FILES = {
    1: ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
    2: ("memory.max", "memory.current", "inactive_file"),
}


def default_cache_budget():
    return int(available_memory() * DEFAULT_CACHE_FRACTION)


def available_memory():
    """Bytes of memory available now: the host's, or what this process's
    memory cgroup leaves before its limit where that is less."""
    host = host_available()
    group = cgroup_available()
    return host if group is None else min(host, group)


def host_available():
    """Linux's MemAvailable, else the free pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def cgroup_available(proc_cgroup="/proc/self/cgroup", root="/sys/fs/cgroup"):
    """Bytes left before the tightest memory limit of this process's cgroup
    and its ancestors, or `None` where none is set or none can be read.

    Reads cgroup v2 (`0::/path`, mounted at `root` or, on a hybrid system,
    `root/unified`) and v1 (the `memory` controller at `root/memory`). A path
    the mount does not show (a container sees its own cgroup as the mount's
    root) is read from the mount's root.
    """
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            mounts = [root, os.path.join(root, "unified")]
            version = 2
        elif "memory" in controllers.split(","):
            mounts = [os.path.join(root, "memory")]
            version = 1
        else:
            continue
        for mount in mounts:
            left = _left_under_limits(mount, path, version)
            if left is not None:
                found.append(left)
    return min(found) if found else None


def _left_under_limits(mount, path, version):
    """The least memory left under a limit, from the cgroup at `path` up to
    the mount's root, or `None` where no level has a limit."""
    limit_file, usage_file, inactive_key = _FILES[version]
    directory = os.path.join(mount, path.lstrip("/"))
    if not os.path.isdir(directory):
        directory = mount
    mount = os.path.abspath(mount)
    directory = os.path.abspath(directory)
    least = None
    while True:
        left = _left_under_limit(directory, limit_file, usage_file, inactive_key)
        if left is not None:
            least = left if least is None else min(least, left)
        if directory == mount or not directory.startswith(mount + os.sep):
            return least
        directory = os.path.dirname(directory)


def _left_under_limit(directory, limit_file, usage_file, inactive_key):
    limit = _read_number(os.path.join(directory, limit_file))
    if limit is None or limit >= _NO_LIMIT:
        return None
    usage = _read_number(os.path.join(directory, usage_file))
    if usage is None:
        return None
    inactive = 0
    try:
        with open(os.path.join(directory, "memory.stat")) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == inactive_key:
                    inactive = int(value)
                    break
    except (OSError, ValueError):
        pass
    return max(0, limit - max(0, usage - inactive))


def _read_number(path):
    """The integer in a cgroup file; `None` for `max`, or where it cannot be read."""
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def decoded_bytes(meta, split, options):
    """Memory the decoded split takes at the target size, as uint8."""
    info = meta.splits[split].stats
    if "image" not in meta.features:  # Text.
        return info.get("characters", 0) + 64 * info["num_examples"]
    height, width = options.image_size
    channels = images.CHANNELS[options.color_mode] + ("mask" in meta.features)
    # One-hot and multi-hot labels are float32 vectors, one per example:
    # with many classes they outweigh small images.
    spec = meta.label_spec or {}
    hot = spec.get("type") == "multi_label" or (
        spec.get("type") == "class" and options.label_mode == "categorical"
    )
    labels = 4 * spec["num_classes"] if hot else 0
    return info["num_examples"] * (height * width * channels + labels + 64)


def decoded_cache(runtime, meta, split, options):
    """`(cache, budget)`: whether `split` gets the decoded cache with the
    `config.RuntimeOptions` `runtime`, and the budget its decoded size was
    judged against (`None` unless `cache="auto"`)."""
    if runtime.cache != "auto":
        return runtime.cache, None
    budget = runtime.cache_budget or default_cache_budget()
    return decoded_bytes(meta, split, options) <= budget, budget
