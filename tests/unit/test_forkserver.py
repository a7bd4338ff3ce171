"""drover/forkserver.py: a service forked from the server is what `python -m module`
would be (its args, environment, working directory, session and log), a child of the
launcher, which reads its exit status."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


# Run in a process of its own: a launcher becomes a subreaper, which the test process
# must not (every orphan of the session would become its child).
LAUNCHER = """if True:
    import json, os, signal, sys
    from pathlib import Path
    from drover.forkserver import ForkServer, become_subreaper
    work = Path(sys.argv[1])
    assert become_subreaper()
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    server = ForkServer(env, work, work / "forkserver.log")
    exited = server.spawn(
        "tests.forked_probe", ["3", "x"], {**env, "PROBE": "yes"}, work, work / "probe.log"
    )
    code = exited.wait(timeout=60)
    stopped = server.spawn("tests.forked_probe", ["0"], env, work, work / "second.log")
    second = stopped.wait(timeout=60)
    server.close()
    print(json.dumps({"pid": exited.pid, "code": code, "second": second}))
"""


def test_a_forked_service_is_what_python_m_would_start(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", LAUNCHER, str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    launcher = json.loads(out.stdout.strip().splitlines()[-1])
    # Exit statuses only a parent can read: the launcher's waitpid got them.
    assert (launcher["code"], launcher["second"]) == (3, 0)
    probe = json.loads((tmp_path / "probe.log").read_text().strip().splitlines()[-1])
    assert probe["argv"] == ["3", "x"]
    assert probe["cwd"] == str(tmp_path)
    assert probe["probe"] == "yes"
    assert probe["own_session"]
    assert probe["torch_loaded"]  # the preload came with it
    assert (tmp_path / "forkserver.log").read_text() == ""


def test_drover_run_starts_its_fork_server_first_and_only_for_a_local_run():
    from drover.__main__ import wants_fork_server

    assert wants_fork_server(["run", "examples/cartpole_dqn.yaml"])
    assert wants_fork_server(["run", "x.yaml", "--backend", "local"])
    for argv in (
        ["run", "x.yaml", "--backend", "docker"],
        ["run", "x.yaml", "--backend=docker"],
        ["run", "--help"],
        ["status", "job-1"],
        [],
    ):
        assert not wants_fork_server(argv), argv


def test_a_fork_server_started_early_is_stopped_when_the_run_never_uses_it(tmp_path):
    from drover.cli import main
    from drover.forkserver import ForkServer

    bad = tmp_path / "bad.yaml"
    bad.write_text("policy: {type: no-such-algorithm}\n")
    server = ForkServer.early()
    assert server is not None
    assert main(["run", str(bad), "--runs-dir", str(tmp_path)], fork_server=server) == 2
    assert server.process.poll() is not None  # stopped, not left to finish its preload


def test_the_preload_leaves_torchs_compiler_to_the_learner_which_warms_up_apart():
    """torch._dynamo (1.2-1.4 s of CPU on a 2-vCPU machine) is not in the fork server's
    preload, which every service waits for; a learner imports it with torch.optim's
    first parameter group, on a thread of its own as it starts (`warm_up_soon`), after
    which an update, a clipped one and a resumed optimizer import nothing of torch's."""
    probe = """if True:
        import sys
        from drover.forkserver import PRELOAD, preload
        preload(PRELOAD)
        assert "torch._dynamo" not in sys.modules, "the preload imported it"
        import torch
        from algorithms.step import adam, device_step, finite_step, warm_up_soon
        warm_up_soon().join(120)
        before = set(sys.modules)
        net = torch.nn.Linear(4, 2)
        optimizer = adam(net.parameters(), lr=0.01)
        device_step(net(torch.randn(8, 4)).pow(2).mean(), optimizer)
        finite_step(net(torch.randn(8, 4)).pow(2).mean(), optimizer, net.parameters(), 1.0)
        optimizer.load_state_dict(optimizer.state_dict())
        late = sorted(m for m in set(sys.modules) - before if m.startswith("torch"))
        assert not late, late
        print("ok")
    """
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "ok"


def test_the_server_hands_back_code_only_it_maps_and_still_works(tmp_path):
    """torch's start-up code, run once at import, is mapped by the server alone: handed
    back (MADV_PAGEOUT), pages of code no other process maps leave the server's memory,
    and what it runs after (torch, a fork) is read back from the files as needed.

    Which of torch's pages are the server's alone depends on the other processes
    running torch, so the pages checked are those of a file of code only this test
    maps."""
    probe = """if True:
        import json, mmap, os, sys
        import torch
        from drover.forkserver import hand_back_unshared_code

        path = sys.argv[1]
        with open(path, "wb") as f:
            f.write(os.urandom(8 << 20))
            os.fsync(f.fileno())  # clean pages, as a library's are
        with open(path, "rb") as f:
            # mapped as the loader maps a library's code: private, read and execute
            code = mmap.mmap(
                f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_EXEC
            )
        sum(code[i] for i in range(0, len(code), 4096))  # every page mapped

        def resident_kib():
            counting, total = False, 0
            for line in open("/proc/self/smaps"):
                fields = line.split()
                if "-" in fields[0] and len(fields) >= 5:
                    counting = fields[-1] == path
                elif counting and fields[0] == "Rss:":
                    total += int(fields[1])
            return total

        before = resident_kib()
        hand_back_unshared_code()
        after = resident_kib()
        assert float(torch.ones(3).sum()) == 3.0
        child = os.fork()
        if child == 0:
            os._exit(0 if float(torch.arange(4).sum()) == 6.0 else 1)
        _, status = os.waitpid(child, 0)
        print(json.dumps({"before": before, "after": after, "child": status}))
    """
    proc = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path / "code.bin")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    assert got["child"] == 0
    assert got["before"] >= 8 * 1024 - 64, got
    # a kernel without MADV_PAGEOUT (before 5.4) keeps them, and the server works the same
    major, minor = (int(part) for part in re.findall(r"\d+", os.uname().release)[:2])
    if (major, minor) >= (5, 4):
        assert got["after"] < 1024, got
