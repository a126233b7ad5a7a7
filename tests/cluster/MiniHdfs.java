// An HDFS mini cluster (one namenode, one datanode) for the tests, run as a single-file program:
//   java -cp hadoop-client-minicluster-3.4.1.jar:<pyspark>/jars/* MiniHdfs.java <base dir> <namenode port>
// It prints "READY hdfs://127.0.0.1:<port>" once the datanode has registered, then serves until killed.
import java.io.File;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.MiniDFSCluster;

public class MiniHdfs {
    public static void main(String[] args) throws Exception {
        Configuration conf = new Configuration();
        conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, new File(args[0]).getAbsolutePath());
        conf.set("dfs.permissions.enabled", "false");
        MiniDFSCluster cluster = new MiniDFSCluster.Builder(conf)
            .nameNodePort(Integer.parseInt(args[1]))
            .numDataNodes(1)
            .format(true)
            .build();
        cluster.waitActive();
        System.out.println("READY hdfs://127.0.0.1:" + cluster.getNameNodePort());
        System.out.flush();
        Thread.currentThread().join();
    }
}
