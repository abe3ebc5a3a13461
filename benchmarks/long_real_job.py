"""A real gloo job under ``ccld run`` for a long time, healthy: every verdict, the records, the cost per step.

    python benchmarks/long_real_job.py [--minutes 30] [--baseline-minutes 5] [--out FILE.json]

What a user does, end to end, on this machine:

1. ``ccld up --port 0 --metrics-port 0``: the embedded broker, the worker and the sink, supervised.
2. ``ccld run --bootstrap B --job J -- torchrun --standalone --nproc-per-node 4 --max-restarts 1
   benchmarks/long_job.py ...`` for ``--minutes``: a DDP model on CPU with gloo, a broadcast, an
   all-reduce and send/recv between neighbours every step (sleeps stand in for GPU compute), an
   evaluation every ``--minutes``/7, one checkpoint pause of ``--ckpt-pause-s`` at 40 % of the run
   (rank 0 writes, the others wait at a barrier), and at 2/3 of the run this script SIGKILLs one rank
   (``--kill-rank``): torchrun stops the others and starts the group again (``TORCHELASTIC_RESTART_COUNT``
   1: a new job incarnation), which resumes from the checkpoint.
3. ``ccld verdicts --from-beginning --json`` once the job has ended and ``--drain-s`` more have passed
   (longer than every hang threshold's minimum, so a hang the job's end or the kill caused would be
   out): every verdict, expected none.

While the job runs it polls the worker's ``/status/?job=J`` (the incarnation the worker holds, so the
restart is seen as ccld sees it) and ``/proc/loadavg``; at the end it scrapes the worker's ``/metrics``
(messages and kernel records handled, dead letters).

The attachment's added time per step: the same job, without ``ccld run``, for ``--baseline-minutes``
(half before the attached run, half after, so a change in the machine's load shows as a difference
between the halves), without the checkpoint and the kill. Reported: the median training-step time of
every rank over the whole run, attached and not, and the median of the step's busy part (the step
without its compute sleep, which is where the attachment's cost lands). On a shared 2-core machine
the difference is within the load's noise; the halves show how large that noise is.

Exit status 0 when there was no verdict, the worker handled records, and (with a kill) the worker saw
the new incarnation; 1 otherwise. ``tests/integration/test_long_real_job.py`` runs a two-minute version.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from harness import descendants  # noqa: E402 - the tests' process-tree walk (torchrun's workers sit in their own sessions)

HERE = Path(__file__).resolve().parent
JOB_SCRIPT = HERE / "long_job.py"


def ccld(*args: str) -> list[str]:
    return [sys.executable, "-m", "ccld.cli", *args]


class Stack:
    """``ccld up`` in a child process: bootstrap and the worker's URL read from what it prints."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.logs = work / "ccld-logs"
        self.lines: list[str] = []
        env = {k: v for k, v in os.environ.items() if not k.startswith("CCLD_")}
        env["CCLD_ARCHIVE_DIR"] = str(work / "archive")
        self.proc = subprocess.Popen(ccld("up", "--port", "0", "--metrics-port", "0", "--logs", str(self.logs)),
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True, cwd=work)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def _find(self, prefix: str, suffix: str = "") -> str | None:
        for line in self.lines:
            if line.startswith(prefix) and line.endswith(suffix):
                return line[len(prefix):len(line) - len(suffix)].strip()
        return None

    def wait_ready(self, timeout_s: float = 120.0) -> tuple[str, str]:
        """(bootstrap, worker base URL) once the worker says "Worker ready"."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit("ccld up exited:\n" + "\n".join(self.lines[-30:]))
            boot, url = self._find("bootstrap:"), self._find("metrics:", "(worker)")
            log = self.logs / "worker.log"
            if boot and url and log.exists() and "Worker ready" in log.read_text(errors="replace"):
                return boot, url.removesuffix("/metrics")
            time.sleep(0.5)
        raise SystemExit("the worker was not ready:\n" + "\n".join(self.lines[-30:]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def get(url: str, timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return str(resp.read().decode())


def scrape_totals(metrics_url: str) -> dict[str, float]:
    """The worker's counters summed over partitions (and verdict labels): ``{name: value}``."""
    out: dict[str, float] = {}
    for line in get(metrics_url).splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        name = key.partition("{")[0]
        out[name] = out.get(name, 0.0) + float(value)
    return out


def job_command(args: argparse.Namespace, log_dir: Path, start_at: float, end_at: float, *,
                ckpt_dir: str = "", ckpt_at: float = 0.0, restarts: int = 0) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.ranks),
            "--max-restarts", str(restarts), "--monitor-interval", "1", str(JOB_SCRIPT),
            "--start-at", f"{start_at:.3f}", "--end-at", f"{end_at:.3f}", "--log-dir", str(log_dir),
            "--ckpt-dir", ckpt_dir, "--ckpt-at", f"{ckpt_at:.3f}", "--ckpt-pause-s", str(args.ckpt_pause_s),
            "--eval-every-s", f"{args.minutes * 60 / 7:.1f}", "--compute-ms", str(args.compute_ms)]


def run_baseline(args: argparse.Namespace, work: Path, name: str, seconds: float) -> Path:
    """The same job without the attachment (no checkpoint, no kill) for ``seconds`` of training."""
    log_dir = work / name
    start = time.time()
    cmd = job_command(args, log_dir, start, start + seconds + args.startup_s)
    with open(work / f"{name}.log", "wb") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=seconds + args.startup_s + 300)
    if proc.returncode != 0:
        raise SystemExit(f"the baseline job failed ({proc.returncode}); see {work / f'{name}.log'}")
    return log_dir


def read_steps(log_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for f in sorted(log_dir.glob("steps-rank*.tsv")):
        rank = int(f.stem.removeprefix("steps-rank"))
        for line in f.read_text().splitlines():
            inc, step, phase, t0, dur, busy = line.split("\t")
            rows.append({"rank": rank, "incarnation": int(inc), "step": int(step), "phase": phase,
                         "t_start": float(t0), "step_ms": float(dur), "busy_ms": float(busy)})
    return rows


def step_stats(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians (and p90) of the training steps' time and busy part, every rank's steps pooled; the first
    20 steps of each rank and incarnation (warm-up) are left out."""
    train = [r for r in rows if r["phase"] == "train"]
    first: dict[tuple[int, int], int] = {}
    for r in train:
        key = (r["rank"], r["incarnation"])
        first[key] = min(first.get(key, r["step"]), r["step"])
    kept = [r for r in train if r["step"] >= first[(r["rank"], r["incarnation"])] + 20]
    if not kept:
        return {"steps": 0}
    dur = sorted(r["step_ms"] for r in kept)
    busy = sorted(r["busy_ms"] for r in kept)
    return {"steps": len(kept), "step_ms_median": statistics.median(dur), "step_ms_p90": dur[int(0.9 * (len(dur) - 1))],
            "busy_ms_median": statistics.median(busy), "busy_ms_p90": busy[int(0.9 * (len(busy) - 1))],
            "phases": dict(Counter(r["phase"] for r in rows if r["rank"] == 0)),
            "incarnations": sorted({r["incarnation"] for r in rows})}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def worker_pid(stack: Stack) -> int | None:
    for pid in descendants(stack.proc.pid):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[-2:-1] == [b"worker"]:
                return pid
    return None


def run_attached(args: argparse.Namespace, work: Path, boot: str, worker: str, job: str,
                 progress: Any) -> dict[str, Any]:
    """The job under ``ccld run``, watched; the kill at 2/3; returns what was seen."""
    log_dir, ckpt_dir = work / "attached", work / "ckpt"
    seconds = args.minutes * 60
    start = time.time()
    end = start + seconds
    ckpt_at, kill_at = start + 0.4 * seconds, start + 2 * seconds / 3
    cmd = ccld("run", "--bootstrap", boot, "--job", job, *(["--source", args.source] if args.source else []),
               "--metrics-port", "0", "--",
               *job_command(args, log_dir, start, end, ckpt_dir=str(ckpt_dir), ckpt_at=ckpt_at,
                            restarts=1 if args.kill_rank >= 0 else 0))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLD_")}
    log = open(work / "attached.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    seen: dict[str, Any] = {"incarnations": {}, "loadavg": [], "kill": None, "start": start,
                            "ckpt_at_s": round(ckpt_at - start, 1), "kill_at_s": round(kill_at - start, 1)}
    hog_at, hog_end = start + args.hog_at * seconds, start + args.hog_at * seconds + args.hog_s
    hogs: list[subprocess.Popen[bytes]] = []
    if args.hogs:
        seen["hogs"] = {"processes": args.hogs, "from_s": round(hog_at - start, 1), "to_s": round(hog_end - start, 1)}
    try:
        next_poll = time.time()
        while proc.poll() is None:
            now = time.time()
            if args.hogs and not hogs and hog_at <= now < hog_end:
                # other work takes the host's CPUs: busy processes, more of them than cores
                progress(f"{args.hogs} busy processes take the CPUs for {args.hog_s:g} s")
                hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
            if hogs and now >= hog_end:
                stop_hogs(hogs)
                progress("the busy processes stopped")
            if now > end + args.startup_s + 300:
                progress("the job did not end; killing it")
                for pid in [*descendants(proc.pid), proc.pid]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                break
            if args.kill_rank >= 0 and seen["kill"] is None and now >= kill_at:
                # not before the checkpoint exists: the restarted group resumes from it
                seen["kill"] = kill_rank(args.kill_rank, log_dir, ckpt_dir, now - start, progress)
            if now >= next_poll:
                next_poll = now + args.poll_s
                seen["loadavg"].append(float(Path("/proc/loadavg").read_text().split()[0]))
                with contextlib.suppress(OSError, ValueError):
                    st = json.loads(get(f"{worker}/status/?job={job}"))
                    inc = st.get("incarnation")
                    if inc is not None:
                        key = str(inc)
                        if key not in seen["incarnations"]:
                            progress(f"the worker holds incarnation {inc} of {job} ({st.get('ranks')} ranks)")
                            seen["incarnations"][key] = {"first_seen_s": round(now - start, 1)}
                        seen["incarnations"][key]["last_seen_s"] = round(now - start, 1)
                        seen["incarnations"][key]["ranks"] = st.get("ranks")
            time.sleep(0.5)
        proc.wait()
    finally:
        stop_hogs(hogs)
        log.close()
    seen["returncode"] = proc.returncode
    seen["ended_s"] = round(time.time() - start, 1)
    seen["log_tail"] = [ln for ln in (work / "attached.log").read_text(errors="replace").splitlines()
                        if ln.startswith("ccld run") or "aggregator" in ln][-6:]
    seen["log_dir"] = str(log_dir)
    return seen


def stop_hogs(hogs: list[subprocess.Popen[bytes]]) -> None:
    for h in hogs:
        h.kill()
    for h in hogs:
        h.wait()
    hogs.clear()


def kill_rank(rank: int, log_dir: Path, ckpt_dir: Path, at_s: float, progress: Any) -> dict[str, Any] | None:
    """SIGKILL ``rank`` of the first incarnation; None while there is no checkpoint yet (try again later)."""
    pid_file = log_dir / f"pid-inc0-rank{rank}"
    if not (ckpt_dir / "ckpt.pt").exists() or not pid_file.exists():
        return None
    pid = int(pid_file.read_text())
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return {"done": False, "why": f"rank {rank} (pid {pid}) was gone", "at_s": round(at_s, 1)}
    progress(f"SIGKILLed rank {rank} (pid {pid}) at {at_s:.0f} s")
    return {"done": True, "rank": rank, "pid": pid, "at_s": round(at_s, 1)}


def collect_verdicts(boot: str) -> list[dict[str, Any]]:
    """Every verdict on the topic, as ``ccld verdicts --from-beginning --json`` prints them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLD_")}
    res = subprocess.run(ccld("verdicts", "--bootstrap", boot, "--from-beginning", "--json", "--timeout", "8"),
                         capture_output=True, text=True, env=env, timeout=120)
    if res.returncode != 0:
        raise SystemExit(f"ccld verdicts failed ({res.returncode}): {res.stderr[-2000:]}")
    return [json.loads(line) for line in res.stdout.splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--minutes", type=float, default=30.0, help="the attached job's length")
    p.add_argument("--baseline-minutes", type=float, default=5.0,
                   help="the job without attachment, half before and half after (0: none)")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--compute-ms", type=float, default=75.0, help="sleep per step standing in for the GPU")
    p.add_argument("--ckpt-pause-s", type=float, default=15.0)
    p.add_argument("--kill-rank", type=int, default=1, help="rank SIGKILLed at 2/3 of the run (-1: none)")
    p.add_argument("--hogs", type=int, default=0,
                   help="busy processes that take the host's CPUs for --hog-s from --hog-at of the run (0: none)")
    p.add_argument("--hog-at", type=float, default=0.25, help="when the busy processes start (share of the run)")
    p.add_argument("--hog-s", type=float, default=30.0, help="how long the busy processes run")
    p.add_argument("--source", default="", help="ccld run --source (default: ccld's own, auto)")
    p.add_argument("--drain-s", type=float, default=30.0,
                   help="wait this long after the job's end before reading the verdicts (> hang_min_s)")
    p.add_argument("--startup-s", type=float, default=30.0, help="a baseline half's allowance for start-up")
    p.add_argument("--poll-s", type=float, default=10.0, help="status and load polling interval")
    p.add_argument("--work-dir", default="", help="keep logs here (default: a temporary folder, kept)")
    p.add_argument("--out", default="", help="write the JSON result here")
    args = p.parse_args(argv)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="ccld-long-"))
    work.mkdir(parents=True, exist_ok=True)
    t_begin = time.time()

    def progress(msg: str) -> None:
        print(f"[{time.time() - t_begin:7.1f} s] {msg}", file=sys.stderr, flush=True)

    job = f"long-real-job-{int(t_begin)}"
    result: dict[str, Any] = {
        "command": " ".join(["python", "benchmarks/long_real_job.py", *(argv if argv is not None else sys.argv[1:])]),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_begin)), "job": job,
        "minutes": args.minutes, "ranks": args.ranks, "compute_ms": args.compute_ms,
        "cpus": os.cpu_count(), "loadavg_at_start": Path("/proc/loadavg").read_text().split()[:3],
        "work_dir": str(work),
    }
    half = args.baseline_minutes * 30.0
    baselines: list[Path] = []
    stack = Stack(work)
    try:
        boot, worker = stack.wait_ready()
        progress(f"ccld up: broker {boot}, worker {worker}")
        wpid = worker_pid(stack)
        cpu0 = cpu_seconds(wpid) if wpid else 0.0
        if half > 0:
            progress(f"baseline (no attachment), first half: {half:.0f} s")
            baselines.append(run_baseline(args, work, "baseline-before", half))
        progress(f"the attached job: {args.minutes:g} min, kill rank {args.kill_rank} at 2/3")
        seen = run_attached(args, work, boot, worker, job, progress)
        job_end = time.time()
        progress(f"the job ended (code {seen['returncode']})")
        if half > 0:
            progress(f"baseline (no attachment), second half: {half:.0f} s")
            baselines.append(run_baseline(args, work, "baseline-after", half))
        rest = args.drain_s - (time.time() - job_end)
        if rest > 0:
            progress(f"waiting {rest:.0f} s more for verdicts the job's end could cause")
            time.sleep(rest)
        verdicts = collect_verdicts(boot)
        totals = scrape_totals(f"{worker}/metrics")
        worker_cpu = (cpu_seconds(wpid) - cpu0) if wpid else None
    finally:
        stack.stop()
    attached = step_stats(read_steps(Path(seen["log_dir"])))
    base_rows = [r for d in baselines for r in read_steps(d)]
    base = step_stats(base_rows) if baselines else {"steps": 0}
    for v in verdicts:  # when, in the job's time, against the events below
        v["onset_s_into_job"] = round(float(v["onset_time"]) - seen["start"], 1)
        v["detected_s_into_job"] = round(float(v["detected_time"]) - seen["start"], 1)
    result["verdicts"] = {"count": len(verdicts), "by_class": dict(Counter(v["kind"] for v in verdicts)),
                          "all": verdicts}
    rows0 = [r for r in read_steps(Path(seen["log_dir"])) if r["rank"] == 0]
    result["events_s_into_job"] = {
        "ckpt_planned": seen["ckpt_at_s"], "kill_planned": seen["kill_at_s"], "ended": seen["ended_s"],
        "first_step": round(min((r["t_start"] for r in rows0), default=seen["start"]) - seen["start"], 1),
        "phases": [(r["phase"], r["incarnation"], round(r["t_start"] - seen["start"], 1), round(r["step_ms"]))
                   for r in rows0 if r["phase"] != "train"]}
    result["worker"] = {"messages": totals.get("ccld_worker_messages_total", 0.0),
                        "records": totals.get("ccld_worker_records_total", 0.0),
                        "dead_letters": totals.get("ccld_worker_dead_letters_total", 0.0),
                        "verdicts_acknowledged": totals.get("ccld_worker_verdicts_total", 0.0),
                        "slow_held_starved": totals.get("ccld_worker_slow_held_starved_total", 0.0),
                        "slow_held_cheap": totals.get("ccld_worker_slow_held_cheap_total", 0.0),
                        "cpu_s_during_run": worker_cpu}
    result["hogs"] = seen.get("hogs")
    result["restart"] = {"kill": seen["kill"], "incarnations_seen_by_worker": seen["incarnations"],
                         "incarnations_in_step_logs": attached.get("incarnations"),
                         "torchrun_exit_code": seen["returncode"]}
    result["ccld_run_lines"] = seen["log_tail"]
    la = seen["loadavg"]
    result["loadavg_1min_during_run"] = {"min": min(la), "median": statistics.median(la), "max": max(la)} if la else {}
    result["steps"] = {"attached": attached, "baseline": base,
                       "baseline_halves": [step_stats(read_steps(d)) for d in baselines]}
    if base.get("steps") and attached.get("steps"):
        result["steps"]["added_ms_per_step"] = attached["step_ms_median"] - base["step_ms_median"]
        result["steps"]["added_busy_ms_per_step"] = attached["busy_ms_median"] - base["busy_ms_median"]
    result["ended_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    text = json.dumps(result, indent=2, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(json.dumps({k: result[k] for k in ("verdicts", "worker", "restart", "steps")}, indent=2, sort_keys=True)
          if not args.out else text)
    restart_ok = args.kill_rank < 0 or "1" in seen["incarnations"]
    ok = not verdicts and result["worker"]["records"] > 0 and restart_ok
    progress(f"{'OK' if ok else 'NOT OK'}: {len(verdicts)} verdicts, {result['worker']['records']:.0f} records, "
             f"incarnations seen {sorted(seen['incarnations'])}; logs in {work}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
