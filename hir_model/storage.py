"""The one place that knows where a path lives: a plain path, `file://`, `s3a://bucket/prefix` or
`hdfs://namenode:port/path`. Nothing else in the project looks at a URI's scheme.

Spark reads and writes the Delta tables at these URIs through Hadoop's FileSystem API (the S3A connector, HDFS
client). Everything the Python side keeps beside the tables (model versions, lineage records, index versions,
reports) goes through this module, on pyarrow's filesystems: pyarrow is already pinned for Parquet, its S3 client is
the AWS C++ SDK, and its HadoopFileSystem is libhdfs, the client a YARN cluster ships. fsspec would add a second
S3 client (s3fs/aiobotocore) for the same calls.

S3 settings are the ones Spark's S3A connector reads (`fs.s3a.endpoint`, `fs.s3a.access.key`, `fs.s3a.secret.key`,
`fs.s3a.session.token`, `fs.s3a.endpoint.region`, `fs.s3a.connection.ssl.enabled`): the driver takes them from its
Hadoop configuration (`configure_from_hadoop`), so one `--conf spark.hadoop.fs.s3a.*` serves both sides. Without
them (a ranking team's notebook, `hir query`), the AWS standard environment applies: `AWS_ENDPOINT_URL_S3` or
`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, then the SDK's own chain (profiles,
instance profiles).

Atomicity, per scheme, of `write_bytes` (the building block of every publish step):
  local  temp file in the same folder, fsync, os.replace, fsync the folder: readers see the old or the new file.
  s3a    one PUT (or a multipart upload completed in one call): S3 makes an object visible whole or not at all.
  hdfs   write `.<name>.tmp-<id>`, then rename over the target (a NameNode rename is atomic).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from hir_model.errors import HirError

REMOTE_SCHEMES = ("s3a", "hdfs")
SCHEMES = ("file", *REMOTE_SCHEMES)


def scheme(uri: str | Path) -> str:
    """'' or 'file' for local paths, 's3a' or 'hdfs'; anything else is refused with one line."""
    text = str(uri)
    if "://" not in text and not text.startswith("file:"):
        return ""
    found = urlparse(text).scheme
    if found == "s3" or found == "s3n":
        raise HirError(f"{text}: use s3a:// (the scheme Spark's S3A connector reads), not {found}://")
    if found not in SCHEMES:
        raise HirError(f"{text}: unknown scheme '{found}://' (use a path, file://, s3a:// or hdfs://)")
    return found


def is_local(uri: str | Path) -> bool:
    return scheme(uri) in ("", "file")


def on_this_machine(uri: str | Path) -> bool:
    """True for plain paths and file:// URIs, False for any other URI, even one this module does not open (a
    gs:// input is Spark's to read): for code that only has something to do with local files."""
    try:
        return is_local(uri)
    except HirError:
        return False


def local_path(uri: str | Path) -> Path:
    """The local path of a plain path or file:// URI (absolute)."""
    if not is_local(uri):
        raise HirError(f"{uri} is not a local path")
    text = str(uri)
    return Path(urlparse(text).path if text.startswith("file:") else text).resolve()


def normalise(uri: str | Path) -> str:
    """A stable spelling: local paths absolute, URIs without a trailing slash."""
    return str(local_path(uri)) if is_local(uri) else str(uri).rstrip("/")


def join(uri: str | Path, *parts: str) -> str:
    if is_local(uri):
        return str(local_path(uri).joinpath(*parts))
    return "/".join([str(uri).rstrip("/"), *(p.strip("/") for p in parts)])


def name(uri: str | Path) -> str:
    return str(uri).rstrip("/").rsplit("/", 1)[-1]


def parent(uri: str | Path) -> str:
    if is_local(uri):
        return str(local_path(uri).parent)
    head, _ = str(uri).rstrip("/").rsplit("/", 1)
    return head


# -- S3 settings ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class S3Settings:
    """How to reach the object store; picklable, so pandas UDFs get the driver's settings in their closure."""

    endpoint: str | None = None  # host[:port], or a URL whose scheme decides TLS
    region: str | None = None
    ssl: bool = True
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)

    @classmethod
    def from_hadoop(cls, conf: Mapping[str, str | None]) -> S3Settings:
        """From S3A's keys (`fs.s3a.endpoint`, ...), as a Hadoop Configuration or `spark.hadoop.` confs give them."""

        def get(key: str) -> str | None:
            value = conf.get(key) or conf.get("spark.hadoop." + key)
            return value.strip() if value and value.strip() else None

        ssl = (get("fs.s3a.connection.ssl.enabled") or "true").lower() != "false"
        return cls(
            endpoint=get("fs.s3a.endpoint"),
            region=get("fs.s3a.endpoint.region"),
            ssl=ssl,
            access_key=get("fs.s3a.access.key"),
            secret_key=get("fs.s3a.secret.key"),
            session_token=get("fs.s3a.session.token"),
        )

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> S3Settings:
        env = os.environ if env is None else env
        return cls(
            endpoint=env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL"),
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION"),
            access_key=env.get("AWS_ACCESS_KEY_ID"),
            secret_key=env.get("AWS_SECRET_ACCESS_KEY"),
            session_token=env.get("AWS_SESSION_TOKEN"),
        )

    def pyarrow_options(self) -> dict:
        options: dict = {"connect_timeout": 10, "request_timeout": 60}
        if self.endpoint:
            parsed = urlparse(self.endpoint if "://" in self.endpoint else "//" + self.endpoint)
            options["endpoint_override"] = parsed.netloc
            options["scheme"] = parsed.scheme or ("https" if self.ssl else "http")
            options["region"] = self.region or "us-east-1"  # S3-compatible servers ignore it; SigV4 needs one
        elif self.region:
            options["region"] = self.region
        if self.access_key and self.secret_key:
            options.update(access_key=self.access_key, secret_key=self.secret_key)
            if self.session_token:
                options["session_token"] = self.session_token
        return options

    def deltalake_options(self) -> dict[str, str]:
        """`storage_options` for delta-rs (`deltalake.DeltaTable(uri, storage_options=...)`), the reader of
        ranking teams without Spark. Unset values are left to the AWS environment, as for Spark and pyarrow."""
        options: dict[str, str] = {}
        if self.endpoint:
            parsed = urlparse(self.endpoint if "://" in self.endpoint else "//" + self.endpoint)
            tls = parsed.scheme == "https" if parsed.scheme else self.ssl
            options["AWS_ENDPOINT_URL"] = f"{'https' if tls else 'http'}://{parsed.netloc}"
            options["AWS_ALLOW_HTTP"] = "false" if tls else "true"
            options["AWS_REGION"] = self.region or "us-east-1"
        elif self.region:
            options["AWS_REGION"] = self.region
        if self.access_key and self.secret_key:
            options.update(AWS_ACCESS_KEY_ID=self.access_key, AWS_SECRET_ACCESS_KEY=self.secret_key)
            if self.session_token:
                options["AWS_SESSION_TOKEN"] = self.session_token
        return options


_settings: S3Settings | None = None
_hadoop: tuple | None = None  # (py4j gateway, Hadoop Configuration) of the Spark driver in this process
_filesystems: dict = {}


def configure(settings: S3Settings | None) -> None:
    """Use these S3 settings from now on in this process (None: back to the environment's)."""
    global _settings
    _settings = settings


def s3_settings() -> S3Settings:
    return _settings if _settings is not None else S3Settings.from_environment()


def configure_from_hadoop(hadoop_conf, gateway=None) -> None:
    """Take the S3 settings from a live Hadoop Configuration (py4j), the one the Spark driver uses; with the
    driver's py4j gateway, hdfs:// goes through the driver's own Hadoop client when libhdfs is not installed."""
    global _hadoop
    _hadoop = (gateway, hadoop_conf) if gateway is not None else None
    keys = (
        "fs.s3a.endpoint",
        "fs.s3a.endpoint.region",
        "fs.s3a.connection.ssl.enabled",
        "fs.s3a.access.key",
        "fs.s3a.secret.key",
        "fs.s3a.session.token",
    )
    found = S3Settings.from_hadoop({key: hadoop_conf.get(key) for key in keys})
    configure(found if found != S3Settings() else None)


# -- filesystems ---------------------------------------------------------------------------------------------


def filesystem(uri: str | Path):
    """(pyarrow FileSystem, path inside it) for a path or URI."""
    import pyarrow.fs as pafs

    kind = scheme(uri)
    if kind in ("", "file"):
        return pafs.LocalFileSystem(), str(local_path(uri))
    parsed = urlparse(str(uri))
    if kind == "s3a":
        if not parsed.netloc:
            raise HirError(f"{uri}: no bucket (s3a://bucket/prefix)")
        settings = s3_settings()
        if ("s3", settings) not in _filesystems:
            _filesystems["s3", settings] = pafs.S3FileSystem(**settings.pyarrow_options())
        return _filesystems["s3", settings], f"{parsed.netloc}{parsed.path}".rstrip("/")
    if not parsed.hostname:
        raise HirError(f"{uri}: no namenode (hdfs://namenode:port/path)")
    key = ("hdfs", parsed.hostname, parsed.port)
    if key not in _filesystems:
        try:
            _filesystems[key] = pafs.HadoopFileSystem(parsed.hostname, parsed.port or 8020)
        except OSError as err:
            if _hadoop is None:
                raise HirError(
                    f"{uri}: outside a Spark driver, hdfs:// needs libhdfs (set ARROW_LIBHDFS_DIR and CLASSPATH "
                    f"as on a Hadoop node): {str(err).splitlines()[0]}"
                ) from None
            from hir_model.hadoop_jvm import HadoopJvmHandler

            root = f"hdfs://{parsed.hostname}" + (f":{parsed.port}" if parsed.port else "")
            _filesystems[key] = pafs.PyFileSystem(HadoopJvmHandler(*_hadoop, root))
    return _filesystems[key], parsed.path or "/"


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())


def _info(uri: str | Path):
    fs, path = filesystem(uri)
    try:
        return fs.get_file_info(path)
    except OSError as err:
        raise HirError(f"{uri}: {_one_line(err)}") from None


def exists(uri: str | Path) -> bool:
    import pyarrow.fs as pafs

    return _info(uri).type != pafs.FileType.NotFound


def is_file(uri: str | Path) -> bool:
    import pyarrow.fs as pafs

    return _info(uri).type == pafs.FileType.File


def is_dir(uri: str | Path) -> bool:
    import pyarrow.fs as pafs

    return _info(uri).type == pafs.FileType.Directory


def read_bytes(uri: str | Path) -> bytes:
    fs, path = filesystem(uri)
    try:
        with fs.open_input_stream(path) as handle:
            return handle.read()
    except FileNotFoundError:
        raise
    except OSError as err:
        if not exists(uri):
            raise FileNotFoundError(str(uri)) from None
        raise HirError(f"{uri}: {_one_line(err)}") from None


def read_text(uri: str | Path) -> str:
    return read_bytes(uri).decode()


def write_bytes(uri: str | Path, data: bytes) -> None:
    """Replace the file at `uri` in one atomic step (see the module doc, per scheme)."""
    kind = scheme(uri)
    if kind in ("", "file"):
        target = local_path(uri)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, staged = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(staged, target)
        except BaseException:
            Path(staged).unlink(missing_ok=True)
            raise
        folder = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
        return
    fs, path = filesystem(uri)
    try:
        if kind == "s3a":
            with fs.open_output_stream(path) as handle:
                handle.write(data)
            return
        staged = f"{parent(path)}/.{name(path)}.tmp-{uuid.uuid4().hex[:8]}"
        fs.create_dir(parent(path), recursive=True)
        with fs.open_output_stream(staged) as handle:
            handle.write(data)
        fs.move(staged, path)
    except OSError as err:
        raise HirError(f"{uri}: write failed: {_one_line(err)}") from None


def write_text(uri: str | Path, text: str) -> None:
    write_bytes(uri, text.encode())


def listdir(uri: str | Path) -> list[str]:
    """Names directly under `uri` (files and folders), sorted; [] when it does not exist."""
    import pyarrow.fs as pafs

    fs, path = filesystem(uri)
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except OSError as err:
        raise HirError(f"{uri}: {_one_line(err)}") from None
    return sorted(info.base_name for info in infos)


def remove(uri: str | Path) -> None:
    """Delete a file or a folder with everything in it; nothing when it is not there."""
    import pyarrow.fs as pafs

    fs, path = filesystem(uri)
    kind = fs.get_file_info(path).type
    if kind == pafs.FileType.Directory:
        fs.delete_dir(path)
    elif kind == pafs.FileType.File:
        fs.delete_file(path)


def _files_under(folder: Path) -> Iterator[Path]:
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            yield path


def upload_tree(local_dir: str | Path, uri: str | Path, *, last: Sequence[str] = ()) -> None:
    """Copy every file under `local_dir` to `uri`, the files named in `last` after all others (in that order), so
    a reader that waits for them never sees a part of the folder."""
    local_dir = Path(local_dir)
    order = [p for p in _files_under(local_dir) if p.relative_to(local_dir).as_posix() not in last]
    order += [local_dir / rel for rel in last if (local_dir / rel).is_file()]
    for path in order:
        write_bytes(join(uri, path.relative_to(local_dir).as_posix()), path.read_bytes())


def download_tree(uri: str | Path, local_dir: str | Path) -> None:
    import pyarrow.fs as pafs

    fs, path = filesystem(uri)
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    except OSError as err:
        raise HirError(f"{uri}: {_one_line(err)}") from None
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        target = Path(local_dir) / info.path[len(path) :].lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        with fs.open_input_stream(info.path) as handle:
            target.write_bytes(handle.read())


def cache_root() -> Path:
    return Path(os.environ.get("HIR_CACHE_DIR") or Path.home() / ".cache" / "hir")


def local_copy(uri: str | Path, key: str) -> Path:
    """A local folder holding the folder at `uri`: the path itself when local, else a copy in the cache
    (`HIR_CACHE_DIR`, default ~/.cache/hir) under a name made of the URI and `key` (a checksum or an immutable
    version name, so a changed folder is never served from an old copy). Copies land whole (download beside,
    then rename)."""
    if is_local(uri):
        return local_path(uri)
    target = cache_root() / hashlib.sha256(f"{normalise(uri)}\0{key}".encode()).hexdigest()[:32]
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        download_tree(uri, staging)
        try:
            os.rename(staging, target)
        except OSError:  # another process put the same copy there first
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def check_reachable(uri: str | Path, what: str) -> None:
    """Fail with one line, before anything is written, when the place cannot be used: no bucket, no credentials,
    an endpoint that does not answer, no namenode. Local paths need nothing (folders are made on write)."""
    import pyarrow.fs as pafs

    kind = scheme(uri)
    if kind in ("", "file"):
        return
    fs, path = filesystem(uri)
    root = path.split("/", 1)[0] if kind == "s3a" else "/"
    try:
        found = fs.get_file_info(root).type
    except OSError as err:
        text = _one_line(err)
        if "ACCESS_DENIED" in text or "credentials" in text.lower() or "InvalidAccessKeyId" in text:
            raise HirError(
                f"{what} {uri}: access denied (check fs.s3a.access.key/secret.key or the AWS credentials)"
            ) from None
        if "NETWORK_CONNECTION" in text or "connect" in text.lower():
            raise HirError(f"{what} {uri}: endpoint does not answer ({text})") from None
        raise HirError(f"{what} {uri}: {text}") from None
    if found == pafs.FileType.NotFound:
        raise HirError(
            f"{what} {uri}: bucket '{root}' does not exist" if kind == "s3a" else f"{what} {uri}: not found"
        )
