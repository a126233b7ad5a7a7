"""The storage layer against a real S3 server (s3proxy) and the local filesystem: the same calls, the same results."""

from __future__ import annotations

import pytest

from hir_model import storage
from hir_model.errors import HirError


@pytest.fixture(params=["local", "s3a", "hdfs"])
def root(request, tmp_path, s3_server, s3_settings) -> str:
    if request.param == "local":
        return str(tmp_path / "root")
    if request.param == "hdfs":
        # Through the Spark driver's Hadoop client (no libhdfs here): the shared session must exist.
        request.getfixturevalue("spark")
        return request.getfixturevalue("hdfs_cluster") + f"/roots/{request.node.name.split('[')[0]}"
    return s3_server.new_bucket(f"roots-{len(list(s3_server.folder.iterdir()))}") + "/some/prefix"


def test_files_round_trip(root: str, tmp_path) -> None:
    target = storage.join(root, "a", "b.json")
    assert not storage.exists(target)
    storage.write_text(target, '{"x": 1}')
    assert storage.read_text(target) == '{"x": 1}'
    assert storage.is_file(target) and not storage.is_dir(target)
    assert storage.is_dir(storage.join(root, "a"))
    storage.write_text(target, '{"x": 2}')  # replaced, not appended
    assert storage.read_text(target) == '{"x": 2}'
    storage.write_bytes(storage.join(root, "a", "c.bin"), b"\x00\x01")
    assert storage.listdir(storage.join(root, "a")) == ["b.json", "c.bin"]
    assert storage.listdir(storage.join(root, "missing")) == []
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(storage.join(root, "a", "nope"))
    storage.remove(storage.join(root, "a"))
    assert not storage.exists(target)
    assert storage.listdir(root) == []


def test_trees_upload_download_and_cached_copies(root: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HIR_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "source"
    (source / "sub").mkdir(parents=True)
    (source / "weights.pt").write_bytes(b"w" * 1000)
    (source / "config.json").write_text("{}")
    (source / "sub" / "x.txt").write_text("deep")
    version = storage.join(root, "models", "v1")
    storage.upload_tree(source, version, last=["weights.pt"])
    assert storage.listdir(version) == ["config.json", "sub", "weights.pt"]

    copy = storage.local_copy(version, "v1")
    assert (copy / "weights.pt").read_bytes() == b"w" * 1000
    assert (copy / "sub" / "x.txt").read_text() == "deep"
    if not storage.is_local(root):
        # The cache answers for the same key without reading the store again, and a new key reads it again.
        storage.write_text(storage.join(version, "config.json"), '{"changed": true}')
        assert (storage.local_copy(version, "v1") / "config.json").read_text() == "{}"
        assert (storage.local_copy(version, "v2") / "config.json").read_text() == '{"changed": true}'


def test_schemes_and_paths() -> None:
    assert storage.scheme("warehouse") == "" and storage.scheme("file:///tmp/x") == "file"
    assert storage.scheme("s3a://b/p") == "s3a" and storage.scheme("hdfs://nn:8020/p") == "hdfs"
    assert storage.join("s3a://b/p/", "models", "v1") == "s3a://b/p/models/v1"
    assert storage.parent("s3a://b/p/models") == "s3a://b/p" and storage.name("s3a://b/p/models/") == "models"
    assert storage.local_path("file:///tmp/x/../y") == storage.local_path("/tmp/y")
    with pytest.raises(HirError, match=r"unknown scheme 'gs://'"):
        storage.scheme("gs://bucket/x")
    with pytest.raises(HirError, match=r"use s3a://"):
        storage.scheme("s3://bucket/x")
    with pytest.raises(HirError, match="no bucket"):
        storage.filesystem("s3a:///x")


def test_settings_from_hadoop_keys_keep_secrets_out_of_repr() -> None:
    settings = storage.S3Settings.from_hadoop(
        {
            "spark.hadoop.fs.s3a.endpoint": "http://minio.local:9000",
            "fs.s3a.access.key": "AKIA",
            "fs.s3a.secret.key": "s3cr3t",
        }
    )
    options = settings.pyarrow_options()
    assert options["endpoint_override"] == "minio.local:9000" and options["scheme"] == "http"
    assert options["access_key"] == "AKIA" and options["secret_key"] == "s3cr3t"
    assert "s3cr3t" not in repr(settings)
    bare = storage.S3Settings.from_hadoop({"fs.s3a.endpoint": "s3.eu-west-1.amazonaws.com"})
    assert bare.pyarrow_options()["scheme"] == "https"
    assert "access_key" not in bare.pyarrow_options()  # the SDK's own chain (instance profiles) decides


def test_unusable_places_fail_with_one_line(s3_server, s3_settings) -> None:
    bucket = s3_server.new_bucket("reachable")
    storage.check_reachable(bucket + "/warehouse", "--warehouse")  # exists: nothing to say
    with pytest.raises(
        HirError, match=r"^--warehouse s3a://no-such-bucket/w: bucket 'no-such-bucket' does not exist$"
    ):
        storage.check_reachable("s3a://no-such-bucket/w", "--warehouse")
    storage.configure(
        storage.S3Settings.from_hadoop({**s3_server.hadoop_conf(), "fs.s3a.secret.key": "wrong"})
    )
    with pytest.raises(HirError, match="access denied") as denied:
        storage.check_reachable(bucket + "/w", "--warehouse")
    assert "\n" not in str(denied.value)
    closed = f"http://127.0.0.1:{_closed_port()}"
    storage.configure(storage.S3Settings.from_hadoop({**s3_server.hadoop_conf(), "fs.s3a.endpoint": closed}))
    with pytest.raises(HirError, match="endpoint does not answer") as silent:
        storage.check_reachable(bucket + "/w", "--warehouse")
    assert "\n" not in str(silent.value)


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
