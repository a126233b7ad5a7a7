"""A real Spark standalone cluster on 127.0.0.1, from the Spark distribution inside the pyspark package, and
`spark-submit` of the jobs: what the cluster and fault tests drive.

Every daemon and every submitted job runs in its own process group, so `stop()` (and a test's finalizer) kills
a worker together with the executor JVMs and Python workers it started. Nothing listens beyond 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from jobs.common.spark import LOCAL_DRIVER_JAVA_OPTIONS, delta_jars
from tests.conftest import REPO_ROOT

SPARK_HOME = Path(pyspark.__file__).resolve().parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
# The venv's spark-submit (pyspark's launcher script), beside the interpreter running the tests.
SPARK_SUBMIT = Path(sys.executable).parent / "spark-submit"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_env(**extra: str) -> dict[str, str]:
    """The environment of daemons and spark-submit: pyspark's Spark, bound to 127.0.0.1, the venv's Python."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_GATEWAY", "MAKE", "MFLAGS"))}
    env.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        HIR_SPARK_LOG_LEVEL="WARN",
    )
    env.update(extra)
    return env


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Signal a process started with start_new_session=True and everything it started."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def get_json(url: str, timeout: float = 2.0):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def build_dist(folder: Path) -> Path:
    """`make dist` into folder; return the --py-files zip."""
    proc = subprocess.run(
        ["make", "-s", "dist", f"DIST={folder}"],
        cwd=REPO_ROOT,
        env=spark_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (zip_path,) = folder.glob("hir_pipeline-*.zip")
    return zip_path


def job_script(job: str) -> Path:
    return REPO_ROOT / "jobs" / f"{job}.py"


def submit_command(
    master: str,
    script: Path,
    args: list[str],
    py_files: Path | None = None,
    conf: dict[str, str] | None = None,
) -> list[str]:
    """The spark-submit line of the README's "Running on a cluster" for a job script (jobs/<job>.py)."""
    confs = {
        # Executors run the interpreter of this venv, resolved at run time (no machine paths in the tests).
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.driver.memory": "1g",
        "spark.executor.memory": "1g",
        "spark.ui.enabled": "false",
        # The collector local runs use (jobs.common.spark): these JVMs do the same small batch work on the
        # same 2 cores, where it spends 15% less CPU than G1 (bench/driver_gc.py).
        "spark.driver.extraJavaOptions": LOCAL_DRIVER_JAVA_OPTIONS,
        "spark.executor.extraJavaOptions": LOCAL_DRIVER_JAVA_OPTIONS,
        **(conf or {}),
    }
    command = [str(SPARK_SUBMIT), "--master", master, "--jars", ",".join(str(j) for j in delta_jars())]
    if py_files is not None:
        command += ["--py-files", str(py_files)]
    for key, value in confs.items():
        command += ["--conf", f"{key}={value}"]
    return [*command, str(script), *args]


@dataclass
class Submitted:
    """A finished spark-submit: exit code, output and wall time."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float


@dataclass
class Running:
    """A spark-submit in its own process group, its output going to files (a pipe nobody reads while the test
    polls the job would fill up and stall it)."""

    proc: subprocess.Popen
    out: Path
    err: Path
    started: float


def start_submit(command: list[str], cwd: Path, name: str = "submit") -> Running:
    out, err = cwd / f"{name}-{time.time_ns()}.out", cwd / f"{name}-{time.time_ns()}.err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen(
            command, cwd=cwd, env=spark_env(), stdout=stdout, stderr=stderr, start_new_session=True
        )
    return Running(proc, out, err, time.perf_counter())


def finish(running: Running, timeout: float = 900) -> Submitted:
    try:
        running.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(running.proc)
        running.proc.wait()
    seconds = round(time.perf_counter() - running.started, 2)
    return Submitted(running.proc.returncode, running.out.read_text(), running.err.read_text(), seconds)


@dataclass
class StandaloneCluster:
    """A master and `workers` workers of `cores` cores each, all on 127.0.0.1 with free ports."""

    folder: Path
    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    port: int = field(default_factory=free_port)
    webui_port: int = field(default_factory=free_port)
    master: subprocess.Popen | None = None
    worker_procs: dict[int, subprocess.Popen] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def state(self) -> dict:
        """The master's JSON status page (workers, active and completed applications)."""
        return get_json(f"http://127.0.0.1:{self.webui_port}/json/")

    def _daemon(self, name: str, *args: str) -> subprocess.Popen:
        env = spark_env(SPARK_LOG_DIR=str(self.folder / "logs"), SPARK_WORKER_DIR=str(self.folder / "work"))
        with open(self.folder / f"{name}.log", "w") as log:  # the daemon keeps its own descriptor
            return subprocess.Popen(
                [str(SPARK_CLASS), *args],
                cwd=self.folder,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start(self, timeout: float = 180) -> StandaloneCluster:
        self.master = self._daemon(
            "master",
            MASTER_CLASS,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(self.webui_port),
        )
        self._wait(lambda s: s.get("status") == "ALIVE", timeout, "the master to start")
        for index in range(self.workers):
            self.start_worker(index)
        self.wait_for_workers(self.workers, timeout)
        return self

    def start_worker(self, index: int) -> None:
        work_dir = self.folder / f"worker{index}"
        work_dir.mkdir(exist_ok=True)
        self.worker_procs[index] = self._daemon(
            f"worker{index}-{time.time_ns()}",
            WORKER_CLASS,
            self.url,
            "--host",
            "127.0.0.1",
            "--cores",
            str(self.cores),
            "--memory",
            self.memory,
            "--webui-port",
            str(free_port()),
            "--work-dir",
            str(work_dir),
        )

    def kill_worker(self, index: int) -> None:
        """SIGKILL a worker with its executors: what a lost machine looks like to the driver."""
        proc = self.worker_procs.pop(index)
        kill_group(proc)
        proc.wait(timeout=30)

    def alive_workers(self) -> int:
        return sum(w["state"] == "ALIVE" for w in self.state()["workers"])

    def wait_for_workers(self, count: int, timeout: float = 180) -> None:
        self._wait(
            lambda s: sum(w["state"] == "ALIVE" for w in s["workers"]) == count,
            timeout,
            f"{count} alive workers",
        )

    def ensure_workers(self) -> None:
        """Restart the workers a fault test killed."""
        for index in range(self.workers):
            if index not in self.worker_procs or self.worker_procs[index].poll() is not None:
                self.start_worker(index)
        self.wait_for_workers(self.workers)

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.master is not None and self.master.poll() is not None:
                break
            try:
                if ready(self.state()):
                    return
            except OSError:
                pass  # not listening yet
            time.sleep(0.5)
        logs = "\n".join(p.read_text()[-2000:] for p in sorted(self.folder.glob("*.log")))
        raise AssertionError(f"timed out waiting for {what}; daemon logs:\n{logs}")

    def stop(self) -> None:
        """Kill every daemon's process group (workers first, so no executor outlives its worker)."""
        procs = [*self.worker_procs.values(), *([self.master] if self.master else [])]
        for proc in procs:
            kill_group(proc, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            kill_group(proc)  # the group may hold executors that ignored SIGTERM
            proc.wait(timeout=30)
        self.worker_procs.clear()
        self.master = None
