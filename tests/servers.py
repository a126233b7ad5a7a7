"""Real storage servers started from packages for the tests and benchmarks: s3proxy (an S3 server on a folder)
and an HDFS mini cluster, both from jars `make setup` fetches into .jars/. Each runs as a child process until
`stop()`."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from jobs.common.spark import jars_dir


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _newest_jar(pattern: str) -> Path:
    jars = sorted(jars_dir().glob(pattern))
    if not jars:
        raise RuntimeError(f"{pattern} not found in {jars_dir()}: run `make setup`")
    return jars[-1]


@dataclass
class _Child:
    process: subprocess.Popen
    log: Path

    def wait_for(self, ready, what: str, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()
                raise RuntimeError(f"{what} did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


@dataclass
class S3Server:
    """A real S3 server (s3proxy on a folder) and the settings that reach it."""

    endpoint: str
    access_key: str
    secret_key: str
    folder: Path
    child: _Child | None = field(default=None, repr=False)

    def hadoop_conf(self) -> dict[str, str]:
        """The S3A settings a Spark job needs (as `spark.hadoop.` confs they are the same keys)."""
        return {
            "fs.s3a.endpoint": self.endpoint,
            "fs.s3a.access.key": self.access_key,
            "fs.s3a.secret.key": self.secret_key,
            "fs.s3a.path.style.access": "true",
            "fs.s3a.endpoint.region": "us-east-1",
            "fs.s3a.connection.ssl.enabled": "false",
        }

    def new_bucket(self, name: str) -> str:
        """Create a bucket (s3proxy's filesystem backend keeps one folder per bucket) and return s3a://name."""
        (self.folder / name).mkdir()
        return f"s3a://{name}"

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()


def start_s3proxy(root: Path) -> S3Server:
    """s3proxy with its filesystem-nio2 backend (4.1.0: 2.6 lists directory markers without a Size, which delta-rs
    refuses) on a free port, buckets as folders under root/buckets; the newest jar in .jars/."""
    jar = _newest_jar("s3proxy-*-jar-with-dependencies.jar")
    folder = root / "buckets"
    folder.mkdir(parents=True)
    port = free_port()
    server = S3Server(f"http://127.0.0.1:{port}", "hir-test-key", "hir-test-secret", folder)
    conf = root / "s3proxy.conf"
    conf.write_text(
        "\n".join(
            [
                f"s3proxy.endpoint={server.endpoint}",
                "s3proxy.authorization=aws-v2-or-v4",
                f"s3proxy.identity={server.access_key}",
                f"s3proxy.credential={server.secret_key}",
                "jclouds.provider=filesystem-nio2",
                f"jclouds.identity={server.access_key}",
                f"jclouds.credential={server.secret_key}",
                f"jclouds.filesystem.basedir={folder}",
                "",
            ]
        )
    )
    log = root / "s3proxy.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            ["java", "-jar", str(jar), "--properties", str(conf)], stdout=out, stderr=out
        )
    server.child = _Child(process, log)

    def answers() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    server.child.wait_for(answers, "s3proxy", 60)
    return server


@dataclass
class HdfsCluster:
    url: str  # hdfs://127.0.0.1:<port>
    child: _Child = field(repr=False)

    def stop(self) -> None:
        self.child.stop()


def start_hdfs(root: Path) -> HdfsCluster:
    """An HDFS mini cluster (one namenode, one datanode) from hadoop-client-minicluster and pyspark's own Hadoop
    jars, run by `tests/cluster/MiniHdfs.java` (Java's single-file launcher: nothing to compile)."""
    import pyspark

    classpath = os.pathsep.join(
        [
            str(_newest_jar("hadoop-client-minicluster-*.jar")),
            str(Path(pyspark.__file__).parent / "jars" / "*"),
        ]
    )
    source = Path(__file__).parent / "cluster" / "MiniHdfs.java"
    log = root / "minihdfs.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            ["java", "-cp", classpath, str(source), str(root / "base"), str(free_port())],
            stdout=out,
            stderr=out,
        )
    child = _Child(process, log)
    child.wait_for(lambda: "READY hdfs://" in log.read_text(), "HDFS mini cluster", 180)
    return HdfsCluster(log.read_text().split("READY ", 1)[1].split()[0], child)
