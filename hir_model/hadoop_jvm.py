"""hdfs:// for the storage layer through the Spark driver's own Hadoop client (py4j), when libhdfs is not there.

pyarrow's HadoopFileSystem needs libhdfs and a Hadoop CLASSPATH, which a YARN node has and a pip install does not.
The Spark driver always has a working HDFS client: the one that writes the tables. This handler gives pyarrow a
FileSystem backed by it (`pyarrow.fs.PyFileSystem(HadoopJvmHandler(...))`), so lineage records, model versions,
index versions and reports reach the same namenode with the same configuration as the tables. It only works in the
driver process (pandas UDF workers have no JVM). Files move through py4j as whole byte arrays: fine for records,
manifests and model weights, slow for multi-GB indexes.
"""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.fs as pafs


class _UploadOnClose(io.BytesIO):
    def __init__(self, handler: HadoopJvmHandler, path: str):
        super().__init__()
        self._handler, self._path = handler, path

    def close(self) -> None:
        if not self.closed:
            out = self._handler.fs.create(self._handler.jpath(self._path), True)
            try:
                out.write(bytearray(self.getvalue()))
            finally:
                out.close()
        super().close()


class HadoopJvmHandler(pafs.FileSystemHandler):
    """A pyarrow filesystem on `org.apache.hadoop.fs.FileSystem` for one namenode (`hdfs://host:port`)."""

    def __init__(self, gateway, hadoop_conf, root: str):
        self.gateway, self.jvm, self.conf, self.root = gateway, gateway.jvm, hadoop_conf, root.rstrip("/")
        self.fs = self.jvm.org.apache.hadoop.fs.FileSystem.get(self.jvm.java.net.URI(self.root), hadoop_conf)

    def jpath(self, path: str):
        return self.jvm.org.apache.hadoop.fs.Path(self.root + "/" + path.lstrip("/"))

    def get_type_name(self) -> str:
        return "hadoop-jvm"

    def normalize_path(self, path: str) -> str:
        return path

    def equals(self, other) -> bool:
        return isinstance(other, HadoopJvmHandler) and other.root == self.root

    def _info(self, path: str, status) -> pafs.FileInfo:
        if status.isDirectory():
            return pafs.FileInfo(path, pafs.FileType.Directory)
        return pafs.FileInfo(
            path,
            pafs.FileType.File,
            size=status.getLen(),
            mtime_ns=status.getModificationTime() * 1_000_000,
        )

    def get_file_info(self, paths):
        infos = []
        for path in paths:
            target = self.jpath(path)
            if not self.fs.exists(target):
                infos.append(pafs.FileInfo(path, pafs.FileType.NotFound))
            else:
                infos.append(self._info(path, self.fs.getFileStatus(target)))
        return infos

    def get_file_info_selector(self, selector):
        base = selector.base_dir.rstrip("/")
        if not self.fs.exists(self.jpath(base)):
            if selector.allow_not_found:
                return []
            raise FileNotFoundError(base)
        found, folders = [], [base]
        while folders:
            folder = folders.pop()
            for status in self.fs.listStatus(self.jpath(folder)):
                path = f"{folder}/{status.getPath().getName()}"
                found.append(self._info(path, status))
                if status.isDirectory() and selector.recursive:
                    folders.append(path)
        return found

    def create_dir(self, path: str, recursive: bool) -> None:
        self.fs.mkdirs(self.jpath(path))

    def delete_dir(self, path: str) -> None:
        self.fs.delete(self.jpath(path), True)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        if not self.fs.exists(self.jpath(path)):
            if missing_dir_ok:
                return
            raise FileNotFoundError(path)
        for status in self.fs.listStatus(self.jpath(path)):
            self.fs.delete(status.getPath(), True)

    def delete_root_dir_contents(self) -> None:
        self.delete_dir_contents("/")

    def delete_file(self, path: str) -> None:
        self.fs.delete(self.jpath(path), False)

    def move(self, src: str, dest: str) -> None:
        """HDFS's rename with OVERWRITE: one namenode operation, so readers see the old file or the new one."""
        rename = self.jvm.org.apache.hadoop.fs.Options.Rename
        options = self.gateway.new_array(rename, 1)
        options[0] = rename.OVERWRITE
        context = self.jvm.org.apache.hadoop.fs.FileContext.getFileContext(
            self.jvm.java.net.URI(self.root), self.conf
        )
        context.rename(self.jpath(src), self.jpath(dest), options)

    def copy_file(self, src: str, dest: str) -> None:
        self.open_output_stream(dest, None).write(self.open_input_stream(src).read())

    def open_input_stream(self, path: str):
        if not self.fs.isFile(self.jpath(path)):
            raise FileNotFoundError(path)
        stream = self.fs.open(self.jpath(path))
        try:
            return pa.BufferReader(bytes(stream.readAllBytes()))
        finally:
            stream.close()

    def open_input_file(self, path: str):
        return self.open_input_stream(path)

    def open_output_stream(self, path: str, metadata):
        return pa.PythonFile(_UploadOnClose(self, path), mode="w")

    def open_append_stream(self, path: str, metadata):
        raise NotImplementedError("append is not used by the storage layer")
