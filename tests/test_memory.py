"""The automatic cache's budget: the host's free memory, or a cgroup's limit."""

import json
import os
import subprocess
import sys
import uuid

import pytest

from keras_datum import memory

V1_MEMORY = "/sys/fs/cgroup/memory"


def _write(root, relative, text):
    path = os.path.join(root, relative)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def _group(root, relative, version, limit, usage, stat=""):
    """A cgroup's memory files: v1's or v2's names for the limit and the usage."""
    names = {1: ("memory.limit_in_bytes", "memory.usage_in_bytes"), 2: ("memory.max", "memory.current")}
    limit_file, usage_file = names[version]
    _write(root, os.path.join(relative, limit_file), f"{limit}\n")
    _write(root, os.path.join(relative, usage_file), f"{usage}\n")
    if stat:
        _write(root, os.path.join(relative, "memory.stat"), stat)


def test_a_memory_limit_of_this_process_cgroup_bounds_the_budget(tmp_path):
    """A real cgroup v1 memory limit, as a container's: the process inside
    it sees the host's /proc/meminfo, and the budget must follow the limit."""
    limit = 3 * 2**30
    if memory.host_available() < 2 * limit:
        pytest.skip("needs a host with well over 6 GiB available")
    group = os.path.join(V1_MEMORY, f"keras-datum-test-{uuid.uuid4().hex[:8]}")
    try:
        os.mkdir(group)
    except OSError as error:
        pytest.skip(f"cannot make a cgroup v1 memory group here: {error}")
    try:
        with open(os.path.join(group, "memory.limit_in_bytes"), "w") as f:
            f.write(str(limit))
    except OSError as error:
        os.rmdir(group)
        pytest.skip(f"cannot set a cgroup v1 memory limit here: {error}")
    try:
        script = (
            "import json, os, sys\n"
            f"open({os.path.join(group, 'cgroup.procs')!r}, 'w').write(str(os.getpid()))\n"
            # TensorFlow, which a training process has imported, is charged to
            # the group (importing keras_datum alone no longer imports it).
            "import tensorflow\n"
            "from keras_datum import memory\n"
            "print(json.dumps([memory.host_available(), memory.available_memory(),"
            " memory.default_cache_budget()]))\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        )
        assert result.returncode == 0, result.stderr
        host, available, budget = json.loads(result.stdout.strip().splitlines()[-1])
    finally:
        os.rmdir(group)
    assert host > 2 * limit
    # The interpreter and TensorFlow it imported are charged to the group.
    assert 0 < available < limit - 100 * 2**20
    assert budget == int(available * memory.DEFAULT_CACHE_FRACTION)


def test_cgroup_v2_takes_the_tightest_limit_up_the_tree_less_its_usage(tmp_path):
    root = str(tmp_path / "cgroup")
    _write(root, "cgroup.controllers", "cpu memory\n")
    # Page cache the kernel can drop does not count as used.
    _group(root, "job", 2, 1000000, 700000, "anon 500000\nfile 200000\ninactive_file 150000\n")
    _group(root, "job/step", 2, "max", 600000, "inactive_file 0\n")
    proc = tmp_path / "cgroup_of_self"
    proc.write_text("0::/job/step\n")
    assert memory.cgroup_available(str(proc), root) == 1000000 - (700000 - 150000)

    _write(root, "job/step/memory.max", "400000\n")
    assert memory.cgroup_available(str(proc), root) == 0  # Over its limit: nothing left.


def test_a_container_reads_its_own_cgroup_at_the_mount_root(tmp_path):
    """In a cgroup namespace, /proc/self/cgroup may name a path the mount
    does not show; the mount's root is then this process's group."""
    root = str(tmp_path / "cgroup")
    _group(root, "memory", 1, 2000000, 500000, "inactive_file 1\ntotal_inactive_file 100000\n")
    proc = tmp_path / "cgroup_of_self"
    proc.write_text("5:cpu:/docker/abc\n4:memory:/docker/abc\n0::/docker/abc\n")
    assert memory.cgroup_available(str(proc), root) == 2000000 - (500000 - 100000)


@pytest.mark.parametrize("limit", ["9223372036854771712", "max"])
def test_no_limit_or_no_cgroup_leaves_the_host_figure(tmp_path, limit):
    root = str(tmp_path / "cgroup")
    _group(root, "memory", 1, limit, 500000)
    _group(root, "unified", 2, limit, 500000)
    proc = tmp_path / "cgroup_of_self"
    proc.write_text("4:memory:/\n0::/\n")
    assert memory.cgroup_available(str(proc), root) is None
    assert memory.cgroup_available(str(tmp_path / "missing"), root) is None
