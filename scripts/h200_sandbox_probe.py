"""One device call that proves the grader's isolation boundary carries CUDA memory (issue: grader integrity).

The parent (root) allocates an input and an output arena, exports them by CUDA IPC and starts a child that enters
`metakernel.grader.sandbox` (own uid, mount and network namespaces) before importing torch. The child maps both
arenas, checks the parent's values, writes its answer into the output arena, and reports what it can and cannot
reach. Torch's own multiprocessing transport is tried across the same boundary for comparison, and the channel's
round trip is timed. Writes one JSON report.

    python3 scripts/h200_sandbox_probe.py --out validation/h200-sandbox-probe.json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def child_main(fd: int) -> None:
    from metakernel.grader import transport
    from metakernel.grader.sandbox import Plan, enter

    conn = Connection(fd)
    msg, _ = transport.receive(conn)
    out: dict = {}
    iso = enter(Plan(**msg["plan"]))
    out["isolation"] = iso.to_dict()

    def attempt(name, f):
        try:
            out[name] = ["reachable", str(f())[:120]]
        except Exception as exc:  # noqa: BLE001
            out[name] = ["blocked", f"{type(exc).__name__}: {exc}"[:160]]

    ppid = msg["ppid"]
    attempt("parent_mem", lambda: open(f"/proc/{ppid}/mem", "rb").read(1))
    attempt("parent_environ", lambda: open(f"/proc/{ppid}/environ", "rb").read(50))
    attempt("parent_cmdline", lambda: open(f"/proc/{ppid}/cmdline", "rb").read(50))
    attempt("other_processes", lambda: [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()])
    attempt("baseline_cache", lambda: os.listdir(os.path.expanduser("~root/.cache/metakernel")))
    attempt("checkout_files", lambda: os.listdir(msg["checkout"]))
    attempt("write_etc", lambda: open("/etc/mk-probe", "w").write("x"))
    attempt("network", lambda: socket.create_connection(("127.0.0.1", 22), timeout=1))
    attempt("regain_root", lambda: os.setuid(0))
    t0 = time.perf_counter()
    import torch

    out["torch_import_s"] = time.perf_counter() - t0
    try:
        torch.cuda.init()
        torch.empty(1, device="cuda")
        driver = transport.Driver()
        base_in = driver.open(msg["in"]["handle"])
        base_out = driver.open(msg["out"]["handle"])
        arena_in = transport.wrap_device_bytes(base_in, msg["in"]["nbytes"])
        arena_out = transport.wrap_device_bytes(base_out, msg["out"]["nbytes"])
        x = transport.unpack_value(msg["x"], [], arena_in)
        out["input_sum"] = float(x.double().sum().item())
        y = (x.float() * 2).to(x.dtype)
        arena_out[: y.numel() * y.element_size()].view(y.dtype).copy_(y.reshape(-1))
        x.add_(1)  # an in-place update the parent must see
        torch.cuda.synchronize()
        out["cuda"] = "ok"
    except Exception as exc:  # noqa: BLE001
        out["cuda"] = f"failed: {type(exc).__name__}: {exc}"
    try:  # the other direction: the child exports its own buffer, the parent maps it
        mine, _ = transport.allocate_arena(32 << 20)
        mine[:1024].fill_(7)
        torch.cuda.synchronize()
        out["child_export"] = transport.export_arena(transport.Driver(), mine)
        out["_keep"] = id(mine)
        globals()["_MINE"] = mine
    except Exception as exc:  # noqa: BLE001
        out["child_export"] = f"failed: {type(exc).__name__}: {exc}"
    try:
        from multiprocessing.reduction import ForkingPickler

        import torch.multiprocessing  # noqa: F401

        rebuilt = ForkingPickler.loads(bytes.fromhex(msg["torch_pickle"]))
        out["torch_reductions"] = f"ok ({float(rebuilt.sum())})"
    except Exception as exc:  # noqa: BLE001
        out["torch_reductions"] = f"failed: {type(exc).__name__}: {exc}"[:200]
    transport.send(conn, out)
    for _ in range(2000):
        if "_MINE" in globals():
            torch.cuda.synchronize()  # ping-pong for the round-trip time
        got = transport.receive(conn)
        if got is None or got[0].get("op") == "exit":
            break
        transport.send(conn, {"ok": True})


def parent_main(out_path: Path) -> None:
    from multiprocessing.reduction import ForkingPickler

    import torch
    import torch.multiprocessing  # noqa: F401 - registers its reductions

    from metakernel.grader import transport
    from metakernel.grader.sandbox import make_plan, protect_parent

    report: dict = {"python": sys.version.split()[0], "torch": torch.__version__, "euid": os.geteuid(),
                    "gpu": torch.cuda.get_device_name(0), "parent_non_dumpable": protect_parent()}
    driver = transport.Driver()
    arena_in, pool_in = transport.allocate_arena(64 << 20)
    arena_out, pool_out = transport.allocate_arena(64 << 20)
    report["arena_in"] = transport.export_arena(driver, arena_in)
    report["arena_out"] = transport.export_arena(driver, arena_out)
    x = torch.randn(1000, 777, device="cuda").to(torch.bfloat16)
    placed, specs, _ = transport.place([x], arena_in)
    torch.cuda.synchronize()
    expect_sum = float(x.double().sum().item())
    buf = io.BytesIO()
    ForkingPickler(buf).dump(torch.randn(10, device="cuda"))
    work = Path(tempfile.mkdtemp(prefix="mk-probe-")) / "work"
    work.mkdir()
    plan = make_plan(work)
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen([sys.executable, __file__, "--child", str(theirs.fileno())], pass_fds=[theirs.fileno()],
                            cwd=str(work))
    theirs.close()
    conn = Connection(ours.detach())
    transport.send(conn, {"plan": asdict(plan), "ppid": os.getpid(), "checkout": str(Path.cwd()),
                          "in": report["arena_in"], "out": report["arena_out"], "x": specs[0],
                          "torch_pickle": buf.getvalue().hex()})
    got = transport.receive(conn, timeout=300)
    assert got is not None
    child = got[0]
    report["child"] = child
    if isinstance(child.get("child_export"), dict):
        try:
            base = driver.open(child["child_export"]["handle"])
            theirs_t = transport.wrap_device_bytes(base, child["child_export"]["nbytes"])
            report["parent_maps_child"] = int(theirs_t[:1024].sum().item()) == 7 * 1024
            theirs_t[1024:2048].fill_(3)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001
            report["parent_maps_child"] = f"failed: {exc}"
    y = arena_out[: x.numel() * 2].view(torch.bfloat16).reshape(x.shape)
    report["input_seen_by_child"] = abs(child.get("input_sum", 0.0) - expect_sum) < 1e-3 * max(1.0, abs(expect_sum))
    report["output_from_child_ok"] = bool(torch.equal(y, (x.float() * 2).to(x.dtype)))
    report["inplace_seen_by_parent"] = bool(torch.equal(placed[0], x + 1))
    lat = []
    for _ in range(1000):
        t0 = time.perf_counter()
        transport.send(conn, {"op": "ping"})
        transport.receive(conn, timeout=10)
        lat.append(time.perf_counter() - t0)
    lat.sort()
    report["roundtrip_us"] = {"median": lat[len(lat) // 2] * 1e6, "p10": lat[len(lat) // 10] * 1e6,
                              "p90": lat[9 * len(lat) // 10] * 1e6}
    transport.send(conn, {"op": "exit"})
    proc.wait(timeout=30)
    report["ok"] = bool(report["input_seen_by_child"] and report["output_from_child_ok"]
                        and report["inplace_seen_by_parent"])
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child_main(int(sys.argv[2]))
    else:
        ap = argparse.ArgumentParser()
        ap.add_argument("--out", default="validation/h200-sandbox-probe.json")
        parent_main(Path(ap.parse_args().out))
